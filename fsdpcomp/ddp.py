"""The DDP communication hook: ``model.register_comm_hook(state, fsdpcomp.ddp_hook)`` replaces
each bucket's all-reduce by a compressed reduce-scatter and an all-gather of the reduced shards."""
# No `from __future__ import annotations`: DDP's register_comm_hook compares the hook's
# annotations with dist.GradBucket and Future[Tensor] as objects, and strings fail that check.
import weakref

import torch
import torch.distributed as dist

from .state import CommState

# Backward passes each state has seen through DDP (counted on the last bucket).
_ITERATIONS: "weakref.WeakKeyDictionary[CommState, int]" = weakref.WeakKeyDictionary()

# DDP rebuilds its buckets once, before the second forward, in the order gradients became
# ready (never when find_unused_parameters=True): residuals keyed by bucket would then mean
# other parameters. The first backward is therefore reduced uncompressed, as torch's PowerSGD
# hook also requires (start_powerSGD_iter >= 2).
_WARMUP_ITERATIONS = 1


def ddp_hook(state: CommState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Mean over ranks of the bucket's flat gradient: compressed reduce-scatter, then an
    all-gather of the reduced shards in the bucket's dtype (not compressed). Residuals are
    keyed by bucket index."""
    if not isinstance(state, CommState):
        raise TypeError(f"ddp_hook's state must be a fsdpcomp.CommState, got {type(state).__name__}")
    if not isinstance(bucket, dist.GradBucket):
        raise TypeError(f"ddp_hook's bucket must be a torch.distributed.GradBucket, got {type(bucket).__name__}")
    buf = bucket.buffer()
    if buf.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"ddp_hook: gradient bucket {bucket.index()} must be float32, bfloat16 or "
                         f"float16, got {buf.dtype}")
    iteration = _ITERATIONS.get(state, 0)
    if iteration < _WARMUP_ITERATIONS:
        _plain_mean(state, buf)
    else:
        state.all_reduce(buf, ("ddp_bucket", bucket.index()))
    if bucket.is_last():
        _ITERATIONS[state] = iteration + 1
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buf)
    return fut


def _plain_mean(state: CommState, buf: torch.Tensor) -> None:
    """The uncompressed all-reduce of a warm-up iteration (not counted: no unit, no bytes)."""
    world, _ = state._world_rank()
    if world > 1:
        dist.all_reduce(buf, group=state.process_group)
    buf.div_(world)
