"""One key schema, one validation: a method's config keys are described in method_info's format
(name, type, default, min, max, choices: the C method tables' format, csrc/python/fc_config.c), and a
reducer whose keys the C tables do not hold validates them here, against that description, with
the C parser's wording. The common keys stay the C core's to check."""
from __future__ import annotations

import math
from typing import Any, Mapping

from . import _C


def refuse_unknown(method: str, config: Mapping[str, Any], own: list[dict], common: list[dict]) -> None:
    """ValueError for a removed key (saying why) or one that is neither the method's nor common."""
    valid = [k["name"] for k in own] + [k["name"] for k in common if k["name"] not in {o["name"] for o in own}]
    for key in config:
        if key in _C.REMOVED_KEYS:
            raise ValueError(_C.REMOVED_KEYS[key])
        if key not in valid:
            near = _C.near_name(key, valid) if isinstance(key, str) and "\0" not in key else None
            hint = f" (did you mean {near!r}?)" if near else ""
            raise ValueError(f"unknown config key {key!r} for method {method!r}{hint}; valid keys: {', '.join(valid)}")


def resolve(method: str, config: Mapping[str, Any], own: list[dict]) -> dict[str, Any]:
    """The `own` keys' values (defaults filled in), each checked against its description."""
    return {spec["name"]: check(method, spec, config.get(spec["name"], spec["default"])) for spec in own}


def check(method: str, spec: Mapping[str, Any], value: Any) -> Any:
    """One value against its key's description: the value (an int float as a float), or
    ValueError naming the key, as the C parser words it."""
    name, kind = spec["name"], spec["type"]
    where = f"{method} config key '{name}'"
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"{where} must be true or false, got {type(value).__name__}")
        return value
    if kind == "choice":
        if value not in spec["choices"]:
            raise ValueError(f"{where} must be one of {', '.join(map(repr, spec['choices']))}, got {value!r}")
        return value
    if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{where} must be an integer, got {type(value).__name__}")
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where} must be a number, got {type(value).__name__}")
        value = float(value)
    if not (math.isfinite(value) and spec["min"] <= value <= spec["max"]):
        raise ValueError(f"{where} must be in [{spec['min']:g}, {spec['max']:g}], got {value}")
    return value
