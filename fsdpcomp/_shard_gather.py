"""The all-gather half of an all-reduce (DDP, FSDP1 NO_SHARD, FSDP2's replica all-reduce): the
reduced shards go back to every rank compressed with the state's method (`allgather_compress`,
the default) or in the gradient's dtype. Compressed, every rank, the owner included, decodes
every payload, so the replicas stay bit-identical; the shard's own error-feedback residual
(when error feedback is on) is the C State's, in its unit's "gather" slot.

The uncompressed all-gather is used where compressing would not pay or cannot run: a unit below
`min_numel`; a payload no smaller than the raw shard (`none`, 16-bit casts of 16-bit gradients,
a sketch table larger than the shard: counted in fallback_units, as the reduce-scatter's own
fallback is); and a device where the method has no single-payload codec (learned from the first
compress() there, not a list kept here: on CUDA every method has one, unless the loaded library
lacks the method's kernels; asked for explicitly, `"allgather_compress": true`, that is a
TypeError instead). On CUDA tensors every step queues on the current stream, with no
wait on the host, except a data-dependent method's size exchange."""
from __future__ import annotations

from typing import Callable

import torch

from ._dist import all_gather_single as _all_gather_single

# What a compressed all-gather attempt came to.
_SENT, _NO_GAIN, _NO_CODEC = "sent", "no gain", "no codec"


