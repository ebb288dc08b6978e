"""The compressor names and the Reducer behind each, one registry for every place that shows
them (fsdpcomp.methods(), --comm_compress's choices, the unknown-method ValueError) and for
CommState, which asks it for its reducer: the C method table's chunk codecs, then the reducers
that are no codec (powersgd: two all-reduces of factors, _powersgd.py), which no table the C
side could list holds."""
from __future__ import annotations

from typing import Any, Mapping

from . import _C, _adaptive, _powersgd
from ._codec_reducer import CodecReducer
from ._reducer import Reducer

# A name here is its own Reducer; every other name is a codec of the C method table. adaptive is
# both: a C codec whose parts tables its reducer chooses.
_OWN_REDUCERS = {_powersgd.NAME: _powersgd.PowerSGDReducer, _adaptive.NAME: _adaptive.AdaptiveReducer}


def names() -> list[str]:
    codecs = list(_C.methods())
    return codecs + [n for n in _OWN_REDUCERS if n not in codecs]


def check(name: str) -> None:
    """ValueError listing every name, for a name that is none of them."""
    valid = names()
    if name not in valid:
        # "int8\0" reads as int8 where text ends at the first NUL (C, logs): say why it is not
        nul = " (it contains an embedded NUL character)" if "\0" in name else ""
        near = _C.near_name(name.split("\0")[0], valid)
        hint = f" (did you mean {near!r}?)" if near and not nul else ""
        raise ValueError(f"unknown compression method {name!r}{nul}{hint}; valid methods: {', '.join(map(repr, valid))}")


def make_reducer(name: str, config: Mapping[str, Any]) -> Reducer:
    """The Reducer of method `name` with this config (a dict); ValueError naming what is wrong."""
    check(name)  # here, not in C: the C table lists only the codecs
    return _OWN_REDUCERS.get(name, CodecReducer)(name, config)
