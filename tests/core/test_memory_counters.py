"""The memory a state holds, in its counters: residual_bytes is the bytes of the residual
tensors it keeps (each residual dtype, powersgd's e too), buffer_bytes those of its buffers,
buffer_peak_bytes the most held at once, a regrown buffer's old one included. One rank; the
all-gather halves' residuals and FSDP2 are in tests/distributed/test_rank_memory.py."""
import pytest
import torch

import fsdpcomp
from fsdpcomp._buffers import Buffers


def _bytes(tensors) -> int:
    """Bytes of the distinct storages: what is really held, whatever views the state keeps."""
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def _held(state):
    residuals = [t for slot in ("scatter", "gather", "factors") for t in state._core.residuals(slot) if t is not None]
    return _bytes(residuals), _bytes(state._reducer.exchange.buffers._bufs.values())


def test_buffers_count_what_they_hold_and_the_peak_of_a_regrowth():
    b = Buffers()
    assert (b.held_bytes, b.peak_bytes, b.by_kind()) == (0, 0, {})
    b.bytes("send", 3000, torch.device("cpu"))
    b.typed("acc", 10, torch.float32, torch.device("cpu"))  # 40 bytes: at least 1024 are kept
    assert b.held_bytes == b.peak_bytes == 3000 + 1024
    b.bytes("send", 2000, torch.device("cpu"))  # fits: nothing new
    assert b.held_bytes == 3000 + 1024
    b.bytes("send", 5000, torch.device("cpu"))  # regrown: the old 3000 lived while 5000 were made
    assert b.held_bytes == 5000 + 1024 and b.peak_bytes == 3000 + 1024 + 5000
    assert b.by_kind() == {"send": 5000, "acctorch.float32": 1024}
    b.reset_peak()
    assert b.peak_bytes == b.held_bytes


@pytest.mark.parametrize("residual_dtype", ["fp32", "bf16", "int8"])
def test_counters_are_the_tensors_held(gen, residual_dtype):
    try:
        state = fsdpcomp.CommState("topk", {"ratio": 0.1, "compress_own_chunk": True,
                                            "residual_dtype": residual_dtype})
    except ValueError as e:  # the 8-bit residual comes with fsdpcomp's int8 residual support
        pytest.skip(f"residual_dtype {residual_dtype} not accepted here: {e}")
    c = state.counters()
    assert (c["residual_bytes"], c["buffer_bytes"], c["buffer_peak_bytes"]) == (0, 0, 0)
    sizes = (1000, 40000)  # the second unit regrows the first one's buffers
    for _ in range(2):
        for n in sizes:
            state.reduce_scatter(torch.randn(n, generator=gen), torch.empty(n))
        state.end_step()
    c = state.counters()
    residual, buffers = _held(state)
    per_element = {"fp32": 4, "bf16": 2, "int8": 1 + 4 / 64}[residual_dtype]
    assert c["residual_bytes"] == residual == pytest.approx(per_element * sum(sizes), rel=0.01)
    assert c["buffer_bytes"] == buffers > 0
    assert c["buffer_peak_bytes"] > c["buffer_bytes"]  # the first unit's buffers, while regrown
    state.reset_counters()  # held memory is not a count: it stays; the peak restarts from it
    c = state.counters()
    assert (c["residual_bytes"], c["buffer_bytes"], c["buffer_peak_bytes"]) == (residual, buffers, buffers)


@pytest.mark.parametrize("residual_dtype", ["fp32", "int8"])
def test_powersgd_counts_its_e(residual_dtype):
    try:
        state = fsdpcomp.CommState("powersgd", {"start_iter": 0, "rank": 2, "compress_own_chunk": True,
                                                "residual_dtype": residual_dtype})
    except ValueError as e:
        pytest.skip(f"residual_dtype {residual_dtype} not accepted here: {e}")
    layout = fsdpcomp._layout.Layout.of_shapes([(48, 32)])
    g = torch.Generator().manual_seed(3)
    for _ in range(2):
        state.reduce_scatter(torch.randn(48 * 32, generator=g), torch.empty(48 * 32), matrices=layout)
        state.end_step()
    c = state.counters()
    residual, buffers = _held(state)
    per_element = {"fp32": 4, "int8": 1 + 4 / 64}[residual_dtype]
    assert c["residual_bytes"] == residual == pytest.approx(per_element * 48 * 32, rel=0.01)
    assert c["buffer_bytes"] == buffers  # powersgd's factors live only within a call
