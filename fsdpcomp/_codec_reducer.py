"""The chunk codecs as a Reducer: the C core plans, encodes, decodes, keeps every residual (the
reduce-scatter's and the all-gather half's) and counts; its Exchange moves the payloads, and its
ShardGather does an all-reduce's all-gather half."""
from __future__ import annotations

from typing import Any, Mapping

import torch

from . import _C, _agree
from ._alloc import allocate
from ._config import gather_default
from ._dist import Ranks
from ._layout import Layout
from ._reducer import Reducer


class CodecReducer(Reducer):
    """A method of the C method table (see the module docstring)."""

    def __init__(self, method: str, config: Mapping[str, Any]):
        self.name = method
        super().__init__(_C.State(method, gather_default(config), allocate), config, {})

    def signature(self, grad: torch.Tensor, ranks: Ranks, layout: Layout | None) -> tuple:
        return self.exchange.signature(grad, ranks.world, ranks.rank)

    def reduce_scatter(self, grad, output, unit: int, ranks: Ranks, step: int, layout: Layout | None) -> None:
        try:
            self.exchange.reduce_scatter(grad, output, unit, ranks)
        except _C.PayloadError as e:
            raise _agree.explain(e) from None
        self.exchange.sync(unit, ranks, grad.device)

    def all_reduce(self, grad, unit: int, ranks: Ranks, step: int, layout: Layout | None) -> None:
        """The compressed reduce-scatter, then the all-gather of the reduced shards."""
        n = grad.numel()
        reduced = self.exchange.buffers.like("shard", -(-n // ranks.world), grad)
        self.reduce_scatter(grad, reduced, unit, ranks, step, layout)
        if ranks.world == 1:
            grad.copy_(reduced[:n])
            return
        self.all_gather(reduced, grad, unit, ranks)

    def _count(self, c: dict[str, Any]) -> None:
        # the codecs compress from the first call: only a method with a warm-up has exact steps
        c.update(warmup_calls_exact=0, warmup_steps_exact=0)