class ShardGather:
    """The all-gather half of one Exchange: its C core's single-payload codec (and residual
    store), the Exchange's wire config, buffers and counted collectives, and per device type
    whether the codec took tensors there."""

    def __init__(self, core, wire, buffers, timed: Callable[..., None]):
        self._core = core
        self._wire = wire
        self._buffers = buffers
        self._timed = timed  # Exchange.timed: one counted collective
        # whether compress() took tensors of a device type: learned from the first call there
        # (its argument checks run before anything changes, so a refusal costs nothing)
        self._device_ok: dict[str, bool] = {}

    def __call__(self, reduced: torch.Tensor, grad: torch.Tensor, unit: int, ranks) -> None:
        """grad[:n] = every rank's reduced shard (reduced: this rank's), compressed on the wire
        where that pays; the same bits on every rank either way."""
        wire = self._wire
        if not wire.gather_compressed or grad.numel() < wire.min_numel:
            return self._plain(reduced, grad, ranks, fallback=False)
        # a fixed-size payload no smaller than the raw shard: decided from sizes, alike on every rank
        raw = reduced.numel() * grad.element_size()
        if not wire.varsize and self._slot(reduced.numel(), unit, ranks.world) >= raw:
            return self._plain(reduced, grad, ranks, fallback=self._core.method != "none")
        outcome = self._compressed(reduced, grad, unit, ranks)
        if outcome != _SENT:
            self._plain(reduced, grad, ranks, fallback=outcome == _NO_GAIN)

    def _slot(self, shard: int, unit: int, world: int) -> int:
        """Bytes of each rank's payload slot for a fixed-size method: its payload of a shard, or
        under a parts table (adaptive) the largest of the ranks' shards' payloads, which the
        table sizes one by one (every rank holds the same table, so all compute the same)."""
        if not self._wire.parts:
            return self._core.payload_bytes(shard)
        return max(self._core.payload_bytes(shard, unit=unit, chunk=world + r, world=world) for r in range(world))

    def _plain(self, reduced, grad, ranks, *, fallback: bool) -> None:
        """The all-gather in the gradient's dtype: what an uncompressed all-reduce sends."""
        shard, n, world = reduced.numel(), grad.numel(), ranks.world
        gathered = self._buffers.like("gathered", shard * world, grad)
        nbytes = (world - 1) * shard * grad.element_size()
        self._timed(lambda g, r: _all_gather_single(g, r, group=ranks.group), gathered, reduced,
                    bytes_sent=nbytes, bytes_raw=nbytes, fallback=fallback)
        grad.copy_(gathered[:n].view_as(grad))

    def _encode(self, x: torch.Tensor, send: torch.Tensor, e: torch.Tensor | None, unit: int, world: int,
                rank: int) -> int | None:
        """compress() of this rank's shard (plus its residual e, which it replaces) into send; None
        where the device has no codec yet (nothing changed)."""
        dev = x.device.type
        if self._device_ok.get(dev) is False:
            return None
        try:
            # chunk index world + r: a random stream apart from the reduce-scatter's chunks 0..world-1
            written = self._core.compress(x, send, unit=unit, chunk=world + rank, world=world, rank=rank,
                                          residual=e)
        except TypeError as err:
            if dev == "cpu":
                raise
            if self._wire.gather_explicit:  # asked for by name: say that it cannot run here
                raise TypeError(f"allgather_compress: {self._core.method}'s single-payload codec does not take "
                                f"tensors on {x.device} ({err}); leave the key unset (the all-gather then goes "
                                f"uncompressed on {dev}) or set it false") from err
            self._device_ok[dev] = False  # the default on a device without the codec: uncompressed
            return None
        self._device_ok[dev] = True
        return written

    def _compressed(self, reduced, grad, unit, ranks) -> str:
        """Encode this rank's shard (plus its residual), all-gather the payloads, decode them all:
        _SENT. With nothing changed, _NO_CODEC where the device has no single-payload codec yet and
        _NO_GAIN where a data-dependent payload came out no smaller than the raw shard on some rank
        (every rank sees the same sizes, so they all turn back together)."""
        core, wire, buffers = self._core, self._wire, self._buffers
        shard, n = reduced.numel(), grad.numel()
        world, rank, dev = ranks.world, ranks.rank, reduced.device
        x = buffers.typed("gather_x", shard, torch.float32, dev)
        x.copy_(reduced)  # the encode input
        e, kept = None, None
        if wire.error_feedback:  # the unit's residual in the State's "gather" slot, in place
            # in residual_dtype (int8: packed as compress() takes it, csrc/common/fc_res8.h)
            e = core.residual(unit, "gather", x)
            if wire.varsize:
                kept = buffers.typed("gather_e_kept", e.numel(), e.dtype, dev)
                kept.copy_(e)  # restored if the payloads do not pay
        elif wire.zero_nonfinite:  # "zero" mode's NaN/Inf of the shard become e = 0
            e = buffers.typed("gather_e0", shard, torch.float32, dev)
            e.zero_()
        bound = self._slot(shard, unit, world) if not wire.varsize else core.payload_bytes(shard)
        send = buffers.bytes("gather_send", bound, dev)
        # g' = x + e and e = g' - D(C(g')) as the C driver's reduce-scatter makes them
        # (csrc/common/fc_range.h)
        written = self._encode(x, send, e, unit, world, rank)
        if written is None:
            return _NO_CODEC
        slot = bound
        if wire.varsize:  # data-dependent size: the largest payload sets the slot
            slot = self._largest_payload(written, ranks, dev)
            if slot >= shard * grad.element_size():
                if kept is not None:
                    e.copy_(kept)  # the raw shard goes out: the residual waits, as it was
                return _NO_GAIN  # most values passed on some rank: the raw shards cost less
            send[written:slot].zero_()  # no stale bytes on the wire past a shorter payload
        elif written < slot:  # a parts table's shorter shard payload: the same
            send[written:slot].zero_()
        recv = buffers.bytes("gather_recv", slot * world, dev)
        self._timed(lambda r, s: _all_gather_single(r, s, group=ranks.group), recv, send[:slot],
                    bytes_sent=(world - 1) * slot, bytes_raw=(world - 1) * shard * grad.element_size())
        full = buffers.typed("gather_full", shard * world, torch.float32, dev)
        full.zero_()
        for r in range(world):
            core.decompress(recv[r * slot:r * slot + slot], full[r * shard:(r + 1) * shard],
                            unit=unit, chunk=world + r, world=world)
        grad.copy_(full[:n].view_as(grad))
        return _SENT

    def _largest_payload(self, written: int, ranks, device) -> int:
        """Every rank's payload size, all-gathered (one extra collective): the largest, which every
        payload slot is sized to."""
        mine = torch.tensor([written], dtype=torch.int64, device=device)
        every = torch.empty(ranks.world, dtype=torch.int64, device=device)
        self._timed(lambda e, m: _all_gather_single(e, m, group=ranks.group), every, mine,
                    bytes_sent=8 * (ranks.world - 1), extra=True)
        return int(every.max())
