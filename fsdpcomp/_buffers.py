"""The reusable working memory of one CommState's collectives (payloads, receive buffers, the
second round's, the all-gather half's, the parameter gathers' on the CPU), and what it holds:
``held_bytes`` (now) and ``peak_bytes`` (the most at once) become the counters ``buffer_bytes``
and ``buffer_peak_bytes``, so a rank's memory can be accounted for without guessing."""
from __future__ import annotations

import torch

ELEMENT_SIZE = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}


class Buffers:
    """One uint8 buffer per (kind, device), grown and never shrunk, so no call allocates in
    steady state; typed buffers are views of it."""

    def __init__(self):
        self._bufs: dict[tuple[str, str], torch.Tensor] = {}
        self.generation = 0  # counts the buffers made: views cached by a user are stale once it moves
        self._held = 0  # the sum of the buffers' sizes, kept as they grow: counters() reads it
        self._peak = 0

    def bytes(self, kind: str, nbytes: int, device: torch.device) -> torch.Tensor:
        key = (kind, str(device))
        buf = self._bufs.get(key)
        if buf is None or buf.numel() < nbytes:
            new = torch.empty(max(nbytes, 1024), dtype=torch.uint8, device=device)
            # the old buffer is alive while its replacement is allocated: both count in the peak
            self._peak = max(self._peak, self._held + new.numel())
            self._held += new.numel() - (0 if buf is None else buf.numel())
            self._bufs[key] = buf = new
            self.generation += 1
        return buf[:nbytes]

    def typed(self, kind: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        size = ELEMENT_SIZE.get(dtype) or torch.empty((), dtype=dtype).element_size()
        return self.bytes(kind + str(dtype), numel * size, device).view(dtype)

    def like(self, kind: str, numel: int, like: torch.Tensor) -> torch.Tensor:
        return self.typed(kind, numel, like.dtype, like.device)

    def base(self, kind: str, device: torch.device) -> torch.Tensor | None:
        """The buffer itself: views cached beside it are stale once it is regrown."""
        return self._bufs.get((kind, str(device)))

    @property
    def held_bytes(self) -> int:
        """Bytes of the buffers held now (the views handed out share them)."""
        return self._held

    @property
    def peak_bytes(self) -> int:
        """The most bytes held at once since creation or reset_peak(), a regrown buffer's old
        one included while it was replaced."""
        return self._peak

    def reset_peak(self) -> None:
        self._peak = self._held

    def by_kind(self) -> dict[str, int]:
        """Bytes held per buffer kind (a typed buffer's kind ends in its dtype), all devices
        summed: what makes up held_bytes."""
        out: dict[str, int] = {}
        for (kind, _), buf in self._bufs.items():
            out[kind] = out.get(kind, 0) + buf.numel()
        return out
