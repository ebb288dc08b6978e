"""DDP (``DistributedDataParallel``): the communication hook. ``fsdpcomp.register(ddp_model, ...)``
(or ``ddp_model.register_comm_hook(state, fsdpcomp.ddp_hook)``) replaces each bucket's all-reduce
by a compressed reduce-scatter and an all-gather of the reduced shards."""
# No `from __future__ import annotations`: DDP's register_comm_hook compares the hook's
# annotations with dist.GradBucket and Future[Tensor] as objects, and strings fail that check.
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .._dist import Ranks, settled
from .._layout import Layout
from ..state import CommState
from ._checks import check_kind, check_state, refuse_param_gather

# DDP buckets its parameters once when it is built and again, in the order their gradients
# became ready, before its second forward (unless find_unused_parameters without static_graph):
# a residual made for a bucket of the first layout would then belong to other parameters. A
# bucket of a layout that is not final is therefore reduced uncompressed (torch's PowerSGD hook
# requires start_powerSGD_iter >= 2 for the same reason), unless the state already knows the
# final buckets it holds (a resumed run): those are reduced as the final buckets they will be.

_WARMUP_ITERATIONS = 1


@dataclass
class _Backwards:
    """Backward passes a bare CommState has seen through ddp_hook (counted on the last bucket):
    without the DDP module at hand, the first one is taken for the one before the rebuild."""
    count: int = 0


class DDPHookState:
    """What ``fsdpcomp.register`` registers with a DDP module: the CommState, and the module,
    which says whether its buckets are final and names their parameters. A bucket's unit key is
    ``("ddp", names of its parameters)``, the same in every process, so a checkpoint's
    residuals find their bucket again in a fresh DDP wrapper."""

    def __init__(self, state: CommState, ddp: torch.nn.parallel.DistributedDataParallel):
        check_state(state, "DDPHookState")
        self.state = state
        self._ddp = weakref.ref(ddp)
        self._names = {id(p): name for name, p in ddp.module.named_parameters()}
        self._keys: dict[tuple[int, ...], tuple] = {}

    def key(self, bucket: dist.GradBucket) -> tuple:
        ids = tuple(id(p) for p in bucket.parameters())
        key = self._keys.get(ids)
        if key is None:
            key = self._keys[ids] = ("ddp", tuple(self._names[i] for i in ids))
        return key

    def final(self) -> bool:
        """Whether DDP's buckets are the ones it keeps (rebuilt, or never to be rebuilt)."""
        ddp = self._ddp()
        # torch's DDP says whether it rebuilt its buckets only through this member
        return (ddp is None or ddp._has_rebuilt_buckets or
                (ddp.find_unused_parameters and not ddp.static_graph))

    def reduce(self, bucket: dist.GradBucket, buf: torch.Tensor) -> None:
        state, key = self.state, self.key(bucket)
        if self.final() or key in state.unit_keys:
            state.all_reduce(buf, key, matrices=_matrices(state, bucket.gradients()))
            return
        # A first layout: the final buckets the state knows that lie inside this one go as
        # themselves (their parameters' gradients laid out in their order, their unit), so a
        # resumed run reduces what the uninterrupted one did; the rest goes uncompressed.
        where = {name: i for i, name in enumerate(key[1])}
        grads = bucket.gradients()
        done = set()
        for known in state.unit_keys:
            if isinstance(known, tuple) and known[0] == "ddp" and all(name in where for name in known[1]):
                parts = [grads[where[name]] for name in known[1]]
                flat = torch.cat([g.reshape(-1) for g in parts])
                state.all_reduce(flat, known, matrices=_matrices(state, parts))
                for g, piece in zip(parts, flat.split([g.numel() for g in parts])):
                    g.copy_(piece.view_as(g))
                done.update(known[1])
        if not done:
            _plain_mean(state, buf)
        elif len(done) < len(key[1]):
            parts = [g for name, g in zip(key[1], grads) if name not in done]
            flat = torch.cat([g.reshape(-1) for g in parts])
            _plain_mean(state, flat)
            for g, piece in zip(parts, flat.split([g.numel() for g in parts])):
                g.copy_(piece.view_as(g))

    def __repr__(self) -> str:
        return f"fsdpcomp.DDPHookState({self.state!r})"


def ddp_hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Mean over ranks of the bucket's flat gradient: compressed reduce-scatter, then an
    all-gather of the reduced shards in the bucket's dtype (or compressed: allgather_compress).
    state: the ``DDPHookState`` that ``fsdpcomp.register`` registers (units keyed by the
    bucket's parameters), or a bare CommState (units keyed by bucket index, the first backward
    of each process uncompressed). TypeError for a state or bucket of the wrong kind or a
    bucket of another dtype than float32/bfloat16/float16; the rest as CommState's."""
    if not isinstance(state, DDPHookState):
        check_state(state, "ddp_hook")
    if not isinstance(bucket, dist.GradBucket):
        raise TypeError(f"ddp_hook's bucket must be a torch.distributed.GradBucket, got {type(bucket).__name__}")
    buf = bucket.buffer()
    check_kind(buf, f"ddp_hook: gradient bucket {bucket.index()}")
    if isinstance(state, DDPHookState):
        state.reduce(bucket, buf)
    else:
        backwards = state.hook_memo("ddp backward passes", _Backwards)
        if backwards.count < _WARMUP_ITERATIONS:
            _plain_mean(state, buf)
        else:
            state.all_reduce(buf, ("ddp_bucket", bucket.index()), matrices=_matrices(state, bucket.gradients()))
        if bucket.is_last():
            backwards.count += 1
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buf)
    return fut


def _matrices(state: CommState, grads: list[torch.Tensor]) -> Layout | None:
    """The bucket's parameters, back to back in its flat buffer (the matrices of a state that
    takes a layout; the codecs take none)."""
    return Layout.of_shapes(g.shape for g in grads) if state.takes_layout else None


def _plain_mean(state: CommState, buf: torch.Tensor) -> None:
    """The uncompressed all-reduce of a bucket whose layout is not final (not counted: no unit,
    no bytes)."""
    world = Ranks.of(state.process_group).world
    if world > 1:
        settled(lambda b: dist.all_reduce(b, group=state.process_group), buf)
    buf.div_(world)


def register_ddp(ddp: torch.nn.parallel.DistributedDataParallel, state: CommState) -> None:
    """``register_comm_hook`` with :func:`ddp_hook` and a :class:`DDPHookState`: buckets keyed by
    their parameters. ValueError for a ``param_gather`` other than "none" (DDP has no
    parameter all-gather)."""
    refuse_param_gather(state, "DistributedDataParallel")
    if state.process_group is None:
        state.process_group = ddp.process_group
    ddp.register_comm_hook(DDPHookState(state, ddp), ddp_hook)
