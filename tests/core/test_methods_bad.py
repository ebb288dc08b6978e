"""Bad input for every method: each config key with a wrong type or out of its range, unknown
keys, and corrupted or truncated payloads for every decoder. A clear exception, never a crash."""
import pytest
import torch

import fsdpcomp
from fsdpcomp import _C
from helpers.method_cases import CASES, case_id

NEW_METHODS = ["fp8", "intN", "qsgd", "nc", "topk", "randomk", "thresholdv", "sketch", "gradiveq",
               "signsgd", "onebit"]


def bad_values(key):
    """(value, words the message must contain) that the key must refuse."""
    t = key["type"]
    out = []
    if t == "bool":
        out += [(1, "true or false"), ("yes", "true or false")]
    elif t == "int":
        out += [("3", "integer"), (2.5, "integer"), (True, "integer"),
                (int(key["min"]) - 1, "must be in"), (int(key["max"]) + 1, "must be in")]
        if key["power_of_two"] and key["max"] >= 12:
            out.append((12, "power of two"))
    elif t == "float":
        out += [("0.1", "number"), (key["min"] - 1, "must be in"), (float("nan"), "must be in")]
        if key["max"] < 1e29:
            out.append((key["max"] * 2 + 1, "must be in"))
    elif t == "choice":
        out += [(3, "one of"), ("nope", "one of")]
    return out


@pytest.mark.parametrize("method", NEW_METHODS)
def test_every_config_key_refuses_bad_values(method):
    keys = fsdpcomp.method_info(method)["keys"]
    assert keys, method
    for key in keys:
        for value, words in bad_values(key):
            with pytest.raises(ValueError) as ei:
                fsdpcomp.CommState(method, {key["name"]: value})
            msg = str(ei.value)
            assert key["name"] in msg and words in msg, (key["name"], value, msg)


@pytest.mark.parametrize("method", NEW_METHODS)
def test_unknown_key_lists_the_valid_ones(method):
    with pytest.raises(ValueError, match=r"unknown config key 'blok_size'.*valid keys"):
        fsdpcomp.CommState(method, {"blok_size": 256})


def test_cross_key_checks():
    with pytest.raises(ValueError, match=r"'k' must be <= dim \(8\), got 9"):
        fsdpcomp.CommState("gradiveq", {"dim": 8, "k": 9})


def payload_for(method, cfg, x):
    s = _C.State(method, dict(cfg, error_feedback=False))
    buf = torch.zeros(s.payload_bytes(x.numel()), dtype=torch.uint8)
    w = s.compress(x, buf)
    return s, buf[:w].clone()


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_corrupted_header_and_truncation_are_payload_errors(case, gen):
    method, cfg = case
    x = torch.randn(1000, generator=gen)
    s, p = payload_for(method, cfg, x)
    acc = torch.zeros(1000)
    for offset, pattern in ((0, "bad magic"), (3, "method id"), (16, "elements"), (28, "config")):
        q = p.clone()
        q[offset] ^= 0x5A
        with pytest.raises(fsdpcomp.PayloadError, match=pattern):
            s.decompress(q, acc)
    for keep in (10, p.numel() // 2, p.numel() - 16):
        with pytest.raises(fsdpcomp.PayloadError):
            s.decompress(p[:keep].clone(), acc)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_random_bodies_never_crash(case, gen):
    """Garbage after a valid header: the decoder refuses it or decodes garbage numbers, and the
    process survives (an out-of-bounds read or write would take pytest down)."""
    method, cfg = case
    x = torch.randn(777, generator=gen)
    s, p = payload_for(method, cfg, x)
    for _ in range(20):
        q = p.clone()
        q[32:] = torch.randint(0, 256, (q.numel() - 32,), generator=gen, dtype=torch.uint8)
        acc = torch.zeros(777)
        try:
            s.decompress(q, acc)
        except fsdpcomp.PayloadError:
            pass


@pytest.mark.parametrize("method,cfg,offset,value,pattern", [
    ("intN", {"bits": 2}, _C.HEADER_BYTES + 4 * 4, 0xFF, "outside"),          # code 3 of a 2-bit quantiser
    ("qsgd", {"levels": 5}, _C.HEADER_BYTES + 4 * 2, 0xFF, "exceeds"),        # level 7 > 5
    ("nc", {}, _C.HEADER_BYTES, 0xFF, "exponent"),                # block exponent > 255
    ("topk", {"k": 10}, _C.HEADER_BYTES, 0xFF, "out of range|ascending"),  # index past the chunk
    ("thresholdv", {"threshold": 1.0}, _C.HEADER_BYTES + 3, 0x7F, "count"),   # count > n
], ids=["intN", "qsgd", "nc", "topk", "thresholdv"])
def test_corrupted_bodies_that_are_detected(method, cfg, offset, value, pattern, gen):
    n = 1000
    x = torch.randn(n, generator=gen)
    s, p = payload_for(method, cfg, x)
    p[offset] = value
    if method == "nc":
        p[offset + 1] = 0x01  # exponent 0x01FF
    with pytest.raises(fsdpcomp.PayloadError, match=pattern):
        s.decompress(p, torch.zeros(n))


def test_thresholdv_receive_buffer_longer_than_its_payloads_is_refused(gen):
    world, n = 2, 2000
    states = [_C.State("thresholdv", {"threshold": 1.0, "error_feedback": False}) for _ in range(world)]
    g = torch.randn(n, generator=gen)
    sends = []
    for r, s in enumerate(states):
        s.begin(n)
        send = torch.zeros(sum(s.plan(g, world, r)[0]), dtype=torch.uint8)
        sizes = s.encode(g, send, world, r, 0)
        sends.append(send[:sum(sizes)].clone())
    recv = torch.cat([sends[1], torch.zeros(16, dtype=torch.uint8)])
    with pytest.raises(fsdpcomp.PayloadError, match="payloads use"):
        states[0].decode(recv, g, torch.empty(n // 2), world, 0, 0)
