# What one rank holds, counted from the tensors themselves: FSDP2's sharded parameters, gradients and optimizer state, and a CommState's residuals and buffers.
"""Used by mem_worker.py. Bytes are those of the distinct storages the tensors live in (a DTensor
counts its local tensor's), so a padded shard counts its padding and the gradients that FSDP2
keeps as views of one reduce-scatter output count that output once. The CommState's part walks
the tensors it keeps, not its counters: the worker compares the two."""
from __future__ import annotations

import torch


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)  # a DTensor: this rank's shard
    return to_local() if to_local is not None else t


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages the tensors live in."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        st = _local(t).untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def params_bytes(model: torch.nn.Module) -> int:
    return storage_bytes(model.parameters())


def grads_bytes(model: torch.nn.Module) -> int:
    return storage_bytes(p.grad for p in model.parameters())


def optimizer_bytes(opt: torch.optim.Optimizer) -> int:
    """Every tensor of the optimizer's state (AdamW: exp_avg, exp_avg_sq and its step counters)."""
    return storage_bytes(v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor))


def residual_tensors(state) -> list[torch.Tensor]:
    """Every residual tensor a CommState keeps (private members, read on purpose: the point is to
    count what is there, not what the counters say): the C core's, every slot (the
    reduce-scatter's, the all-gather halves', powersgd's e)."""
    return [t for slot in ("scatter", "gather", "factors") for t in state._core.residuals(slot) if t is not None]


def residual_bytes(state) -> int:
    return storage_bytes(residual_tensors(state))


def buffer_bytes(state) -> dict[str, int]:
    """The collectives' buffers per kind, from the tensors the state's Buffers keep."""
    out: dict[str, int] = {}
    for (kind, _), buf in state._reducer.exchange.buffers._bufs.items():
        out[kind] = out.get(kind, 0) + buf.untyped_storage().nbytes()
    return out


def rss_bytes() -> int:
    """This process's resident set now (Linux /proc/self/statm)."""
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
