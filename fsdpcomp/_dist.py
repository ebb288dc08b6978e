"""torch.distributed as every module here uses it: the ranks of a call, the one collective
whose name changed across the torch versions fsdpcomp supports, and collectives that are over
when they return (settled)."""
from __future__ import annotations

import time
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

# torch 2.13 renamed all_gather_into_tensor (and deprecates the old name); older torch has only it.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass(frozen=True)
class Ranks:
    """The process group of one call, its size and this rank's place in it."""
    group: dist.ProcessGroup | None
    world: int
    rank: int

    @staticmethod
    def of(group: dist.ProcessGroup | None) -> "Ranks":
        """None with torch.distributed not initialised: a single rank."""
        if not dist.is_available() or not dist.is_initialized():
            return Ranks(group, 1, 0)
        return Ranks(group, dist.get_world_size(group), dist.get_rank(group))


# ---- collectives that are over when they return
#
# torch keeps a tensor's Python object alive while C++ code holds the tensor, and drops it under
# the GIL when C++ lets go. A gloo collective's C++ references live in a worker thread, which
# lets go just after the caller's wait() has returned. If the caller's script ends then (an
# error raised right after the collective: a mismatched config, a bad payload), the interpreter
# finalizes while that thread waits for the GIL; CPython ends such a thread with pthread_exit,
# and its unwinding through the work's noexcept destructor is std::terminate: "terminate called
# without an active exception", SIGABRT, a clean ValueError turned into a killed rank (issue 22,
# tests/tools/test_exit_codes.py). So fsdpcomp hands gloo fresh views that nothing else holds and
# returns only once they are gone: once the worker thread has let go of everything it took.
# CUDA tensors are left alone: NCCL's watchdog lets go later and fsdpcomp must not wait for it.

_RELEASE_TIMEOUT_S = 2.0
_settling = True  # off for the process after one wait timed out: never a slow path per call


def fresh_views(*tensors: torch.Tensor) -> tuple[list[torch.Tensor], list[weakref.ref]]:
    """Views of `tensors` for one collective, and weak references that die when the collective's
    backend has let go of them (the caller drops the views once it has started the collective)."""
    views = [t.view(t.shape) for t in tensors]
    return views, [weakref.ref(v) for v in views] if _settling and _on_cpu(tensors) else []


def wait_released(refs: list[weakref.ref]) -> None:
    """Returns once every view of fresh_views() is gone (sleeping hands the waiting worker the
    GIL); gives up after _RELEASE_TIMEOUT_S and stops settling for the process."""
    global _settling
    if not refs or all(r() is None for r in refs):
        return
    deadline = time.monotonic() + _RELEASE_TIMEOUT_S
    while any(r() is not None for r in refs):
        if time.monotonic() > deadline:
            _settling = False
            warnings.warn("fsdpcomp: torch.distributed kept a collective's tensors for "
                          f"{_RELEASE_TIMEOUT_S} s after it ended; no longer waiting for that "
                          "(a script that ends right after an error may then abort at exit)",
                          RuntimeWarning, stacklevel=2)
            return
        time.sleep(20e-6)


def settled(collective: Callable[..., Any], *tensors: torch.Tensor) -> None:
    """collective(*views of tensors), a blocking torch.distributed call, over only once its
    backend has let go of the tensors (see above)."""
    views, refs = fresh_views(*tensors)
    collective(*views)
    del views
    wait_released(refs)


def _on_cpu(tensors) -> bool:
    return all(t.device.type == "cpu" for t in tensors)
