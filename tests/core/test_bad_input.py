"""Bad input: a clear exception naming what was wrong, no crash, and no state changed."""
import argparse

import pytest
import torch

import fsdpcomp
from helpers.ckpt import own, with_own
from fsdpcomp import _C


def test_unknown_method_lists_the_valid_names():
    with pytest.raises(ValueError, match=r"unknown compression method 'int9'.*'int8'"):
        fsdpcomp.CommState("int9")


@pytest.mark.parametrize("config,pattern", [
    ({"blocksize": 256}, r"unknown config key 'blocksize'.*block_size"),
    ({"block_size": 300}, r"'block_size' must be a power of two, got 300"),
    ({"block_size": 0}, r"'block_size' must be in \[8"),
    ({"block_size": "256"}, r"'block_size' must be an integer, got str"),
    ({"block_size": 256.0}, r"'block_size' must be an integer, got float"),
    ({"stochastic": 1}, r"'stochastic' must be true or false, got int"),
    ({"error_feedback": "yes"}, r"'error_feedback' must be true or false"),
    ({"residual_dtype": "fp64"}, r"'residual_dtype' must be one of 'fp32', 'bf16', 'int8', got 'fp64'"),
    ({"seed": -1}, r"'seed' must be in"),
    ({"seed": 2**70}, r"'seed' must be in .* beyond 64 bits"),
    ({1: 2}, r"config keys must be strings"),
])
def test_bad_config_names_the_key(config, pattern):
    with pytest.raises(ValueError, match=pattern):
        fsdpcomp.CommState("int8", config)


@pytest.mark.parametrize("key,value", [("transport", "nccl"), ("transport", "auto"), ("timeout_s", 30)])
def test_a_removed_key_is_refused_saying_why(key, value):
    """The C parser refuses a removed key for the C State and CommState alike, in one sentence
    that says it was removed, why, and to drop it; no resolved config or key list shows it."""
    for make in (lambda c: _C.State("int8", c), lambda c: fsdpcomp.CommState("int8", c)):
        with pytest.raises(ValueError, match=rf"^config key '{key}' was removed: [^;]+; drop the key$"):
            make({key: value})
    assert _C.REMOVED_KEYS[key].startswith(f"config key '{key}' was removed: ")
    assert key not in fsdpcomp.CommState("int8").config
    assert key not in [k["name"] for k in fsdpcomp.method_info("int8")["common_keys"]]


def test_removing_transport_left_the_header_fingerprint_alone():
    """transport was part of the fingerprint every payload header carries; it keeps its place
    there as "auto", so these are the values of the build that still had it (every rank of one
    build agrees with itself whatever they are: only pinned values catch a change)."""
    assert _C.State("int8", {}).fingerprint == 2811170126
    assert _C.State("int8", {"seed": 3}).fingerprint == 3598975547


def test_bad_config_json():
    with pytest.raises(ValueError, match="not valid JSON"):
        fsdpcomp.CommState("int8", "{block_size: 4}")
    with pytest.raises(ValueError, match="JSON object"):
        fsdpcomp.CommState("int8", "[1, 2]")


def test_argparse_rejects_unknown_method_and_from_args_validates():
    p = fsdpcomp.add_argparse_args(argparse.ArgumentParser())
    with pytest.raises(SystemExit):
        p.parse_args(["--comm_compress", "nope"])
    args = p.parse_args(["--comm_compress", "int8", "--comm_config_json", '{"block_size": 64}'])
    assert fsdpcomp.from_args(args).config["block_size"] == 64
    args = p.parse_args(["--comm_compress", "int8", "--comm_config_json", '{"block_size": 63}'])
    with pytest.raises(ValueError, match="power of two"):
        fsdpcomp.from_args(args)


@pytest.fixture
def used_state(gen):
    """A state that has seen one unit of 256 elements, with a residual."""
    s = fsdpcomp.CommState("int8", {"error_feedback": True, "compress_own_chunk": True})
    fsdpcomp.fsdp_hook(s, torch.randn(256, generator=gen), torch.empty(256))
    return s


def _snapshot(s):
    sd = s.state_dict()
    return sd["step"], own(sd).units, [None if r is None else r.clone() for r in own(sd).residuals["scatter"]], s.counters()["calls"], s._core.cursor


def _unchanged(s, snap):
    now = _snapshot(s)
    assert now[0] == snap[0] and now[1] == snap[1] and now[3] == snap[3]
    assert all(a is b is None or torch.equal(a, b) for a, b in zip(now[2], snap[2]))


@pytest.mark.parametrize("grad,out,exc,pattern", [
    (torch.randn(256, dtype=torch.float64), torch.empty(256), TypeError, "grad must be float32 or bfloat16 or float16"),
    (torch.randint(0, 5, (256,)), torch.empty(256), TypeError, "grad must be"),
    (torch.randn(512)[::2], torch.empty(256), ValueError, "grad must be contiguous"),
    ([1.0] * 256, torch.empty(256), TypeError, "grad must be a tensor"),
    (torch.randn(256), torch.empty(256, dtype=torch.int32), TypeError, "output must be"),
    (torch.randn(256), torch.empty(100), ValueError, "output has 100 elements, the shard needs 256"),
    (torch.empty(256, device="meta"), torch.empty(256), TypeError, "grad cannot be read through DLPack"),
])
def test_bad_tensors_are_refused_without_state_change(used_state, grad, out, exc, pattern):
    core = used_state._core
    snap = _snapshot(used_state)
    unit = core.begin(256) if isinstance(grad, torch.Tensor) and grad.numel() == 256 else 0
    with pytest.raises(exc, match=pattern):
        send = torch.empty(used_state._core.plan(torch.empty(256), 1, 0)[0][0], dtype=torch.uint8)
        core.encode(grad, send, 1, 0, unit)
        core.decode(send, grad, out, 1, 0, unit)
    if exc is not ValueError or "output" not in pattern:
        assert _snapshot(used_state)[2][0].equal(snap[2][0])


