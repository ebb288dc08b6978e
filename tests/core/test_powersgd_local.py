"""powersgd in one process: config validation naming the key, method_info and the method lists,
the math of one rank (the mean of one rank is its own rank-r approximation, error feedback
carries the rest), checkpoints (Q and e round-trip; a bad one is refused, changing nothing)."""
import pytest
import torch

import fsdpcomp
from fsdpcomp._layout import Layout
from helpers.ckpt import own, with_own


@pytest.mark.parametrize("config, key", [
    ({"rank": 0}, "rank"), ({"rank": 2.5}, "rank"), ({"rank": True}, "rank"),
    ({"start_iter": -1}, "start_iter"), ({"min_compression_rate": 0.5}, "min_compression_rate"),
    ({"min_compression_rate": float("nan")}, "min_compression_rate"),
    ({"factor_dtype": "fp16"}, "factor_dtype"), ({"error_feedback": 1}, "error_feedback"),
    ({"bogus": 1}, "bogus"), ({"seed": "x"}, "seed"),
    ({"block_size": 256}, "block_size"),  # another method's key
    ({"ef_decay": 1.5}, "ef_decay"), ({"ef_decay": "x"}, "ef_decay"),
])
def test_bad_config_names_the_key(config, key):
    with pytest.raises(ValueError, match=f"'{key}'"):
        fsdpcomp.CommState("powersgd", config)


@pytest.mark.parametrize("method, config, message", [
    ("powersgd", {"rank": 0}, "powersgd config key 'rank' must be in [1, 4096], got 0"),
    ("int8", {"block_size": 3}, "int8 config key 'block_size' must be in [8, 16777216], got 3"),
    ("powersgd", {"rank": "x"}, "powersgd config key 'rank' must be an integer, got str"),
    ("int8", {"block_size": "x"}, "int8 config key 'block_size' must be an integer, got str"),
    ("powersgd", {"factor_dtype": "x"}, "powersgd config key 'factor_dtype' must be one of 'fp32', 'bf16', got 'x'"),
    ("powersgd", {"min_compression_rate": 0.5},
     "powersgd config key 'min_compression_rate' must be in [1, 1e+09], got 0.5"),
])
def test_own_keys_are_checked_from_their_description_as_the_codecs_are(method, config, message):
    """powersgd's keys are validated from their method_info description (_keys.py), worded as
    the C tables' validation words the codecs' keys."""
    with pytest.raises(ValueError) as err:
        fsdpcomp.CommState(method, config)
    assert str(err.value) == message


@pytest.mark.parametrize("key", ["transport", "timeout_s"])
def test_a_removed_key_is_refused_saying_why(key):
    with pytest.raises(ValueError, match=rf"^config key '{key}' was removed: [^;]+; drop the key$"):
        fsdpcomp.CommState("powersgd", {key: 1})


def test_method_lists_and_info():
    assert "powersgd" in fsdpcomp.methods() and "powersgd" not in fsdpcomp.codecs()
    info = fsdpcomp.method_info("powersgd")
    assert {k["name"] for k in info["keys"]} == {"rank", "start_iter", "min_compression_rate", "factor_dtype"}
    assert info["error_feedback_default"] and not info["linear"]
    state = fsdpcomp.CommState("powersgd", '{"rank": 3}')
    assert state.method == "powersgd" and state.config["rank"] == 3 and state.config["error_feedback"]
    assert fsdpcomp.CommState("powersgd", {"error_feedback": False}).config["error_feedback"] is False


def _call(state, g, layout):
    out = g.clone()
    state.all_reduce(out, "u", matrices=layout)
    state.end_step()
    return out


def test_one_rank_is_its_own_low_rank_approximation_with_error_feedback():
    state = fsdpcomp.CommState("powersgd", {"rank": 2, "start_iter": 1})
    layout = Layout.of_shapes([(24, 10), (10,)])
    g = torch.randn(250, generator=torch.Generator().manual_seed(0))
    assert torch.equal(_call(state, g, layout), g)  # start_iter 1: the first step is exact
    out = _call(state, g, layout)
    m = g[:240].view(24, 10)
    assert torch.equal(out[240:], g[240:])  # the vector is summed exactly
    assert torch.linalg.matrix_rank(out[:240].view(24, 10)) == 2
    # P orthonormal: P P^T M is the projection of M on P's span, and e = M - that
    p = torch.linalg.qr(out[:240].view(24, 10))[0][:, :2]
    assert torch.allclose(out[:240].view(24, 10), p @ p.t() @ m, atol=1e-5)
    e = own(state.state_dict()).residuals["factors"][0]
    assert torch.allclose(e[:240], g[:240] - out[:240], atol=1e-6) and not e[240:].any()
    c = state.counters()
    assert c["calls"] == 2 and c["calls_uncompressed"] == 1 and c["elements"] == 500
    assert c["bytes_sent"] == 0  # one rank: nothing on the wire
    assert c["residual_bytes"] == 250 * 4 and c["residual_norm"] == pytest.approx(float(e.norm()), rel=1e-5)


