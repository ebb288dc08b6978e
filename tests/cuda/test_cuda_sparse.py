"""The sparse, aggregate and stateful methods on CUDA (signsgd, topk, randomk, thresholdv, sketch,
gradiveq, dct) against the CPU reference: payload bytes and residuals (tests/helpers/cuda_cases.py's checks),
and what is special to them: compressed-domain decodes of W payloads, data-dependent sizes, the
second round, gradiveq's unit state and its sync across ranks.

Runs on a GPU (tests/gpu/run.sh), or here without one under the host emulation of the CUDA
library (tests/cuda/test_cuda_files_emulated.py runs this file with FSDPCOMP_TEST_EMULATED=1: the real
_C drives tests/cuda_emu's library, CPU tensors standing for CUDA ones, at smaller sizes)."""
from __future__ import annotations

import pytest
import torch

import fsdpcomp
from helpers.cuda_cases import check_decode, check_encode, cpu_encode, cuda_cases, make_grad, residual_of, same_bits
from helpers.cuda_device import DEV, EMULATED, OnDevice, on_device, skip_without_device

skip_without_device()

SPARSE = ("signsgd", "topk", "randomk", "thresholdv", "sketch", "gradiveq", "dct")
# geometries and options the kernels treat apart, beyond tests/helpers/method_cases.py's
EXTRA = [
    ("signsgd", {"block_size": 8}), ("signsgd", {"block_size": 1024}),
    ("signsgd", {"mode": "majority", "scale": 3.0}),
    # tables smaller than most chunks here (a unit whose chunks are no larger than its table goes
    # as `none`, as method_cases' sketches do at these sizes: test_sketch_units_larger_than_the_table)
    ("sketch", {"rows": 3, "cols": 64, "k": 8}), ("sketch", {"rows": 3, "cols": 64, "k": 8, "second_round": True}),
    # the default table, sized to each chunk (cols 0: n / (8 rows) columns)
    ("sketch", {}), ("sketch", {"k": 8, "second_round": True}),
]
SIZES = [1, 255, 257, 2053] if EMULATED else [1, 255, 257, (1 << 20) + 3]


BACKEND = OnDevice()


def cases() -> list[tuple[str, dict]]:
    have = {m for m, _ in cuda_cases()}
    return [c for c in cuda_cases() if c[0] in SPARSE] + [c for c in EXTRA if c[0] in have]


CASES = cases()
IDS = [m + "".join(f"-{k}={v}" for k, v in c.items()) for m, c in CASES]


