"""CommState: one named compressor (its C state: config, residuals, counters) plus the
process group it reduces over. The FSDP1 hook, the FSDP2 reduce-scatter and the DDP hook all
drive it; the numerics stay in C, this file only moves buffers through torch.distributed."""
from __future__ import annotations

import time
from typing import Any, Hashable, Mapping

import torch
import torch.distributed as dist

from . import _C, _agree, _nccl
from ._shard_gather import all_gather_shards
from ._config import gather_default, normalize_config
from ._order import Units
from ._param_codec import make_param_codec
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


def _check_tensor(t: Any, name: str) -> None:
    """What every tensor of a hook call must be, checked before the call claims its unit."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _ELEMENT_SIZE:
        raise TypeError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
    if t.device.type not in ("cpu", "cuda"):
        raise TypeError(f"{name} must be on the CPU or a CUDA device, got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous()), got shape "
                         f"{tuple(t.shape)} with strides {t.stride()}")


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
        self._units = Units(self._core)  # which unit a call is, where a step ends
        self._device: torch.device | None = None  # where the units live: one state, one device
        self._varsize = bool(self._core.flags["varsize"])
        cfg = self._core.config  # read once: the property copies a dict
        self._transport = cfg["transport"]
        self._ef = cfg["error_feedback"]
        self._zero_nonfinite = cfg["nonfinite"] == "zero"
        # what the all-gather half's torch ops saturated (_range.py), per device: read with
        # counters(), so CUDA calls never wait for the count
        self._gather_saturated: dict[torch.device, torch.Tensor] = {}
        self._gather_compressed = cfg["allgather_compress"]
        self._gather_explicit = "allgather_compress" in config  # set by name, not by default
        self._min_numel = cfg["min_numel"]
        self._pipeline = cfg["pipeline"]
        self._timeout_s = cfg["timeout_s"]
        self._group_ranks: tuple[dist.ProcessGroup, list[int]] | None = None  # for _peers()
        self._gather_residuals: dict[int, torch.Tensor] = {}  # all-gather stage, per unit
        self._param_codec = make_param_codec(cfg)  # FSDP2 parameter all-gathers (param_gather.py)
        self._agreed_shapes: set = set()  # (group, shape) the ranks agreed on (_agree.agree)
        _agree.remember(self)
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
        c = self._core.counters()
        c["saturated"] += sum(int(t) for t in self._gather_saturated.values())
        return Counters(c)

    def reset_counters(self) -> None:
        self._core.reset_counters()
        self._gather_saturated.clear()

    def _count_saturated(self, count: torch.Tensor) -> None:
        """Adds a count of the all-gather half's saturations (a 0-dim tensor on any device)."""
        total = self._gather_saturated.get(count.device)
        self._gather_saturated[count.device] = count if total is None else total + count

    def end_step(self) -> None:
        """Marks the end of a backward pass. Called automatically at the end of every backward
        that ran the hook; call it yourself only when driving the hook outside autograd."""
        self._units.end_step()

    def state_dict(self) -> dict[str, Any]:
        """Method, config, step, unit sizes and keys, residuals (cloned) and the units' method
        state (gradiveq's basis: a resumed run encodes as the uninterrupted one would), for
        checkpoints."""
        return {
            "method": self.method,
            "config": self.config,
            "step": self._core.step,
            "units": self._core.units(),
            **self._units.state(),
            "residuals": [None if r is None else r.detach().clone() for r in self._core.residuals()],
            "unit_states": [None if b is None else torch.frombuffer(bytearray(b), dtype=torch.float32)
                            for b in self._core.unit_states()],
            "gather_residuals": {u: r.clone() for u, r in self._gather_residuals.items()},
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restores a state_dict() of a state with the same method and config. Everything is
        checked first: a refused load leaves this state as it was."""
        for key in ("method", "config", "step", "units", "residuals"):
            if key not in state_dict:
                raise ValueError(f"fsdpcomp state_dict is missing '{key}'")
        if state_dict["method"] != self.method:
            raise ValueError(f"state_dict is for method '{state_dict['method']}', this state is '{self.method}'")
        if dict(state_dict["config"]) != self.config:
            raise ValueError(f"state_dict config {dict(state_dict['config'])} differs from this state's {self.config}")
        for key, kinds in (("units", (list, tuple)), ("residuals", (list, tuple)),
                           ("unit_states", (list, tuple, type(None)))):
            value = state_dict.get(key)
            if not isinstance(value, kinds):
                raise TypeError(f"state_dict '{key}' must be a {' or '.join(k.__name__ for k in kinds)}, "
                                f"got {type(value).__name__}")
        for key in ("residuals", "unit_states"):
            for u, r in enumerate(state_dict.get(key) or []):
                if r is not None and not isinstance(r, torch.Tensor):
                    raise TypeError(f"state_dict {key}[{u}] must be a tensor or None, got {type(r).__name__}")
        units = list(state_dict["units"])
        # a checkpoint from before units had keys: every unit in call order
        keys, open_keys = Units.check_state(len(units), state_dict.get("unit_keys"),
                                            state_dict.get("open_keys"))
        residuals = [None if r is None else r.detach().clone() for r in state_dict["residuals"]]
        gather = _gather_residuals(state_dict.get("gather_residuals") or {}, len(units))
        # a residual never holds NaN/Inf: refuse one before anything changes (the C side scans
        # CPU tensors too; this also covers device tensors)
        named = [(f"residuals[{u}]", r) for u, r in enumerate(residuals) if r is not None]
        named += [(f"gather_residuals[{u}]", r) for u, r in gather.items()]
        for name, r in named:
            bad = ~torch.isfinite(r.float())
            if bool(bad.any()):
                i = int(bad.nonzero()[0, 0])
                raise ValueError(f"state_dict {name} element {i} is {float(r.flatten()[i])}: a "
                                 f"residual never holds NaN/Inf (a corrupted checkpoint?)")
        # a checkpoint from before unit states were saved has none: they restart from the seed
        unit_states = state_dict.get("unit_states")
        if unit_states is not None:
            unit_states = [None if t is None else torch.as_tensor(t).detach().cpu().contiguous()
                           for t in unit_states]
        step = state_dict["step"]
        self._core.restore(units, residuals, int(step) if isinstance(step, (int, torch.Tensor)) else step,
                           unit_states)
        self._units.restore(keys, open_keys)
        self._gather_residuals = gather

    def __repr__(self) -> str:
        return f"CommState(method={self.method!r}, config={self.config!r})"

    # ---- plumbing shared by the hooks

    def _world_rank(self) -> tuple[int, int]:
        if not dist.is_available() or not dist.is_initialized():
            return 1, 0
        group = self.process_group
        return dist.get_world_size(group), dist.get_rank(group)

    def _check_call(self, grad: Any, output: Any, world: int) -> None:
        """Everything a reduce-scatter call's tensors must be, before it claims a unit."""
        _check_tensor(grad, "grad")
        device = grad.device
        if self._device is not None and device != self._device:
            raise TypeError(f"grad is on {device} but this CommState's units live on {self._device}: "
                            "one state serves one device")
        if output is None:
            return
        _check_tensor(output, "output")
        if output.device != device:
            raise TypeError(f"output is on {output.device} but grad is on {device}: all tensors of "
                            "a call must share a device")
        shard = -(-grad.numel() // world)
        if output.numel() < shard:
            raise ValueError(f"output has {output.numel()} elements, the shard needs {shard} "
                             f"(grad has {grad.numel()} elements over {world} ranks)")

    def _begin(self, grad: torch.Tensor, key: Hashable | None) -> int:
        """Unit index of this call: its key's, or its place in call order within the backward
        pass (fsdpcomp/_order.py has how steps end)."""
        unit = self._units.claim(grad.numel(), key)
        self._device = grad.device
        return unit

    def _buffer(self, kind: str, nbytes: int, device: torch.device) -> torch.Tensor:
        """A reusable uint8 buffer (grown, never shrunk): no allocation per call in steady state."""
        key = (kind, str(device))
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < nbytes:
            buf = torch.empty(max(nbytes, 1024), dtype=torch.uint8, device=device)
            self._buffers[key] = buf
        return buf[:nbytes]

    def _collective(self, like: torch.Tensor, run, bytes_sent: int = 0, bytes_raw: int = 0,
                    extra: bool = False, fallback: bool = False) -> None:
        """Runs `run()`, one torch.distributed collective on tensors like `like`, and counts it.
        On CUDA its time is that of CUDA events around it on the current stream (the stream
        waits for the collective, the host does not: a host clock would time the enqueue
        only), read lazily with counters(); on the CPU, the host clock. extra: a collective
        beyond the all-to-all (extra_collectives); fallback: a unit sent uncompressed because
        compressing would not have paid (fallback_units)."""
        if like.is_cuda:
            index = like.device.index if like.device.index is not None else torch.cuda.current_device()
            stream = torch.cuda.current_stream(index).cuda_stream
            self._core.comm_mark(index, stream, False, extra)
            run()
            self._core.comm_mark(index, stream, True, extra)
            seconds = 0.0
        else:
            t0 = time.perf_counter()
            run()
            seconds = time.perf_counter() - t0
        self._core.add_comm(seconds, bytes_sent=bytes_sent, bytes_raw=bytes_raw, extra=extra,
                            fallback=fallback)

    def _plan(self, grad: torch.Tensor, world: int, rank: int):
        key = (grad.numel(), grad.dtype, world, rank)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._core.plan(grad, world, rank)
            self._plans[key] = plan
        return plan

    def reduce_scatter(self, grad: torch.Tensor, output: torch.Tensor, key: Hashable | None = None) -> int:
        """output = (sum over ranks of rank r's chunk of grad) / world, compressed on the wire.

        grad: flat, contiguous, len = world * shard (FSDP pads it); output: the shard.
        key: the unit's name (its residual and method state); None: the next unit in call order.
        Returns the unit index. A refused call (TypeError/ValueError) changes nothing.
        """
        world, rank = self._world_rank()
        world, rank = self._world_rank()
        self._check_call(grad, output, world)
        _agree.agree(self, grad, world, rank)  # the first call of a shape: the ranks compare configs
        unit = self._begin(grad, key)
        try:
            if self._exchanges_per_peer(grad, world):
                self._per_peer_exchange(grad, output, world, rank, unit)
            else:
                send_splits, recv_splits = self._plan(grad, world, rank)
                self._all_to_all_exchange(grad, output, world, rank, unit, send_splits, recv_splits)
        except _C.PayloadError as e:
            raise _agree.explain(e) from None
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
            comm = _nccl.comm_for(self.process_group, grad.device, self._timeout_s)
            self._core.nccl_all_to_all(comm, send, recv, send_splits, recv_splits)
        elif world > 1:
            self._collective(send, lambda: dist.all_to_all_single(
                recv, send, list(recv_splits), list(send_splits), group=self.process_group))
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
            self._collective(grad, lambda: _all_gather_single(everyone, picks, group=self.process_group),
                             extra=True)
        else:
            everyone = picks
        send = self._typed_buffer("fetch_send", world * kmax, torch.float32, grad.device)
        send_splits, recv_splits = self._core.fetch(everyone.view(torch.uint8), grad,
                                                    send.view(torch.uint8), world, rank, unit)
        send = send[:sum(send_splits)]
        recv = self._typed_buffer("fetch_recv", sum(recv_splits), torch.float32, grad.device)
        if world > 1:
            self._collective(grad, lambda: dist.all_to_all_single(
                recv, send, list(recv_splits), list(send_splits), group=self.process_group), extra=True)
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
            # the state lives on the host (C), so on CUDA this costs a copy each way and a wait,
            # on the steps the method's schedule makes it due (gradiveq: its basis updates)
            t = summed.to(device)
            nbytes = len(vec) * (world - 1) // world * 2  # ring all-reduce traffic per rank
            self._collective(t, lambda: dist.all_reduce(t, group=self.process_group),
                             bytes_sent=nbytes, extra=True)
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
            self._collective(send, lambda: dist.all_to_all_single(in_sizes, out_sizes, group=self.process_group),
                             bytes_sent=8 * (world - 1), extra=True)
            # the one host sync of a data-dependent size on CUDA: the receive splits must be
            # known on the host to post the payloads' all-to-all
            recv_splits = tuple(int(v) for v in in_sizes.tolist())
        return send[:sum(send_splits)], recv[:sum(recv_splits)], send_splits, recv_splits

    def all_reduce(self, grad: torch.Tensor, key: Hashable | None = None) -> None:
        """grad = mean over ranks of grad, in place: compressed reduce-scatter, then an
        all-gather of the reduced shards, compressed too (allgather_compress) where that pays.
        key as for reduce_scatter."""
        world, _ = self._world_rank()
        self._check_call(grad, None, world)
        n = grad.numel()
        shard = -(-n // world)
        reduced = self._buffer_like("shard", shard, grad)
        unit = self.reduce_scatter(grad, reduced, key)
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


def _gather_residuals(saved: Any, n_units: int) -> dict[int, torch.Tensor]:
    """A checkpoint's all-gather residuals (allgather_compress), checked and copied."""
    if not isinstance(saved, Mapping):
        raise TypeError(f"state_dict 'gather_residuals' must be a dict of unit -> tensor, got "
                        f"{type(saved).__name__}")
    out = {}
    for unit, r in saved.items():
        if isinstance(unit, bool) or not isinstance(unit, int) or not 0 <= unit < n_units:
            raise ValueError(f"state_dict 'gather_residuals' is keyed by unit (0 to {n_units - 1}), "
                             f"got {unit!r}")
        if not isinstance(r, torch.Tensor) or not r.is_floating_point():
            raise TypeError(f"state_dict 'gather_residuals'[{unit}] must be a float tensor, got "
                            f"{type(r).__name__}")
        out[unit] = r.detach().clone().float()
    return out
