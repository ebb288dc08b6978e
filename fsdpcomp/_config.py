"""Config input handling: a dict, a JSON string or None, normalised to a dict for the C parser."""
from __future__ import annotations

import json
from typing import Any, Mapping


def normalize_config(config: Mapping[str, Any] | str | None) -> dict[str, Any]:
    """Returns a plain dict; the C side checks every key and value."""
    if config is None:
        return {}
    if isinstance(config, str):
        text = config.strip()
        if not text:
            return {}
        try:
            config = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"comm config is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}): {text!r}") from None
        except RecursionError:
            # json's decoder recurses once per level; a config is one flat object
            raise ValueError(f"comm config is nested too deeply to be a config (one flat JSON "
                             f"object of keys): {text[:40]!r}...") from None
    if not isinstance(config, Mapping):
        raise ValueError(f"comm config must be a JSON object / dict, got {type(config).__name__}")
    return dict(config)


def gather_default(config: dict[str, Any]) -> dict[str, Any]:
    """The config with `allgather_compress` resolved where its default cannot hold, the one home
    of that rule: a unit with a second round (sketch's `second_round`) is decoded from all
    payloads together, never from one alone, so its all-reduce's all-gather half goes
    uncompressed; asked for by name with it, the pair is refused (ValueError)."""
    if config.get("second_round") is not True:
        return config
    if "allgather_compress" not in config:
        return dict(config, allgather_compress=False)
    if config["allgather_compress"] is True:
        raise ValueError("config key 'allgather_compress' cannot be combined with 'second_round': the "
                         "compressed all-gather decodes single payloads")
    return config
