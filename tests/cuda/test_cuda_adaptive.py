"""`adaptive` (csrc/methods/m_adaptive.c) through the CUDA library against the CPU reference, bit for
bit: each span of a unit's parts table goes through its rung's own kernels (cuda/fc_cu_parts.cu), so
the payload bytes, the residuals and the decoded sums must be the CPU's, with no table (one fp32
part) and with a table of all 12 rungs whose odd spans cross the chunk boundaries, at W = 1..4,
with error feedback, NaN/Inf in either mode, bf16 gradients and residuals, and for
compress()/decompress(); a payload written under another table is refused as on the CPU.

Runs on a GPU (tests/gpu/run.sh), or here under the host emulation of the CUDA library
(tests/cuda/test_cuda_files_emulated.py runs it with FSDPCOMP_TEST_EMULATED=1)."""
from __future__ import annotations

import pytest
import torch

import fsdpcomp
from fsdpcomp import _C
from helpers.cuda_cases import bits_report, common_cfg, make_grad, residual_of, same_bits
from helpers.cuda_device import DEV, OnDevice, on_device, skip_without_device

skip_without_device()

BACKEND = OnDevice()
N = 1031
RUNGS = len(_C.adaptive_ladder())
# every rung once, odd spans (a one-element one, one shorter than a dct block, one across several
# blocks) whose ends fall inside the chunks at W = 2, 3, 4 and across their boundaries
ENDS = [1, 38, 171, 300, 301, 388, 517, 640, 777, 900, 1000, N]
TABLE = (ENDS, [3, 11, 0, 7, 5, 1, 9, 2, 6, 10, 4, 8])
OTHER = ([500, N], [2, 6])


def set_table(st, unit: int, table) -> None:
    if table is not None:
        ends, rungs = table
        st._core.set_parts(unit, torch.tensor(ends), torch.tensor(rungs, dtype=torch.uint8))


def cpu_encode(st, g: torch.Tensor, world: int, rank: int, unit: int) -> torch.Tensor:
    """The CPU's payloads back to back, planned by the unit's table."""
    s, _ = st._core.plan(g, world, rank, unit)
    send = torch.zeros(sum(s), dtype=torch.uint8)
    sizes = st._core.encode(g, send, world, rank, unit)
    return send[:sum(sizes)]


def test_the_table_has_every_rung():
    assert sorted(TABLE[1]) == list(range(RUNGS)) and ENDS[-1] == N


def check_encode(table, world: int, rank: int, dtype=torch.float32, residual_dtype: str = "fp32",
                 nonfinite: str | None = None, ef: bool = True, steps: int = 2, gen=None,
                 huge: bool = False) -> None:
    """`steps` encodes of fresh gradients: payload bytes and residuals the CPU's; `huge`: values
    near the dtype's largest (g + e and the casts saturate)."""
    cfg = common_cfg(world, residual_dtype, nonfinite or "pass", ef)
    cpu, dev = fsdpcomp.CommState("adaptive", cfg), on_device("adaptive", cfg)
    for step in range(steps):
        g = make_grad(N, dtype, gen, nonfinite=nonfinite is not None, huge=huge)
        u = cpu._core.begin(N)
        set_table(cpu, u, table)
        uc = dev._core.begin(N)
        set_table(dev, uc, table)
        a = cpu_encode(cpu, g, world, rank, u)
        x = g.to(DEV, copy=True)
        s, _ = dev._core.plan(x, world, rank, uc)
        send = torch.full((sum(s),), 0xA5, dtype=torch.uint8, device=DEV)  # unwritten bytes show
        sizes = dev._core.encode(x, send, world, rank, uc)
        b = send[:sum(sizes)].cpu()
        where = f"table={table is not None} W={world} r={rank} {dtype} res={residual_dtype} nonfinite={nonfinite} step={step}"
        assert a.shape == b.shape, f"{where}: {b.numel()} payload bytes, the CPU wrote {a.numel()}"
        diff = (a != b).nonzero().flatten()
        assert diff.numel() == 0, f"{where}: payload bytes differ at {diff[:8].tolist()} (of {a.numel()})"
        rc, rd = residual_of(cpu, u), residual_of(dev, uc)
        assert (rc is None) == (rd is None), f"{where}: residual kept on one side only"
        if rc is not None:
            assert same_bits(rc, rd.cpu()), f"{where}: residuals differ: {bits_report(rc, rd.cpu())}"
        cpu.end_step()
        dev.end_step()
    c, d = cpu.counters(), dev.counters()
    assert d["nonfinite_in"] == c["nonfinite_in"], f"{where}: nonfinite_in {d['nonfinite_in']} vs {c['nonfinite_in']}"
    assert d["saturated"] <= c["saturated"]
    if ef and world > 1:  # the device sums the stored residual: a bf16 one after its rounding
        rel = 1e-6 if residual_dtype == "fp32" else 1e-3
        assert d["residual_norm"] == pytest.approx(c["residual_norm"], rel=rel)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("table", [None, TABLE], ids=["no_table", "all_rungs"])
