"""residual_dtype "int8" (csrc/common/fc_res8.h): about one byte per element whatever the method, a pack
that is unbiased and deterministic, the same payloads from encode() and the per-peer parts,
checkpoints that keep the packed bytes, and clear errors for a residual of the wrong shape.
The CUDA kernels' equality with these is tests/cuda/test_cuda_res8.py's."""
import io

import pytest
import torch

import fsdpcomp
from fsdpcomp._layout import Layout
from helpers.ckpt import own, with_own

EF = {"error_feedback": True, "compress_own_chunk": True, "residual_dtype": "int8"}
METHODS = [("topk", {"ratio": 0.05}), ("int8", {}), ("onebit", {}), ("signsgd", {}),
           ("randomk", {"ratio": 0.25, "quantize": "intN"}), ("sketch", {"rows": 3, "cols": 64, "k": 8})]


def packed_bytes(n: int) -> int:
    """The layout docs/design.md states: one fp32 scale per block of 64 values, one byte each."""
    return 4 * ((n + 63) // 64) + n


def unpacked(state, e: torch.Tensor, n: int) -> torch.Tensor:
    out = torch.empty(n)
    state._core.unpack_residual(e, out)
    return out


@pytest.mark.parametrize("method,cfg", METHODS, ids=str)
def test_residual_is_about_one_byte_per_element(method, cfg, gen):
    st = fsdpcomp.CommState(method, dict(cfg, **EF))
    sizes = (5000, 70001)
    for step in range(2):
        for key, n in zip("ab", sizes):
            st.reduce_scatter(torch.randn(n, generator=gen), torch.empty(n), key)
        st.end_step()
    res = st._core.residuals()
    assert [r.dtype for r in res] == [torch.uint8, torch.uint8]
    assert [r.numel() for r in res] == [packed_bytes(n) for n in sizes]
    assert st.counters()["residual_bytes"] == sum(packed_bytes(n) for n in sizes)
    assert st.counters()["residual_bytes"] <= 1.1 * sum(sizes)
    assert all(r.any() for r in res), "the residuals stayed zero"


def test_pack_is_within_one_step_deterministic_and_keyed_by_unit(gen):
    st = fsdpcomp.CommState("topk", EF)
    e = torch.randn(1000, generator=gen) * torch.logspace(-3, 3, 1000)  # blocks of very unequal scale
    a, b, c = (torch.zeros(packed_bytes(1000), dtype=torch.uint8) for _ in range(3))
    st._core.pack_residual(e, a, unit=3)
    st._core.pack_residual(e, b, unit=3)
    st._core.pack_residual(e, c, unit=4)
    assert torch.equal(a, b) and not torch.equal(a, c)
    err = (unpacked(st, a, 1000) - e).abs()
    block_amax = torch.nn.functional.pad(e, (0, 24)).view(-1, 64).abs().amax(dim=1)
    step = (block_amax / 127).repeat_interleave(64)[:1000]
    assert bool((err <= step * 1.0001).all()) and float(err.max()) > 0


def test_pack_is_unbiased_where_round_to_nearest_would_lose_a_small_component():
    """A value at 0.3 of the block's step: round-to-nearest codes 0 every time (the component
    never reaches the wire); stochastic rounding keeps it on average."""
    st = fsdpcomp.CommState("topk", EF)
    e = torch.zeros(64)
    e[0] = 127.0  # scale 1.0
    e[1:] = 0.3
    p = torch.zeros(packed_bytes(64), dtype=torch.uint8)
    mean = torch.zeros(64)
    for unit in range(400):
        st._core.pack_residual(e, p, unit=unit)
        mean += unpacked(st, p, 64)
    mean /= 400
    assert float(mean[0]) == 127.0
    assert abs(float(mean[1:].mean()) - 0.3) < 0.02


def test_all_zero_and_tiny_blocks_pack_to_zero_codes():
    st = fsdpcomp.CommState("topk", EF)
    e = torch.zeros(128)
    e[64:] = 1e-44  # amax / 127 underflows to 0: the block codes 0
    p = torch.full((packed_bytes(128),), 0xA5, dtype=torch.uint8)
    st._core.pack_residual(e, p)
    assert not p.any()


def test_a_saturated_residual_unpacks_finite_and_is_not_taken_for_a_gradient_nan(gen):
    """A residual that saturated holds fp32's largest value (fc_max_like); its 8-bit block's
    scale amax / 127 made code 127 unpack to Inf before (127 * scale rounded past fp32), so the
    next g' counted a NaN/Inf the gradient never had, and "zero" mode sent that Inf as e."""
    st = fsdpcomp.CommState("topk", {"ratio": 0.1, "residual_dtype": "int8"})
    top = torch.finfo(torch.float32).max
    for amax in (top, 3.4028232e38, 3e38, 1.0):
        e = torch.randn(130, generator=gen) * (amax / 4)
        e[::7] = amax
        e[3] = -amax
        packed = torch.zeros(st._core.residual_numel(130), dtype=torch.uint8)
        st._core.pack_residual(e, packed)
        out = torch.empty(130)
        st._core.unpack_residual(packed, out)
        assert torch.isfinite(out).all(), amax
        assert (out - e).abs().max() <= amax / 127 * 1.01, amax  # within one code step still
    # through a codec: what topk does not send stays in e, so g + e overflows and the residual
    # saturates at fp32's largest value
    for mode in ("pass", "zero"):
        s = fsdpcomp.CommState("topk", dict(EF, ratio=0.01, nonfinite=mode))
        for _ in range(3):
            g = torch.full((256,), 3e38)
            s.reduce_scatter(g, torch.empty(256), "w")
            s.end_step()
        assert s.counters()["nonfinite_in"] == 0 and s.counters()["saturated"] > 0, mode


def test_error_feedback_keeps_what_was_not_sent_to_the_residual_step(gen):
    st = fsdpcomp.CommState("topk", dict(EF, ratio=0.05))
    n = 3000
    e_old = torch.zeros(n)
    for _ in range(3):
        g = torch.randn(n, generator=gen)
        out = torch.empty(n)
        st.reduce_scatter(g, out)
        st.end_step()
        e = unpacked(st, st._core.residuals()[0], n)
        amax = torch.nn.functional.pad(g + e_old - out, (0, 64 - n % 64)).view(-1, 64).abs().amax(dim=1)
        bound = (amax / 127).repeat_interleave(64)[:n] * 1.001
        assert bool(((out + e) - (g + e_old)).abs().le(bound).all())
        e_old = e


def test_per_peer_parts_send_and_keep_what_encode_does(gen):
    n, world, rank = 4099, 3, 1
    cfg = dict(EF, compress_own_chunk=False, ratio=0.1)
    whole, parts = fsdpcomp.CommState("topk", cfg), fsdpcomp.CommState("topk", cfg)
    for _ in range(2):
        g = torch.randn(n, generator=gen)
        uw, up = whole._core.begin(n), parts._core.begin(n)
        ss, _ = whole._core.plan(g, world, rank)
        a = torch.zeros(sum(ss), dtype=torch.uint8)
        whole._core.encode(g, a, world, rank, uw)
        send, _ = parts._core.pieces(g, world, rank)
        b = torch.zeros(sum(sum(p) for p in send), dtype=torch.uint8)
        for c in (2, 0, 1):  # any chunk order; the last part packs the residual
            for piece in range(len(send[c])):
                parts._core.encode_part(g, b, world, rank, up, c, piece)
        assert torch.equal(a, b)
        assert torch.equal(whole._core.residuals()[0], parts._core.residuals()[0])
        whole.end_step()
        parts.end_step()


def _encode_parts(state, g, world, rank, order):
    """One call's per-peer parts, the chunks in `order`, each chunk's pieces in turn: the send buffer."""
    unit = state._core.begin(g.numel())
    send, _ = state._core.pieces(g, world, rank)
    b = torch.zeros(sum(sum(p) for p in send), dtype=torch.uint8)
    for c in order:
        for piece in range(len(send[c])):
            state._core.encode_part(g, b, world, rank, unit, c, piece)
    return b


@pytest.mark.parametrize("own", [True, False], ids=["own-compressed", "own-exact"])
def test_parts_in_any_order_pack_the_same_bytes(own, gen):
    """The CPU packs in place: a 64-block that a chunk or piece boundary cuts waits in a carry until
    its last value is written. Pieces of 100 and 8 ranks cut many blocks; whatever the chunks'
    order (_exchange.py's, ascending, shuffled), the residual and payloads are the same bytes, and
    _exchange.py's order needs 3 carry slots at most (scratch_bytes the same for every W)."""
    n, world, rank = 6007, 8, 3
    cfg = dict(EF, compress_own_chunk=own, pipeline_piece=100)
    fsdp = [(rank - k) % world for k in range(1, world)] + [rank]
    orders = [fsdp, list(range(world)), [5, 0, 7, 3, 1, 6, 2, 4]]
    states = [fsdpcomp.CommState("int8", cfg) for _ in orders]
    for _ in range(2):
        g = torch.randn(n, generator=gen)
        sends = []
        for st, order in zip(states, orders):
            sends.append(_encode_parts(st, g, world, rank, order))
        for st, b in zip(states[1:], sends[1:]):
            assert torch.equal(sends[0], b)
            assert torch.equal(states[0]._core.residuals()[0], st._core.residuals()[0])
        for st in states:
            st.end_step()
    x = states[0].counters()["scratch_bytes"]
    fresh = fsdpcomp.CommState("int8", dict(cfg, residual_dtype="fp32"))
    _encode_parts(fresh, g, world, rank, fsdp)
    assert x - fresh.counters()["scratch_bytes"] == 3 * 272 + 16  # three slots, 64-byte rounded


def test_checkpoint_keeps_the_packed_bytes(gen):
    cfg = dict(EF, ratio=0.05)
    a = fsdpcomp.CommState("topk", cfg)
    for _ in range(2):
        a.reduce_scatter(torch.randn(777, generator=gen), torch.empty(777), "w")
        a.end_step()
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b = fsdpcomp.CommState("topk", cfg)
    b.load_state_dict(torch.load(buf))
    assert torch.equal(own(b.state_dict()).residuals["scatter"][0], a._core.residuals()[0])
    g = torch.randn(777, generator=gen)
    oa, ob = torch.empty(777), torch.empty(777)
    a.reduce_scatter(g, oa, "w")
    b.reduce_scatter(g, ob, "w")
    assert torch.equal(oa, ob) and torch.equal(a._core.residuals()[0], b._core.residuals()[0])


def test_restore_refuses_a_packed_residual_of_the_wrong_size_or_a_nan_scale():
    st = fsdpcomp.CommState("topk", EF)
    with pytest.raises(ValueError, match="fc_res8_bytes"):
        st._core.restore([100], [torch.zeros(100, dtype=torch.uint8)], 0)
    bad = torch.zeros(packed_bytes(100), dtype=torch.uint8)
    bad[:4].view(torch.float32)[0] = float("nan")
    with pytest.raises(ValueError, match="nan"):
        st._core.restore([100], [bad], 0)
    with pytest.raises(TypeError):
        st._core.restore([100], [torch.zeros(100)], 0)  # an fp32 residual for an int8 state


def _nan_scale(n: int) -> torch.Tensor:
    bad = torch.zeros(packed_bytes(n), dtype=torch.uint8)
    bad[4:8].view(torch.float32)[0] = float("nan")  # block 1's scale
    return bad


@pytest.mark.parametrize("device", ["cpu", "device (emulated)"])
@pytest.mark.parametrize("home", ["residuals", "gather_residuals", "powersgd e"])
def test_every_home_refuses_a_nan_scale_on_restore(home, device, gen):
    """One check (the core's check_residual) for every residual a checkpoint brings: a NaN scale
    of an 8-bit residual is refused by name, whichever home keeps it, and on a device tensor too
    (the emulated State takes the device branch: a copy to the host for the check). The codes'
    bytes are any values, so r.float() of the packed tensor, the old Python check, never saw it."""
    method, cfg = ("powersgd", {"residual_dtype": "int8", "start_iter": 0}) if home == "powersgd e" else ("topk", EF)
    st = fsdpcomp.CommState(method, cfg)
    st.reduce_scatter(torch.randn(200, generator=gen), torch.empty(200), "w")
    st.end_step()
    sd, n = st.state_dict(), 200
    slot = {"residuals": "scatter", "gather_residuals": "gather", "powersgd e": "factors"}[home]
    bad = with_own(sd, residuals=dict(own(sd).residuals, **{slot: [_nan_scale(n)]}))
    fresh = fsdpcomp.CommState(method, cfg)
    if device != "cpu":
        fresh._core._emulate_cuda(True)
    before = fresh.state_dict()
    name = rf"residuals\['{slot}'\]\[0\]"
    with pytest.raises(ValueError, match=name + "'s scale of block 1 is nan"):
        fresh.load_state_dict(bad)
    assert fresh.state_dict() == before  # nothing restored
    fresh.load_state_dict(sd)  # the good one loads


def test_compress_and_pack_refuse_a_residual_of_the_wrong_size():
    st = fsdpcomp.CommState("int8", EF)
    x = torch.randn(100)
    p = torch.zeros(st._core.payload_bytes(100), dtype=torch.uint8)
    with pytest.raises(ValueError, match="expected 108"):
        st._core.compress(x, p, residual=torch.zeros(100, dtype=torch.uint8))
    with pytest.raises(ValueError, match="needs 108"):
        st._core.pack_residual(x, torch.zeros(100, dtype=torch.uint8))
    assert st._core.residual_numel(100) == 108
    assert fsdpcomp.CommState("int8", {"residual_dtype": "bf16"})._core.residual_numel(100) == 100


def test_powersgd_keeps_its_error_packed(gen):
    cfg = {"rank": 2, "residual_dtype": "int8", "start_iter": 0}
    st = fsdpcomp.CommState("powersgd", cfg)
    layout = Layout.of_shapes([(64, 48), (48,)])
    g = torch.randn(64 * 48 + 48, generator=gen)
    for _ in range(2):
        st.all_reduce(g.clone(), "m", matrices=layout)
        st.end_step()
    c = st.counters()
    e = st.state_dict()
    assert c["residual_bytes"] == packed_bytes(g.numel()) and c["residual_norm"] > 0
    other = fsdpcomp.CommState("powersgd", cfg)
    other.load_state_dict(e)
    assert other.counters()["residual_norm"] == pytest.approx(c["residual_norm"])
    out_a, out_b = g.clone(), g.clone()
    st.all_reduce(out_a, "m", matrices=layout)
    other.all_reduce(out_b, "m", matrices=layout)
    assert torch.equal(out_a, out_b)


def test_scratch_bytes_hold_no_unpacked_workspace_on_the_cpu(gen):
    """The CPU reads and packs an 8-bit residual in place: no unit-sized fp32 workspace beside
    the core's buffers (only a carry of straddling blocks, 0 here: the pieces of 4096 of a
    single rank start at multiples of 64)."""
    n = 70001
    got = {}
    for dt in ("fp32", "int8"):
        st = fsdpcomp.CommState("topk", dict(EF, ratio=0.05, residual_dtype=dt))
        st.reduce_scatter(torch.randn(n, generator=gen), torch.empty(n))
        got[dt] = st.counters()["scratch_bytes"]
    assert got["fp32"] >= 4 * n  # at least g' of the chunk in fp32
    assert got["int8"] == got["fp32"]
