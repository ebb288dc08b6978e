"""What a call into fsdpcomp._C does in Python, counted: the Python functions it calls (the
allocator, a torch helper: sys.setprofile's 'call' events below the caller's own frame), the
torch operators it runs (a TorchDispatchMode: allocations are aten.empty / aten.zeros ...) and
the torch functions and tensor methods it calls (a TorchFunctionMode). Each is counted in its
own run of the call, as the modes are Python functions themselves."""
from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode


class _Functions(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.seen = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen[getattr(func, "__name__", str(func))] += 1
        return func(*args, **(kwargs or {}))


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen[str(func)] += 1
        return func(*args, **(kwargs or {}))


@dataclass
class PythonWork:
    python_calls: dict[str, int]
    torch_ops: dict[str, int]
    torch_functions: dict[str, int]

    @staticmethod
    def of(call: Callable[[], object]) -> "PythonWork":
        """Runs `call` three times (it must be repeatable: a warm State's call is) and counts
        what happened in Python below it."""
        own = call.__code__ if hasattr(call, "__code__") else None
        called = Counter()

        def profile(frame, event, arg):
            if event == "call" and frame.f_code is not own:
                called[f"{frame.f_code.co_filename}:{frame.f_code.co_name}"] += 1

        sys.setprofile(profile)
        try:
            call()
        finally:
            sys.setprofile(None)
        with _Ops() as ops:
            call()
        with _Functions() as functions:
            call()
        return PythonWork(dict(called), dict(ops.seen), dict(functions.seen))


class WarmCalls:
    """The four calls of a State's codec on one unit, each as a function of no argument (so they
    can be repeated, counted and timed): the collective's encode and decode as rank 0 of WORLD,
    decode reading the payload the peer State (rank 1, the same config) encoded of the same
    gradient, and compress() / decompress() of one payload of the unit. `state` and `peer` are
    CommStates of one method and config, on the path under test (CPU, or the CUDA library)."""

    N, WORLD = 4097, 2  # an odd size: the last chunk is shorter
    CALLS = ("encode", "decode", "compress", "decompress")

    def __init__(self, state, peer):
        n, world = self.N, self.WORLD
        self.state = state
        core, pcore = state._core, peer._core
        g = torch.randn(n, generator=torch.Generator().manual_seed(5)) * 3
        unit, punit = core.begin(n), pcore.begin(n)
        # the unit: adaptive's sizes follow the unit's parts table
        send = torch.zeros(sum(core.plan(g, world, 0, unit)[0]), dtype=torch.uint8)
        psend = torch.zeros(sum(pcore.plan(g, world, 1, punit)[0]), dtype=torch.uint8)
        sizes = pcore.encode(g, psend, world, 1, punit)
        recv = psend[:sizes[0]].clone()  # rank 1's one payload: for chunk 0, rank 0's
        out = torch.zeros(-(-n // world))
        payload = torch.zeros(core.payload_bytes(n), dtype=torch.uint8)
        written = core.compress(g, payload, unit=unit, chunk=0, world=world, rank=0)
        one = payload[:written].clone()
        acc = torch.zeros(n)
        self.unit = unit
        self.calls = {
            "encode": lambda: core.encode(g, send, world, 0, unit),
            "decode": lambda: core.decode(recv, g, out, world, 0, unit),
            "compress": lambda: core.compress(g, payload, unit=unit, chunk=0, world=world, rank=0),
            "decompress": lambda: core.decompress(one, acc, unit=unit, chunk=0, world=world),
        }

    def warm(self) -> "WarmCalls":
        for call in self.calls.values():
            call()
        return self

    def outside_tensors(self) -> dict[str, int]:
        """The tensors each call reads that come from outside the C side: the caller's, and in an
        encode the unit's residual where it keeps one (a restore may have handed it in)."""
        res = self.state._core.residuals()
        keeps = len(res) > self.unit and res[self.unit] is not None
        return {"encode": 2 + keeps, "decode": 3, "compress": 2, "decompress": 2}
