"""FSDP2's parameter all-gather on the wire, with the codec the config key ``param_gather`` names
(the C method of that name, nearest rounding). Each rank encodes its own shard once per gather,
one all-gather moves the fixed-size payloads, and every rank, the owner included, decodes all of
them into FSDP's unsharded buffer: every rank computes with the same weights, and the forward
gather and the backward re-gather of a step yield the same bits. ``param_gather: "none"`` is
torch's own all-gather, timed and counted. On CUDA tensors the codec's kernels and the
all-gather queue on the current stream; the times counted are then the host's (the enqueue).
integrations/fsdp2.py's AllGather does the FSDP2 side (checks, the parameter layout, Work)."""
from __future__ import annotations

import time
from typing import Any, Mapping

import torch

from . import _C
from ._alloc import allocate
from ._buffers import Buffers
from ._dist import Ranks, all_gather_single, settled


def make_param_codec(config: Mapping[str, Any]) -> "_C.State | None":
    """A C state of the method ``config["param_gather"]`` names (None for "none"), with nearest
    rounding and the ``param_gather_block_size`` scales. Only its compress/decompress are used:
    its step and units never move, so every gather of every step is encoded the same way."""
    name = config["param_gather"]
    if name == "none":
        return None
    # the allocator: on CUDA the codec's workspace is a torch tensor (the GPU run found it missing)
    return _C.State(name, {} if name == "bf16" else {"block_size": config["param_gather_block_size"]}, allocate)


class ParamGather:
    """The parameter all-gathers of one CommState: its codec, counted in its core's counters."""

    def __init__(self, core, buffers: Buffers):
        self.codec = make_param_codec(core.config)  # None: torch's own all-gather
        self._core = core  # counts: add_param_gather
        self._buffers = buffers  # the state's, for CPU scratch
        self._sizes: dict[tuple[int, ...], list[int]] = {}

    def __call__(self, output: torch.Tensor, shard: torch.Tensor, ranks: Ranks, unit: int,
                 segments: tuple[int, ...], async_op: bool = False):
        """output = every rank's shard, rank after rank; segments: the elements of each piece of
        the shard encoded on its own (each parameter's padded shard), summing to its size.
        Returns torch's Work for the uncompressed gather with async_op, else None."""
        world, rank, group = ranks.world, ranks.rank, ranks.group
        n, elem = shard.numel(), shard.element_size()
        raw = (world - 1) * n * elem  # what this rank sends in an uncompressed all-gather
        if self.codec is None:
            t0 = time.perf_counter()
            if world > 1:
                work = all_gather_single(output, shard, group=group, async_op=async_op)
                self._core.add_param_gather(time.perf_counter() - t0, 0.0, raw, raw)
                return work
            if shard.data_ptr() != output.data_ptr():  # FSDP2 never gathers one rank
                output.copy_(shard)
            self._core.add_param_gather(time.perf_counter() - t0, 0.0, raw, raw)
            return None
        t0 = time.perf_counter()
        sizes = self._sizes.get(segments)
        if sizes is None:
            sizes = self._sizes[segments] = [self.codec.payload_bytes(k) for k in segments]
        payload, codec_s = self._encode(shard, unit, segments, sizes, world, rank)
        size = payload.numel()
        recv = self._scratch("param_gather_recv", size * world, torch.uint8, shard.device)
        if world > 1:
            settled(lambda r, p: all_gather_single(r, p, group=group), recv, payload)
        else:
            recv.copy_(payload)
        codec_s += self._decode(recv, unit, segments, sizes, output, world)
        self._core.add_param_gather(time.perf_counter() - t0, codec_s, (world - 1) * size, raw)
        return None

    def _encode(self, shard: torch.Tensor, unit: int, segments, sizes, world: int,
                rank: int) -> tuple[torch.Tensor, float]:
        """This rank's payload. The shard is a view of the output (FSDP copies it in there), so it
        is read before any decode writes there."""
        n = shard.numel()
        x = shard
        if shard.dtype != torch.float32:  # param_dtype bf16/fp16: exact in fp32
            x = self._scratch("param_gather_x", n, torch.float32, shard.device)
            x.copy_(shard)
        payload = self._scratch("param_gather_send", sum(sizes), torch.uint8, shard.device)
        t0 = time.perf_counter()
        at = out = 0
        for k, b in zip(segments, sizes):
            self.codec.compress(x[at:at + k], payload[out:out + b], unit=unit, chunk=rank,
                                world=world, rank=rank)
            at, out = at + k, out + b
        return payload, time.perf_counter() - t0

    def _decode(self, recv: torch.Tensor, unit: int, segments, sizes, output: torch.Tensor,
                world: int) -> float:
        """Rank r's slot of output = the decode of rank r's payload, for every r: the same bytes
        decoded the same way on every rank, rounded once to the parameter dtype."""
        full = output
        if output.dtype != torch.float32:
            full = self._scratch("param_gather_full", output.numel(), torch.float32, output.device)
        full.zero_()  # decompress adds into it
        t0 = time.perf_counter()
        at = out = 0  # walks all W payloads and shards: they lie rank after rank
        for r in range(world):
            for k, b in zip(segments, sizes):
                self.codec.decompress(recv[out:out + b], full[at:at + k], unit=unit, chunk=r, world=world)
                at, out = at + k, out + b
        seconds = time.perf_counter() - t0
        if full is not output:
            output.copy_(full)
        return seconds

    def _scratch(self, kind: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Working memory of one call. On the CPU the state's cached buffers (no allocation in
        steady state); on CUDA fresh memory from torch's caching allocator on the current stream,
        because FSDP2 may gather on more than one stream and a cached buffer would be shared
        between them."""
        if device.type == "cuda":
            return torch.empty(numel, dtype=dtype, device=device)
        return self._buffers.typed(kind, numel, dtype, device)
