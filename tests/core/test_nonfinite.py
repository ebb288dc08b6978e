"""NaN/Inf in gradients: "nonfinite": "zero" zeroes and counts them in every chunk,
the rank's own included, and a chunk that held one does not keep a residual that was already
sent: e becomes g' - D(C(g')) where both are finite, g' where only the decode is not (nothing
of it arrived), and 0 where g' itself is not; "zero" mode zeroes the gradient's NaN, so there
g' = e and the residual still goes out (docs/design.md, "Non-finite gradients")."""
import torch

import fsdpcomp
from helpers.wire_sim import end_step, exchange


def test_zero_mode_zeroes_and_counts_the_own_chunk():
    s = fsdpcomp.CommState("int8", {"nonfinite": "zero"})  # one rank: the own chunk stays exact
    g = torch.randn(64)
    g[3], g[10] = float("nan"), float("-inf")
    out = torch.empty(64)
    s.reduce_scatter(g, out)
    assert torch.isfinite(out).all()
    assert out[3] == 0 and out[10] == 0 and torch.equal(out[:3], g[:3])
    assert s.counters()["nonfinite_in"] == 2


def test_zero_mode_own_chunk_at_two_ranks():
    states = [fsdpcomp.CommState("int8", {"nonfinite": "zero"}) for _ in range(2)]
    grads = [torch.randn(64), torch.randn(64)]
    grads[0][5] = float("nan")    # rank 0's own chunk
    grads[1][40] = float("inf")   # rank 1's own chunk
    grads[1][7] = float("nan")    # rank 1's payload to rank 0
    outs = [torch.empty(32), torch.empty(32)]
    exchange(states, grads, outs)
    for o in outs:
        assert torch.isfinite(o).all()
    assert states[0].counters()["nonfinite_in"] == 1
    assert states[1].counters()["nonfinite_in"] == 2


def test_pass_mode_counts_the_own_chunk_too():
    s = fsdpcomp.CommState("int8")
    g = torch.randn(64)
    g[3] = float("nan")
    out = torch.empty(64)
    s.reduce_scatter(g, out)
    assert torch.isnan(out[3]) and s.counters()["nonfinite_in"] == 1


def _ef(nonfinite):
    return fsdpcomp.CommState("int8", {"error_feedback": True, "compress_own_chunk": True,
                                       "block_size": 8, "nonfinite": nonfinite})


def test_a_nonfinite_chunk_does_not_keep_its_sent_residual():
    for mode in ("pass", "zero"):
        s = _ef(mode)
        out = torch.empty(64)
        s.reduce_scatter(torch.randn(64) * 3, out)
        s.end_step()
        e1 = s._core.residuals()[0].clone()
        assert e1.abs().sum() > 0
        g = torch.randn(64)
        g[3] = float("nan")
        s.reduce_scatter(g, out)
        s.end_step()
        e2 = s._core.residuals()[0]
        assert torch.isfinite(e2).all(), mode
        x = g + e1  # g' of this step
        finite = torch.isfinite(out)
        if mode == "zero":
            x[3] = e1[3]  # the gradient's NaN is zeroed; the residual still goes out
            assert finite.all()
        # the telescoping identity where something arrived: g' = D + e
        torch.testing.assert_close((out + e2)[finite], x[finite], atol=1e-5, rtol=0)
        # nothing arrived for the NaN's block (pass): e keeps g' there, and 0 for the NaN itself
        if mode == "pass":
            assert not finite[:8].any()
            assert e2[3] == 0
            torch.testing.assert_close(e2[[0, 1, 2, 4, 5, 6, 7]], x[[0, 1, 2, 4, 5, 6, 7]])


def test_residual_is_never_delivered_twice():
    # zero mode, one rank: everything sent arrives, so sum(outputs) + e_T = sum(finite inputs)
    s = _ef("zero")
    total, outs = torch.zeros(64, dtype=torch.float64), torch.zeros(64, dtype=torch.float64)
    gen = torch.Generator().manual_seed(5)
    for step in range(6):
        g = torch.randn(64, generator=gen)
        if step in (2, 3):
            g[11 + step] = float("nan")
        out = torch.empty(64)
        s.reduce_scatter(g, out)
        s.end_step()
        total += torch.where(torch.isfinite(g), g, 0).double()
        outs += out.double()
    e = s._core.residuals()[0].double()
    torch.testing.assert_close(outs + e, total, atol=1e-4, rtol=0)


FMAX = torch.finfo(torch.float32).max


def rule(x: float, d: float) -> float:
    """fc_range.h's residual where x - D is not finite, from g' (x) and the decode D, element by
    element: 0 where x went on the wire, x where D is NaN, x minus fp32's largest value of D's
    sign where D is +-Inf (saturated), else the overflowed sum saturated."""
    t = torch.tensor
    if not torch.isfinite(t(x)):
        return 0.0
    if d != d:
        return x
    if d in (float("inf"), float("-inf")):
        s = (t(x, dtype=torch.float32) - t(FMAX if d > 0 else -FMAX, dtype=torch.float32)).item()
        return s if abs(s) <= FMAX else (FMAX if s > 0 else -FMAX)
    return FMAX if x - d > 0 else -FMAX


def test_the_residual_is_decided_per_element():
    """One pass on the GPU writes a residual before it knows whether its chunk holds NaN/Inf, so
    the rule is the same for every chunk (docs/decisions.md, 2026-11-28): here a chunk with a NaN
    and an Inf sent in "pass" mode, values near fp32's largest and random-k's nc decode that
    overflows to +-Inf on finite input. Where g' or D is not finite the residual is the rule's,
    elsewhere g' - D."""
    from helpers.method_cases import CASES
    gen = torch.Generator().manual_seed(21)
    n = 4096
    x = torch.randn(n, generator=gen)
    x[:64] = FMAX * torch.sign(torch.randn(64, generator=gen))
    x[64:128] = 3e38 * torch.rand(64, generator=gen)
    x[700], x[1500] = float("nan"), float("-inf")
    seen_inf = seen_nan = 0
    for method, cfg in [("fp16", {}), ("bf16", {}), ("int8", {})] + CASES:
        st = fsdpcomp._C.State(method, dict(cfg, seed=3))
        buf = torch.zeros(st.payload_bytes(n), dtype=torch.uint8)
        e = torch.zeros(n)
        w = st.compress(x.clone(), buf, residual=e)
        d = torch.zeros(n)
        st.decompress(buf[:w], d)
        assert torch.isfinite(e).all(), (method, cfg)
        odd = ~torch.isfinite(x) | ~torch.isfinite(d) | ~torch.isfinite(x - d)
        for i in odd.nonzero().flatten().tolist():
            assert e[i].item() == rule(x[i].item(), d[i].item()), (method, cfg, i, x[i], d[i], e[i])
        seen_inf += int(torch.isinf(d[torch.isfinite(x)]).sum())
        seen_nan += int(torch.isnan(d[torch.isfinite(x)]).sum())
        torch.testing.assert_close(e[~odd], (x - d)[~odd], rtol=0, atol=0, msg=f"{method} {cfg}")
    assert seen_inf > 0 and seen_nan > 0  # both of the rule's decode cases met
