"""torch.distributed as every module here uses it: the ranks of a call, and the one collective
whose name changed across the torch versions fsdpcomp supports."""
from __future__ import annotations

from dataclasses import dataclass

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
