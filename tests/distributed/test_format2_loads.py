"""A checkpoint of format 2 (every residual in one of three fields: the reduce-scatter's list, the
all-gather half's `gather_residuals`, PowerSGD's e in its method_state) still loads into format 3's
one residual store, and the run resumes as the run that saved it went on. The files were written
by the fsdpcomp of format 2 itself (tests/data/format2/make.py says how): 2 gloo ranks, all_reduce
on two units for 3 steps, the state_dict, then a 4th step's outputs and state_dict."""
import dataclasses
import os

import pytest
import torch

import fsdpcomp
from fsdpcomp import _checkpoint
from helpers.dist_utils import run_ranks

HERE = os.path.join(os.path.dirname(__file__), "..", "data", "format2")
CASES = ["int8_fp32", "int8_int8", "topk_bf16", "powersgd_fp32", "powersgd_int8"]


def _load(name, rank):
    return torch.load(os.path.join(HERE, f"{name}.rank{rank}.pt"))  # weights_only: RankState is allowed


def _step(state, rank, i):
    """tests/data/format2/make.py's step: two units' all-reduce from seeded gradients."""
    from fsdpcomp._layout import Layout
    outs = []
    for key, n in (("a", 240), ("b", 700)):
        g = torch.randn(n, generator=torch.Generator().manual_seed(1000 * rank + 10 * i + n))
        state.all_reduce(g, key, matrices=Layout.of_shapes([(24, 10)]) if n == 240 else None)
        outs.append(g)
    state.end_step()
    return outs


def _slots(mine):
    """A RankState's residuals as {slot: [bytes or None per unit]} (format 2's read as format 3's)."""
    return {slot: [None if r is None else (str(r.dtype), r.contiguous().view(torch.uint8).numpy().tobytes()) for r in table]
            for slot, table in mine.residuals.items()}


def _resume(rank, world, name):
    old = _load(name, rank)
    assert old["saved"]["format"] == 2 and hasattr(old["saved"][f"rank{rank}"], "gather_residuals")
    state = fsdpcomp.CommState(old["method"], old["config"])
    state.load_state_dict(old["saved"])
    loaded = state.state_dict()
    outs = _step(state, rank, 3)
    residual_dtype = state.config["residual_dtype"]
    as3 = lambda sd: _checkpoint.from_format2(sd[f"rank{rank}"], residual_dtype)  # noqa: E731
    return {"loaded": _slots(loaded[f"rank{rank}"]), "expected": _slots(as3(old["saved"])),
            "outs_equal": [torch.equal(a, b) for a, b in zip(outs, old["next_outs"])],
            "outs_close": [torch.allclose(a, b, rtol=0, atol=1e-2) for a, b in zip(outs, old["next_outs"])],
            "after": _slots(state.state_dict()[f"rank{rank}"]), "after_expected": _slots(as3(old["after"])),
            "method_state": loaded[f"rank{rank}"].method_state, "gather_kept": sum(
                r is not None for r in loaded[f"rank{rank}"].residuals["gather"] + loaded[f"rank{rank}"].residuals["factors"])}


@pytest.mark.parametrize("name", CASES)
def test_a_format2_checkpoint_loads_and_resumes_as_its_run_went_on(name):
    for r in run_ranks(_resume, 2, name):
        # the all-gather half's, one per unit, or PowerSGD's e of unit "a" (its matrix; "b" goes
        # exactly): moved into their slots, not lost
        assert r["gather_kept"] == (1 if name.startswith("powersgd") else 2)
        assert r["loaded"] == r["expected"]  # every residual in its slot, bit for bit
        if name == "topk_bf16":  # format 2 kept the all-gather half's in fp32: rounded to bf16 now
            assert all(r["outs_close"])
        else:
            assert all(r["outs_equal"]) and r["after"] == r["after_expected"]
        if name.startswith("powersgd"):
            assert set(r["method_state"]["powersgd"]) == {"version", "q"}


def test_format2_fields_are_checked_by_their_old_names():
    old = _load("int8_fp32", 0)["saved"]["rank0"]
    for field, value, err, pattern in [
            ("gather_residuals", [torch.zeros(3)], TypeError, "'gather_residuals' must be a dict"),
            ("gather_residuals", {5: torch.zeros(3)}, ValueError, r"'gather_residuals' is keyed by unit \(0 to 1\)"),
            ("gather_residuals", {0: [1.0]}, TypeError, r"'gather_residuals'\[0\] must be a tensor")]:
        bad = dataclasses.replace(old)
        setattr(bad, field, value)
        with pytest.raises(err, match=pattern):
            _checkpoint.from_format2(bad, "fp32")
