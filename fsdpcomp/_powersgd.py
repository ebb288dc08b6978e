"""PowerSGD as a Reducer: its keys (described and validated as the codecs' are: _keys.py), a
`none` core for its units, step and counters, its exact warm-up through that core's exchange
(a reduce-scatter sends half the bytes of the all-reduce its factors would need), and its
factors (_powersgd_factors.py) after it. Not a chunk codec (two collectives with arithmetic
between them), so it is no entry of the C method table (docs/decisions.md, "PowerSGD in
Python")."""
from __future__ import annotations

from typing import Any, Mapping

import torch

from . import _C, _agree, _checkpoint, _keys
from ._alloc import allocate
from ._config import gather_default
from ._dist import Ranks
from ._layout import Layout
from ._powersgd_factors import Config, Factors
from ._reducer import Reducer

NAME = "powersgd"
# RankState.method_state["powersgd"]'s layout: 2 holds Q (e went to the core's residuals with
# checkpoint format 3); 1 (format 2) held e too, and _checkpoint's format-2 reader moves it
STATE_VERSION = 2

# The method's own keys, in method_info's format (csrc/python/fc_config.c's tables for the codecs).
KEYS = [
    {"name": "rank", "type": "int", "default": 4, "min": 1.0, "max": 4096.0, "power_of_two": False,
     "choices": None, "rank_local": False, "doc": "rank r of the factors P (n x r) and Q (m x r)"},
    {"name": "start_iter", "type": "int", "default": 10, "min": 0.0, "max": 9007199254740991.0,
     "power_of_two": False, "choices": None, "rank_local": False,
     "doc": "steps (backward passes) reduced exactly before compression starts"},
    {"name": "min_compression_rate", "type": "float", "default": 2.0, "min": 1.0, "max": 1e9,
     "power_of_two": False, "choices": None, "rank_local": False,
     "doc": "a matrix is compressed only where n*m >= this times (n+m)*rank; others go exactly"},
    {"name": "factor_dtype", "type": "choice", "default": "fp32", "min": 0.0, "max": 0.0,
     "power_of_two": False, "choices": ["fp32", "bf16"], "rank_local": False,
     "doc": "dtype of both all-reduces on the wire (bf16: half the bytes; the uncompressed "
            "elements then carry bf16 rounding too); the arithmetic stays fp32"},
]
# Common keys that mean nothing to two all-reduces of factors are accepted and ignored (a config
# shared with other methods stays valid); a removed one is refused, as the codecs refuse it.


def info() -> dict[str, Any]:
    """method_info('powersgd'), in the codecs' format."""
    return {"name": NAME, "id": None, "summary": "rank-r factors P, Q of each matrix, two all-reduces "
            "per unit, warm-started Q and error feedback; vectors exact; the first start_iter steps exact "
            "(warm-up: counters' warmup_steps_exact)", "unbiased": False,
            "linear": False, "random": False, "varsize": False, "error_feedback_default": True,
            "keys": [dict(k) for k in KEYS], "aliases": []}  # num_bits names no width here


def _core(config: Mapping[str, Any]) -> "_C.State":
    """The `none` core of the common keys, which it checks (named for powersgd); error_feedback
    is PowerSGD's own (the `none` core keeps no residual)."""
    own = {k["name"] for k in KEYS} | {"error_feedback"}
    try:
        return _C.State("none", gather_default({k: v for k, v in config.items() if k not in own}), allocate)
    except ValueError as e:
        raise ValueError(str(e).replace("none config key", f"{NAME} config key")) from None


class PowerSGDReducer(Reducer):
    """PowerSGD (see the module docstring); its residual e lives in its core's "factors" slot."""

    name = NAME
    takes_layout = True  # the matrices it factors
    method_state_key = NAME

    def __init__(self, method: str, config: Mapping[str, Any]):
        common = _C.method_info("")
        _keys.refuse_unknown(NAME, config, KEYS, common)
        own = _keys.resolve(NAME, config, KEYS)
        ef_spec = next(k for k in common if k["name"] == "error_feedback")
        ef = _keys.check(NAME, ef_spec, config.get("error_feedback", True))
        core = _core(config)
        super().__init__(core, config, dict(own, error_feedback=ef))
        c = core.config
        cfg = Config(own["rank"], own["start_iter"], own["min_compression_rate"], ef, own["factor_dtype"] == "bf16")
        self.factors = Factors(cfg, c["seed"], c["error_stats_every"], core)

    def signature(self, grad: torch.Tensor, ranks: Ranks, layout: Layout | None) -> tuple:
        return (NAME, *self.factors.signature(layout, grad.numel()))

    def detail(self, grad: torch.Tensor, layout: Layout | None) -> dict[str, Any]:
        return {"matrices": repr(self.factors.signature(layout, grad.numel())[-2:])}

    def reduce_scatter(self, grad, output, unit: int, ranks: Ranks, step: int, layout: Layout | None) -> None:
        if not self.factors.warming(step):
            self.factors.reduce(grad, output, unit, ranks, layout, step, True, self.exchange.timed)
            return
        self.factors.count_exact(step)  # calls and elements: the core's
        try:
            self.exchange.reduce_scatter(grad, output, unit, ranks)
        except _C.PayloadError as e:
            raise _agree.explain(e) from None

    def all_reduce(self, grad, unit: int, ranks: Ranks, step: int, layout: Layout | None) -> None:
        """Its two all-reduces (one, exact, in the warm-up)."""
        self.factors.reduce(grad, grad, unit, ranks, layout, step, False, self.exchange.timed)

    def _count(self, c: dict[str, Any]) -> None:
        c["method"] = NAME
        self.factors.merge_counters(c)  # residual_bytes: the core's, its e's included

    def reset_counters(self) -> None:
        super().reset_counters()
        self.factors.reset_counts()

    def state_dict(self) -> dict[str, Any]:
        """method_state {"powersgd": {"version": 2, "q": unit -> [Q per matrix]}} (e: the core's
        residuals, slot "factors")."""
        return {"method_state": {NAME: {"version": STATE_VERSION, **self.factors.state_dict()}}}

    def check(self, mine: "_checkpoint.RankState", units: list[int]) -> dict:
        return Factors.check(_own_part(mine.method_state), len(units))

    def restore(self, checked: dict | None) -> None:
        self.factors.restore(checked or {})  # residuals="drop": Q afresh too


def _own_part(method_state: Mapping[str, Any]) -> Any:
    """RankState.method_state's powersgd entry for Factors.check: a checkpoint without one (saved
    before its first call) restores none; another version is refused."""
    part = method_state.get(NAME)
    if part is None:
        return {"q": {}}
    version = part.get("version") if isinstance(part, Mapping) else None
    if version != STATE_VERSION:
        raise ValueError(f"state_dict powersgd state has version {version!r}, this fsdpcomp reads "
                         f"version {STATE_VERSION}")
    return {k: v for k, v in part.items() if k != "version"}
