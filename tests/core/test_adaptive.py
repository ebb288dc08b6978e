"""The `adaptive` method's C core (issue 39): a unit's parts table cuts each chunk into spans, each
sent as one rung of a fixed ladder. Driven through the core at world 1..4, one State per rank and
no process group: the composite is exactly its spans' own codecs side by side, its bytes are
theirs plus alignment, and ranks that disagree on the table refuse each other's payloads."""
import pytest
import torch

import fsdpcomp
from fsdpcomp import _C
from fsdpcomp._budget import LADDER
from fsdpcomp._dist import Ranks

RUNG = {r["name"]: i for i, r in enumerate(_C.adaptive_ladder())}
HEADER = 32


def _core(**cfg):
    return fsdpcomp.CommState("adaptive", cfg)._core


def _align(v, a):
    return (v + a - 1) // a * a


def _table(core, unit, parts):
    """set_parts from [(end, rung name), ...]."""
    ends = torch.tensor([e for e, _ in parts], dtype=torch.int64)
    rungs = torch.tensor([RUNG[r] for _, r in parts], dtype=torch.uint8)
    core.set_parts(unit, ends, rungs)


def _rung_state(name):
    rung = _C.adaptive_ladder()[RUNG[name]]
    return fsdpcomp.CommState(rung["method"], dict(rung["config"]))._core


def _rung_decode(name, x):
    """D(C(x)) of one span by the rung's own method, as configured whatever the size (compress:
    no `none` fallback), and its body bytes."""
    st = _rung_state(name)
    pay = torch.zeros(st.payload_bytes(x.numel()), dtype=torch.uint8)
    st.compress(x.contiguous(), pay)
    acc = torch.zeros(x.numel())
    st.decompress(pay, acc)
    lay = st.layout(x.numel())
    return acc, lay["value_bytes"] + lay["meta_bytes"] + lay["index_bytes"]


def _spans(parts, start, n):
    """[(lo, hi, rung name)] of the table over [start, start + n)."""
    out, lo = [], 0
    for end, rung in parts:
        a, b = max(lo, start), min(end, start + n)
        if a < b:
            out.append((a, b, rung))
        lo = end
    return out


def _reference(parts, x, start):
    """The chunk x (starting at `start` of the unit) through its spans' own codecs, and the
    composite's expected payload size (8-aligned sub-bodies, then header and 16-byte padding)."""
    dec, off = torch.zeros_like(x), 0
    for lo, hi, rung in _spans(parts, start, x.numel()):
        d, body = _rung_decode(rung, x[lo - start:hi - start])
        dec[lo - start:hi - start] = d
        off = _align(off, 8) + body
    return dec, _align(HEADER + off, 16)


def _ranks(world, n, parts, cfg=None, seed=0):
    """One State per rank, the unit begun and its table set; the gradients."""
    gen = torch.Generator().manual_seed(seed)
    cores, grads = [], []
    for r in range(world):
        c = _core(**(cfg or {}))
        u = c.begin(n)
        if parts is not None:
            _table(c, u, parts)
        cores.append(c)
        grads.append(torch.randn(n, generator=gen))
    return cores, grads


def _encode_all(cores, grads, world):
    sends = []
    for r, (c, g) in enumerate(zip(cores, grads)):
        splits, _ = c.plan(g, world, r, 0)
        send = torch.empty(sum(splits), dtype=torch.uint8)
        sizes = c.encode(g, send, world, r, 0)
        assert list(sizes) == list(splits)  # fixed sizes: the plan is exact
        offs = [0]
        for s in splits:
            offs.append(offs[-1] + s)
        sends.append([send[offs[q]:offs[q + 1]] for q in range(world)])
    return sends


