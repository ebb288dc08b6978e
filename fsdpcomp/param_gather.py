"""FSDP2's parameter all-gather, compressed: ``m.set_custom_all_gather(AllGather(state, unit=i, module=m))``.

``fsdpcomp.register`` sets one on every FSDPModule. Each rank encodes its own shard once per
gather with the codec named by the state's ``param_gather`` key (the C method of that name,
nearest rounding), one all-gather moves the fixed-size payloads, and every rank, the owner
included, decodes all of them into FSDP's unsharded buffer. So every rank computes with the
same weights, and the forward gather and the backward re-gather of a step
(``reshard_after_forward=True``) yield the same bits: the sharded weights they encode have not
changed in between. The sharded weights the optimizer updates are never touched.
``param_gather: "none"`` is torch's own all-gather, timed and counted. On CUDA tensors the
codec's kernels and the all-gather queue on the current stream; the times counted are then
the host's (the enqueue), not the device's.
"""
from __future__ import annotations

import time
from typing import Sequence

import torch
import torch.distributed as dist

from . import _agree
from .state import CommState

try:  # torch >= 2.9 defines the protocol; subclassing it keeps torch's isinstance checks true
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _TorchAllGather
except ImportError:  # older torch: the class still works, register() says what is missing
    _TorchAllGather = object  # type: ignore[assignment,misc]

# torch 2.13 renamed all_gather_into_tensor (and deprecates the old name); older torch has only it.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_DEVICES = ("cpu", "cuda")  # where State.compress/decompress run