@pytest.mark.parametrize("method,cfg", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("world,rank", [(1, 0), (3, 1), (4, 3)])
def test_encode_bytes_and_residuals_match_cpu(method, cfg, dtype, world, rank, gen):
    for res in ("fp32", "bf16"):
        for n in SIZES:
            check_encode(BACKEND, method, cfg, dtype, world, rank, max(n, world), gen, residual_dtype=res)


SKETCHES = [c for c in CASES if c[0] == "sketch" and c[1].get("cols", 0) > 64]  # set tables wider than SIZES


@pytest.mark.parametrize("method,cfg", SKETCHES, ids=[IDS[CASES.index(c)] for c in SKETCHES])
def test_sketch_units_larger_than_the_table_match_cpu(method, cfg, gen):
    """method_cases' sketches (tables of a set width) on units whose chunks are larger than
    their tables, so that they go as sketches, not as `none`."""
    full = fsdpcomp.CommState(method, cfg).config
    per = 2 * full["rows"] * full["cols"] + 67  # 16-bit `none` of the chunk: larger than the table
    for world, rank, dtype in ((1, 0, torch.float32), (3, 1, torch.bfloat16), (4, 3, torch.float32)):
        n = world * per - 1
        st = fsdpcomp.CommState(method, dict(cfg, compress_own_chunk=True))
        g = make_grad(n, dtype, gen)
        cpu_encode(st, g, world, rank, st._core.begin(n))
        assert st.counters()["fallback_units"] == 0, f"{cfg} W={world}: the unit went as none"
        check_encode(BACKEND, method, cfg, dtype, world, rank, n, gen)


@pytest.mark.parametrize("cfg", [{}, {"k": 8, "second_round": True}, {"rows": 5, "k": 0}],
                         ids=["default", "second_round", "rows5-all"])
def test_sketch_default_table_sized_to_each_chunk_matches_cpu(cfg, gen):
    """With cols 0 (the default) each chunk's table is sized to it, so a unit's shorter last
    chunk has a narrower table than the others (here 20 columns and 19 at 3 rows): the device
    writes and reads each chunk at its own width, as the CPU does."""
    for world, n in ((4, 1917), (3, 1438), (2, 959)):  # chunks of 480, the last 477, 478, 479
        for rank in range(world):
            check_encode(BACKEND, "sketch", cfg, torch.float32, world, rank, n, gen)
            check_decode(BACKEND, "sketch", cfg, torch.float32, world, rank, n, gen)


@pytest.mark.parametrize("method,cfg", CASES, ids=IDS)
@pytest.mark.parametrize("mode", ["pass", "zero"])
def test_encode_of_nonfinite_inputs_matches_cpu(method, cfg, mode, gen):
    for world, rank in ((1, 0), (3, 2)):
        for n in SIZES[1:]:
            check_encode(BACKEND, method, cfg, torch.float32, world, rank, n, gen, nonfinite=mode)


@pytest.mark.parametrize("method,cfg", CASES, ids=IDS)
def test_encode_near_the_largest_values_matches_cpu(method, cfg, gen):
    """g + e beyond fp32, residuals, value codecs, sketch buckets, gradiveq's coefficients and
    random-k's scaled values saturating as on the CPU (docs/methods.md, "Range and NaN")."""
    n = 1031 if EMULATED else 4099
    for dtype, res in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        check_encode(BACKEND, method, cfg, dtype, 3, 1, n, gen, residual_dtype=res, huge=True, steps=3)


@pytest.mark.parametrize("method,cfg", CASES, ids=IDS)
def test_decode_of_overflowing_and_nonfinite_sums_matches_cpu(method, cfg, gen):
    """Sums beyond fp32 saturate unless the own chunk ("pass") or a flagged payload brought
    NaN/Inf; the counters follow."""
    n = 1031 if EMULATED else 4099
    check_decode(BACKEND, method, cfg, torch.float32, 3, 1, n, gen, huge=True)
    check_decode(BACKEND, method, cfg, torch.float32, 3, 2, n, gen, huge=True, own_nonfinite=True)
    check_decode(BACKEND, method, cfg, torch.float32, 3, 2, n, gen, huge=True, own_nonfinite=True, mode="zero")
    check_decode(BACKEND, method, cfg, torch.float32, 3, 0, n, gen, huge=True, nonfinite=True, mode="zero")


@pytest.mark.parametrize("method,cfg", CASES, ids=IDS)
def test_encode_of_tiny_and_huge_values_matches_cpu(method, cfg, gen):
    """Gradients whose 1 / scale overflows (tiny) or whose squares do (huge): the value codecs
    and the sums give the CPU's answers."""
    for scale in (1e-40, 1e-37, 1e30):
        check_encode(BACKEND, method, cfg, torch.float32, 3, 1, 1031, gen, scale=scale)


ALL_CASES = cuda_cases()


@pytest.mark.parametrize("method,cfg", ALL_CASES, ids=[m + "".join(f"-{k}={v}" for k, v in c.items())
                                                       for m, c in ALL_CASES])
def test_single_payloads_match_cpu(method, cfg, gen):
    """State.compress/decompress (the compressed all-gathers' path) through the CUDA library, every
    method: the CPU's bytes and acc += alpha * D(payload) (tests/cuda/test_cuda_single.py has the sparse,
    aggregate and stateful methods' variants, sizes and refusals)."""
    c = dict(cfg, seed=99)
    n = 257
    x = make_grad(n, torch.float32, gen)
    cpu, dev = fsdpcomp.CommState(method, c), on_device(method, c)
    size = cpu._core.payload_bytes(n)
    pa = torch.zeros(size, dtype=torch.uint8)
    pb = torch.full((size,), 0xA5, dtype=torch.uint8, device=DEV)
    wa = cpu._core.compress(x, pa, unit=3, chunk=5, world=3, rank=1)
    wb = dev._core.compress(x.to(DEV, copy=True), pb, unit=3, chunk=5, world=3, rank=1)
    assert wa == wb and torch.equal(pa[:wa], pb[:wb].cpu()), f"{method} {cfg}: payload bytes"
    for alpha in (1.0, -0.5):
        acc = make_grad(n, torch.float32, gen)
        acc_d = acc.to(DEV, copy=True)
        cpu._core.decompress(pa[:wa], acc, alpha=alpha, unit=3, chunk=5, world=3)
        dev._core.decompress(pb[:wb], acc_d, alpha=alpha, unit=3, chunk=5, world=3)
        assert same_bits(acc, acc_d.cpu()), f"{method} {cfg} alpha={alpha}: decompressed sums"


@pytest.mark.parametrize("method,cfg", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_decode_of_w_payloads_matches_cpu(method, cfg, dtype, gen):
    """W payloads encoded by the CPU, summed (in the compressed domain where the method does)
    with the own chunk by the device: the CPU's decode of the same buffer, bit for bit."""
    n = 4099 if EMULATED else 65536 * 3 + 5
    check_decode(BACKEND, method, cfg, dtype, 4, 2, n, gen)
    check_decode(BACKEND, method, cfg, dtype, 3, 0, 1031, gen, nonfinite=True, compress_own=True)
    check_decode(BACKEND, method, cfg, dtype, 1, 0, 9, gen, compress_own=True)
    check_decode(BACKEND, method, cfg, dtype, 5, 4, 12, gen)  # chunks of 3, the last one empty


def test_many_calls_on_one_state_without_reading_counters(gen):
    """More calls than the context has timing events (64), counters read once at the end."""
    st = on_device("signsgd", {"compress_own_chunk": True, "error_feedback": True})
    g = make_grad(1000, torch.float32, gen).to(DEV, copy=True)
    s, _ = st._core.plan(g, 1, 0)
    send = torch.empty(sum(s), dtype=torch.uint8, device=DEV)
    out = torch.empty(1000, device=DEV)
    for _ in range(70):
        u = st._core.begin(1000)
        st._core.encode(g, send, 1, 0, u)
        st._core.decode(send, g, out, 1, 0, u)
        st.end_step()
    c = st.counters()
    assert c["calls"] == 70 and c["residual_norm"] > 0


# ---- exchanges by hand: W States standing in for W ranks, the collectives done here

def exchange(states, grads, world, via_cuda):
    """One reduce-scatter of a unit over `world` ranks without a process group: every rank
    encodes, each receiver gets the payloads meant for it back to back (sizes as encode()
    returns them), decodes, and a unit state due for a sync is summed over the ranks (rank order)
    and handed back. Returns the outputs (CPU tensors) and the summed sync vector (or None)."""
    dev = DEV if via_cuda else "cpu"
    n = grads[0].numel()
    shard = -(-n // world)
    sends, sizes, units = [], [], []
    for r, (st, g) in enumerate(zip(states, grads)):
        g = g.to(dev, copy=True)
        u = st._units.claim(n, None)  # as the hooks claim it: state_dict() lists the unit's key
        s, _ = st._core.plan(g, world, r)
        send = torch.zeros(sum(s), dtype=torch.uint8, device=dev)
        sizes.append(st._core.encode(g, send, world, r, u))
        sends.append(send)
        units.append(u)
    outs = []
    for r, (st, g) in enumerate(zip(states, grads)):
        parts = []
        for q in range(world):
            off = sum(sizes[q][:r])
            parts.append(sends[q][off:off + sizes[q][r]])
        recv = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8, device=dev)
        out = torch.zeros(shard, dtype=g.dtype, device=dev)
        st._core.decode(recv, g.to(dev, copy=True), out, world, r, units[r])
        outs.append(out)
    kmax = states[0]._core.fetch_kmax(n, world)
    if kmax:  # the second round: picks all-gathered, values all-to-all, then finish
        picks = []
        for st, u in zip(states, units):
            p = torch.zeros(kmax, dtype=torch.int32, device=dev)
            st._core.fetch_picks(u, p.view(torch.uint8))
            picks.append(p)
        everyone = torch.cat(picks)
        vals, splits = [], []
        for r, (st, g) in enumerate(zip(states, grads)):
            send = torch.zeros(world * kmax, dtype=torch.float32, device=dev)
            ss, _ = st._core.fetch(everyone.view(torch.uint8), g.to(dev, copy=True), send.view(torch.uint8), world, r, units[r])
            vals.append(send)
            splits.append(ss)
        for r, (st, g) in enumerate(zip(states, grads)):
            recv = torch.cat([vals[q][sum(splits[q][:r]):sum(splits[q][:r + 1])] for q in range(world)])
            st._core.finish(recv.view(torch.uint8), g.to(dev, copy=True), outs[r], world, r, units[r])
    outs = [o.cpu() for o in outs]
    vecs = [st._core.sync_vector(u) for st, u in zip(states, units)]
    summed = None
    if vecs[0] is not None:
        summed = torch.zeros(len(vecs[0]) // 4)
        for v in vecs:
            summed += torch.frombuffer(bytearray(v), dtype=torch.float32)
        for st, u in zip(states, units):
            st._core.sync_apply(u, summed.clone())
    for st in states:
        st.end_step()
    return outs, summed


@pytest.mark.parametrize("cfg", [{"dim": 16, "k": 4, "warmup": 2, "refresh": 3}, {"dim": 32, "k": 8, "warmup": 1}])
@pytest.mark.parametrize("world", [2, 3])
def test_gradiveq_basis_sync_across_ranks_matches_cpu(cfg, world, gen):
    """W device States as W ranks: the covariance each sums on the device on learn steps comes to
    the host bit for bit as the CPU's (the same order of additions), the ranks' sum gives every
    rank the same new basis as the CPU's, and the next steps' payloads and outputs agree."""
    full = dict(cfg, seed=11, error_feedback=True)
    cpus = [fsdpcomp.CommState("gradiveq", full) for _ in range(world)]
    devs = [on_device("gradiveq", full) for _ in range(world)]
    n = 2 * 1031
    for step in range(4):
        grads = [make_grad(n, torch.float32, gen) for _ in range(world)]
        out_c, sum_c = exchange(cpus, grads, world, False)
        out_d, sum_d = exchange(devs, grads, world, True)
        assert (sum_c is None) == (sum_d is None), f"step {step}: a sync on one side only"
        if sum_c is not None:
            assert torch.equal(sum_c, sum_d), f"step {step}: summed covariances differ"
        for r in range(world):
            assert same_bits(out_c[r], out_d[r]), f"step {step} rank {r}: outputs differ"
            bc, bd = cpus[r]._core.unit_states()[0], devs[r]._core.unit_states()[0]
            assert bc == bd, f"step {step} rank {r}: bases differ"
        assert devs[0]._core.unit_states()[0] == devs[-1]._core.unit_states()[0]


def test_gradiveq_resumes_from_a_checkpoint_on_the_device(gen):
    """A learned basis saved from a device State and loaded into a fresh one: the device copy
    follows the restored host state, so the resumed encode writes the uninterrupted bytes (and
    the CPU's, restored from the same checkpoint: its residual, saved on the device, moves to the
    CPU at the unit's first call)."""
    full = {"dim": 16, "k": 4, "warmup": 1, "seed": 5, "error_feedback": True, "compress_own_chunk": True,
            "pipeline": False}
    n = 999
    a = [on_device("gradiveq", full)]
    exchange(a, [make_grad(n, torch.float32, gen)], 1, True)  # step 0 learns: a new basis
    sd = a[0].state_dict()
    b = on_device("gradiveq", full)
    b.load_state_dict(sd)
    cpu = fsdpcomp.CommState("gradiveq", full)
    cpu.load_state_dict(sd)
    g = make_grad(n, torch.float32, gen)
    want = cpu_encode(cpu, g, 1, 0, cpu._core.begin(n))
    assert cpu._core.residuals()[0].device.type == "cpu"
    assert torch.equal(BACKEND.encode(a[0], g, 1, 0), want)
    assert torch.equal(BACKEND.encode(b, g, 1, 0), want)


def encode_both(method: str, cfg: dict, g: torch.Tensor, world: int, rank: int, steps: int = 2):
    """`steps` encodes of g on the CPU and on the device (error feedback): bytes and residuals."""
    full = dict(cfg, seed=3, error_feedback=True, compress_own_chunk=world == 1, pipeline=False)
    cpu, dev = fsdpcomp.CommState(method, full), on_device(method, full)
    for step in range(steps):
        a = cpu_encode(cpu, g, world, rank, cpu._core.begin(g.numel()))
        b = BACKEND.encode(dev, g, world, rank)
        assert torch.equal(a, b), f"{method} {cfg} W={world} step {step}: payload bytes differ at " \
                                  f"{(a != b).nonzero().flatten()[:8].tolist() if a.shape == b.shape else 'sizes'}"
        rc, rd = residual_of(cpu, 0), BACKEND.residual(dev)  # None: the unit went as `none`
        assert (rc is None) == (rd is None) and (rc is None or same_bits(rc, rd)), f"{method} {cfg}: residuals differ"
        cpu.end_step()
        dev.end_step()


@pytest.mark.parametrize("k", [1, 7, 300, 999, 1000, 5000])
def test_topk_ties_go_to_the_lowest_indices(k, gen):
    """Magnitudes from a few values (and zeros): the k-th largest is tied many times over, and
    the kept ties must be the lowest indices, as fc_select.c keeps them."""
    g = torch.randint(-3, 4, (3001,), generator=gen).float() * 0.25
    g[::7] = 0.0
    g[5] = -0.0
    for world, rank in ((1, 0), (3, 1)):
        encode_both("topk", {"k": k}, g, world, rank)
    encode_both("topk", {"k": k}, torch.zeros(3001), 2, 0)  # every magnitude tied


@pytest.mark.parametrize("n,k", [(20011, 7000), (20011, 13), (9000, 4097), (8192, 8191)])
def test_topk_ties_across_tiles(n, k, gen):
    """The device selects in tiles of 4096 elements (cuda/fc_cu_select.cu): ties of the k-th
    largest magnitude spread over several tiles (whole tiles of zeros, or of one value), so that
    the cut among them falls in a later tile; with NaN and Inf among them (NaN the largest)."""
    g = torch.randint(-2, 3, (n,), generator=gen).float() * 0.5
    g[100:5000] = 0.0
    encode_both("topk", {"k": k}, g, 1, 0)
    encode_both("topk", {"k": k}, torch.full((n,), -1.5), 1, 0)  # every key equal
    g[7::997] = float("nan")
    g[11::1501] = float("-inf")
    encode_both("topk", {"k": k}, g, 1, 0, steps=1)


@pytest.mark.parametrize("n,k", [(5000, 0), (40960, 2)])
def test_topk_of_many_small_chunks(n, k, gen):
    """W = 1024 (the most the device takes): a thousand chunks' selections at once, chunks of
    five (k = 0: the ratio's one, a bitmap) and of forty (16-bit indices). Smaller chunks go as
    `none` (no smaller than topk's payload)."""
    st = fsdpcomp.CommState("topk", {"k": k, "compress_own_chunk": False})
    cpu_encode(st, make_grad(n, torch.float32, gen), 1024, 5, st._core.begin(n))
    assert st.counters()["fallback_units"] == 0
    encode_both("topk", {"k": k}, make_grad(n, torch.float32, gen), 1024, 5, steps=1)


@pytest.mark.parametrize("n,k", [(70001, 50), (70001, 9000), (1000, 40), (1000, 200), (4096, 256), (4096, 257)])
def test_topk_index_formats(n, k, gen):
    """32-bit indices (n > 65536), 16-bit and the bitmap, and the switch between them."""
    encode_both("topk", {"k": k, "quantize": "fp16"}, make_grad(n, torch.float32, gen), 1, 0)


@pytest.mark.parametrize("method,cfg", CASES, ids=IDS)
def test_exchange_over_ranks_matches_cpu(method, cfg, gen):
    """W States as W ranks, both sides encoding and decoding (and, where the method has them, the
    second round and the unit-state sync): every rank's output and residual equal the CPU's, over
    steps with error feedback (NaN/Inf in one, values near fp32's largest in another), and the
    counters of what was sent agree."""
    for world in (2, 3):
        full = dict(cfg, seed=21, error_feedback=True)
        cpus = [fsdpcomp.CommState(method, full) for _ in range(world)]
        devs = [on_device(method, full) for _ in range(world)]
        n = 3 * 677 + 1
        for step in range(4):  # step 1: NaN/Inf on rank 0; step 3: values near fp32's largest
            grads = [make_grad(n, torch.float32, gen, nonfinite=step == 1 and r == 0, huge=step == 3)
                     for r in range(world)]
            out_c, _ = exchange(cpus, grads, world, False)
            out_d, _ = exchange(devs, grads, world, True)
            for r in range(world):
                where = f"{method} {cfg} W={world} step {step} rank {r}"
                assert same_bits(out_c[r], out_d[r]), f"{where}: outputs differ"
                rc, rd = residual_of(cpus[r], 0), residual_of(devs[r], 0)
                assert (rc is None) == (rd is None) and (rc is None or same_bits(rc, rd.cpu())), f"{where}: residuals"
        for c, d in zip(cpus, devs):
            kc, kd = c.counters(), d.counters()
            for key in ("bytes_sent", "header_bytes", "meta_bytes", "index_bytes", "value_bytes", "chunks_sent",
                        "nonfinite_in", "nonfinite_out", "extra_collectives", "calls"):
                assert kc[key] == kd[key], f"{method} {cfg} W={world}: counter {key} {kc[key]} != {kd[key]}"
            # the device sums ||e||^2 in two parts (coordinates not kept, kept ones) with fp64
            # atomics: the CPU's value in another order (exact where nothing is left: 0)
            assert kd["residual_norm"] == pytest.approx(kc["residual_norm"], rel=1e-6, abs=1e-5)
            assert kd["saturated"] <= kc["saturated"]  # the codecs' own are the CPU's alone


@pytest.mark.parametrize("threshold", [0.0, 0.5, 2.5, 1e9])
@pytest.mark.parametrize("values", ["exact", "sign"])
def test_thresholdv_sizes_are_the_cpus(threshold, values, gen):
    """Data-dependent sizes: encode() returns what the device wrote, the CPU's sizes, for counts
    from none to every element, and the packed payloads decode on the other side."""
    if values == "sign" and threshold == 0.0:
        threshold = 1e-3  # sign needs v > 0
    cfg = {"threshold": threshold, "values": values}
    for world, rank in ((1, 0), (4, 2)):
        full = dict(cfg, seed=3, error_feedback=True, compress_own_chunk=world == 1, pipeline=False)
        cpu, dev = fsdpcomp.CommState("thresholdv", full), on_device("thresholdv", full)
        g = make_grad(4099, torch.float32, gen)
        g[:700] = 0.0  # a chunk with nothing above any threshold
        s, _ = cpu._core.plan(g, world, rank)
        a = torch.zeros(sum(s), dtype=torch.uint8)
        b = torch.zeros(sum(s), dtype=torch.uint8, device=DEV)
        sa = cpu._core.encode(g, a, world, rank, cpu._core.begin(g.numel()))
        sb = dev._core.encode(g.to(DEV, copy=True), b, world, rank, dev._core.begin(g.numel()))
        assert sa == sb, f"{cfg} W={world}: sizes {sb}, the CPU's {sa}"
        assert torch.equal(a[:sum(sa)], b[:sum(sb)].cpu())
        assert dev.counters()["value_bytes"] == cpu.counters()["value_bytes"]
    states_c = [fsdpcomp.CommState("thresholdv", dict(cfg, seed=4)) for _ in range(3)]
    states_d = [on_device("thresholdv", dict(cfg, seed=4)) for _ in range(3)]
    grads = [make_grad(2001, torch.float32, gen) for _ in range(3)]
    oc, _ = exchange(states_c, grads, 3, False)
    od, _ = exchange(states_d, grads, 3, True)
    assert all(same_bits(x, y) for x, y in zip(oc, od))


def corrupt_decode(method, cfg, n, edit):
    """A CPU payload for one rank, edited, decoded on the device: the PayloadError comes when
    counters are read, and the output is NaN, as a rejected dense payload makes it."""
    full = dict(cfg, seed=5, compress_own_chunk=True, pipeline=False)
    st = fsdpcomp.CommState(method, full)
    g = make_grad(n, torch.float32, gen=torch.Generator().manual_seed(1))
    send = cpu_encode(st, g, 1, 0, st._core.begin(n))
    edit(send)
    with pytest.raises(fsdpcomp.PayloadError):
        st._core.decode(send, g, torch.empty(n), 1, 0, 0)
    dev = on_device(method, full)
    out = torch.zeros(n, device=DEV)
    dev._core.decode(send.to(DEV, copy=True), g.to(DEV, copy=True), out, 1, 0, dev._core.begin(n))
    with pytest.raises(fsdpcomp.PayloadError, match="rank 0"):
        dev.counters()
    assert torch.isnan(out.cpu()).all()


def _swap_u16(at):
    def edit(send):
        a, b = send[at:at + 2].clone(), send[at + 2:at + 4].clone()
        send[at:at + 2], send[at + 2:at + 4] = b, a
    return edit


def test_sparse_payloads_that_the_cpu_rejects_are_rejected():
    corrupt_decode("topk", {"k": 20}, 1000, _swap_u16(32))  # 16-bit indices out of order
    corrupt_decode("topk", {"k": 300}, 1000, lambda p: p.__setitem__(32, int(p[32]) ^ 0x01))  # bitmap count
    corrupt_decode("thresholdv", {"threshold": 1.0}, 1000, lambda p: p.__setitem__(32, int(p[32]) + 1))  # count
    # a value code no encoder writes (intN's default 4-bit codes stop at 14; qsgd's default 15
    # levels fill its 5-bit codes, so no qsgd code is impossible)
    corrupt_decode("topk", {"k": 20, "quantize": "intN"}, 1000, lambda p: p.__setitem__(32 + 40 + 4, 0xFF))


def test_second_round_picks_that_the_cpu_rejects_are_reported(gen):
    """Owner picks corrupted on the wire: the CPU's fetch raises; the device's reports it at the
    next counters() and sends NaN to that owner instead of values."""
    cfg = {"rows": 3, "cols": 64, "k": 8, "second_round": True, "seed": 2, "error_feedback": True}
    n, world = 4000, 2  # chunks whose `none` payload is larger than the table (else no second round)
    for via_cuda in (False, True):
        states = [on_device("sketch", cfg) if via_cuda else fsdpcomp.CommState("sketch", cfg) for _ in range(world)]
        dev = DEV if via_cuda else "cpu"
        grads = [make_grad(n, torch.float32, gen) for _ in range(world)]
        units = []
        sizes, sends = [], []
        for r, st in enumerate(states):
            g = grads[r].to(dev, copy=True)
            units.append(st._core.begin(n))
            s, _ = st._core.plan(g, world, r)
            send = torch.zeros(sum(s), dtype=torch.uint8, device=dev)
            sizes.append(st._core.encode(g, send, world, r, units[r]))
            sends.append(send)
        for r, st in enumerate(states):
            recv = torch.cat([sends[q][sum(sizes[q][:r]):sum(sizes[q][:r + 1])] for q in range(world)])
            st._core.decode(recv, grads[r].to(dev, copy=True), torch.zeros(n // world, device=dev), world, r, units[r])
        kmax = states[0]._core.fetch_kmax(n, world)
        assert kmax > 0
        everyone = torch.zeros(world * kmax, dtype=torch.int32, device=dev)
        for r, st in enumerate(states):
            st._core.fetch_picks(units[r], everyone[r * kmax:(r + 1) * kmax].view(torch.uint8))
        everyone[1], everyone[2] = everyone[2].clone(), everyone[1].clone()  # owner 0's out of order
        send = torch.zeros(world * kmax, dtype=torch.float32, device=dev)
        if not via_cuda:
            with pytest.raises(fsdpcomp.PayloadError):
                states[1]._core.fetch(everyone.view(torch.uint8), grads[1], send.view(torch.uint8), world, 1, units[1])
        else:
            ss, _ = states[1]._core.fetch(everyone.view(torch.uint8), grads[1].to(dev, copy=True), send.view(torch.uint8),
                                          world, 1, units[1])
            assert torch.isnan(send[:ss[0]].cpu()).all()
            with pytest.raises(fsdpcomp.PayloadError, match="rank 0"):
                states[1].counters()


# gradiveq's kernel shapes (cuda/fc_cu_gradiveq.cu): covariances of one entry a thread (dim <= 128)
# and of four (above), U in shared memory or read where it is (k * (dim | 1) > 3072 floats), tiles
# of slices that end inside a slice and inside a chunk, several tiles per chunk, per staging
# buffer of the covariance, and per block of the encode.
GVQ_SHAPES = [{"dim": 2, "k": 1}, {"dim": 3, "k": 2}, {"dim": 33, "k": 5}, {"dim": 130, "k": 7},
              {"dim": 256, "k": 5}, {"dim": 256, "k": 16}]


@pytest.mark.parametrize("cfg", GVQ_SHAPES, ids=[f"dim{c['dim']}-k{c['k']}" for c in GVQ_SHAPES])
def test_gradiveq_shapes_match_cpu(cfg, gen):
    """Learn steps at every shape: the covariances summed on the device (bit for bit: the sync
    vector), the payloads and residuals (values near fp32's largest too: the covariance's
    saturating pass), the decoded sums of W payloads, and decompress()."""
    full = dict(cfg, warmup=2, refresh=0, seed=11, error_feedback=True)
    world, n = 3, 3 * 4801 + 2  # chunks of 4801 (two covariance tiles at dim 2), the last 4801 - 1
    cpus = [fsdpcomp.CommState("gradiveq", full) for _ in range(world)]
    devs = [on_device("gradiveq", full) for _ in range(world)]
    for step in range(2):  # the second near fp32's largest: covariances saturate
        grads = [make_grad(n, torch.float32, gen, huge=step == 1) for _ in range(world)]
        out_c, sum_c = exchange(cpus, grads, world, False)
        out_d, sum_d = exchange(devs, grads, world, True)
        assert sum_c is not None and torch.equal(sum_c, sum_d), f"{cfg} step {step}: summed covariances differ"
        for r in range(world):
            assert same_bits(out_c[r], out_d[r]), f"{cfg} step {step} rank {r}: outputs differ"
    check_encode(BACKEND, "gradiveq", cfg, torch.float32, world, 1, n, gen)
    check_encode(BACKEND, "gradiveq", cfg, torch.bfloat16, 1, 0, 2 * 2048 + 5, gen, residual_dtype="bf16", huge=True)
    check_encode(BACKEND, "gradiveq", cfg, torch.float32, world, 0, n, gen, nonfinite="pass")
    check_decode(BACKEND, "gradiveq", cfg, torch.float32, world, 2, n, gen)
    cpu, dev = fsdpcomp.CommState("gradiveq", dict(cfg, seed=5)), on_device("gradiveq", dict(cfg, seed=5))
    x = make_grad(2 * 2048 + 3, torch.float32, gen)
    size = cpu._core.payload_bytes(x.numel())
    pa, pb = torch.zeros(size, dtype=torch.uint8), torch.zeros(size, dtype=torch.uint8, device=DEV)
    wa = cpu._core.compress(x, pa, unit=1, chunk=2, world=3, rank=1)
    wb = dev._core.compress(x.to(DEV, copy=True), pb, unit=1, chunk=2, world=3, rank=1)
    assert wa == wb and torch.equal(pa[:wa], pb[:wb].cpu()), f"{cfg}: compress() bytes differ"
    acc = make_grad(x.numel(), torch.float32, gen)
    acc_d = acc.to(DEV, copy=True)
    cpu._core.decompress(pa[:wa], acc, alpha=-0.5, unit=1, chunk=2, world=3)
    dev._core.decompress(pb[:wb], acc_d, alpha=-0.5, unit=1, chunk=2, world=3)
    assert same_bits(acc, acc_d.cpu()), f"{cfg}: decompressed sums differ"


# sketch's table build (cuda/fc_cu_sketch_table.cu): one bucket (every term in one group's run,
# several chunks of the walk), a group cut short (31, 33 columns), the widest table it builds
# (4096) and one wider (the sort's path), five rows (two passes of four rows at most).
SKETCH_SHAPES = [{"rows": 1, "cols": 1, "k": 5}, {"rows": 3, "cols": 31, "k": 0}, {"rows": 5, "cols": 33, "k": 9},
                 {"rows": 2, "cols": 100, "k": 3, "second_round": True}, {"rows": 1, "cols": 4096, "k": 7},
                 {"rows": 1, "cols": 4097, "k": 7}]


@pytest.mark.parametrize("cfg", SKETCH_SHAPES, ids=[f"r{c['rows']}-c{c['cols']}-k{c['k']}{'-2nd' if c.get('second_round') else ''}"
                                                    for c in SKETCH_SHAPES])
def test_sketch_table_shapes_match_cpu(cfg, gen):
    """Tables of every shape the build treats apart, over chunks of several tiles: payloads and
    residuals equal the CPU's, with values near fp32's largest (buckets that saturate: the
    chains' saturating pass) and NaN/Inf (NaN buckets)."""
    world, n = 3, 3 * 5000 - 7
    check_encode(BACKEND, "sketch", cfg, torch.float32, world, 1, n, gen)
    check_encode(BACKEND, "sketch", cfg, torch.float32, 1, 0, 5003, gen, huge=True)
    check_encode(BACKEND, "sketch", cfg, torch.float32, world, 0, n, gen, nonfinite="pass")
    check_decode(BACKEND, "sketch", cfg, torch.float32, world, 2, n, gen)
