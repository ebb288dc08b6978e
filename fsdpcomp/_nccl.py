"""The C-side NCCL communicators (``"transport": "nccl"``): one per (process group, device),
made lazily on the first CUDA call. Rank 0's ncclUniqueId reaches the others through
torch.distributed; ncclCommInitRankConfig runs in C on torch's own libnccl, non-blocking, so a
peer that never joins, or an all-to-all that never completes, aborts the communicator after the
timeout (config key ``timeout_s``, else the process group's) and raises NcclError.

End them with :func:`release_nccl` on every rank before ``destroy_process_group``: destroying an
NCCL communicator is collective, so no destructor may do it. torch has no public hook to run at
``destroy_process_group``; a communicator still alive when the interpreter exits is left to the
process's exit (never destroyed, since its peers are not destroying theirs at that moment)."""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from . import _C

_COMMS: dict[tuple, tuple] = {}


def _group_timeout(group: dist.ProcessGroup | None, device: torch.device) -> float:
    """The process group's own timeout in seconds (what its collectives wait before torch gives
    up on them), from the backend serving `device`; torch's default for the backend otherwise."""
    pg = group if group is not None else dist.group.WORLD
    try:
        # torch exposes a process group's timeout only through these private members
        timeout = pg._get_backend(device).options._timeout
    except (AttributeError, RuntimeError):
        try:
            timeout = dist.distributed_c10d._get_default_timeout(dist.get_backend(pg))
        except Exception:  # a torch without either: NCCL's default of torch
            timeout = datetime.timedelta(minutes=10)
    return float(timeout.total_seconds())


def _key(group: dist.ProcessGroup | None, index: int) -> tuple:
    if not dist.is_available() or not dist.is_initialized():
        return ("single", index)
    return (id(group if group is not None else dist.group.WORLD), index)


def comm_for(group: dist.ProcessGroup | None, device: torch.device, timeout_s: float = 0.0):
    """The communicator of `group` on `device` (created on first use, then cached).

    timeout_s: seconds before a stalled peer aborts it (0: the process group's timeout)."""
    if device.type != "cuda":
        raise ValueError(f"transport 'nccl' needs CUDA tensors, got a tensor on {device}")
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = _key(group, index)
    entry = _COMMS.get(key)
    if entry is not None and entry[0] is (group or (dist.group.WORLD if dist.is_initialized() else None)):
        return entry[1]
    if not dist.is_available() or not dist.is_initialized():
        world, rank = 1, 0
    else:
        world, rank = dist.get_world_size(group), dist.get_rank(group)
    if timeout_s <= 0:
        timeout_s = _group_timeout(group, device) if world > 1 else 0.0
    uid = [_C.nccl_unique_id() if rank == 0 else None]
    if world > 1:
        src = dist.get_global_rank(group, 0) if group is not None else 0
        dist.broadcast_object_list(uid, src=src, group=group, device=torch.device("cpu")
                                   if dist.get_backend(group) == "gloo" else None)
    comm = _C.nccl_comm_init(uid[0], world, rank, index, float(timeout_s))
    # the group is kept with its communicator, so its id() cannot be reused meanwhile
    _COMMS[key] = (group or (dist.group.WORLD if dist.is_initialized() else None), comm)
    return comm


def release_nccl(group: dist.ProcessGroup | None = None) -> int:
    """Ends fsdpcomp's NCCL communicators of `group` (None: every one this process made).

    Collective: every rank of the group calls it, after the last training step and before
    ``torch.distributed.destroy_process_group``. Waits for their queued all-to-alls, then
    ncclCommFinalize and ncclCommDestroy; raises NcclError (after aborting the communicator)
    when a peer does not take part within the timeout. Returns how many were released. A later
    call with ``"transport": "nccl"`` makes a new communicator."""
    if group is None:
        keys = list(_COMMS)
    else:
        index = id(group)
        keys = [k for k in _COMMS if k[0] == index]
    failures = []
    for key in keys:  # creation order, the same on every rank: each release is collective
        _, comm = _COMMS.pop(key)
        try:
            _C.nccl_comm_release(comm)
        except _C.NcclError as e:
            failures.append(str(e))
    if failures:
        raise _C.NcclError("release_nccl: " + "; ".join(failures))
    return len(keys)
