"""The compressed all-gather half of an all-reduce (``"allgather_compress": true``): every rank
encodes its reduced shard with the state's method, the payloads are all-gathered, and every
rank, the owner included, decodes all of them, so the replicas stay bit-identical. The shard's
own error-feedback residual (when error feedback is on) is kept per unit in ``residuals``."""
from __future__ import annotations

import torch
import torch.distributed as dist

_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def compressed_all_gather(state, reduced: torch.Tensor, grad: torch.Tensor, unit: int,
                          world: int, rank: int, residuals: dict[int, torch.Tensor]) -> None:
    """grad[:n] = the decoded shards of every rank (reduced: this rank's averaged shard). On
    CUDA tensors every step queues on the current stream (State.compress/decompress run the
    method's kernels; the payload bytes are the CPU's), with no wait on the host."""
    core, shard, n = state._core, reduced.numel(), grad.numel()
    x = state._typed_buffer("gather_x", shard, torch.float32, reduced.device)
    x.copy_(reduced)  # the encode input, and the residual's reference
    use_ef = state._ef
    if use_ef:
        e = residuals.get(unit)
        if e is None or e.numel() != shard or e.device != reduced.device:
            e = residuals[unit] = torch.zeros(shard, dtype=torch.float32, device=reduced.device)
        x += e
    payload_bytes = core.payload_bytes(shard)
    send = state._buffer("gather_send", payload_bytes, reduced.device)
    # chunk index world + r: a random stream apart from the reduce-scatter's chunks 0..world-1
    core.compress(x, send, unit=unit, chunk=world + rank, world=world, rank=rank)
    recv = state._buffer("gather_recv", payload_bytes * world, reduced.device)
    state._collective(send, lambda: _all_gather_single(recv, send, group=state.process_group),
                      bytes_sent=(world - 1) * payload_bytes,
                      bytes_raw=(world - 1) * shard * grad.element_size())
    full = state._typed_buffer("gather_full", shard * world, torch.float32, reduced.device)
    full.zero_()
    for r in range(world):
        core.decompress(recv[r * payload_bytes:(r + 1) * payload_bytes], full[r * shard:(r + 1) * shard],
                        unit=unit, chunk=world + r, world=world)
    if use_ef:
        torch.sub(x, full[rank * shard:(rank + 1) * shard], out=residuals[unit])
    grad.copy_(full[:n].view_as(grad))
