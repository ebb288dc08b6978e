"""The collectives of one CommState: what goes on the wire and in which order, apart from the
state (config, units, counters, checkpoint) they serve, as torch FSDP2 keeps its collectives in
``_fsdp_collectives.py``. CommState claims the unit; the C core plans, encodes, decodes and
counts; this moves the payloads through torch.distributed, the one way onto the wire.

The interface CommState uses: ``reduce_scatter`` (the all-to-all exchange, or the pipelined
per-peer one, with the size exchange and the second round where the method has them), ``sync``
(method state kept equal on all ranks), ``shard_gather`` (the all-gather half of an all-reduce,
a ShardGather from _shard_gather.py, which keeps that half's residuals), ``signature`` (what an
exchange looks like, for the handshake in _agree.py), ``timed`` (one counted collective) and
``buffers``."""
from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Mapping, NamedTuple

import torch
import torch.distributed as dist

from ._buffers import Buffers
from ._dist import Handoff, Ranks, all_gather_single, settled
from ._shard_gather import ShardGather

_ABANDON_WAIT_S = 30  # the messages an error left posted: how long, in all, they may take to end

Splits = tuple[tuple[int, ...], tuple[int, ...]]  # bytes sent to, received from, each rank


@dataclass(frozen=True)
class Wire:
    """The config keys the exchange reads, read once (the core's config property copies a dict)."""
    varsize: bool  # payload sizes depend on the data: a size exchange first
    pipeline: bool
    error_feedback: bool
    zero_nonfinite: bool
    gather_compressed: bool  # allgather_compress
    gather_explicit: bool  # allgather_compress set by name, not by default
    min_numel: int
    parts: bool = False  # payload sizes follow each unit's parts table (adaptive): planned per call

    @staticmethod
    def of(core, given: Mapping[str, Any]) -> "Wire":
        cfg = core.config
        return Wire(bool(core.flags["varsize"]), cfg["pipeline"], cfg["error_feedback"], cfg["nonfinite"] == "zero",
                    cfg["allgather_compress"], "allgather_compress" in given, cfg["min_numel"],
                    bool(core.flags["parts"]))


class _Shape(NamedTuple):
    numel: int
    dtype: torch.dtype
    world: int
    rank: int


class _AllToAll(NamedTuple):
    """One shape's all-to-all, from the C core's plan and the buffers: what a call needs, read
    with one lookup (no split sizes asked again, no buffer sliced again)."""
    generation: int  # the buffers' when the views were cut
    device: torch.device
    send_splits: tuple[int, ...]
    recv_splits: tuple[int, ...]
    send: torch.Tensor  # views of the send and recv buffers, as long as the plan says
    recv: torch.Tensor
    kmax: int  # second-round picks, 0: none


class _PartSlots(NamedTuple):
    """The per-peer exchange's buffers and a view per (peer, piece) of each."""
    bases: tuple[torch.Tensor, torch.Tensor]  # the send and recv buffers the views are of
    send: torch.Tensor
    recv: torch.Tensor
    send_slots: list[list[torch.Tensor]]
    recv_slots: list[list[torch.Tensor]]


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