MIXED = [(37, "fp32"), (300, "intN 3-bit"), (301, "int8"), (700, "dct 15/128"), (760, "dct 15/128"),
         (1000, "int8"), (1003, "fp32")]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("parts", [
    [(1003, "int8")], [(1003, "dct 15/128")], [(1003, "intN 2-bit")], [(1003, "bf16")], MIXED,
    # a part smaller than a dct block, a one-element part, parts across every chunk boundary
    [(5, "dct 4/128"), (6, "intN 4-bit"), (260, "dct 32/128"), (400, "bf16"), (1003, "dct 8/128")],
], ids=["int8", "dct15", "intN2", "bf16", "mixed", "small"])
def test_each_payload_is_its_spans_own_codecs_and_the_decode_sums_them(world, parts):
    n = 1003
    cores, grads = _ranks(world, n, parts, {"compress_own_chunk": world == 1})
    sends = _encode_all(cores, grads, world)
    per = -(-n // world)
    for q in range(world):
        start, m = q * per, min(per, n - q * per)
        acc = torch.zeros(m, dtype=torch.float64)
        for s in range(world):
            if s == q and world > 1:  # the own chunk, exact
                acc += grads[q][start:start + m].double()
                continue
            ref, size = _reference(parts, grads[s][start:start + m], start)
            pay = sends[s][q]
            assert pay.numel() == size
            got = torch.zeros(m)
            cores[q].decompress(pay, got, unit=0, chunk=q, world=world)
            assert torch.equal(got, ref)  # bit for bit, span by span
            acc += got.double()
        out = torch.empty(m)
        recv = torch.cat([sends[s][q] for s in range(world)])
        cores[q].decode(recv, grads[q], out, world, q, 0)
        torch.testing.assert_close(out, (acc / world).float(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("world", [2, 3, 4, 7])
@pytest.mark.parametrize("parts", [MIXED, [(5, "dct 4/128"), (6, "intN 4-bit"), (260, "dct 32/128"),
                                           (400, "bf16"), (1003, "dct 8/128")]], ids=["mixed", "small"])
def test_an_all_gather_shard_follows_the_table(world, parts):
    """An all-reduce's all-gather half (fsdpcomp/_shard_gather.py) sends rank r's reduced shard,
    ceil(n / world) elements from r times that, as compress() chunk world + r: its payload is
    the table's spans over the shard, the last shard's tail past the unit (padding) in no part;
    payload_bytes(unit=, chunk=, world=) says its size before it is written."""
    n = 1003
    core = _core()
    _table(core, core.begin(n), parts)
    per = -(-n // world)
    x = torch.randn(per * world, generator=torch.Generator().manual_seed(world))
    x[n:] = 0  # the reduced shards' padding, as the reduce-scatter leaves it
    for r in range(world):
        start = r * per
        m = max(0, min(per, n - start))
        shard = x[start:start + per]
        ref, size = _reference(parts, shard[:m], start) if m else (torch.zeros(0), _align(HEADER, 16))
        assert core.payload_bytes(per, unit=0, chunk=world + r, world=world) == size
        with pytest.raises(ValueError, match=f"need {size}"):
            core.compress(shard, torch.zeros(size - 1, dtype=torch.uint8), unit=0, chunk=world + r, world=world,
                          rank=r)
        pay = torch.zeros(size, dtype=torch.uint8)
        assert core.compress(shard, pay, unit=0, chunk=world + r, world=world, rank=r) == size
        got = torch.zeros(per)
        core.decompress(pay, got, unit=0, chunk=world + r, world=world)
        assert torch.equal(got[:m], ref) and not got[m:].any()
    # another length, or a chunk id past the all-gather's, is no chunk of the unit: the default table
    fp32 = core.payload_bytes(per)
    assert core.payload_bytes(per, unit=0, chunk=2 * world, world=world) == fp32
    assert core.payload_bytes(per + 1, unit=0, chunk=world, world=world) == core.payload_bytes(per + 1)


def test_an_all_gather_shard_wholly_past_the_unit_is_a_header_alone():
    """5 elements over 4 ranks: shards of 2, the last one [6, 8) past the unit's end: no span of
    the table, a payload of the header alone, decoded as zeros."""
    core = _core(min_numel=1)
    _table(core, core.begin(5), [(2, "int8"), (5, "bf16")])
    shard = torch.zeros(2)
    size = core.payload_bytes(2, unit=0, chunk=4 + 3, world=4)
    assert size == _align(HEADER, 16)
    pay = torch.zeros(size, dtype=torch.uint8)
    assert core.compress(shard, pay, unit=0, chunk=4 + 3, world=4, rank=3) == size
    got = torch.full((2,), 7.0)
    core.decompress(pay, got, unit=0, chunk=4 + 3, world=4)
    assert torch.equal(got, torch.full((2,), 7.0))  # nothing added


def test_bytes_are_the_parts_bytes_plus_alignment_and_the_counters_count_them():
    n, world = 1003, 1
    cores, grads = _ranks(world, n, MIXED, {"compress_own_chunk": True})
    c, g = cores[0], grads[0]
    before = c.counters()["bytes_sent"]
    (size,) = c.encode(g, torch.empty(sum(c.plan(g, 1, 0, 0)[0]), dtype=torch.uint8), 1, 0, 0)
    _, want = _reference(MIXED, g, 0)
    assert size == want
    assert c.counters()["bytes_sent"] - before == size
    # the body: every part's own bytes, at 8-byte aligned offsets (the gaps are meta bytes)
    off = 0
    for lo, hi, rung in _spans(MIXED, 0, n):
        off = _align(off, 8) + _rung_decode(rung, g[lo:hi])[1]
    assert _align(HEADER + off, 16) == size


def test_default_table_is_fp32_exact_and_none_sized():
    n = 777
    for world in (1, 3):
        cores, grads = _ranks(world, n, None, {"compress_own_chunk": True})
        none = fsdpcomp.CommState("none", {"compress_own_chunk": True})._core
        none.begin(n)
        for r in range(world):
            assert cores[r].plan(grads[r], world, r, 0) == none.plan(grads[r], world, r)
        sends = _encode_all(cores, grads, world)
        per = -(-n // world)
        for q in range(world):
            m = min(per, n - q * per)
            got = torch.zeros(m)
            cores[q].decompress(sends[0][q], got, unit=0, chunk=q, world=world)
            assert torch.equal(got, grads[0][q * per:q * per + m])


def test_every_rung_is_fixed_size_and_stateless():
    for rung in _C.adaptive_ladder():
        info = _C.method_info(rung["method"])
        assert not info["varsize"], rung["name"]
        assert not info["linear"] or rung["method"] == "none", rung["name"]
    info = _C.method_info("adaptive")
    assert not info["varsize"] and not info["linear"]
    assert info["id"] == 16


def test_ladder_is_budget_ladder():
    assert [(r["name"], r["method"], r["config"]) for r in _C.adaptive_ladder()] == \
        [(c.name, c.method, c.config) for c in LADDER]


def test_keys_and_fingerprint():
    keys = {k["name"]: k for k in _C.method_info("adaptive")["keys"]} if isinstance(
        _C.method_info("adaptive")["keys"], list) else _C.method_info("adaptive")["keys"]
    assert {"ratio", "every", "objective"} <= set(keys)
    base = _core().fingerprint
    assert _core(ratio=16.0).fingerprint != base
    assert _core(every=10).fingerprint != base
    assert _core(objective="per-param").fingerprint != base
    for bad in ({"ratio": 1.0}, {"every": 0}, {"objective": "x"}):
        with pytest.raises(ValueError):
            _core(**bad)


def test_set_parts_refusals_name_the_fault_and_change_nothing():
    n = 100
    c = _core(compress_own_chunk=True)
    u = c.begin(n)
    g = torch.randn(n)
    _table(c, u, [(50, "int8"), (100, "dct 8/128")])
    good = c.plan(g, 1, 0, u)
    i64, u8 = torch.int64, torch.uint8
    cases = [
        ((torch.tensor([50, 40, 100], dtype=i64), torch.tensor([0, 1, 2], dtype=u8)), "ascending"),
        ((torch.tensor([50, 50, 100], dtype=i64), torch.tensor([0, 1, 2], dtype=u8)), "ascending"),
        ((torch.tensor([0, 100], dtype=i64), torch.tensor([0, 1], dtype=u8)), "ascending"),
        ((torch.tensor([50, 99], dtype=i64), torch.tensor([0, 1], dtype=u8)), "last end"),
        ((torch.tensor([50, 101], dtype=i64), torch.tensor([0, 1], dtype=u8)), "last end"),
        ((torch.tensor([50, 100], dtype=i64), torch.tensor([0, 12], dtype=u8)), "out of range"),
        ((torch.tensor([50, 100], dtype=torch.int32), torch.tensor([0, 1], dtype=u8)), "ends must be"),
        ((torch.tensor([50, 100], dtype=i64), torch.tensor([0, 1], dtype=torch.int64)), "rungs must be"),
        ((torch.tensor([50, 100], dtype=i64), torch.tensor([0, 1, 2], dtype=u8)), "one rung per part"),
        ((torch.tensor([], dtype=i64), torch.tensor([], dtype=u8)), "1 to 100 parts"),
    ]
    for (ends, rungs), msg in cases:
        with pytest.raises((ValueError, TypeError), match=msg):
            c.set_parts(u, ends, rungs)
        assert c.plan(g, 1, 0, u) == good  # the old table stands
    with pytest.raises(ValueError, match="unit must be"):
        c.set_parts(5, torch.tensor([100]), torch.tensor([0], dtype=u8))
    with pytest.raises(ValueError, match="unit must be"):
        _core().set_parts(0, torch.tensor([100]), torch.tensor([0], dtype=u8))  # not begun
    other = fsdpcomp.CommState("int8", {})._core
    other.begin(n)
    with pytest.raises(ValueError, match="only 'adaptive'"):
        other.set_parts(0, torch.tensor([100]), torch.tensor([0], dtype=u8))
    small = _core(min_numel=1000)
    small.begin(n)
    with pytest.raises(ValueError, match="min_numel"):
        small.set_parts(0, torch.tensor([100]), torch.tensor([2], dtype=u8))
    with pytest.raises(ValueError, match="pass the unit"):
        c.plan(g, 1, 0)
    # replacing the table between calls, and back to the default
    _table(c, u, [(100, "intN 2-bit")])
    assert c.plan(g, 1, 0, u) != good
    _table(c, u, [(100, "fp32")])
    assert c.plan(g, 1, 0, u)[0][0] == _align(HEADER + 4 * n, 16)


def test_set_parts_on_a_cuda_tensor_is_refused():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    c = _core()
    c.begin(10)
    with pytest.raises(ValueError, match="CPU"):
        c.set_parts(0, torch.tensor([10], device="cuda"), torch.tensor([0], dtype=torch.uint8))


@pytest.mark.parametrize("world", [2, 3])
def test_a_receiver_with_another_table_refuses_the_payload(world):
    n = 600
    per = -(-n // world)
    mine = [(per, "int8"), (n, "intN 4-bit")]
    # rank 0 cuts chunk 1's span in two, same rung: the same payload size, another table
    theirs = [(per, "int8"), (per + per // 2, "intN 4-bit"), (n, "intN 4-bit")]
    cores, grads = _ranks(world, n, mine)
    _table(cores[0], 0, theirs)
    sends = _encode_all(cores, grads, world)
    assert sends[0][1].numel() == sends[2 % world][1].numel() or world == 2
    recv = torch.cat([sends[s][1] for s in range(world)])
    with pytest.raises(fsdpcomp.PayloadError, match="parts table"):
        cores[1].decode(recv, grads[1], torch.empty(per), world, 1, 0)
    # a table that changes the sizes is refused by the receive buffer's size, saying why
    _table(cores[0], 0, [(n, "fp32")])
    sends = _encode_all(cores, grads, world)
    recv = torch.cat([sends[s][1] for s in range(world)])
    with pytest.raises(fsdpcomp.PayloadError, match="parts table"):
        cores[1].decode(recv, grads[1], torch.empty(per), world, 1, 0)


def test_a_truncated_or_corrupted_body_is_refused():
    n = 1003
    cores, grads = _ranks(2, n, MIXED)
    sends = _encode_all(cores, grads, 2)
    pay = sends[0][1].clone()
    m = n - 502
    # truncated: the receive buffer and the header's slot
    with pytest.raises(fsdpcomp.PayloadError):
        cores[1].decode(pay[:-16], grads[1], torch.empty(m), 2, 1, 0)
    with pytest.raises(fsdpcomp.PayloadError):
        cores[1].decompress(pay[:-16], torch.zeros(m), unit=0, chunk=1, world=2)
    # any header byte changed: refused, or (a byte nobody reads) the same decode
    for i in range(HEADER):
        b = pay.clone()
        b[i] ^= 0x40
        acc = torch.zeros(m)
        try:
            cores[1].decompress(b, acc, unit=0, chunk=1, world=2)
        except fsdpcomp.PayloadError:
            continue
        # a byte the header does not check (reserved) leaves the decode as it was
        ref = torch.zeros(m)
        cores[1].decompress(pay, ref, unit=0, chunk=1, world=2)
        assert torch.equal(acc, ref), i
    # garbage in the body: never a crash, at most other values (every byte of a fixed-size
    # codec decodes to something; dct's position ranks are range-checked)
    for seed in range(5):
        b = pay.clone()
        gen = torch.Generator().manual_seed(seed)
        b[HEADER:] = torch.randint(0, 256, (b.numel() - HEADER,), dtype=torch.uint8, generator=gen)
        try:
            cores[1].decompress(b, torch.zeros(m), unit=0, chunk=1, world=2)
        except fsdpcomp.PayloadError:
            pass


def test_per_peer_pieces_are_refused_with_the_reason():
    c = _core()
    c.begin(100)
    assert not c.per_peer_ok(100, 2)


def test_the_table_goes_with_the_unit_table():
    """restore() replaces the units: their tables go back to the default (no leak, no stale
    pointer), and a fresh begin() starts from it too."""
    n = 300
    c = _core(compress_own_chunk=True)
    u = c.begin(n)
    _table(c, u, [(100, "int8"), (300, "dct 8/128")])
    g = torch.randn(n)
    assert c.plan(g, 1, 0, u)[0][0] < 4 * n
    c.restore([n], {}, 3)
    assert c.plan(g, 1, 0, 0)[0][0] == _align(HEADER + 4 * n, 16)


@pytest.mark.parametrize("ef", [False, True])
def test_the_state_reduce_scatter_follows_the_table(ef):
    """CommState's own exchange (world 1, own chunk compressed) plans an adaptive unit per call:
    the bytes follow the table set between two calls; with error feedback the residual is
    g' - D, as for any method."""
    n = 1003
    st = fsdpcomp.CommState("adaptive", {"compress_own_chunk": True, "error_feedback": ef})
    g = torch.randn(n, generator=torch.Generator().manual_seed(3))
    out = torch.empty(n)
    st.reduce_scatter(g, out)
    assert torch.equal(out, g)  # default table: exact
    first = st.counters()["bytes_sent"]
    assert first == _align(HEADER + 4 * n, 16)
    _table(st._core, 0, MIXED)
    st._core.end_step()
    # the exchange itself: CommState's reducer would replace this table by its own choice
    # (fsdpcomp/_adaptive.py, tested in tests/distributed/test_adaptive_ranks.py)
    st._reducer.exchange.reduce_scatter(g, out, 0, Ranks.of(None))
    ref, size = _reference(MIXED, g, 0)
    assert st.counters()["bytes_sent"] - first == size
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
