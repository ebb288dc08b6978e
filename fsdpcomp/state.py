"""CommState: one named compressor (its C state: config, residuals, counters) plus the
process group it reduces over. The FSDP1 hook, the FSDP2 reduce-scatter and the DDP hook all
drive it; the numerics stay in C, this file only moves buffers through torch.distributed."""
from __future__ import annotations

import time
from typing import Any, Mapping

import torch
import torch.distributed as dist

from . import _C, _nccl
from ._gather import all_gather_shards
from ._config import gather_default, normalize_config
from .counters import Counters

_ELEMENT_SIZE = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}
_RESIDUAL_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


# torch 2.13 renamed all_gather_into_tensor (and deprecates the old name); older torch has only it.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _slots(buf: torch.Tensor, parts) -> list[list[torch.Tensor]]:
    """Views of buf, one per part, for parts[c] = the byte sizes of chunk c's pieces laid back
    to back, chunk after chunk."""
    slots, at = [], 0
    for sizes in parts:
        slots.append([])
        for size in sizes:
            slots[-1].append(buf[at:at + size])
            at += size
    return slots


def _allocate_residual(numel: int, dtype_name: str, like: torch.Tensor) -> torch.Tensor:
    """Residual memory comes from torch's allocator, on the gradient's device."""
    return torch.zeros(numel, dtype=_RESIDUAL_DTYPES[dtype_name], device=like.device)


