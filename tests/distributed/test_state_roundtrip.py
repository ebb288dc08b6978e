"""Every method's checkpoint round-trips bit for bit on FSDP1, FSDP2 and DDP (2 gloo ranks): after
3 steps with error feedback, state_dict -> torch.save/torch.load -> load_state_dict into a fresh
CommState -> state_dict gives the same dict, and a fresh model with the same weights, driven by
the restored state, takes the next step to the same weights and the same state as the original
one. Each method's first case of method_cases, sketch's second round and PowerSGD, with fp32 and
int8 residuals (PowerSGD's packed error could not be read back before its size rule was fixed;
sketch's and PowerSGD's residual lists came back longer)."""
import dataclasses
import io

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import fsdpcomp
from helpers.dist_utils import run_ranks
from helpers.method_cases import CASES
from helpers.step_models import Blocks, fsdp1, fsdp2

POWERSGD = ("powersgd", {"start_iter": 1, "rank": 2, "min_compression_rate": 1.0})  # 8x8 matrices factored
_FIRST_OF_EACH = list({m: (m, c) for m, c in reversed(CASES)}.values())[::-1]  # each method's first case
SECOND_ROUND = next(case for case in CASES if case[1].get("second_round"))  # residuals of the fetch path
RUNS = [(m, dict(c, error_feedback=True, residual_dtype=dtype))
        for dtype in ("fp32", "int8") for m, c in _FIRST_OF_EACH + [SECOND_ROUND, POWERSGD]]
WRAP = {"fsdp1": fsdp1, "fsdp2": fsdp2, "ddp": DDP}


def flat(x, path="", out=None):
    """A state_dict as {path: leaf}: dataclasses and containers opened, list lengths recorded."""
    out = {} if out is None else out
    if dataclasses.is_dataclass(x):
        x = {f.name: getattr(x, f.name) for f in dataclasses.fields(x)}
    if isinstance(x, dict):
        for k, v in x.items():
            flat(v, f"{path}/{k}", out)
    elif isinstance(x, (list, tuple)):
        out[path + "#len"] = len(x)
        for i, v in enumerate(x):
            flat(v, f"{path}[{i}]", out)
    else:
        out[path] = x
    return out


def difference(a, b) -> str | None:
    """Where two state_dicts differ (None: bit for bit equal, dtypes and shapes too)."""
    fa, fb = flat(a), flat(b)
    if fa.keys() != fb.keys():
        return f"keys differ: {sorted(set(fa) ^ set(fb))[:4]}"
    for k, x in fa.items():
        y = fb[k]
        if isinstance(x, torch.Tensor):
            if not (isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape
                    and torch.equal(x, y)):
                return f"{k} differs"
        elif x != y:
            return f"{k}: {x!r} != {y!r}"
    return None


def _step(rank, t, model, wrapped):
    gen = torch.Generator().manual_seed(1000 * rank + t)  # step t's data, whoever runs it
    x, y = torch.randn(8, model.in_dim, generator=gen), torch.randn(8, model.out_dim, generator=gen)
    torch.nn.functional.mse_loss(wrapped(x), y).backward()
    with torch.no_grad():
        for p in wrapped.parameters():
            if p.grad is not None:  # FSDP1: a rank may hold no element of a parameter
                p -= 0.1 * p.grad
                p.grad = None


def _wrapped(kind, method, config):
    model = Blocks()
    wrapped = WRAP[kind](model)
    state = fsdpcomp.CommState(method, config)
    fsdpcomp.register(wrapped, state)
    return model, wrapped, state


def _params(wrapped):
    return [p.detach().clone() for p in wrapped.parameters()]


def _round_trips(rank, world, kind, runs):
    """For each run, what differs (None: nothing) after the load and after the next step."""
    found = []
    for method, config in runs:
        model, wrapped, state = _wrapped(kind, method, config)
        for t in range(3):
            _step(rank, t, model, wrapped)
        saved = state.state_dict()
        buf = io.BytesIO()
        torch.save(saved, buf)
        buf.seek(0)
        fresh_model, fresh_wrapped, fresh = _wrapped(kind, method, config)
        fresh.load_state_dict(torch.load(buf))  # weights_only: a RankState is a safe global
        after_load = difference(saved, fresh.state_dict())
        with torch.no_grad():  # the same weights (this rank's shards), as a resumed run loads them
            for p, q in zip(fresh_wrapped.parameters(), _params(wrapped)):
                p.copy_(q)
        _step(rank, 3, model, wrapped)
        _step(rank, 3, fresh_model, fresh_wrapped)
        same_weights = all(torch.equal(p, q) for p, q in zip(_params(wrapped), _params(fresh_wrapped)))
        after_step = difference(state.state_dict(), fresh.state_dict())
        found.append((method, config, after_load, same_weights, after_step))
    return found


@pytest.mark.parametrize("kind", ["fsdp1", "fsdp2", "ddp"])
def test_every_method_round_trips_bit_for_bit(kind):
    for rank, found in enumerate(run_ranks(_round_trips, 2, kind, RUNS)):
        assert len(found) == len(RUNS)
        for method, config, after_load, same_weights, after_step in found:
            what = f"{kind} rank {rank} {method} {config}"
            assert after_load is None, f"{what}: state_dict after load_state_dict: {after_load}"
            assert same_weights, f"{what}: the restored state's next step took other weights"
            assert after_step is None, f"{what}: state after the next step: {after_step}"


def test_the_comparison_sees_a_changed_residual():
    """difference() is not blind: one element of one residual changed is found."""
    a = {"rank0": {"residuals": [None, torch.zeros(4)]}}
    b = {"rank0": {"residuals": [None, torch.tensor([0.0, 0.0, 1e-30, 0.0])]}}
    assert difference(a, a) is None and "residuals[1]" in difference(a, b)
    assert "keys differ" in difference(a, {"rank0": {"residuals": [torch.zeros(4)]}})
