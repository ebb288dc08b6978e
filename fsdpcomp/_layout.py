"""Layout: where the matrices lie in a call's flat gradient. Each integration describes its
parameters with one (CommState.takes_layout says whether the state's reducer reads it); a
reducer that compresses matrices as matrices (low-rank factors) needs it, the chunk codecs
ignore it."""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """Where the matrices lie in a call's flat gradient: ``blocks`` equal blocks (FSDP2's
    reduce-scatter input: one per rank, each holding every parameter's padded dim-0 shard; 1
    otherwise), and in each block, per parameter, (offset, rows, cols): a matrix is its blocks'
    pieces stacked, (blocks * rows) x cols. Elements outside every piece are summed exactly."""
    blocks: int
    pieces: tuple[tuple[int, int, int], ...]

    @staticmethod
    def of_shapes(shapes, blocks: int = 1) -> "Layout":
        """Tensors of these shapes laid back to back in each block; 1-D and 0-D ones go exactly."""
        pieces, at = [], 0
        for shape in shapes:
            shape = tuple(shape)
            numel = math.prod(shape)
            if len(shape) >= 2:
                pieces.append((at, shape[0], numel // shape[0] if shape[0] else 0))
            at += numel
        return Layout(blocks, tuple(pieces))
