"""The parameter all-gather's codec: the C method named by the config key ``param_gather``."""
from __future__ import annotations

from typing import Any, Mapping

from . import _C


def make_param_codec(config: Mapping[str, Any]) -> "_C.State | None":
    """A C state of the method ``config["param_gather"]`` names (None for "none"), with nearest
    rounding and the ``param_gather_block_size`` scales. Only its compress/decompress are used:
    its step and units never move, so every gather of every step is encoded the same way."""
    name = config["param_gather"]
    if name == "none":
        return None
    return _C.State(name, {} if name == "bf16" else {"block_size": config["param_gather_block_size"]})
