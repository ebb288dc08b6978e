# Per-rank bytes computed from a model's FSDP2 units: parameters, gradients, AdamW state, the error-feedback residual in each dtype, and fsdpcomp's buffers.
"""What mem_bench.py computes for any world size W, and what its measured rows are checked
against. A model is its FSDP2 units (every transformer block, and the root with the rest), each
a list of parameter shapes. FSDP2 shards every parameter on dim 0, padded to a multiple of W;
rank 0 holds the largest shard, so the numbers are rank 0's (the largest):

- parameters and gradients: 4 B per element of the padded shard (fp32); the gradients are the
  reduce-scatter's output, one padded shard per unit.
- AdamW: exp_avg and exp_avg_sq, 4 B each per element of the shard, and a 4-byte step each.
- the residual: the reduce-scatter's error feedback keeps, on every rank, the unit's whole
  (padded, unsharded) gradient in the residual dtype: fp32 4 B, bf16 2 B, int8 1 B plus one fp32
  scale per block of 64 (1 + 4/64 B). It does not divide by W.
- fsdpcomp's buffers: one send and one receive buffer, each grown to the largest unit's payloads
  to the W - 1 other ranks (the own chunk is not compressed), sized by the method's codec
  (`payload_bytes`).
- plain FSDP2: 16/W B per parameter (fp32 parameters, gradients, AdamW m and v)."""
from __future__ import annotations

import math

RESIDUAL_BYTES = {"none": 0.0, "fp32": 4.0, "bf16": 2.0, "int8": 1.0 + 4.0 / 64}

# LLaMA-2-7B (hidden 4096, MLP 11008, 32 layers, 32000-token vocabulary, untied head): the 7B
# model the memory table is computed for. Per block: q, k, v, o, gate, up, down, two RMSNorms.
_LLAMA_BLOCK = [(4096, 4096)] * 4 + [(11008, 4096)] * 2 + [(4096, 11008), (4096,), (4096,)]
LLAMA_7B = [_LLAMA_BLOCK] * 32 + [[(32000, 4096), (32000, 4096), (4096,)]]


def gpt2_units(preset: str) -> list[list[tuple[int, ...]]]:
    """examples/gpt.py's model as FSDP2 units: its blocks, then the root (built on the meta
    device: shapes only)."""
    import torch
    import gpt
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    with torch.device("meta"):
        model = gpt.make_model(gpt.make_config(preset))
    blocks = [m for m in model.modules() if isinstance(m, GPT2Block)]
    inner = {id(p) for b in blocks for p in b.parameters()}
    units = [[tuple(p.shape) for p in b.parameters()] for b in blocks]
    return units + [[tuple(p.shape) for p in model.parameters() if id(p) not in inner]]


def units_of(model: str) -> list[list[tuple[int, ...]]]:
    return LLAMA_7B if model == "llama-7b" else gpt2_units(model)


def _shard(shape: tuple[int, ...], world: int) -> int:
    """Elements of rank 0's shard of one parameter (dim 0 split in ceil(dim0 / W) rows)."""
    rest = math.prod(shape[1:])
    return -(-shape[0] // world) * rest


def n_params(units) -> int:
    return sum(math.prod(s) for u in units for s in u)


def per_rank(units, world: int, payload_bytes=None) -> dict[str, float]:
    """Rank 0's bytes: params, grads, optimizer, the residual per dtype (residual_<dtype>), and
    buffers when payload_bytes (a codec's bytes for a chunk of n elements) is given."""
    shards = [sum(_shard(s, world) for s in u) for u in units]
    tensors = sum(len(u) for u in units)
    out = {"params": 4.0 * sum(shards), "grads": 4.0 * sum(shards), "optimizer": 8.0 * sum(shards) + 4.0 * tensors}
    for dtype, b in RESIDUAL_BYTES.items():
        out["residual_" + dtype] = b * world * sum(shards)  # each unit's padded gradient: W shards
    if payload_bytes is not None:  # the buffers only grow: the largest unit sizes them
        out["buffers"] = 2.0 * (world - 1) * payload_bytes(max(shards)) if world > 1 else 0.0
    return out


def largest_shard(units, world: int) -> int:
    """Elements of rank 0's shard of the largest unit."""
    return max(sum(_shard(s, world) for s in u) for u in units)


def plain_fsdp2(n: int, world: int) -> float:
    """Plain FSDP2's per-rank bytes without padding: fp32 params, grads, AdamW m and v."""
    return 16.0 * n / world
