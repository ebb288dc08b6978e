"""The all-gather half of an all-reduce (DDP, FSDP1 NO_SHARD, FSDP2's replica all-reduce): the
reduced shards go back to every rank compressed with the state's method (`allgather_compress`,
the default) or in the gradient's dtype. Compressed, every rank, the owner included, decodes
every payload, so the replicas stay bit-identical; the shard's own error-feedback residual
(when error feedback is on) is kept per unit in ``residuals``.

The uncompressed all-gather is used where compressing would not pay or cannot run: a unit below
`min_numel`; a payload no smaller than the raw shard (`none`, 16-bit casts of 16-bit gradients,
a sketch table larger than the shard: counted in fallback_units, as the reduce-scatter's own
fallback is); and a device where the method has no single-payload codec (learned from the first
compress() there, not a list kept here: on CUDA every method has one, unless the loaded library
lacks the method's kernels; asked for explicitly, `"allgather_compress": true`, that is a
TypeError instead). On CUDA tensors every step queues on the current stream, with no
wait on the host, except a data-dependent method's size exchange."""
from __future__ import annotations

import weakref

import torch

from ._dist import all_gather_single as _all_gather_single


# Whether an exchange's single-payload compress() took tensors of a device type: learned from the
# first call there (its argument checks run before anything changes, so a refusal costs nothing).
_DEVICE_OK: "weakref.WeakKeyDictionary[object, dict[str, bool]]" = weakref.WeakKeyDictionary()

# What a compressed all-gather attempt came to.
_SENT, _NO_GAIN, _NO_CODEC = "sent", "no gain", "no codec"


def all_gather_shards(ex, reduced: torch.Tensor, grad: torch.Tensor, unit: int, ranks,
                      residuals: dict[int, torch.Tensor]) -> None:
    """grad[:n] = every rank's reduced shard (reduced: this rank's), compressed on the wire
    where that pays; the same bits on every rank either way. ex: the state's Exchange (its
    core, wire config, buffers and counted collectives); ranks: its Ranks."""
    wire = ex.wire
    if not wire.gather_compressed or grad.numel() < wire.min_numel:
        return _plain(ex, reduced, grad, ranks, fallback=False)
    # a fixed-size payload no smaller than the raw shard: decided from sizes, alike on every rank
    raw = reduced.numel() * grad.element_size()
    if not wire.varsize and ex.core.payload_bytes(reduced.numel()) >= raw:
        return _plain(ex, reduced, grad, ranks, fallback=ex.core.method != "none")
    outcome = _compressed(ex, reduced, grad, unit, ranks, residuals)
    if outcome != _SENT:
        _plain(ex, reduced, grad, ranks, fallback=outcome == _NO_GAIN)


def _plain(ex, reduced, grad, ranks, *, fallback: bool) -> None:
    """The all-gather in the gradient's dtype: what an uncompressed all-reduce sends."""
    shard, n, world = reduced.numel(), grad.numel(), ranks.world
    gathered = ex.buffers.like("gathered", shard * world, grad)
    nbytes = (world - 1) * shard * grad.element_size()
    ex.timed(lambda g, r: _all_gather_single(g, r, group=ranks.group), gathered, reduced,
             bytes_sent=nbytes, bytes_raw=nbytes, fallback=fallback)
    grad.copy_(gathered[:n].view_as(grad))


def _encode(ex, x: torch.Tensor, send: torch.Tensor, e: torch.Tensor | None, unit: int, world: int,
            rank: int) -> int | None:
    """compress() of this rank's shard (plus its residual e, which it replaces) into send; None
    where the device has no codec yet (nothing changed)."""
    known = _DEVICE_OK.setdefault(ex, {})
    dev = x.device.type
    if known.get(dev) is False:
        return None
    try:
        # chunk index world + r: a random stream apart from the reduce-scatter's chunks 0..world-1
        written = ex.core.compress(x, send, unit=unit, chunk=world + rank, world=world, rank=rank,
                                   residual=e)
    except TypeError as err:
        if dev == "cpu":
            raise
        if ex.wire.gather_explicit:  # asked for by name: say that it cannot run here
            raise TypeError(f"allgather_compress: {ex.core.method}'s single-payload codec does not take "
                            f"tensors on {x.device} ({err}); leave the key unset (the all-gather then goes "
                            f"uncompressed on {dev}) or set it false") from err
        known[dev] = False  # the default on a device without the codec: uncompressed, not an error
        return None
    known[dev] = True
    return written


