"""sketch's default table is sized to the chunk (cols 0: n / (8 rows) columns, 1 to 4096), so a
small unit compresses instead of going as `none`, and its estimates keep the count sketch's
bound; explicit `cols` keep their tables (tests/helpers/method_cases.py's payloads)."""
import pytest
import torch

import fsdpcomp
from fsdpcomp import _C


@pytest.mark.parametrize("n", [64, 500, 2048, 12287, 50000, 1 << 17])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_default_table_compresses_any_unit(n, dtype):
    s = fsdpcomp.CommState("sketch", {"compress_own_chunk": True})
    g = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype)
    s.reduce_scatter(g, torch.empty(n, dtype=dtype))
    c = s.counters()
    assert c["fallback_units"] == 0 and c["ratio"] > 1, (n, dtype, dict(c))
    cols = min(4096, max(1, n // 24))
    assert _C.State("sketch", {}).layout(n)["value_bytes"] == 4 * 3 * cols
    if n >= 3 * 4096 * 8:  # large chunks keep the table the fixed default had
        assert _C.State("sketch", {}).layout(n) == _C.State("sketch", {"cols": 4096}).layout(n)


def test_explicit_cols_keep_their_table():
    assert fsdpcomp.CommState("sketch").config["cols"] == 0
    for cols in (1, 64, 4096):
        for n in (100, 2048, 1 << 20):
            assert _C.State("sketch", {"cols": cols}).layout(n)["value_bytes"] == 4 * 3 * cols


def _roundtrip(x, cfg):
    s = _C.State("sketch", cfg)
    buf = torch.zeros(s.payload_bytes(x.numel()), dtype=torch.uint8)
    w = s.compress(x, buf, chunk=0, world=1)
    d = torch.zeros_like(x)
    s.decompress(buf[:w], d, chunk=0, world=1)
    return w, d


def test_default_table_on_a_small_unit_keeps_the_count_sketch_bound():
    """2048 elements: noise and 5 heavy hitters, sketched at the default (3 x 85). The count
    sketch's bound (Charikar et al.): each coordinate's estimate is within 3 ||x without i||_2 /
    sqrt(cols) of x_i with probability >= 1 - 3 (1/9)^2 = 0.96 at 3 rows; the default keeps the
    k = 256 largest estimates, the heavy hitters among them, close to their values."""
    n = 2048
    g = torch.Generator().manual_seed(12)
    x = torch.randn(n, generator=g) * 0.01
    heavy = torch.randperm(n, generator=g)[:5]
    x[heavy] = torch.randn(5, generator=g).sign() * (5 + torch.rand(5, generator=g))
    w, d = _roundtrip(x, {})
    assert w <= n, f"{w} payload bytes for {4 * n} of fp32"  # >= 4x, header included
    _, est = _roundtrip(x, {"k": 0})  # the same table, every estimate decoded
    bound = 3 * (x.square().sum() - x.square()).sqrt() / (n // 24) ** 0.5
    within = float(((est - x).abs() <= bound).float().mean())
    assert within >= 0.96, f"{within:.3f} of the estimates within the count sketch's bound"
    kept = d.nonzero().flatten()
    assert kept.numel() == 256 and torch.equal(d[kept], est[kept])
    assert set(heavy.tolist()) <= set(kept.tolist())
    torch.testing.assert_close(d[heavy], x[heavy], atol=0.5, rtol=0)


# powersgd needs matrices; adaptive sends every unit exact (fp32) until a parts table is set,
# by design: step 0 goes exact and the chooser (Python) decides from measured errors
@pytest.mark.parametrize("method", [m for m in fsdpcomp.codecs() if m not in ("none", "adaptive")])
@pytest.mark.parametrize("n", [72, 2048])
def test_every_method_compresses_a_small_unit_at_its_defaults(method, n):
    """A small model's units (a 8 x 8 layer and its bias: 72) go compressed at every method's
    defaults; thresholdv's size depends on the data: most values under its threshold here."""
    g = torch.randn(n, generator=torch.Generator().manual_seed(n))
    if method == "thresholdv":
        g *= 1e-3 / 3
    s = fsdpcomp.CommState(method, {"compress_own_chunk": True})
    s.reduce_scatter(g, torch.empty(n))
    c = s.counters()
    assert c["fallback_units"] == 0 and c["ratio"] > 1, dict(c)
