"""The emulated CUDA runtime's call counts (cuda_runtime.h's fc_emu_count: kernel launches, memsets,
event creations, records and queries, host waits, device-to-host copies, cudaMalloc calls, CUB
algorithm runs), read through ctypes from the emulated library fsdpcomp._C loaded
(FSDPCOMP_CUDA_LIB names it: the same dlopen handle, so the same counters). For
tests/cuda/test_cuda_call_counts.py and benchmarks/call_overhead.py."""
from __future__ import annotations

import ctypes
import os
from typing import Callable


class Counts:
    """The counters of one emulated library (FSDPCOMP_CUDA_LIB by default)."""

    def __init__(self, lib: str | None = None):
        path = lib or os.environ.get("FSDPCOMP_CUDA_LIB")
        if not path:
            raise RuntimeError("FSDPCOMP_CUDA_LIB does not name the emulated CUDA library")
        self._lib = ctypes.CDLL(path)
        if not hasattr(self._lib, "fc_emu_counts_read"):
            raise RuntimeError(f"{path} is not the emulated CUDA library (no fc_emu_counts_read)")
        self._lib.fc_emu_counts_names.restype = ctypes.c_char_p
        self.names = tuple(self._lib.fc_emu_counts_names().decode().split(","))
        self._buf = (ctypes.c_ulonglong * len(self.names))()

    def reset(self) -> None:
        self._lib.fc_emu_counts_reset()

    def read(self) -> dict[str, int]:
        self._lib.fc_emu_counts_read(self._buf, len(self.names))
        return dict(zip(self.names, map(int, self._buf)))

    def of(self, call: Callable[[], object]) -> dict[str, int]:
        """What one call asked of the runtime: the counters zeroed, the call, the counters."""
        self.reset()
        call()
        return self.read()
