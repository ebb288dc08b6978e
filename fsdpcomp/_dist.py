"""torch.distributed as every module here uses it: the ranks of a call, the one collective
whose name changed across the torch versions fsdpcomp supports, and collectives that are over
when they return (settled)."""
from __future__ import annotations

import time
import warnings
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
# torch keeps a tensor's Python object alive while C++ code also holds the tensor (a view holds
# its base too), and drops that reference, under the GIL, in whichever thread lets go last. A
# gloo collective's C++ references live in a worker thread, which lets go just after the caller's
# wait() has returned. If the caller's script ends then (an error raised right after the
# collective: a mismatched config, a bad payload; or a script that simply ends), the interpreter
# finalizes while that thread waits for the GIL; CPython ends such a thread with pthread_exit,
# and its unwinding through the work's noexcept destructor is std::terminate: "terminate called
# without an active exception", SIGABRT, a clean ValueError turned into a killed rank (issue 22,
# tests/tools/test_exit_codes.py).
#
# So fsdpcomp holds one more C++ reference to every tensor it hands to gloo, and to its base, for
# the length of the collective (a DLPack capsule: an at::Tensor the capsule owns). The worker's
# release is then never the last C++ one, so it needs no GIL, and its C++ reference counts drop
# without waiting for anything; the call returns once they are back to their values before the
# collective, and then drops its capsules, in this thread, under the GIL. CUDA tensors are left
# alone: NCCL's watchdog lets go later, and fsdpcomp must not wait for it.

_RELEASE_TIMEOUT_S = 2.0
_settling = hasattr(torch.Tensor, "_use_count")  # off for the process after one wait timed out


class Handoff:
    """The CPU tensors given to one or more collectives, held once more from C++ until wait()
    has seen the backend let go of them all."""

    def __init__(self, tensors):
        watch: dict[int, torch.Tensor] = {}
        for t in tensors:
            if _settling and t is not None and t.device.type == "cpu":
                for x in (t, t._base):  # a view's base: gloo's own views of t hold it
                    if x is not None:
                        watch.setdefault(id(x), x)
        self.watch = list(watch.values())
        self._held = [t.__dlpack__() for t in self.watch]
        self.before = [_cxx_refs(t) for t in self.watch]

    def wait(self) -> None:
        """Returns once every C++ count is back; gives up after _RELEASE_TIMEOUT_S, and then stops
        settling for the process (a torch that kept its own references would otherwise cost that
        on every call)."""
        global _settling
        if not self._released(_RELEASE_TIMEOUT_S):
            _settling = False
            warnings.warn("fsdpcomp: torch.distributed still held a collective's tensors "
                          f"{_RELEASE_TIMEOUT_S} s after it ended; no longer waiting for that "
                          "(a script that ends right after an error may then abort at exit)",
                          RuntimeWarning, stacklevel=2)

    def abandon(self) -> None:
        """After a failed collective: what the backend still holds a moment later keeps its
        capsule for the life of the process, so no worker ever needs the GIL to let go."""
        self._released(0.1)

    def _released(self, patience_s: float) -> bool:
        deadline = None
        while any(_cxx_refs(t) > was for t, was in zip(self.watch, self.before)):
            if deadline is None:
                deadline = time.monotonic() + patience_s
            elif time.monotonic() > deadline:
                _parked.append(self._held)
                self._held, self.watch = [], []
                return False
            time.sleep(0)
        self._held.clear()  # the last C++ references drop here, under the GIL
        self.watch.clear()
        return True


def _cxx_refs(t: torch.Tensor) -> int:
    # torch's count of C++ references to t: nothing public tells what the backend still holds
    return t._use_count()


_parked: list = []  # capsules of tensors a failed collective may still hold


def settled(collective: Callable[..., Any], *tensors: torch.Tensor) -> None:
    """collective(*tensors), a blocking torch.distributed call, over only once its backend has
    let go of the tensors (see above)."""
    handoff = Handoff(tensors)
    try:
        collective(*tensors)
    except BaseException:
        handoff.abandon()
        raise
    handoff.wait()
