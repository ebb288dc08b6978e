"""The CUDA code a shared library carries, read from its bytes: no cuobjdump needed (the toolkit
install of the build machine has none). Used by tests/tools/test_wheel.py (the wheel's archs)
and tests/gpu/prepare.py (a carried library against the GPU it is to run on)."""
from __future__ import annotations

import struct


def fatbin_entries(path: str) -> set[tuple[str, int]]:
    """{(kind, sm)} of the CUDA fat binaries in a library, kind "elf" (a cubin) or "ptx": what
    `cuobjdump --list-elf/--list-ptx` lists (this toolkit install has no cuobjdump). A fat binary
    is a 16-byte header (magic 0xBA55ED50, version 1, header size, size) and entries, each a
    header (kind 1 PTX / 2 ELF, header size, payload size, the SM number at byte 28) and payload;
    nvcc puts one per .cu file (and nvlink one) in the .nv_fatbin section."""
    with open(path, "rb") as f:
        data = f.read()
    found, pos = set(), 0
    magic = struct.pack("<I", 0xBA55ED50)
    while (i := data.find(magic, pos)) >= 0:
        version, hsize, size = struct.unpack_from("<HHQ", data, i + 4)
        pos = i + 4
        if version != 1 or hsize != 16:
            continue
        p, end = i + hsize, i + hsize + size
        while p < end:
            kind, _, ehsize, psize = struct.unpack_from("<HHIQ", data, p)
            found.add(({1: "ptx", 2: "elf"}.get(kind, str(kind)), struct.unpack_from("<I", data, p + 28)[0]))
            p += ehsize + psize
        pos = end
    return found
