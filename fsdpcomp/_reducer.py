"""The Reducer protocol: what a CommState delegates to, so what every integration reaches through
it: the reduce-scatter, both halves of an all-reduce, the parameter gathers, the handshake's
signature, the counters and this rank's part of a checkpoint. Two implementations: the chunk
codecs (_codec_reducer.py: the C core plus the Exchange) and PowerSGD (_powersgd.py);
_methods.py maps a method's name to one, the only place that does.

What every reducer shares is here: a C core that keeps the units, the step and the counters (a
reducer that is not a codec drives a `none` core), an Exchange of it (counted collectives,
buffers, the all-gather half), the parameter gathers and the handshake. CommState claims the
unit and checks the tensors before any of these methods runs."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Mapping

import torch

from . import _agree
from ._dist import Ranks
from ._exchange import Exchange, Wire
from ._layout import Layout
from ._param_gather import ParamGather


class Reducer(ABC):
    """One method's collectives and the state they keep (see the module docstring)."""

    name: str  # the method, as counters, results lines and checkpoints name it
    takes_layout: bool = False  # whether a call's Layout (its matrices) changes what it sends
    method_state_key: str | None = None  # its entry in RankState.method_state, if it keeps one

    def __init__(self, core, given: Mapping[str, Any], own_keys: Mapping[str, Any]):
        """core: the C state of units, step and counters; given: the config as the user gave it;
        own_keys: the resolved keys the core does not hold (a method that is not its codec)."""
        self.core = core
        self.own_keys = dict(own_keys)
        self.exchange = Exchange(core, Wire.of(core, given))
        self.param_gather = ParamGather(core, self.exchange.buffers)
        self.handshake = _agree.Handshake(core, self.name, self.own_keys)

    @property
    def config(self) -> dict[str, Any]:
        """The resolved config, defaults included."""
        return {**self.core.config, **self.own_keys}

    # ---- the collectives: the unit is claimed and the tensors checked

    @abstractmethod
    def reduce_scatter(self, grad: torch.Tensor, output: torch.Tensor, unit: int, ranks: Ranks,
                       step: int, layout: Layout | None) -> None:
        """output (fp32 or grad's dtype) = this rank's chunk of the mean over ranks of grad."""

    def all_gather(self, reduced: torch.Tensor, grad: torch.Tensor, unit: int, ranks: Ranks) -> None:
        """The second half of an all-reduce: grad = every rank's reduced shard (reduced: this
        rank's), compressed where that pays (_shard_gather.py)."""
        self.exchange.shard_gather(reduced, grad, unit, ranks)

    @abstractmethod
    def all_reduce(self, grad: torch.Tensor, unit: int, ranks: Ranks, step: int,
                   layout: Layout | None) -> None:
        """grad = the mean over ranks of grad, in place."""

    def gather_params(self, output: torch.Tensor, shard: torch.Tensor, ranks: Ranks, unit: int,
                      segments: tuple[int, ...], async_op: bool):
        """FSDP2's parameter all-gather through the ``param_gather`` codec (_param_gather.py),
        after the handshake of its first gather of a shape."""
        self.handshake.before_param_gather(ranks.group, shard, ranks.world)
        return self.param_gather(output, shard, ranks, unit, segments, async_op)

    # ---- the handshake (_agree.py)

    @abstractmethod
    def signature(self, grad: torch.Tensor, ranks: Ranks, layout: Layout | None) -> tuple:
        """What the exchange of this shape looks like from this rank."""

    def detail(self, grad: torch.Tensor, layout: Layout | None) -> dict[str, Any]:
        """More of the handshake's description than the config (e.g. which matrices)."""
        return {}

    def agree(self, grad: torch.Tensor, ranks: Ranks, layout: Layout | None) -> None:
        """The handshake before the first reduction of this shape on this group."""
        self.handshake.before_reduce(ranks.group, grad, ranks.world,
                                     lambda: self.signature(grad, ranks, layout),
                                     lambda: self.detail(grad, layout))

    # ---- counters

    def counters(self) -> dict[str, Any]:
        """The core's counters with the reducer's own merged in, and the buffers' bytes: a
        rank's memory, every part of it this reducer holds."""
        c = self.core.counters()
        self._count(c)
        buffers = self.exchange.buffers
        c.update(buffer_bytes=buffers.held_bytes, buffer_peak_bytes=buffers.peak_bytes)
        return c

    @abstractmethod
    def _count(self, c: dict[str, Any]) -> None:
        """Merges what this reducer counts beyond the core into c (residual_bytes: every home)."""

    def reset_counters(self) -> None:
        self.core.reset_counters()
        self.exchange.buffers.reset_peak()

    # ---- checkpoints: the RankState field beyond the unit table and the residuals, which the
    # core keeps for every method (_checkpoint.py): a method's own state (PowerSGD's Q)

    def state_dict(self) -> dict[str, Any]:
        """{"method_state": ...}, cloned: none for a codec (its state is the core's)."""
        return {"method_state": {}}

    def check(self, mine, units: list[int]) -> Any:
        """RankState.method_state's entry of this reducer (units: each unit's elements, checked),
        checked and copied, for restore()."""
        return None

    def restore(self, checked: Any | None) -> None:
        """Takes check()'s result; None starts the method state afresh."""