def _compressed(ex, reduced, grad, unit, ranks, residuals) -> str:
    """Encode this rank's shard (plus its residual), all-gather the payloads, decode them all:
    _SENT. With nothing changed, _NO_CODEC where the device has no single-payload codec yet and
    _NO_GAIN where a data-dependent payload came out no smaller than the raw shard on some rank
    (every rank sees the same sizes, so they all turn back together)."""
    core, shard, n = ex.core, reduced.numel(), grad.numel()
    world, rank, dev = ranks.world, ranks.rank, reduced.device
    x = ex.buffers.typed("gather_x", shard, torch.float32, dev)
    x.copy_(reduced)  # the encode input
    e, kept = None, None
    if ex.wire.error_feedback:  # the unit's residual, kept once the payloads went out
        # fp32, or with residual_dtype "int8" packed as compress() takes it (csrc/fc_res8.h)
        numel, dtype = (core.residual_numel(shard), torch.uint8) if ex.wire.residual_int8 else (shard, torch.float32)
        e = residuals.get(unit)
        if e is None or e.numel() != numel or e.dtype != dtype:
            e = torch.zeros(numel, dtype=dtype, device=dev)
        elif ex.wire.varsize:
            kept = ex.buffers.typed("gather_e_kept", numel, dtype, dev)
            kept.copy_(e)  # restored if the payloads do not pay
    elif ex.wire.zero_nonfinite:  # "zero" mode's NaN/Inf of the shard become e = 0
        e = ex.buffers.typed("gather_e0", shard, torch.float32, dev)
        e.zero_()
    bound = core.payload_bytes(shard)
    send = ex.buffers.bytes("gather_send", bound, dev)
    # g' = x + e and e = g' - D(C(g')) as the C driver's reduce-scatter makes them (csrc/fc_range.h)
    written = _encode(ex, x, send, e, unit, world, rank)
    if written is None:
        return _NO_CODEC
    slot = bound
    if ex.wire.varsize:  # data-dependent size: the largest payload sets the slot
        slot = _largest_payload(ex, written, ranks, dev)
        if slot >= shard * grad.element_size():
            if kept is not None:
                e.copy_(kept)  # the raw shard goes out: the residual waits, as it was
            return _NO_GAIN  # most values passed on some rank: the raw shards cost less
        send[written:slot].zero_()  # no stale bytes on the wire past a shorter payload
    recv = ex.buffers.bytes("gather_recv", slot * world, dev)
    ex.timed(lambda r, s: _all_gather_single(r, s, group=ranks.group), recv, send[:slot],
             bytes_sent=(world - 1) * slot, bytes_raw=(world - 1) * shard * grad.element_size())
    full = ex.buffers.typed("gather_full", shard * world, torch.float32, dev)
    full.zero_()
    for r in range(world):
        core.decompress(recv[r * slot:r * slot + slot], full[r * shard:(r + 1) * shard],
                        unit=unit, chunk=world + r, world=world)
    if ex.wire.error_feedback:
        residuals[unit] = e
    grad.copy_(full[:n].view_as(grad))
    return _SENT


def _largest_payload(ex, written: int, ranks, device) -> int:
    """Every rank's payload size, all-gathered (one extra collective): the largest, which every
    payload slot is sized to."""
    mine = torch.tensor([written], dtype=torch.int64, device=device)
    every = torch.empty(ranks.world, dtype=torch.int64, device=device)
    ex.timed(lambda e, m: _all_gather_single(e, m, group=ranks.group), every, mine,
             bytes_sent=8 * (ranks.world - 1), extra=True)
    return int(every.max())