class AllGather(_TorchAllGather):
    """FSDP2's all-gather of one FSDPModule's parameters, through a CommState's parameter codec.

    ``unit`` names the module in the payload headers (``fsdpcomp.register`` numbers the modules
    in the same order on every rank), so ranks that gather different modules at the same time
    get a PayloadError instead of each other's weights. ``module``, the FSDPModule this gathers
    for, tells where each parameter's shard lies in the flat shard: each is encoded as its own
    segment, so no block of scales spans two parameters (a LayerNorm gain of 1 would otherwise
    set the scale of the small weights beside it). Without it the shard is one segment.
    """

    def __init__(self, state: CommState, key: str | None = None, unit: int = 0,
                 module: torch.nn.Module | None = None):
        if not isinstance(state, CommState):
            raise TypeError(f"AllGather's state must be a fsdpcomp.CommState, got {type(state).__name__}")
        if not isinstance(unit, int) or unit < 0:
            raise ValueError(f"unit must be a non-negative int, got {unit!r}")
        if module is not None and not hasattr(module, "_get_fsdp_state"):
            raise TypeError(f"module must be the FSDPModule this all-gather serves, got {type(module).__name__}")
        self.state = state
        self.key = key
        self.unit = unit
        self.module = module
        self.codec = state._param_codec  # None: torch's own all-gather
        self._layouts: dict[int, tuple[list[int], list[int]]] = {}

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        # FSDP2 splits the output into the unsharded parameters after the call: fresh memory.
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup | None = None, async_op: bool = False):
        group = group if group is not None else self.state.process_group
        world, rank = (dist.get_world_size(group), dist.get_rank(group)) if dist.is_initialized() else (1, 0)
        _check_tensors(output_tensor, input_tensor, world, floats=self.codec is not None)
        _agree.agree_gather(self.state, input_tensor, world, group)  # first gather of a shape
        n, elem = input_tensor.numel(), input_tensor.element_size()
        raw = (world - 1) * n * elem  # what this rank sends in an uncompressed all-gather
        if self.codec is None:
            t0 = time.perf_counter()
            if world > 1:
                work = _all_gather_single(output_tensor, input_tensor, group=group, async_op=async_op)
                self.state._core.add_param_gather(time.perf_counter() - t0, 0.0, raw, raw)
                return work
            if input_tensor.data_ptr() != output_tensor.data_ptr():  # FSDP2 never gathers one rank
                output_tensor.copy_(input_tensor)
            self.state._core.add_param_gather(time.perf_counter() - t0, 0.0, raw, raw)
            return _completed(output_tensor, async_op)
        if input_tensor.device.type not in _DEVICES:
            raise TypeError(f"param_gather '{self.state.config['param_gather']}' runs on CPU and CUDA tensors; "
                            f"set param_gather 'none' for parameters on {input_tensor.device}")
        t0 = time.perf_counter()
        segments, sizes = self._layout(n)
        payload, codec_s = self._encode(input_tensor, segments, sizes, world, rank)
        size = payload.numel()
        recv = self._scratch("param_gather_recv", size * world, torch.uint8, input_tensor.device)
        if world > 1:
            _all_gather_single(recv, payload, group=group)
        else:
            recv.copy_(payload)
        codec_s += self._decode(recv, segments, sizes, output_tensor, world)
        self.state._core.add_param_gather(time.perf_counter() - t0, codec_s, (world - 1) * size, raw)
        return _completed(output_tensor, async_op)

    def _layout(self, n: int) -> tuple[list[int], list[int]]:
        """Elements of each segment of a shard of n elements (each parameter's padded shard, in
        FSDP2's order) and the payload bytes of each: a pure function of n and the module, so
        the same on every rank. Segments lie back to back in the shard and in the payload."""
        layout = self._layouts.get(n)
        if layout is None:
            segments = [n]
            if self.module is not None:
                groups = self.module._get_fsdp_state()._fsdp_param_groups
                params = groups[0].fsdp_params if len(groups) == 1 else []
                sizes = [p.padded_sharded_param_size.numel() for p in params]
                if sizes and sum(sizes) == n and all(sizes):  # else (a resharded post-forward shard): one
                    segments = sizes
            layout = self._layouts[n] = (segments, [self.codec.payload_bytes(k) for k in segments])
        return layout

    def _encode(self, shard: torch.Tensor, segments: list[int], sizes: list[int], world: int,
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
            self.codec.compress(x[at:at + k], payload[out:out + b], unit=self.unit, chunk=rank,
                                world=world, rank=rank)
            at, out = at + k, out + b
        return payload, time.perf_counter() - t0

    def _decode(self, recv: torch.Tensor, segments: list[int], sizes: list[int], output: torch.Tensor,
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
                self.codec.decompress(recv[out:out + b], full[at:at + k], unit=self.unit, chunk=r, world=world)
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
        if dtype == torch.uint8:
            return self.state._buffer(kind, numel, device)
        return self.state._typed_buffer(kind, numel, dtype, device)

    def __repr__(self) -> str:
        return f"fsdpcomp.AllGather({self.state!r}, key={self.key!r}, unit={self.unit})"


def _completed(output: torch.Tensor, async_op: bool):
    """What torch's all-gather returns: None, or (async_op) a Work; the gather has already run
    on the caller's stream, so the Work is a completed one."""
    if not async_op:
        return None
    fut = torch.futures.Future()
    fut.set_result([output])
    return torch._C._distributed_c10d._create_work_from_future(fut)


def _check_tensors(output: torch.Tensor, input: torch.Tensor, world: int, floats: bool) -> None:
    """floats: a codec reads them (`none` moves any dtype FSDP2 gathers, uint8 included)."""
    for name, t in (("output_tensor", output), ("input_tensor", input)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if floats and t.dtype not in _FLOATS:
            raise ValueError(f"{name} must be float32, bfloat16 or float16 (parameters with their own "
                             f"all-gather extension, e.g. float8 training, need param_gather 'none'), got {t.dtype}")
        if t.dim() != 1 or not t.is_contiguous():
            raise ValueError(f"{name} must be a flat contiguous tensor, got shape {tuple(t.shape)}")
    if output.dtype != input.dtype or output.device != input.device:
        raise ValueError(f"output_tensor ({output.dtype}, {output.device}) and input_tensor "
                         f"({input.dtype}, {input.device}) must share dtype and device")
    if input.numel() == 0 or output.numel() != world * input.numel():
        raise ValueError(f"output_tensor has {output.numel()} elements; an all-gather over {world} ranks "
                         f"of input_tensor's {input.numel()} needs {world * input.numel()} (and at least one)")
