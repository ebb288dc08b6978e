"""The checkpoint format of a CommState (format 3): what is the same on every rank at the top,
each rank's own state (residuals, unit states) under a key naming the rank, so that
torch.distributed.checkpoint (DCP) and a plain torch.save per rank both give every rank its own
back, and a load that does not fit is refused by name before anything changes.

    {"format": 3, "method": "int8", "config": '{"block_size": 256, ...}' (JSON),
     "world_size": 2, "step": 10, "rank1": RankState(...)}

Format 3 keeps every residual in one field, RankState.residuals, by the C State's slots (each a
list, one entry per unit); format 2 kept the all-gather half's in `gather_residuals` and
PowerSGD's error in its method_state, and still loads (from_format2 moves them).

Why this shape (docs/decisions.md has the longer story): DCP writes a value whose key is the
same on every rank once (one rank's), and reads it into every rank; it needs the shape of every
tensor it loads before it reads, which a fresh CommState cannot know (its units come with the
first backward). A key naming the rank makes each rank write its own; a RankState, which is not
a dict or a list, is one opaque object to DCP (pickled whole), so no shapes are needed at load.
The config is a JSON string for the same reason: a dict would be split key by key and a
checkpoint of another method would fail in DCP, not here with its name."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

import torch

from . import _C
from ._dist import Ranks

FORMAT = 3  # 2: residuals in three fields; 1: the flat dict of fsdpcomp 0.1 (no "format" key, no rank)
SLOTS = ("scatter", "gather", "factors")  # the C State's residual slots (csrc/python/state.h)
DROP_HINT = ("to resume at another world size, or from another rank's state, drop the "
             "residuals on purpose: state.load_state_dict(sd, residuals=\"drop\"), or "
             "dcp.load({..., \"fsdpcomp\": state.without_residuals()})")


@dataclass
class RankState:
    """One rank's part of a CommState checkpoint: its unit table (each unit's size and key, the
    keys claimed in the open step), its residuals (slot -> one entry per unit: the
    reduce-scatter's, the all-gather half's, PowerSGD's error), the units' method state
    (gradiveq's basis), and method_state: a method's own extra state keyed by the method's
    name, each a dict with its own "version" (PowerSGD's Q)."""
    units: list
    unit_keys: list
    open_keys: list
    residuals: dict
    unit_states: list | None
    method_state: dict = field(default_factory=dict)


# torch.load's default (weights_only=True) reads a checkpoint holding a RankState
if hasattr(torch.serialization, "add_safe_globals"):
    torch.serialization.add_safe_globals([RankState])


@dataclass(frozen=True)
class Saved:
    """A checked checkpoint: its step, and this rank's part (None: residuals dropped)."""
    step: int
    rank_state: RankState | None


def process_rank() -> tuple[int, int]:
    """(rank, world size) of this process in the default group: the keys DCP's writers share."""
    ranks = Ranks.of(None)
    return ranks.rank, ranks.world


def rank_key(rank: int) -> str:
    return f"rank{rank}"


def shared(method: str, config: Mapping[str, Any], step: int) -> dict[str, Any]:
    """The part every rank saves alike."""
    return {"format": FORMAT, "method": method, "config": json.dumps(dict(config), sort_keys=True),
            "world_size": process_rank()[1], "step": step}


def pack(method: str, config: Mapping[str, Any], step: int, mine: RankState) -> dict[str, Any]:
    return {**shared(method, config, step), rank_key(process_rank()[0]): mine}


def unpack(sd: Any, method: str, config: Mapping[str, Any], residuals: str) -> Saved:
    """The checks of the top level, in the order a user fixes them: the format, the method and
    config, then (residuals "keep") the world size and this rank's part."""
    if residuals not in ("keep", "drop"):
        raise ValueError(f"residuals must be \"keep\" or \"drop\", got {residuals!r}")
    if not isinstance(sd, Mapping):
        raise TypeError(f"a CommState state_dict must be a dict, got {type(sd).__name__}")
    for key in ("method", "config", "step"):
        if key not in sd:
            raise ValueError(f"fsdpcomp state_dict is missing '{key}'")
    fmt = sd.get("format", 1)
    if fmt not in (1, 2, FORMAT):
        raise ValueError(f"fsdpcomp state_dict has format {fmt!r}; this fsdpcomp reads format {FORMAT}")
    if sd["method"] != method:
        raise ValueError(f"state_dict is for method '{sd['method']}', this state is '{method}'")
    # a key removed since it was saved (transport, timeout_s) never changed what the residuals
    # mean: a checkpoint that still lists it loads as before; a common key added since
    # (ef_decay, 2026-11-28) is absent from it, and at its default it is what the saving run did
    saved_config = {k: v for k, v in _config_of(sd["config"]).items() if k not in _C.REMOVED_KEYS}
    for key in _C.method_info(""):
        name = key["name"]
        if name not in saved_config and name in config and config[name] == key["default"]:
            saved_config[name] = config[name]
    if saved_config != dict(config):
        diff = {k: (saved_config.get(k), config.get(k)) for k in sorted(set(saved_config) | set(config))
                if saved_config.get(k) != config.get(k)}
        raise ValueError(f"state_dict config differs from this state's in {diff} (saved, this)")
    step = sd["step"]
    step = int(step) if isinstance(step, (int, torch.Tensor)) else step  # the core names a bad one
    if residuals == "drop":
        return Saved(step, None)
    if fmt == 1:
        raise ValueError("this fsdpcomp state_dict has no 'format' key: it was written by fsdpcomp "
                         "0.1, which did not record which rank saved it, so its residuals cannot be "
                         f"checked against this rank; {DROP_HINT}")
    rank, world = process_rank()
    if sd.get("world_size") != world:
        raise ValueError(f"state_dict was saved at world size {sd.get('world_size')!r}, this run has "
                         f"{world} ranks: residuals are per rank; {DROP_HINT}")
    mine = sd.get(rank_key(rank))
    if mine is None:
        held = sorted(k for k in sd if isinstance(k, str) and k.startswith("rank") and k[4:].isdigit())
        raise ValueError(f"state_dict holds the state of {', '.join(held) or 'no rank'}, this is rank {rank}: "
                         "each rank loads its own (save one file per rank, or use "
                         f"torch.distributed.checkpoint); {DROP_HINT}")
    if not isinstance(mine, RankState):
        raise TypeError(f"state_dict '{rank_key(rank)}' must be a fsdpcomp RankState, got {type(mine).__name__}")
    return Saved(step, from_format2(mine, config.get("residual_dtype")) if fmt == 2 else mine)


def from_format2(mine: RankState, residual_dtype: str | None) -> RankState:
    """A format-2 RankState (the reduce-scatter's residuals a list, the all-gather half's in
    `gather_residuals`, unit -> tensor, PowerSGD's error in method_state["powersgd"]["e"] of its
    version 1) as format 3's: every residual by slot. The values are checked where format 3's
    are (the core's restore); the shapes of the old fields here, by their old names. Format 2's
    all-gather half kept fp32 where residual_dtype was "bf16"; one dtype rule now, so those are
    rounded to bf16 here (the only value a format-2 load changes)."""
    n = len(mine.units) if isinstance(mine.units, (list, tuple)) else 0

    def by_unit(table: Any, name: str) -> list:
        if not isinstance(table, Mapping):
            raise TypeError(f"state_dict '{name}' must be a dict of unit -> tensor, got {type(table).__name__}")
        out = [None] * n
        for unit, r in table.items():
            if isinstance(unit, bool) or not isinstance(unit, int) or not 0 <= unit < n:
                raise ValueError(f"state_dict '{name}' is keyed by unit (0 to {n - 1}), got {unit!r}")
            if not isinstance(r, torch.Tensor):
                raise TypeError(f"state_dict '{name}'[{unit}] must be a tensor, got {type(r).__name__}")
            out[unit] = r.to(torch.bfloat16) if residual_dtype == "bf16" and r.dtype == torch.float32 else r
        return out

    method_state = getattr(mine, "method_state", {})
    if not isinstance(method_state, Mapping):
        raise TypeError(f"state_dict RankState.method_state must be a dict, got {type(method_state).__name__}")
    method_state = dict(method_state)
    factors = [None] * n
    part = method_state.get("powersgd")
    if isinstance(part, Mapping) and part.get("version") == 1:  # its e moves to the factors slot
        factors = by_unit(part.get("e", {}), "powersgd'['e")
        method_state["powersgd"] = {"version": 2, **{k: v for k, v in part.items() if k not in ("version", "e")}}
    residuals = {"scatter": mine.residuals, "gather": by_unit(getattr(mine, "gather_residuals", {}), "gather_residuals"),
                 "factors": factors}
    return RankState(mine.units, mine.unit_keys, mine.open_keys, residuals, mine.unit_states, method_state)


def _config_of(saved: Any) -> dict[str, Any]:
    if isinstance(saved, Mapping):  # format 1
        return dict(saved)
    if isinstance(saved, str):
        try:
            out = json.loads(saved)
        except json.JSONDecodeError:
            out = None
        if isinstance(out, dict):
            return out
    raise ValueError(f"state_dict 'config' must be the config as a JSON object, got {saved!r:.200}")


def unit_fields(mine: RankState, step: int) -> dict[str, Any]:
    """This rank's unit table as UnitTable.check reads it."""
    names = ("units", "unit_keys", "open_keys", "residuals", "unit_states")
    return {"step": step, **{n: getattr(mine, n) for n in names}}


def check_same_units(keys: tuple, sizes: list, mine: RankState) -> None:
    """A state that has run already knows its units: a checkpoint of other units (another
    model, another sharding) is refused by name. Units by key where they have one, else by
    place; a unit on only one side is fine (units that sat out, or come later)."""
    saved = {(k if k is not None else ("#", u)): n for u, (k, n) in enumerate(zip(mine.unit_keys, mine.units))}
    for u, (k, n) in enumerate(zip(keys, sizes)):
        name = k if k is not None else ("#", u)
        if name in saved and saved[name] != n:
            what = f"unit {k!r}" if k is not None else f"unit {u} (call order)"
            raise ValueError(f"state_dict {what} has {saved[name]} elements, this state's has {n}: "
                             "a checkpoint of other units (another model or sharding)")


def check_rank_state(mine: RankState, own_method: str | None = None) -> None:
    """Fields of the right kinds; the values are checked by UnitTable.check and the core (and
    own_method's entry of method_state by that method)."""
    kinds = {"residuals": (dict,), "method_state": (dict,), "unit_states": (list, type(None))}
    for f in fields(RankState):
        value, want = getattr(mine, f.name, None), kinds.get(f.name, (list,))
        if not isinstance(value, want):
            raise TypeError(f"state_dict RankState.{f.name} must be a {' or '.join(k.__name__ for k in want)}, "
                            f"got {type(value).__name__}")
    if set(mine.method_state) - {own_method}:
        raise ValueError(f"state_dict holds method state for {sorted(mine.method_state)}, which this "
                         "fsdpcomp does not know")


class WithoutResiduals:
    """A DCP Stateful view of a CommState that reads a checkpoint's method, config and step
    and starts the residuals afresh (CommState.without_residuals)."""

    def __init__(self, state):
        self._state = state

    def state_dict(self) -> dict[str, Any]:
        return shared(self._state.method, self._state.config, self._state.step)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self._state.load_state_dict(state_dict, residuals="drop")
