"""Single-chunk round trips of the foundation methods, and their exact byte accounting."""
import pytest
import torch

import fsdpcomp
from fsdpcomp import _C

HEADER = _C.HEADER_BYTES


def roundtrip(method, x, config=None, **kw):
    s = _C.State(method, config or {})
    payload = torch.empty(s.payload_bytes(x.numel()), dtype=torch.uint8)
    written = s.compress(x, payload, **kw)
    assert written == payload.numel()
    acc = torch.zeros_like(x)
    s.decompress(payload, acc, world=kw.get("world", 1))
    return acc, payload


def align(n):
    return -(-n // _C.ALIGN) * _C.ALIGN


@pytest.mark.parametrize("n", [1, 7, 1000, 4099])
def test_none_is_exact(gen, n):
    x = torch.randn(n, generator=gen) * 10
    y, payload = roundtrip("none", x)
    assert torch.equal(y, x)
    assert payload.numel() == align(HEADER + 4 * n)


@pytest.mark.parametrize("n", [5, 1000, 4099])
def test_bf16_is_exact_to_its_dtype(gen, n):
    x = torch.randn(n, generator=gen) * 3
    y, payload = roundtrip("bf16", x)
    assert torch.equal(y, x.bfloat16().float())
    assert payload.numel() == align(HEADER + 2 * n)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_fp16_is_exact_to_its_dtype_after_the_predivide(gen, world):
    # values spread over fp16's normal and subnormal range
    x = torch.randn(3000, generator=gen) * torch.logspace(-6, 4, 3000)
    y, payload = roundtrip("fp16", x, world=world)
    expected = (x / world).half().float() * world
    assert torch.equal(y, expected)
    assert payload.numel() == align(HEADER + 2 * 3000)


def test_fp16_matches_torch_on_specials():
    # torch's cast, except that a finite value beyond 65504 saturates there (docs/methods.md,
    # "Range and NaN"): an Inf on the wire would poison error feedback
    x = torch.tensor([65504.0, 65519.0, 65520.0, 1e6, -1e6, 6e-8, 2.9e-8, 3.0e-8, 0.0, -0.0,
                      float("inf"), float("-inf"), 1.0 + 2**-11, 1.0 + 3 * 2**-11])
    y, _ = roundtrip("fp16", x)
    finite = torch.isfinite(x)
    expected = torch.where(finite, x.clamp(-65504, 65504), x).half().float()
    assert torch.equal(y, expected)


@pytest.mark.parametrize("block", [8, 64, 256])
@pytest.mark.parametrize("n", [1, 100, 1000, 4097])
def test_int8_error_within_half_a_step_of_its_block(gen, block, n):
    x = torch.randn(n, generator=gen) * torch.rand(n, generator=gen) * 5
    y, payload = roundtrip("int8", x, {"block_size": block})
    nb = -(-n // block)
    pad = torch.zeros(nb * block - n)
    amax = torch.cat([x, pad]).view(nb, block).abs().amax(1)
    step = (amax / 127).repeat_interleave(block)[:n]
    err = (y - x).abs()
    assert torch.all(err <= step / 2 * (1 + 1e-5) + 1e-12)
    assert payload.numel() == align(HEADER + n + 4 * nb)


def test_int8_stochastic_is_unbiased_and_within_one_step(gen):
    x = torch.randn(512, generator=gen)
    s = _C.State("int8", {"block_size": 512, "stochastic": True, "seed": 11})
    payload = torch.empty(s.payload_bytes(512), dtype=torch.uint8)
    mean = torch.zeros(512, dtype=torch.float64)
    draws = 400
    for d in range(draws):
        s.compress(x, payload, unit=d)  # the unit is part of the RNG key: fresh draws
        acc = torch.zeros(512)
        s.decompress(payload, acc, unit=d)
        step = x.abs().max() / 127
        assert torch.all((acc - x).abs() < step * (1 + 1e-5))
        mean += acc.double()
    mean /= draws
    # per element the rounding error is a Bernoulli of variance <= step^2/4:
    # the mean of 400 draws lies within 5 sigma = 5 * step / (2 * 20)
    bound = 5 * (x.abs().max() / 127) / (2 * draws**0.5)
    assert torch.all((mean - x.double()).abs() < bound)


def test_int8_nearest_is_deterministic_and_stochastic_depends_on_seed(gen):
    x = torch.randn(2048, generator=gen)
    _, a = roundtrip("int8", x, {"stochastic": True, "seed": 1})
    _, b = roundtrip("int8", x, {"stochastic": True, "seed": 1})
    _, c = roundtrip("int8", x, {"stochastic": True, "seed": 2})
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("method,config", [("none", {}), ("fp16", {}), ("bf16", {}), ("int8", {"block_size": 128})])
def test_layout_formula_matches_the_payload(method, config):
    s = _C.State(method, config)
    for n in (1, 127, 128, 129, 10000):
        lay = s.layout(n)
        assert lay["total"] == s.payload_bytes(n)
        assert lay["total"] == align(HEADER + lay["value_bytes"] + lay["meta_bytes"] + lay["index_bytes"])
        assert lay["header_bytes"] == lay["total"] - lay["value_bytes"] - lay["meta_bytes"]


def test_methods_lists_the_foundation():
    names = fsdpcomp.codecs()
    for m in ("none", "fp16", "bf16", "int8"):
        assert m in names
    info = fsdpcomp.method_info("int8")
    assert {k["name"] for k in info["keys"]} == {"block_size", "stochastic"}
    assert "error_feedback" in {k["name"] for k in info["common_keys"]}
