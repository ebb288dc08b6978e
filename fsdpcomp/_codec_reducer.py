"""The chunk codecs as a Reducer: the C core plans, encodes, decodes, keeps the reduce-scatter's
residuals and counts; its Exchange moves the payloads, and its ShardGather does an all-reduce's
all-gather half and keeps that half's residuals."""
from __future__ import annotations

from typing import Any, Mapping

import torch

from . import _C, _agree, _checkpoint
from ._alloc import allocate
from ._config import gather_default
from ._dist import Ranks
from ._layout import Layout
from ._reducer import Reducer
from ._shard_gather import ShardGather


class CodecReducer(Reducer):
    """A method of the C method table (see the module docstring)."""

    def __init__(self, method: str, config: Mapping[str, Any]):
        self.name = method
        super().__init__(_C.State(method, gather_default(config), allocate), config, {})
        if self.exchange.wire.gather_compressed and self.core.config.get("second_round"):
            # a single payload (the all-gather stage) has no second round to fetch values with
            raise ValueError("config key 'allgather_compress' cannot be combined with "
                             "'second_round': the compressed all-gather decodes single payloads")

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
        c["residual_bytes"] += sum(t.numel() * t.element_size() for t in self.exchange.shard_gather.residuals.values())

    def state_dict(self) -> dict[str, Any]:
        return {"gather_residuals": self.exchange.shard_gather.state_dict(), "method_state": {}}

    def check(self, mine: "_checkpoint.RankState", units: list[int]) -> dict[int, torch.Tensor]:
        return ShardGather.check(self.core, mine.gather_residuals, len(units))

    def restore(self, checked: dict[int, torch.Tensor] | None) -> None:
        self.exchange.shard_gather.restore(checked or {})
