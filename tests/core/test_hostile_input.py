"""Hostile input (entry points, sizes, checkpoints, threads): a clear ValueError or
TypeError naming what was wrong, before any state changes; never a wrong read, a wrapped size,
a RecursionError or a second thread inside one State."""
import threading

import pytest
import torch

import fsdpcomp
from helpers.ckpt import own, with_own
from fsdpcomp import _C


# ---- item 4: checkpoints

@pytest.fixture
def used():
    s = fsdpcomp.CommState("int8", {"error_feedback": True, "compress_own_chunk": True})
    for _ in range(2):
        s.reduce_scatter(torch.randn(256), torch.empty(256))
        s.end_step()
    return s


def _same(a, b):
    return (a["step"] == b["step"] and own(a).units == own(b).units
            and all(torch.equal(x, y) for x, y in zip(own(a).residuals["scatter"], own(b).residuals["scatter"])))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_restore_refuses_a_nonfinite_residual(value, dtype):
    s = fsdpcomp.CommState("int8", {"error_feedback": True, "compress_own_chunk": True,
                                    "residual_dtype": dtype})
    s.reduce_scatter(torch.randn(256), torch.empty(256))
    s.end_step()
    sd = s.state_dict()
    before = s.state_dict()
    bad = own(sd).residuals["scatter"][0].clone()
    bad[17] = value
    with pytest.raises(ValueError, match=r"residuals\['scatter'\]\[0\].*element 17.*(nan|inf)"):
        s.load_state_dict(with_own(sd, residuals={"scatter": [bad]}))
    assert _same(s.state_dict(), before)


@pytest.mark.parametrize("step", [2**32 + 3, 2**32, -1, 2**70])
def test_restore_refuses_a_step_outside_32_bits(used, step):
    sd, before = used.state_dict(), used.state_dict()
    with pytest.raises(ValueError, match=r"step must be in \[0, 2\^32\)"):
        used.load_state_dict(dict(sd, step=step))
    assert _same(used.state_dict(), before)


def test_restore_accepts_the_largest_step(used):
    used.load_state_dict(dict(used.state_dict(), step=2**32 - 1))
    assert used.step == 2**32 - 1


# ---- item 9: strings, JSON, sizes, tensor views

@pytest.mark.parametrize("config,name", [
    ({"residual_dtype": "bf16\x00x"}, "residual_dtype"),
    ({"nonfinite": "zero\x00"}, "nonfinite"),
    ({"block_size\x00junk": 64}, "block_size"),
    ({"seed\x00": 1}, "seed"),
])
def test_embedded_nul_is_refused(config, name):
    with pytest.raises(ValueError, match=f"{name}.*(NUL|null)"):
        fsdpcomp.CommState("int8", config)


def test_embedded_nul_in_a_method_name_is_refused():
    for name in ("bf16\x00x", "int8\x00"):
        with pytest.raises(ValueError, match="NUL|null"):
            fsdpcomp.CommState(name)


def test_fp8_format_with_nul_is_refused():
    with pytest.raises(ValueError, match="format.*(NUL|null)"):
        fsdpcomp.CommState("fp8", {"format": "e5m2\x00junk"})


@pytest.mark.parametrize("text", ["[" * 100000 + "]" * 100000,
                                  '{"a":' * 100000 + "1" + "}" * 100000])
def test_deeply_nested_json_is_a_value_error(text):
    with pytest.raises(ValueError, match="nest"):
        fsdpcomp.CommState("int8", text)


@pytest.mark.parametrize("method", ["none", "int8", "intN", "qsgd", "topk", "thresholdv", "gradiveq"])
@pytest.mark.parametrize("n", [2**61, 2**62, 2**63 - 1])
def test_sizes_never_wrap(method, n):
    s = _C.State(method, {})
    with pytest.raises(ValueError, match=r"\bn\b.*at most"):
        s.payload_bytes(n)
    with pytest.raises(ValueError, match=r"\bn\b.*at most"):
        s.layout(n)


@pytest.mark.parametrize("n", [2**61, 2**63 - 1])
def test_unit_sizes_never_wrap(n):
    s = _C.State("int8", {})
    with pytest.raises(ValueError, match="numel.*at most"):
        s.begin(n)
    with pytest.raises(ValueError, match="numel.*at most"):
        s.per_peer_ok(n, 2)
    with pytest.raises(ValueError, match="numel.*at most"):
        s.fetch_kmax(n, 2)
    assert s.units() == []


def test_negative_bit_views_are_never_read_with_the_wrong_sign():
    x = torch.randn(64)
    neg = x._neg_view()
    s = _C.State("none", {})
    p = torch.empty(s.payload_bytes(64), dtype=torch.uint8)
    with pytest.raises(ValueError, match="x.*negative.*resolve_neg"):
        s.compress(neg, p)
    state = fsdpcomp.CommState("none")
    with pytest.raises(ValueError, match="grad.*negative"):
        state.reduce_scatter(neg, torch.empty(64))
    out = torch.empty(64)
    with pytest.raises(ValueError, match="output.*negative"):
        state.reduce_scatter(x, out._neg_view())


# ---- item 10: one State, one thread, from the first call that can release the GIL

def test_a_second_thread_is_refused_while_the_allocator_runs():
    seen = {}

    def intruder(state):
        try:
            state.restore([], [], 0)
            seen["result"] = "entered"
        except RuntimeError as e:
            seen["result"] = str(e)

    def allocator(numel, dtype, like):
        t = threading.Thread(target=intruder, args=(core,))
        t.start()
        t.join()
        return torch.zeros(numel)

    core = _C.State("int8", {"error_feedback": True, "compress_own_chunk": True}, allocator)
    unit = core.begin(256)
    send = torch.empty(core.plan(torch.empty(256), 1, 0)[0][0], dtype=torch.uint8)
    core.encode(torch.randn(256), send, 1, 0, unit)
    assert "in use by another thread" in seen["result"]
    assert core.units() == [256]


# ---- the method byte: a payload and its `none` fallback can have the same size

def test_a_flipped_method_byte_is_a_payload_error():
    """thresholdv's payload of n values can be 4n bytes long, the size of the `none` payload it
    falls back to; with only the method byte changed (tests/helpers/fuzz.py's find: 41 of 2.5M inputs)
    the receiver decoded its index/value records as raw floats. The header's fingerprint mixes
    in the method id, so that flip is now a config mismatch."""
    s = _C.State("thresholdv", {"threshold": 1.5})
    none = _C.State("none", {})
    none_p = torch.zeros(none.payload_bytes(7), dtype=torch.uint8)
    none.compress(torch.ones(7), none_p)
    none_id = int(none_p[3])  # byte 3: the method id
    for seed in range(200):
        g = torch.randn(7, generator=torch.Generator().manual_seed(seed)) * 3
        p = torch.zeros(s.payload_bytes(7), dtype=torch.uint8)
        w = s.compress(g, p)
        body = int.from_bytes(bytes(p[24:28].tolist()), "little")  # body bytes, low 32 bits
        if body == 4 * 7:  # what a `none` payload of 7 values carries
            break
    else:
        raise AssertionError("no thresholdv payload of a none payload's size in 200 seeds")
    q = p[:w].clone()
    assert int(q[3]) != none_id
    q[3] = none_id
    acc = torch.zeros(7)
    with pytest.raises(fsdpcomp.PayloadError, match="config"):
        s.decompress(q, acc)
    assert torch.equal(acc, torch.zeros(7))  # refused before anything was added