def test_size_mismatch_against_the_unit(used_state, gen):
    core = used_state._core
    send = torch.empty(core.plan(torch.empty(256), 1, 0)[0][0], dtype=torch.uint8)
    snap = _snapshot(used_state)
    with pytest.raises(ValueError, match="grad has 300 elements but unit 0 has 256"):
        core.encode(torch.randn(300, generator=gen), send, 1, 0, 0)
    with pytest.raises(ValueError, match="send has 10 bytes, plan"):
        core.encode(torch.randn(256, generator=gen), torch.empty(10, dtype=torch.uint8), 1, 0, 0)
    with pytest.raises(ValueError, match="rank must be in"):
        core.encode(torch.randn(256, generator=gen), send, 2, 5, 0)
    with pytest.raises(ValueError, match="unit must be in"):
        core.encode(torch.randn(256, generator=gen), send, 1, 0, 7)
    _unchanged(used_state, snap)


def _payload(gen, method="int8", n=1000):
    s = _C.State(method, {})
    x = torch.randn(n, generator=gen)
    p = torch.empty(s.payload_bytes(n), dtype=torch.uint8)
    s.compress(x, p)
    return s, x, p


@pytest.mark.parametrize("offset,value,pattern", [
    (0, 0x00, "bad magic"), (2, 9, "wire version 9"), (3, 2, "method id 2, expected 3"),
    (4, 7, "dtype code 7"), (5, 2, "flags 0x02"), (6, 3, "encoded for world 3"), (28, 1, "another config"),
    (8, 1, "for unit 1 of step 0"), (12, 3, "unit 0 of step 3"),
    (16, 99, r"\d+ elements, expected 1000"), (24, 200, "body of"),
])
def test_corrupted_header_is_a_payload_error(gen, offset, value, pattern):
    s, x, p = _payload(gen)
    p[offset] = value
    acc = torch.randn(1000, generator=gen)
    before = acc.clone()
    with pytest.raises(fsdpcomp.PayloadError, match=pattern):
        s.decompress(p, acc)
    assert torch.equal(acc, before), "a refused payload must not touch the accumulator"


@pytest.mark.parametrize("keep", [0, 10, 31, 500])
def test_truncated_payload_is_a_payload_error(gen, keep):
    s, x, p = _payload(gen)
    acc = torch.zeros(1000)
    short = p[:keep].clone() if keep else torch.empty(0, dtype=torch.uint8)
    with pytest.raises(fsdpcomp.PayloadError):
        s.decompress(short, acc)
    assert not acc.any()


def test_payload_for_a_different_size_is_refused(gen):
    s, x, p = _payload(gen)
    with pytest.raises(fsdpcomp.PayloadError, match="1000 elements, expected 999"):
        s.decompress(p, torch.zeros(999))


def test_misaligned_buffer_is_refused(gen):
    s, x, p = _payload(gen)
    big = torch.empty(p.numel() + 1, dtype=torch.uint8)
    with pytest.raises(ValueError, match="16-byte boundary"):
        s.compress(x, big[1:])


def test_load_state_dict_validates_before_changing(used_state):
    sd = used_state.state_dict()
    snap = _snapshot(used_state)
    bad = with_own(sd, residuals={"scatter": [torch.zeros(5)]})
    with pytest.raises(ValueError, match=r"residuals\['scatter'\]\[0\] has 5 elements, its unit needs 256"):
        used_state.load_state_dict(bad)
    with pytest.raises(ValueError, match="missing 'step'"):
        used_state.load_state_dict({k: v for k, v in sd.items() if k != "step"})
    with pytest.raises(ValueError, match="holds the state of no rank, this is rank 0"):
        used_state.load_state_dict({k: v for k, v in sd.items() if k != "rank0"})
    bad = with_own(sd, residuals={"scatter": [torch.zeros(256, dtype=torch.float64)]})
    with pytest.raises(TypeError, match=r"residuals\['scatter'\]\[0\] must be float32"):
        used_state.load_state_dict(bad)
    _unchanged(used_state, snap)


def test_hook_needs_a_comm_state():
    with pytest.raises(TypeError, match="fsdpcomp.CommState"):
        fsdpcomp.fsdp_hook(object(), torch.randn(4), torch.empty(2))


def test_nonfinite_gradients_are_counted_and_never_poison_the_residual(gen):
    s = fsdpcomp.CommState("int8", {"error_feedback": True, "compress_own_chunk": True, "block_size": 8})
    out = torch.empty(64)
    fsdpcomp.fsdp_hook(s, torch.randn(64, generator=gen), out)
    s.end_step()
    before = own(s.state_dict()).residuals["scatter"][0]
    g = torch.randn(64, generator=gen)
    g[3] = float("nan")
    g[40] = float("inf")
    fsdpcomp.fsdp_hook(s, g, out)
    c = s.counters()
    assert c["nonfinite_in"] == 2
    assert torch.isnan(out[:8]).all(), "NaN passes through (pass mode) to its block"
    after = own(s.state_dict()).residuals["scatter"][0]
    # never poisoned, and never the old one (it went out inside g'): test_nonfinite.py has the rule
    assert torch.isfinite(after).all() and not torch.equal(after, before)
    z = fsdpcomp.CommState("int8", {"nonfinite": "zero", "compress_own_chunk": True})
    fsdpcomp.fsdp_hook(z, g, out)
    assert torch.isfinite(out).all() and z.counters()["nonfinite_in"] == 2
