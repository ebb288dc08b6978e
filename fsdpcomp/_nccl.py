"""The C-side NCCL communicators (``"transport": "nccl"``): one per (process group, device),
made lazily on the first CUDA call. Rank 0's ncclUniqueId reaches the others through
torch.distributed; ncclCommInitRank runs in C on torch's own libnccl."""
from __future__ import annotations

import torch
import torch.distributed as dist

from . import _C

_COMMS: dict[tuple, object] = {}


def comm_for(group: dist.ProcessGroup | None, device: torch.device):
    """The communicator of `group` on `device` (created on first use, then cached)."""
    if device.type != "cuda":
        raise ValueError(f"transport 'nccl' needs CUDA tensors, got a tensor on {device}")
    index = device.index if device.index is not None else torch.cuda.current_device()
    if not dist.is_available() or not dist.is_initialized():
        world, rank, key = 1, 0, ("single", index)
    else:
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        key = (id(group if group is not None else dist.group.WORLD), index)
    entry = _COMMS.get(key)
    comm = entry[1] if entry is not None and entry[0] is (group or dist.group.WORLD) else None
    if comm is None:
        uid = [_C.nccl_unique_id() if rank == 0 else None]
        if world > 1:
            src = dist.get_global_rank(group, 0) if group is not None else 0
            dist.broadcast_object_list(uid, src=src, group=group, device=torch.device("cpu")
                                       if dist.get_backend(group) == "gloo" else None)
        comm = _C.nccl_comm_init(uid[0], world, rank, index)
        # the group is kept with its communicator, so its id() cannot be reused meanwhile
        _COMMS[key] = (group or (dist.group.WORLD if dist.is_initialized() else None), comm)
    return comm
