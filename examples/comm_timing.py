"""Times FSDP's parameter all-gathers in ordinary runs, without the profiler: a wrapper around
the one call through which each FSDP version issues an all-gather, on the host for CPU tensors
(a gloo collective returns when it is done) and with CUDA events on the collective's stream for
GPU tensors, read after the step's own synchronisation (no host sync added).

FSDP1 has no all-gather hook; every unshard goes through FlatParamHandle._all_gather_flat_param
(torch 2.x), so that method is wrapped on each handle. FSDP2 issues its all-gathers through the
param group's AllGather object, the one FSDPModule.set_custom_all_gather replaces; the timer
wraps whichever is installed (torch's default or a custom one) and forwards everything else."""
from __future__ import annotations

import time

import torch

try:  # torch >= 2.9: subclassing keeps FSDP2's view of the object an AllGather
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _AllGatherBase
except ImportError:
    _AllGatherBase = object  # type: ignore[assignment,misc]


class AllGatherTimer:
    """Sums the time of the all-gathers issued while `active` (the timed training steps).

    ms() is the total in milliseconds, or None with `why_none` saying why it could not be
    measured. step_done() collects the CUDA events of the step; call it after the step's
    synchronisation, so it never waits."""

    def __init__(self):
        self.active = False
        self.calls = 0
        self._total_s = 0.0
        self._pending: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.why_none: str | None = "no all-gather was wrapped"

    def wrap(self, fn):
        def timed(*args, **kwargs):
            if not self.active:
                return fn(*args, **kwargs)
            self.calls += 1
            device = _device_of(args, kwargs)
            if device is not None and device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()  # on the current stream: the one FSDP issues the collective on
                out = fn(*args, **kwargs)
                end.record()
                self._pending.append((start, end))
                return out
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self._total_s += time.perf_counter() - t0
            return out
        return timed

    def step_done(self) -> None:
        for start, end in self._pending:
            self._total_s += start.elapsed_time(end) / 1e3
        self._pending.clear()

    def ms(self) -> float | None:
        self.step_done()
        return None if self.why_none else self._total_s * 1e3


def _device_of(args, kwargs) -> torch.device | None:
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a.device
    return None


class _TimedAllGather(_AllGatherBase):
    """FSDP2's AllGather protocol around another AllGather: the call is timed, allocate() and
    any other attribute go to the wrapped one."""

    def __init__(self, inner, timer: AllGatherTimer):
        self.inner = inner
        self._call = timer.wrap(inner.__call__)

    def allocate(self, *args, **kwargs):
        return self.inner.allocate(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def __getattr__(self, name):
        if name == "inner":  # not set yet: no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self.inner, name)


def attach(module: torch.nn.Module, parallel: str) -> AllGatherTimer:
    """An AllGatherTimer wrapped around every parameter all-gather of the wrapped model.
    DDP gathers no parameters: its timer measures 0 (the all-gather half of a compressed
    all-reduce is fsdpcomp's own, counted in the CommState's comm_time_s)."""
    timer = AllGatherTimer()
    if parallel == "ddp":
        timer.why_none = None
        return timer
    if parallel == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        handles = [m._handle for m in module.modules() if isinstance(m, FSDP) and getattr(m, "_handle", None)]
        if not handles or not all(hasattr(h, "_all_gather_flat_param") for h in handles):
            timer.why_none = "this torch's FSDP1 has no FlatParamHandle._all_gather_flat_param to time"
            return timer
        for h in handles:
            h._all_gather_flat_param = timer.wrap(h._all_gather_flat_param)
        timer.why_none = None
        return timer
    from torch.distributed.fsdp import FSDPModule

    groups = [g for m in module.modules() if isinstance(m, FSDPModule)
              for g in getattr(m._get_fsdp_state(), "_fsdp_param_groups", [])]
    if not groups or not all(hasattr(g, "_all_gather_comm") for g in groups):
        timer.why_none = "this torch's FSDP2 param groups have no _all_gather_comm to time"
        return timer
    for g in groups:
        g._all_gather_comm = _TimedAllGather(g._all_gather_comm, timer)
    timer.why_none = None
    return timer