class Exchange:
    """The collectives of one C core (see the module docstring)."""

    def __init__(self, core, wire: Wire):
        self.core = core
        self.wire = wire
        self.buffers = Buffers()
        self.shard_gather = ShardGather(core, wire, self.buffers, self.timed)  # an all-reduce's second half
        # the C core's answers per shape, asked once
        self._splits: dict[_Shape, Splits] = {}
        self._pipelined_ok: dict[tuple[int, int], bool] = {}  # (numel, world)
        self._kmax: dict[tuple[int, int], int] = {}  # (numel, world): second-round picks, 0: none
        self._slots: dict[_Shape, _PartSlots] = {}
        self._slots_checked = -1  # the buffers' generation when every cached slot was last found current
        self._all_to_all: dict[_Shape, _AllToAll] = {}
        self._peers: tuple[dist.ProcessGroup, list[int]] | None = None

    # ---- counting

    def timed(self, run: Callable[..., Any], *tensors: torch.Tensor, bytes_sent: int = 0, bytes_raw: int = 0,
              extra: bool = False, fallback: bool = False) -> None:
        """Runs `run(*tensors)`, one blocking torch.distributed collective, settled (over only once
        the backend has let go of the tensors: _dist.settled says why), and counts it.
        On CUDA its time is that of CUDA events around it on the current stream (the stream
        waits for the collective, the host does not: a host clock would time the enqueue
        only), read lazily with counters(); on the CPU, the host clock. extra: a collective
        beyond the all-to-all (extra_collectives); fallback: a unit sent uncompressed because
        compressing would not have paid (fallback_units)."""
        like = tensors[0]
        if like.is_cuda:
            index = like.device.index if like.device.index is not None else torch.cuda.current_device()
            stream = torch.cuda.current_stream(index).cuda_stream
            self.core.comm_mark(index, stream, False, extra)
            settled(run, *tensors)
            self.core.comm_mark(index, stream, True, extra)
            seconds = 0.0
        else:
            t0 = time.perf_counter()
            settled(run, *tensors)
            seconds = time.perf_counter() - t0
        self.core.add_comm(seconds, bytes_sent=bytes_sent, bytes_raw=bytes_raw, extra=extra,
                           fallback=fallback)

    # ---- the reduce-scatter

    def signature(self, grad: torch.Tensor, world: int, rank: int) -> tuple:
        """What the exchange of this shape looks like from this rank, up to the payloads: per-peer
        or all-to-all, the split sizes, the pieces, the size exchange."""
        per_peer = self._pipelined(grad, world)
        pieces = self.core.pieces(grad, world, rank) if per_peer else None
        # a parts table's sizes are the unit's (every rank sets the same one; the headers check)
        plan = ("parts",) if self.wire.parts else self.core.plan(grad, world, rank)
        return (per_peer, plan, pieces, self.wire.varsize)

    def _pipelined(self, grad: torch.Tensor, world: int) -> bool:
        """The pipelined exchange applies to CPU tensors, over >= 2 ranks, for units whose
        payloads have fixed sizes and are decoded one by one."""
        if not self.wire.pipeline or world < 2 or grad.device.type != "cpu":
            return False
        key = (grad.numel(), world)
        ok = self._pipelined_ok.get(key)
        if ok is None:
            ok = self._pipelined_ok[key] = self.core.per_peer_ok(grad.numel(), world)
        return ok

    def reduce_scatter(self, grad: torch.Tensor, output: torch.Tensor, unit: int, ranks: Ranks) -> None:
        """output = this rank's chunk of the sum over ranks of grad / world (the C core decodes),
        for the unit the caller claimed."""
        if self._pipelined(grad, ranks.world):
            self._per_peer_exchange(grad, output, unit, ranks)
        else:
            self._all_to_all_exchange(grad, output, unit, ranks)

    def _all_to_all_exchange(self, grad, output, unit: int, ranks: Ranks) -> None:
        """Encode every payload, one all-to-all, decode them all: any method, any device."""
        world, rank = ranks.world, ranks.rank
        a2a = self._parts_all_to_all(grad, world, rank, unit) if self.wire.parts else \
            self._all_to_all_of(grad, world, rank)
        send_splits, recv_splits, send, recv = a2a.send_splits, a2a.recv_splits, a2a.send, a2a.recv
        sizes = self.core.encode(grad, send, world, rank, unit)
        if self.wire.varsize:
            send, recv, send_splits, recv_splits = self._exchange_sizes(sizes, send, recv, ranks)
        if world > 1:
            self.timed(lambda r, s: dist.all_to_all_single(
                r, s, list(recv_splits), list(send_splits), group=ranks.group), recv, send)
        elif recv.numel():
            recv.copy_(send)  # one rank compressing its own chunk: the payload loops back
        self.core.decode(recv, grad, output, world, rank, unit)
        if a2a.kmax:
            self._second_round(grad, output, unit, ranks, a2a.kmax)

    def _all_to_all_of(self, grad: torch.Tensor, world: int, rank: int) -> _AllToAll:
        """The shape's plan and buffer views, made on its first call and again only after a buffer
        was regrown (then every shape's are dropped: a view would keep the old buffer alive,
        unseen by buffer_bytes) or on another device: a warm call slices nothing."""
        shape = _Shape(grad.numel(), grad.dtype, world, rank)
        a2a = self._all_to_all.get(shape)
        if a2a is not None and a2a.generation == self.buffers.generation and a2a.device == grad.device:
            return a2a
        splits = self._splits.get(shape)
        if splits is None:
            splits = self._splits[shape] = self.core.plan(grad, world, rank)
        key = (grad.numel(), world)
        kmax = self._kmax.get(key)
        if kmax is None:
            kmax = self._kmax[key] = self.core.fetch_kmax(grad.numel(), world)
        send = self.buffers.bytes("send", sum(splits[0]), grad.device)
        recv = self.buffers.bytes("recv", sum(splits[1]), grad.device)
        if any(v.generation != self.buffers.generation for v in self._all_to_all.values()):
            self._all_to_all = {}
        a2a = self._all_to_all[shape] = _AllToAll(self.buffers.generation, grad.device, *splits, send, recv, kmax)
        return a2a

    def _parts_all_to_all(self, grad: torch.Tensor, world: int, rank: int, unit: int) -> _AllToAll:
        """The all-to-all of a unit whose payload sizes follow its parts table (adaptive): planned
        on every call, since the table may change between two (nothing kept per shape)."""
        splits = self.core.plan(grad, world, rank, unit)
        send = self.buffers.bytes("send", sum(splits[0]), grad.device)
        recv = self.buffers.bytes("recv", sum(splits[1]), grad.device)
        return _AllToAll(self.buffers.generation, grad.device, *splits, send, recv, 0)

    def _exchange_sizes(self, sizes, send, recv, ranks: Ranks):
        """Data-dependent payload sizes (flags['varsize']): every rank learns what it will receive
        with one small all-to-all first, counted as an extra collective."""
        send_splits = tuple(sizes)
        if ranks.world == 1:
            recv_splits = send_splits
        else:
            out_sizes = torch.tensor(send_splits, dtype=torch.int64, device=send.device)
            in_sizes = torch.empty(ranks.world, dtype=torch.int64, device=send.device)
            self.timed(lambda i, o: dist.all_to_all_single(i, o, group=ranks.group), in_sizes, out_sizes,
                       bytes_sent=8 * (ranks.world - 1), extra=True)
            # the one host sync of a data-dependent size on CUDA: the receive splits must be
            # known on the host to post the payloads' all-to-all
            recv_splits = tuple(int(v) for v in in_sizes.tolist())
        return send[:sum(send_splits)], recv[:sum(recv_splits)], send_splits, recv_splits

    def _second_round(self, grad, output, unit: int, ranks: Ranks, kmax: int) -> None:
        """Sketched-SGD's second round (sketch with second_round): decode() only picked this
        rank's heavy coordinates. The picks go to every rank (an all-gather), each rank answers
        with its exact values there (an all-to-all), and finish() sums them into output. Two
        extra collectives, timed here; their bytes are counted by the C side."""
        world, rank, dev = ranks.world, ranks.rank, grad.device
        picks = self.buffers.typed("fetch_picks", kmax, torch.int32, dev)
        self.core.fetch_picks(unit, picks.view(torch.uint8))
        if world > 1:
            everyone = self.buffers.typed("fetch_all_picks", world * kmax, torch.int32, dev)
            self.timed(lambda e, p: all_gather_single(e, p, group=ranks.group), everyone, picks, extra=True)
        else:
            everyone = picks
        send = self.buffers.typed("fetch_send", world * kmax, torch.float32, dev)
        send_splits, recv_splits = self.core.fetch(everyone.view(torch.uint8), grad,
                                                   send.view(torch.uint8), world, rank, unit)
        send = send[:sum(send_splits)]
        recv = self.buffers.typed("fetch_recv", sum(recv_splits), torch.float32, dev)
        if world > 1:
            self.timed(lambda r, s: dist.all_to_all_single(
                r, s, list(recv_splits), list(send_splits), group=ranks.group), recv, send, extra=True)
        else:
            recv.copy_(send)  # one rank compressing its own chunk: its values loop back
        self.core.finish(recv.view(torch.uint8), grad, output, world, rank, unit)

    def _per_peer_exchange(self, grad, output, unit: int, ranks: Ranks) -> None:
        """The reduce-scatter as point-to-point messages, overlapped with the codec.

        Every receive is posted first. Then, at step k = 1..W-1, this rank encodes the payload
        for rank - k and puts it on the wire at once, so the next encode runs while it is in
        flight; each rank thus receives from rank + k at step k (a permutation: one flow per
        link per step, on every rank), which is the order decode_part adds them in, after the
        own chunk. A large payload of an element- or block-wise method goes as pieces
        (`pipeline_piece` elements each), so even a single peer's payload is encoded, sent and
        decoded in overlapping steps. The sum runs in that fixed order on every run.
        comm_time_s counts only the time spent waiting on the wire."""
        world, rank, group = ranks.world, ranks.rank, ranks.group
        peers = self._global_ranks(group)
        parts = self._part_slots(grad, world, rank)
        send, send_slots, recv_slots = parts.send, parts.send_slots, parts.recv_slots
        arriving, leaving = {}, []
        # what can go on the wire: the peers' non-empty slots (the own chunk never leaves)
        handoff = Handoff([t for side in (recv_slots, send_slots) for peer, part in enumerate(side)
                           if peer != rank for t in part if t.numel()])
        try:
            for k in range(1, world):
                src = (rank + k) % world
                for piece, slot in enumerate(recv_slots[src]):
                    if slot.numel():  # the tag tells a sender's pieces apart
                        arriving[src, piece] = dist.irecv(slot, src=peers[src], group=group, tag=piece)
            for k in range(1, world):
                dst = (rank - k) % world
                for piece, slot in enumerate(send_slots[dst]):
                    if self.core.encode_part(grad, send, world, rank, unit, dst, piece):
                        leaving.append(dist.isend(slot, dst=peers[dst], group=group, tag=piece))
            for piece, slot in enumerate(send_slots[rank]):  # empty unless compress_own_chunk
                self.core.encode_part(grad, send, world, rank, unit, rank, piece)
            waited = 0.0
            for k in range(world):
                src = (rank + k) % world
                slots = send_slots[rank] if src == rank else recv_slots[src]  # the own payload loops back
                for piece, slot in enumerate(slots):
                    work = arriving.pop((src, piece), None)
                    if work is not None:
                        t0 = time.perf_counter()
                        work.wait()
                        waited += time.perf_counter() - t0
                    self.core.decode_part(slot, grad, output, world, rank, unit, src, piece)
            t0 = time.perf_counter()
            for work in leaving:  # the send buffer is reused by the next call
                work.wait()
            self.core.add_comm(waited + time.perf_counter() - t0)
        except BaseException:
            # a payload that failed to decode (or an interrupt): the messages already posted are
            # waited for, so no work is left pending behind the error (the peers posted theirs)
            deadline = time.monotonic() + _ABANDON_WAIT_S
            for work in [*arriving.values(), *leaving]:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    work.wait(timedelta(seconds=left))
                except Exception:  # noqa: BLE001 - the first error is the one to report
                    pass
            arriving.clear()
            leaving.clear()
            work = None  # noqa: F841
            handoff.abandon()
            raise
        work = None  # noqa: F841 - nor may a Work object of ours hold them
        leaving.clear()
        handoff.wait()  # the works are over: their tensors must be let go of too (_dist.py)

    def _part_slots(self, grad: torch.Tensor, world: int, rank: int) -> _PartSlots:
        """Made once per (size, dtype, world, rank), again only after a buffer was regrown: W x
        pieces views are not worth rebuilding on every call."""
        shape, dev = _Shape(grad.numel(), grad.dtype, world, rank), grad.device
        cached = self._slots.get(shape)
        if cached is not None and self._slots_checked == self.buffers.generation:
            return cached  # no buffer made since every slot was checked: none is stale
        if cached is not None and all(self.buffers.base(kind, dev) is base
                                      for kind, base in zip(("send", "recv"), cached.bases)):
            self._slots_checked = self.buffers.generation
            return cached
        send_parts, recv_parts = self.core.pieces(grad, world, rank)
        send = self.buffers.bytes("send", sum(map(sum, send_parts)), dev)
        recv = self.buffers.bytes("recv", sum(map(sum, recv_parts)), dev)
        parts = _PartSlots((self.buffers.base("send", dev), self.buffers.base("recv", dev)), send, recv,
                           _slots(send, send_parts), _slots(recv, recv_parts))
        # the other shapes' views of a regrown buffer would keep the old one alive, unseen by
        # buffer_bytes, until their shape came again: dropped, they are rebuilt when it does
        self._slots = {s: p for s, p in self._slots.items()
                       if all(a is b for a, b in zip(p.bases, parts.bases))}
        self._slots[shape] = parts
        self._slots_checked = self.buffers.generation
        # and so would the all-to-all's of a buffer regrown here (a State whose units go both ways)
        self._all_to_all = {s: a for s, a in self._all_to_all.items() if a.generation == self.buffers.generation}
        return parts

    def _global_ranks(self, group: dist.ProcessGroup | None) -> list[int]:
        """Global rank of each rank of the group: torch's point-to-point calls take global ranks."""
        group = group if group is not None else dist.group.WORLD
        if self._peers is None or self._peers[0] is not group:
            self._peers = (group, dist.get_process_group_ranks(group))
        return self._peers[1]

    def sync(self, unit: int, ranks: Ranks, device: torch.device) -> None:
        """Method state that must stay identical on all ranks (gradiveq's basis) is rebuilt from
        a sum over ranks: one all-reduce, counted as an extra collective, on the steps it is due."""
        vec = self.core.sync_vector(unit)
        if vec is None:
            return
        summed = torch.frombuffer(bytearray(vec), dtype=torch.float32)
        if ranks.world > 1:
            # the state lives on the host (C), so on CUDA this costs a copy each way and a wait,
            # on the steps the method's schedule makes it due (gradiveq: its basis updates)
            t = summed.to(device)
            nbytes = len(vec) * (ranks.world - 1) // ranks.world * 2  # ring all-reduce traffic per rank
            self.timed(lambda v: dist.all_reduce(v, group=ranks.group), t, bytes_sent=nbytes, extra=True)
            summed = t.cpu()
        self.core.sync_apply(unit, summed)
