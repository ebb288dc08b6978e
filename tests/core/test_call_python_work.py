"""What a warm call of the C core does in Python on CPU tensors (tests/helpers/python_work.py counts
it): the collective's encode and decode and the single payload's compress and decompress, for
every codec, call no Python function and run no torch operator (no allocation once the unit's
residual exists, nor for an 8-bit residual's workspace: the State keeps one), and ask torch one thing per tensor from outside the C side: whether it is a
negative-bit view (DLPack cannot carry the flag). The CUDA path's count is
tests/cuda/test_cuda_call_counts.py's (emulated)."""
from __future__ import annotations

import pytest

import fsdpcomp
from helpers.python_work import PythonWork, WarmCalls

# powersgd is no C codec: its reducer is Python (fsdpcomp/_powersgd.py)
CODECS = [m for m in fsdpcomp.codecs() if m != "powersgd"]
CONFIGS = [{"error_stats_every": 0}, {"error_feedback": True, "error_stats_every": 1},
           {"error_feedback": True, "residual_dtype": "int8", "error_stats_every": 0}]


@pytest.mark.parametrize("method", CODECS)
@pytest.mark.parametrize("cfg", CONFIGS, ids=["defaults", "error-feedback-sampled", "error-feedback-int8"])
def test_a_warm_call_does_no_python_work_but_the_view_checks(method, cfg):
    calls = WarmCalls(fsdpcomp.CommState(method, cfg), fsdpcomp.CommState(method, cfg)).warm()
    tensors = calls.outside_tensors()
    for name, call in calls.calls.items():
        work = PythonWork.of(call)
        assert work.python_calls == {}, f"{method} {name}: Python functions called: {work.python_calls}"
        assert work.torch_ops == {}, f"{method} {name}: torch operators run: {work.torch_ops}"
        assert work.torch_functions == {"is_neg": tensors[name]}, \
            f"{method} {name}: torch functions {work.torch_functions}"


def test_the_counts_see_an_allocation():
    """The counter is not blind: a unit's first encode with error feedback makes its residual
    through the allocator (a Python function, torch.zeros), and that is seen."""
    cfg = {"error_feedback": True}
    calls = WarmCalls(fsdpcomp.CommState("int8", cfg), fsdpcomp.CommState("int8", cfg))
    work = PythonWork.of(calls.calls["encode"])  # its first run is the unit's first encode
    assert any(k.endswith(":allocate") for k in work.python_calls), work.python_calls