def test_encode_matches_cpu(table, world, gen):
    for rank in sorted({0, world - 1}):
        check_encode(table, world, rank, gen=gen)
    check_encode(table, world, world // 2, ef=False, steps=1, gen=gen)


@pytest.mark.parametrize("table", [None, TABLE], ids=["no_table", "all_rungs"])
def test_encode_nonfinite_bf16_matches_cpu(table, gen):
    check_encode(table, 3, 1, nonfinite="pass", gen=gen)
    check_encode(table, 3, 2, nonfinite="zero", gen=gen)
    check_encode(table, 4, 0, nonfinite="pass", ef=False, steps=1, gen=gen)
    check_encode(table, 3, 0, dtype=torch.bfloat16, residual_dtype="bf16", gen=gen)
    check_encode(table, 3, 1, huge=True, gen=gen)


def check_decode(table, world: int, rank: int, dtype=torch.float32, nonfinite: bool = False,
                 compress_own: bool = False, mode: str = "pass", gen=None, huge: bool = False) -> None:
    """W payloads of the CPU's, summed in rank order with the own chunk and / W by the CPU and by
    the device: the same output bits and counts."""
    cfg = dict(seed=7, compress_own_chunk=compress_own, nonfinite=mode)
    grads = [make_grad(N, dtype, gen, nonfinite=nonfinite and r in (rank, (rank + 1) % world), huge=huge)
             for r in range(world)]
    slots = []
    for r, g in enumerate(grads):
        st = fsdpcomp.CommState("adaptive", cfg)
        u = st._core.begin(N)
        set_table(st, u, table)
        ss, _ = st._core.plan(g, world, r, u)
        send = torch.zeros(sum(ss), dtype=torch.uint8)
        sizes = st._core.encode(g, send, world, r, u)
        off = sum(sizes[:rank])
        slots.append(send[off:off + sizes[rank]])
    recv = torch.cat(slots)
    shard = -(-N // world)
    ref, dev = fsdpcomp.CommState("adaptive", cfg), on_device("adaptive", cfg)
    u, ud = ref._core.begin(N), dev._core.begin(N)
    set_table(ref, u, table)
    set_table(dev, ud, table)
    out_c = torch.full((shard + 3,), 7.0, dtype=dtype)  # 3 more: FSDP's padded tail is zeroed
    out_d = torch.full((shard + 3,), 7.0, dtype=dtype, device=DEV)
    ref._core.decode(recv, grads[rank], out_c, world, rank, u)
    dev._core.decode(recv.to(DEV, copy=True), grads[rank].to(DEV, copy=True), out_d, world, rank, ud)
    where = f"table={table is not None} W={world} r={rank} {dtype} nonfinite={nonfinite} own={compress_own}"
    assert same_bits(out_c, out_d.cpu()), f"{where}: decoded sums differ: {bits_report(out_c, out_d.cpu())}"
    c, d = ref.counters(), dev.counters()
    for key in ("nonfinite_out", "saturated", "nonfinite_in"):
        assert d[key] == c[key], f"{where}: {key} {d[key]}, the CPU counted {c[key]}"


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("table", [None, TABLE], ids=["no_table", "all_rungs"])
def test_decode_matches_cpu(table, world, gen):
    for rank in sorted({0, world - 1}):
        check_decode(table, world, rank, compress_own=world == 1, gen=gen)
    check_decode(table, world, world // 2, compress_own=True, gen=gen)


@pytest.mark.parametrize("table", [None, TABLE], ids=["no_table", "all_rungs"])
def test_decode_nonfinite_bf16_matches_cpu(table, gen):
    check_decode(table, 3, 1, nonfinite=True, gen=gen)
    check_decode(table, 3, 2, nonfinite=True, mode="zero", gen=gen)
    check_decode(table, 4, 3, dtype=torch.bfloat16, nonfinite=True, compress_own=True, gen=gen)
    check_decode(table, 4, 1, huge=True, gen=gen)  # sums beyond fp32: saturated, counted
    check_decode(table, 3, 2, dtype=torch.bfloat16, huge=True, compress_own=True, gen=gen)


def single(table, world: int, chunk: int, rank: int, residual: bool, nonfinite: bool, gen) -> None:
    """compress() of chunk `chunk` of a unit (its span of the table where it is one of the unit's
    chunks or, chunk world + r, rank r's shard of an all-reduce's all-gather half; else the default
    table), then decompress() at two alphas: the CPU's bytes and bits."""
    cfg = {"seed": 99, "ef_decay": 0.9}
    cpu, dev = fsdpcomp.CommState("adaptive", cfg), on_device("adaptive", cfg)
    u, ud = cpu._core.begin(N), dev._core.begin(N)
    set_table(cpu, u, table)
    set_table(dev, ud, table)
    per = -(-N // world)
    n = max(0, min(per, N - chunk * per)) if chunk < world else per if chunk < 2 * world else 257
    size = cpu._core.payload_bytes(n) + 8 * RUNGS  # a table's alignment may pass the default's size
    ea, eb = torch.zeros(n), torch.zeros(n, device=DEV)
    for step in range(2):
        x = make_grad(n, torch.float32, gen, nonfinite=nonfinite)
        pa = torch.zeros(size, dtype=torch.uint8)
        pb = torch.full((size,), 0xA5, dtype=torch.uint8, device=DEV)
        kw = dict(unit=u, chunk=chunk, world=world, rank=rank)
        wa = cpu._core.compress(x, pa, residual=ea if residual else None, **kw)
        wb = dev._core.compress(x.to(DEV, copy=True), pb, residual=eb if residual else None, **kw)
        where = f"table={table is not None} W={world} chunk={chunk} n={n} residual={residual} step={step}"
        assert wa == wb, f"{where}: payload sizes {wa} (CPU) and {wb}"
        diff = (pa[:wa] != pb[:wb].cpu()).nonzero().flatten()[:8].tolist()
        assert not diff, f"{where}: payload bytes differ at {diff}"
        if residual:
            assert same_bits(ea, eb.cpu()), f"{where}: residuals differ: {bits_report(ea, eb.cpu())}"
        for alpha in (1.0, -0.5):
            base = make_grad(n, torch.float32, gen)
            acc_a, acc_b = base.clone(), base.to(DEV, copy=True)
            cpu._core.decompress(pa[:wa], acc_a, alpha=alpha, unit=u, chunk=chunk, world=world)
            dev._core.decompress(pb[:wb], acc_b, alpha=alpha, unit=ud, chunk=chunk, world=world)
            assert same_bits(acc_a, acc_b.cpu()), f"{where} alpha={alpha}: {bits_report(acc_a, acc_b.cpu())}"
    dev.counters()  # no payload refused


@pytest.mark.parametrize("table", [None, TABLE], ids=["no_table", "all_rungs"])
def test_single_payloads_match_cpu(table, gen):
    # chunk 5 of 3: the last shard of an all-gather half (its tail past the unit in no part);
    # chunk 7 of 3: no chunk of the unit, the default table
    for world, chunk, rank in ((1, 0, 0), (3, 1, 2), (4, 3, 0), (3, 5, 1), (4, 5, 2), (3, 7, 1)):
        single(table, world, chunk, rank, residual=False, nonfinite=False, gen=gen)
    single(table, 3, 2, 0, residual=True, nonfinite=False, gen=gen)
    single(table, 2, 0, 1, residual=False, nonfinite=True, gen=gen)
    single(table, 2, 1, 0, residual=True, nonfinite=True, gen=gen)


def test_a_payload_under_another_table_is_refused():
    """A payload a rank wrote under another parts table: the CPU raises PayloadError naming the
    tables; the device makes the output NaN and counters() raise, naming them too where the sizes
    agree (two fp32 parts cost what the default table's one does: only the fingerprint differs)."""
    g = make_grad(N, torch.float32, torch.Generator().manual_seed(1))
    cfg = {"seed": 5, "compress_own_chunk": True}
    fp32_halves = ([500, N], [0, 0])
    same_size = 0
    for sender, table in ((OTHER, TABLE), (OTHER, None), (fp32_halves, None)):
        st = fsdpcomp.CommState("adaptive", cfg)
        u = st._core.begin(N)
        set_table(st, u, sender)
        send = cpu_encode(st, g, 1, 0, u)
        cpu, dev = fsdpcomp.CommState("adaptive", cfg), on_device("adaptive", cfg)
        uc, ud = cpu._core.begin(N), dev._core.begin(N)
        set_table(cpu, uc, table)
        set_table(dev, ud, table)
        splits = sum(cpu._core.plan(g, 1, 0, uc)[1])
        if send.numel() == splits:
            same_size += 1
            with pytest.raises(fsdpcomp.PayloadError, match="parts table"):
                cpu._core.decode(send, g, torch.empty(N), 1, 0, uc)
        out = torch.zeros(N, device=DEV)
        recv = torch.zeros(splits, dtype=torch.uint8)
        k = min(splits, send.numel())
        recv[:k] = send[:k]  # the other table's payload in this table's slot
        dev._core.decode(recv.to(DEV), g.to(DEV, copy=True), out, 1, 0, ud)
        with pytest.raises(fsdpcomp.PayloadError, match="rank 0") as why:
            dev.counters()
        if send.numel() == splits:  # the same size: the header's fingerprint tells the tables apart
            assert "parts table" in str(why.value), why.value
        assert torch.isnan(out.cpu()).all()
    assert same_size == 1
    # and a single payload: decompress() under another table
    cpu, dev = fsdpcomp.CommState("adaptive", cfg), on_device("adaptive", cfg)
    for s in (cpu, dev):
        set_table(s, s._core.begin(N), OTHER)
    pay = torch.zeros(cpu._core.payload_bytes(N) + 8 * RUNGS, dtype=torch.uint8)
    w = cpu._core.compress(g, pay, unit=0, chunk=0, world=1, rank=0)
    other = on_device("adaptive", cfg)
    set_table(other, other._core.begin(N), TABLE)
    acc = torch.zeros(N, device=DEV)
    other._core.decompress(pay[:w].to(DEV), acc, unit=0, chunk=0, world=1)
    with pytest.raises(fsdpcomp.PayloadError):
        other.counters()
    assert torch.isnan(acc.cpu()).all()


@pytest.mark.parametrize("ef", [True, False], ids=["ef", "no_ef"])
@pytest.mark.parametrize("mode", ["pass", "zero"])
def test_error_samples_follow_the_cpu(ef, mode, gen):
    """A sampled call's statistics over calls (error_stats_every 2): the sample is the first sent
    chunk that passes no NaN/Inf, picked on the device; NaN/Inf move between chunks and one call
    has them in every sent chunk (no sample in "pass" mode). The device decodes the sent chunks
    again and sums in another order (with error feedback g' as D + e): counts equal, the
    statistics to rounding."""
    world, rank = 4, 1
    per = -(-N // world)
    cfg = dict(seed=5, error_feedback=ef, error_stats_every=2, compress_own_chunk=False, nonfinite=mode)
    cpu, dev = fsdpcomp.CommState("adaptive", cfg), on_device("adaptive", cfg)
    for step in range(8):
        g = make_grad(N, torch.float32, gen)
        if step in (1, 2, 3):
            g[5 + step] = float("nan") if step != 2 else float("-inf")
        if step == 4:
            for c in (0, 2, 3):
                g[c * per + 3] = float("inf")
        u, ud = cpu._core.begin(N), dev._core.begin(N)
        set_table(cpu, u, TABLE)
        set_table(dev, ud, TABLE)
        a = cpu_encode(cpu, g, world, rank, u)
        x = g.to(DEV, copy=True)
        send = torch.zeros(sum(dev._core.plan(x, world, rank, ud)[0]), dtype=torch.uint8, device=DEV)
        sizes = dev._core.encode(x, send, world, rank, ud)
        assert torch.equal(a, send[:sum(sizes)].cpu()), f"step {step}: payload bytes differ"
        cpu.end_step()
        dev.end_step()
    kc, kd = cpu.counters(), dev.counters()
    assert kc["error_samples"] == (3 if mode == "pass" else 4), kc
    for key in ("nonfinite_in", "error_samples", "chunks_sent", "bytes_sent"):
        assert kd[key] == kc[key], f"ef={ef} {mode}: {key} {kd[key]} != the CPU's {kc[key]}"
    # the CPU's sample with error feedback reads g' again from g + e without zeroing its NaN/Inf
    # (backend_cpu/fc_resid_cpu.c, dots3_gprime), so in "zero" mode a sampled chunk with one makes
    # its statistics NaN (int8's too); the device zeroes them as the encode does
    keys = ("residual_norm",) if ef and mode == "zero" else ("grad_rel_error", "grad_cos_sim", "residual_norm")
    for key in keys:
        assert kd[key] == pytest.approx(kc[key], rel=1e-5, abs=1e-9), f"ef={ef} {mode}: {key} {kd[key]} vs {kc[key]}"