def test_decayed_residual_is_what_the_next_step_gets():
    # g' = g + ef_decay * e, as the chunk codecs' driver does it
    d = 0.5
    state = fsdpcomp.CommState("powersgd", {"rank": 1, "ef_decay": d, "start_iter": 0})
    layout = Layout.of_shapes([(24, 10)])
    gen = torch.Generator().manual_seed(1)
    e = torch.zeros(240)
    for _ in range(3):
        g = torch.randn(240, generator=gen)
        out = _call(state, g, layout)
        e_new = own(state.state_dict()).residuals["factors"][0]
        torch.testing.assert_close(out + e_new, g + d * e, atol=1e-5, rtol=0)
        e = e_new


def test_warmup_steps_are_counted():
    """The exact warm-up (start_iter) is in the counters: per call, and per step once (two units
    a step here); the codecs have none; over ranks the steps are the same steps, not a sum."""
    state = fsdpcomp.CommState("powersgd", {"rank": 1, "start_iter": 2})
    layout = Layout.of_shapes([(24, 10)])
    for _ in range(3):
        for key in ("a", "b"):
            state.all_reduce(torch.randn(240), key, matrices=layout)
        state.end_step()
    c = state.counters()
    assert (c["warmup_steps_exact"], c["warmup_calls_exact"], c["calls_uncompressed"], c["calls"]) == (2, 4, 4, 6)
    both = fsdpcomp.combine_counters([c, c])
    assert both["warmup_steps_exact"] == 2 and both["warmup_calls_exact"] == 8
    state.reset_counters()
    assert state.counters()["warmup_steps_exact"] == 0
    c = fsdpcomp.CommState("int8").counters()
    assert c["warmup_steps_exact"] == 0 and c["warmup_calls_exact"] == 0


def test_small_matrices_and_no_layout_go_exactly():
    state = fsdpcomp.CommState("powersgd", {"rank": 4, "start_iter": 0})
    g = torch.randn(36 + 100)
    # 6x6 at rank 4: 48 factor elements for 36 values; 10x10: 80 for 100 < 2x
    assert torch.equal(_call(state, g, Layout.of_shapes([(6, 6), (10, 10)])), g)
    assert torch.equal(_call(state, g, None), g)
    assert state.counters()["calls_uncompressed"] == 2


def test_checkpoint_round_trip_and_refusal():
    layout = Layout.of_shapes([(24, 10)])
    a = fsdpcomp.CommState("powersgd", {"rank": 1, "start_iter": 0})
    gs = [torch.randn(240, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    for g in gs[:2]:
        _call(a, g, layout)
    saved = a.state_dict()
    part = own(saved).method_state["powersgd"]
    assert set(part) == {"version", "q"} and part["q"][0][0].shape == (10, 1)
    assert own(saved).residuals["factors"][0].shape == (240,)  # e: the core's, in the factors slot
    b = fsdpcomp.CommState("powersgd", {"rank": 1, "start_iter": 0})
    b.load_state_dict(saved)
    for g in gs[2:]:
        assert torch.equal(_call(a, g, layout), _call(b, g, layout))
    bad = with_own(saved, method_state={"powersgd": {"version": 2, "q": {0: [torch.full((10, 1), float("nan"))]}}})
    c = fsdpcomp.CommState("powersgd", {"rank": 1, "start_iter": 0})
    with pytest.raises(ValueError, match="NaN"):
        c.load_state_dict(bad)
    with pytest.raises(ValueError, match="unit"):
        c.load_state_dict(with_own(saved, method_state={"powersgd": {"version": 2, "q": {7: []}}}))
    with pytest.raises(ValueError, match="version"):  # format 3 holds version 2 only
        c.load_state_dict(with_own(saved, method_state={"powersgd": {"version": 1, "q": {}, "e": {}}}))
    with pytest.raises(ValueError, match="int8"):  # another method's state is not powersgd's
        c.load_state_dict(with_own(saved, method_state={"int8": {}}))
    assert c.step == 0 and own(c.state_dict()).method_state["powersgd"] == {"version": 2, "q": {}}
