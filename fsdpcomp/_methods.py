"""The compressor names, one list for every place that shows them (fsdpcomp.methods(),
--comm_compress's choices, the unknown-method ValueError): the C method table's chunk codecs,
then powersgd, which is not a codec (two all-reduces of factors, _powersgd.py) and so is in no
table the C side could list."""
from __future__ import annotations

from . import _C, _powersgd


def names() -> list[str]:
    return list(_C.methods()) + [_powersgd.NAME]


def check(name: str) -> None:
    """ValueError listing every name, for a name that is none of them."""
    valid = names()
    if name not in valid:
        # "int8\0" reads as int8 where text ends at the first NUL (C, logs): say why it is not
        nul = " (it contains an embedded NUL character)" if "\0" in name else ""
        raise ValueError(f"unknown compression method {name!r}{nul}; valid methods: {', '.join(map(repr, valid))}")