class CommState:
    """A gradient compressor attached to a process group.

    Args:
        method: a name from ``fsdpcomp.methods()``.
        config: dict or JSON string of config keys (``fsdpcomp.method_info(method)`` lists them).
        process_group: the group to reduce over; None means the default group at call time
            (or a single rank when torch.distributed is not initialised).
    """

    def __init__(self, method: str = "none", config: Mapping[str, Any] | str | None = None,
                 process_group: dist.ProcessGroup | None = None):
        if not isinstance(method, str):
            raise TypeError(f"method must be a str, got {type(method).__name__}")
        config = normalize_config(config)
        self._core = _C.State(method, gather_default(config), _allocate_residual)
        self.process_group = process_group
        self._buffers: dict[tuple[str, str], torch.Tensor] = {}
        self._plans: dict[tuple, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self._step_open = False
        self._varsize = bool(self._core.flags["varsize"])
        cfg = self._core.config  # read once: the property copies a dict
        self._transport = cfg["transport"]
        self._ef = cfg["error_feedback"]
        self._gather_compressed = cfg["allgather_compress"]
        self._gather_explicit = "allgather_compress" in config  # set by name, not by default
        self._min_numel = cfg["min_numel"]
        self._pipeline = cfg["pipeline"]
        self._group_ranks: tuple[dist.ProcessGroup, list[int]] | None = None  # for _peers()
        self._gather_residuals: dict[int, torch.Tensor] = {}  # all-gather stage, per unit
        if self._gather_compressed and cfg.get("second_round"):
            # a single payload (the all-gather stage) has no second round to fetch values with
            raise ValueError("config key 'allgather_compress' cannot be combined with "
                             "'second_round': the compressed all-gather decodes single payloads")

    # ---- what the user sees

    @property
    def method(self) -> str:
        return self._core.method

    @property
    def config(self) -> dict[str, Any]:
        """The resolved config, defaults included."""
        return self._core.config

    @property
    def step(self) -> int:
        return self._core.step

    def counters(self) -> Counters:
        return Counters(self._core.counters())

    def reset_counters(self) -> None:
        self._core.reset_counters()

    def end_step(self) -> None:
        """Marks the end of a backward pass. Called automatically at the end of every backward
        that ran the hook; call it yourself only when driving the hook outside autograd."""
        self._core.end_step()
        self._step_open = False

    def state_dict(self) -> dict[str, Any]:
        """Method, config, step, unit sizes, residuals (cloned) and the units' method state
        (gradiveq's basis: a resumed run encodes as the uninterrupted one would), for checkpoints."""
        return {
            "method": self.method,
            "config": self.config,
            "step": self._core.step,
            "units": self._core.units(),
            "residuals": [None if r is None else r.detach().clone() for r in self._core.residuals()],
            "unit_states": [None if b is None else torch.frombuffer(bytearray(b), dtype=torch.float32)
                            for b in self._core.unit_states()],
            "gather_residuals": {u: r.clone() for u, r in self._gather_residuals.items()},
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        for key in ("method", "config", "step", "units", "residuals"):
            if key not in state_dict:
                raise ValueError(f"fsdpcomp state_dict is missing '{key}'")
        if state_dict["method"] != self.method:
            raise ValueError(f"state_dict is for method '{state_dict['method']}', this state is '{self.method}'")
        if dict(state_dict["config"]) != self.config:
            raise ValueError(f"state_dict config {dict(state_dict['config'])} differs from this state's {self.config}")
        residuals = [None if r is None else r.detach().clone() for r in state_dict["residuals"]]
        # a checkpoint from before unit states were saved has none: they restart from the seed
        unit_states = state_dict.get("unit_states")
        if unit_states is not None:
            unit_states = [None if t is None else torch.as_tensor(t).detach().cpu().contiguous()
                           for t in unit_states]
        self._core.restore(list(state_dict["units"]), residuals, int(state_dict["step"]), unit_states)
        self._gather_residuals = {int(u): r.detach().clone().float()
                                  for u, r in dict(state_dict.get("gather_residuals", {})).items()}
        self._step_open = False

    def __repr__(self) -> str:
        return f"CommState(method={self.method!r}, config={self.config!r})"

    # ---- plumbing shared by the hooks

    def _world_rank(self) -> tuple[int, int]:
        if not dist.is_available() or not dist.is_initialized():
            return 1, 0
        group = self.process_group
        return dist.get_world_size(group), dist.get_rank(group)

    def _begin(self, numel: int) -> int:
        """Unit index of this call: call order within the backward pass. The end of the pass is
        caught with the autograd engine's final callback, as FSDP itself does."""
        if not self._step_open:
            try:
                torch.autograd.Variable._execution_engine.queue_callback(self.end_step)
                self._step_open = True
            except RuntimeError:
                pass  # not inside a backward pass: the caller marks steps with end_step()
        return self._core.begin(numel)

    def _buffer(self, kind: str, nbytes: int, device: torch.device) -> torch.Tensor:
        """A reusable uint8 buffer (grown, never shrunk): no allocation per call in steady state."""
        key = (kind, str(device))
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < nbytes:
            buf = torch.empty(max(nbytes, 1024), dtype=torch.uint8, device=device)
            self._buffers[key] = buf
        return buf[:nbytes]

    def _plan(self, grad: torch.Tensor, world: int, rank: int):
        key = (grad.numel(), grad.dtype, world, rank)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._core.plan(grad, world, rank)
            self._plans[key] = plan
        return plan

    def reduce_scatter(self, grad: torch.Tensor, output: torch.Tensor) -> int:
        """output = (sum over ranks of rank r's chunk of grad) / world, compressed on the wire.

        grad: flat, contiguous, len = world * shard (FSDP pads it); output: the shard.
        Returns the unit index the call was keyed by.
        """
        world, rank = self._world_rank()
        unit = self._begin(grad.numel())
        if self._exchanges_per_peer(grad, world):
            self._per_peer_exchange(grad, output, world, rank, unit)
        else:
            send_splits, recv_splits = self._plan(grad, world, rank)
            self._all_to_all_exchange(grad, output, world, rank, unit, send_splits, recv_splits)
        self._sync_unit_state(unit, world, grad.device)
        return unit

    def _all_to_all_exchange(self, grad, output, world, rank, unit, send_splits, recv_splits):
        """Encode every payload, one all-to-all, decode them all: any method, any transport."""
        send = self._buffer("send", sum(send_splits), grad.device)
        recv = self._buffer("recv", sum(recv_splits), grad.device)
        sizes = self._core.encode(grad, send, world, rank, unit)
        if self._varsize:
            send, recv, send_splits, recv_splits = self._exchange_sizes(sizes, send, recv, world)
        if self._transport == "nccl":
            # the C-side collective: grouped send/recv on the current stream, timed by events
            self._core.nccl_all_to_all(_nccl.comm_for(self.process_group, grad.device), send, recv,
                                       send_splits, recv_splits)
        elif world > 1:
            t0 = time.perf_counter()
            dist.all_to_all_single(recv, send, list(recv_splits), list(send_splits), group=self.process_group)
            self._core.add_comm(time.perf_counter() - t0)
        elif recv.numel():
            recv.copy_(send)  # one rank compressing its own chunk: the payload loops back
        self._core.decode(recv, grad, output, world, rank, unit)
        kmax = self._fetch_kmax(grad.numel(), world)
        if kmax:
            self._second_round(grad, output, world, rank, unit, kmax)

    def _exchanges_per_peer(self, grad: torch.Tensor, world: int) -> bool:
        """The pipelined exchange applies to CPU tensors on torch.distributed, over >= 2 ranks,
        for units whose payloads have fixed sizes and are decoded one by one."""
        if not self._pipeline or world < 2 or grad.device.type != "cpu" or self._transport == "nccl":
            return False
        key = ("per_peer", grad.numel(), world)
        ok = self._plans.get(key)
        if ok is None:
            ok = self._plans[key] = self._core.per_peer_ok(grad.numel(), world)
        return ok

    def _per_peer_exchange(self, grad, output, world, rank, unit):
        """The reduce-scatter as point-to-point messages, overlapped with the codec.

        Every receive is posted first. Then, at step k = 1..W-1, this rank encodes the payload
        for rank - k and puts it on the wire at once, so the next encode runs while it is in
        flight; each rank thus receives from rank + k at step k (a permutation: one flow per
        link per step, on every rank), which is the order decode_part adds them in, after the
        own chunk. A large payload of an element- or block-wise method goes as pieces
        (`pipeline_piece` elements each), so even a single peer's payload is encoded, sent and
        decoded in overlapping steps. The sum runs in that fixed order on every run.
        comm_time_s counts only the time spent waiting on the wire."""
        group, peers = self.process_group, self._peers()
        send, recv, send_slots, recv_slots = self._part_slots(grad, world, rank)
        arriving = {}
        for k in range(1, world):
            src = (rank + k) % world
            for piece, slot in enumerate(recv_slots[src]):
                if slot.numel():  # the tag tells a sender's pieces apart
                    arriving[src, piece] = dist.irecv(slot, src=peers[src], group=group, tag=piece)
        leaving = []
        for k in range(1, world):
            dst = (rank - k) % world
            for piece, slot in enumerate(send_slots[dst]):
                if self._core.encode_part(grad, send, world, rank, unit, dst, piece):
                    leaving.append(dist.isend(slot, dst=peers[dst], group=group, tag=piece))
        for piece, slot in enumerate(send_slots[rank]):  # empty unless compress_own_chunk
            self._core.encode_part(grad, send, world, rank, unit, rank, piece)
        waited = 0.0
        for k in range(world):
            src = (rank + k) % world
            slots = send_slots[rank] if src == rank else recv_slots[src]  # the own payload loops back
            for piece, slot in enumerate(slots):
                work = arriving.get((src, piece))
                if work is not None:
                    t0 = time.perf_counter()
                    work.wait()
                    waited += time.perf_counter() - t0
                self._core.decode_part(slot, grad, output, world, rank, unit, src, piece)
        t0 = time.perf_counter()
        for work in leaving:  # the send buffer is reused by the next call
            work.wait()
        self._core.add_comm(waited + time.perf_counter() - t0)

    def _part_slots(self, grad, world, rank):
        """The send and receive buffers of the per-peer exchange and a view per part of each.
        Made once per (size, dtype, world, rank), again only after a buffer was regrown: W x
        pieces views are not worth rebuilding on every call."""
        key, dev = ("slots", grad.numel(), grad.dtype, world, rank), str(grad.device)
        cached = self._plans.get(key)
        if cached is not None and all(self._buffers.get((kind, dev)) is base
                                      for kind, base in zip(("send", "recv"), cached[0])):
            return cached[1]
        send_parts, recv_parts = self._core.pieces(grad, world, rank)
        send = self._buffer("send", sum(map(sum, send_parts)), grad.device)
        recv = self._buffer("recv", sum(map(sum, recv_parts)), grad.device)
        views = (send, recv, _slots(send, send_parts), _slots(recv, recv_parts))
        self._plans[key] = ((self._buffers[("send", dev)], self._buffers[("recv", dev)]), views)
        return views

    def _peers(self) -> list[int]:
        """Global rank of each rank of the group: torch's point-to-point calls take global ranks."""
        group = self.process_group if self.process_group is not None else dist.group.WORLD
        if self._group_ranks is None or self._group_ranks[0] is not group:
            self._group_ranks = (group, dist.get_process_group_ranks(group))
        return self._group_ranks[1]

    def _fetch_kmax(self, numel: int, world: int) -> int:
        key = ("fetch", numel, world)
        kmax = self._plans.get(key)
        if kmax is None:
            kmax = self._plans[key] = self._core.fetch_kmax(numel, world)
        return kmax

    def _second_round(self, grad, output, world, rank, unit, kmax):
        """Sketched-SGD's second round (sketch with second_round): decode() only picked this
        rank's heavy coordinates. The picks go to every rank (an all-gather), each rank answers
        with its exact values there (an all-to-all), and finish() sums them into output. Two
        extra collectives, timed here; their bytes are counted by the C side."""
        picks = self._typed_buffer("fetch_picks", kmax, torch.int32, grad.device)
        self._core.fetch_picks(unit, picks.view(torch.uint8))
        if world > 1:
            everyone = self._typed_buffer("fetch_all_picks", world * kmax, torch.int32, grad.device)
            t0 = time.perf_counter()
            _all_gather_single(everyone, picks, group=self.process_group)
            self._core.add_comm(time.perf_counter() - t0, extra=True)
        else:
            everyone = picks
        send = self._typed_buffer("fetch_send", world * kmax, torch.float32, grad.device)
        send_splits, recv_splits = self._core.fetch(everyone.view(torch.uint8), grad,
                                                    send.view(torch.uint8), world, rank, unit)
        send = send[:sum(send_splits)]
        recv = self._typed_buffer("fetch_recv", sum(recv_splits), torch.float32, grad.device)
        if world > 1:
            t0 = time.perf_counter()
            dist.all_to_all_single(recv, send, list(recv_splits), list(send_splits),
                                   group=self.process_group)
            self._core.add_comm(time.perf_counter() - t0, extra=True)
        else:
            recv.copy_(send)  # one rank compressing its own chunk: its values loop back
        self._core.finish(recv.view(torch.uint8), grad, output, world, rank, unit)

    def _sync_unit_state(self, unit: int, world: int, device: torch.device) -> None:
        """Method state that must stay identical on all ranks (gradiveq's basis) is rebuilt from
        a sum over ranks: one all-reduce, counted as an extra collective, on the steps it is due."""
        vec = self._core.sync_vector(unit)
        if vec is None:
            return
        summed = torch.frombuffer(bytearray(vec), dtype=torch.float32)
        if world > 1:
            t = summed.to(device)
            t0 = time.perf_counter()
            dist.all_reduce(t, group=self.process_group)
            nbytes = len(vec) * (world - 1) // world * 2  # ring all-reduce traffic per rank
            self._core.add_comm(time.perf_counter() - t0, bytes_sent=nbytes, extra=True)
            summed = t.cpu()
        self._core.sync_apply(unit, summed)

    def _exchange_sizes(self, sizes, send, recv, world):
        """Data-dependent payload sizes (flags['varsize']): every rank learns what it will receive
        with one small all-to-all first, counted as an extra collective."""
        send_splits = tuple(sizes)
        if world == 1:
            recv_splits = send_splits
        else:
            out_sizes = torch.tensor(send_splits, dtype=torch.int64, device=send.device)
            in_sizes = torch.empty(world, dtype=torch.int64, device=send.device)
            t0 = time.perf_counter()
            dist.all_to_all_single(in_sizes, out_sizes, group=self.process_group)
            self._core.add_comm(time.perf_counter() - t0, bytes_sent=8 * (world - 1), extra=True)
            recv_splits = tuple(int(v) for v in in_sizes.tolist())
        return send[:sum(send_splits)], recv[:sum(recv_splits)], send_splits, recv_splits

    def all_reduce(self, grad: torch.Tensor) -> None:
        """grad = mean over ranks of grad, in place: compressed reduce-scatter, then an
        all-gather of the reduced shards, compressed too (allgather_compress) where that pays."""
        world, _ = self._world_rank()
        n = grad.numel()
        shard = -(-n // world)
        reduced = self._buffer_like("shard", shard, grad)
        unit = self.reduce_scatter(grad, reduced)
        if world == 1:
            grad.copy_(reduced[:n])
            return
        _, rank = self._world_rank()
        all_gather_shards(self, reduced, grad, unit, world, rank, self._gather_residuals)

    def _buffer_like(self, kind: str, numel: int, like: torch.Tensor) -> torch.Tensor:
        return self._typed_buffer(kind, numel, like.dtype, like.device)

    def _typed_buffer(self, kind: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A reusable buffer of `numel` elements of `dtype` (a view of a cached uint8 buffer)."""
        size = _ELEMENT_SIZE.get(dtype) or torch.empty((), dtype=dtype).element_size()
        return self._buffer(kind + str(dtype), numel * size, device).view(dtype)
