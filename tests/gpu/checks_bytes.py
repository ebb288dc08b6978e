"""GPU checks, group `bytes` (tests/gpu/run.sh bytes, ~3-6 min): every method with CUDA kernels,
every config of tests/method_cases.py (and each method's defaults), against the CPU path bit for
bit: payload bytes and residuals of the collective's encode at odd sizes (1, 255, 257, 2^20+3)
and one case above 2^31 bytes, NaN/Inf in both `nonfinite` modes, the loopback decode of W
payloads, and the single-payload compress/decompress."""
from __future__ import annotations

import torch

import fsdpcomp
from gpu_common import CheckFailed, Skip, case_name, cuda_configs, first_diff, need_gpu, same_bits

SIZES = [1, 255, 257, (1 << 20) + 3]
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def _encode(st, grad, world, rank):
    unit = st._core.begin(grad.numel())
    s, _ = st._core.plan(grad, world, rank)
    send = torch.full((sum(s),), 0xA5, dtype=torch.uint8, device=grad.device)  # unwritten bytes show
    st._core.encode(grad, send, world, rank, unit)
    res = st._core.residuals()[unit] if unit < len(st._core.residuals()) else None
    return send.cpu(), (None if res is None else res.cpu()), unit


def _report(what: str, bad: list, total: int) -> dict:
    detail = {"compared": total, "mismatches": len(bad), "first": bad[:20]}
    if bad:
        raise CheckFailed(f"{what}: {len(bad)} of {total} comparisons differ from the CPU", detail)
    return detail


def _encode_case(method, cfg, dtype, world, rank, n, gen, extra, bad, steps=2):
    c = dict(cfg, seed=1234, compress_own_chunk=world == 1, **extra)
    cpu, gpu = fsdpcomp.CommState(method, c), fsdpcomp.CommState(method, c)
    for step in range(steps):  # the second step encodes with a non-zero residual
        g = (torch.randn(n, generator=gen) * 3).to(dtype)
        if extra.get("nonfinite"):
            for at, v in ((0, float("nan")), (n // 2, float("inf")), (n - 1, float("-inf"))):
                g[at] = v
        a, ra, _ = _encode(cpu, g, world, rank)
        b, rb, _ = _encode(gpu, g.cuda(), world, rank)
        where = f"{case_name(method, cfg)} {extra} dtype={dtype} W={world} r={rank} n={n} step={step}"
        if not torch.equal(a, b):
            bad.append(f"{where}: payload byte {first_diff(a, b)} of {a.numel()}")
        if (ra is None) != (rb is None) or (ra is not None and not same_bits(ra, rb)):
            bad.append(f"{where}: residual")
        ca, cb = cpu.counters(), gpu.counters()
        for key in ("bytes_sent", "nonfinite_in", "calls", "error_samples"):
            if ca[key] != cb[key]:
                bad.append(f"{where}: counter {key} cpu {ca[key]} gpu {cb[key]}")
        cpu.end_step()
        gpu.end_step()


def check_encode_bytes_and_residuals():
    """The collective's encode: payload bytes and residuals (fp32 and bf16) equal the CPU's."""
    need_gpu()
    gen, bad, total = torch.Generator().manual_seed(1), [], 0
    for method, cfg in cuda_configs():
        for dname, dtype in DTYPES.items():
            for world, rank in ((1, 0), (3, 1), (4, 3)):
                for n in SIZES:
                    res = "bf16" if (world == 3 and dname == "f32") else "fp32"
                    _encode_case(method, cfg, dtype, world, rank, max(n, world), gen,
                                 {"error_feedback": True, "residual_dtype": res}, bad)
                    total += 2
    return _report("encode", bad, total)


def check_encode_nonfinite_bytes():
    """NaN/+Inf/-Inf in g: `pass` and `zero` modes, bytes, residuals and nonfinite_in counts."""
    need_gpu()
    gen, bad, total = torch.Generator().manual_seed(2), [], 0
    for method, cfg in cuda_configs():
        for mode in ("pass", "zero"):
            for world, rank in ((1, 0), (3, 2)):
                for n in (257, (1 << 20) + 3):
                    _encode_case(method, cfg, torch.float32, world, rank, n, gen,
                                 {"error_feedback": True, "nonfinite": mode}, bad)
                    total += 2
    return _report("encode of NaN/Inf", bad, total)


def check_encode_above_2_31_bytes():
    """64-bit offsets: a 2^29 + 17 element fp32 gradient (2 GiB + 68 bytes): `none` with its own
    chunk compressed (a single 2 GiB payload, offsets past 2^31) and int8 at W = 2; then the
    loopback decode of the 2 GiB `none` payload."""
    need_gpu()
    n = (1 << 29) + 17
    free, _ = torch.cuda.mem_get_info()
    if free < 12 * (1 << 30):
        raise Skip(f"needs ~12 GiB of free GPU memory, has {free / 2**30:.1f}")
    g = torch.randn(n, generator=torch.Generator().manual_seed(3))
    detail, bad = {}, []
    for method, world, rank in (("none", 1, 0), ("int8", 2, 1)):
        c = {"compress_own_chunk": world == 1}
        a, _, _ = _encode(fsdpcomp.CommState(method, c), g, world, rank)
        gd = g.cuda()
        dev = fsdpcomp.CommState(method, c)
        b, _, unit = _encode(dev, gd, world, rank)
        detail[method] = {"payload_bytes": a.numel()}
        if not torch.equal(a, b):
            bad.append(f"{method} W={world}: byte {first_diff(a, b)} of {a.numel()} differs")
        if method == "none":  # decode it back on both sides: out = g exactly (W = 1)
            out = torch.empty(n, device="cuda")
            dev._core.decode(b.cuda(), gd, out, 1, 0, unit)
            torch.cuda.synchronize()
            if not torch.equal(out.cpu(), g):
                bad.append("none W=1: the 2 GiB loopback decode is not the gradient")
        del gd, b
        torch.cuda.empty_cache()
    detail["mismatches"] = bad
    if bad:
        raise CheckFailed("; ".join(bad), detail)
    return detail


def check_loopback_decode_of_w_payloads():
    """W payloads encoded by the CPU, decoded (summed, divided, cast) on both sides."""
    need_gpu()
    gen, bad, total = torch.Generator().manual_seed(4), [], 0
    for method, cfg in cuda_configs():
        c = dict(cfg, seed=7)
        for dtype in (torch.float32, torch.bfloat16):
            for world, rank, n, own in ((4, 2, 9, False), (4, 2, 4099, False), (4, 2, 65536 * 3 + 5, False),
                                        (3, 1, 257, True), (1, 0, 1, True), (4, 0, (1 << 20) + 3, False)):
                grads = [(torch.randn(n, generator=gen) * 2).to(dtype) for _ in range(world)]
                slots = []
                for r in range(world):  # what rank r sends to `rank`
                    st = fsdpcomp.CommState(method, dict(c, compress_own_chunk=own))
                    send, _, _ = _encode(st, grads[r], world, r)
                    ss, _ = st._core.plan(grads[r], world, r)
                    off = sum(ss[:rank])
                    slots.append(send[off:off + ss[rank]])
                recv = torch.cat([s for r, s in enumerate(slots) if own or r != rank])
                shard = -(-n // world)
                ref = fsdpcomp.CommState(method, dict(c, compress_own_chunk=own))
                dev = fsdpcomp.CommState(method, dict(c, compress_own_chunk=own))
                out_c = torch.empty(shard + 3, dtype=dtype)  # a padded output: the tail is zeroed
                out_g = torch.full((shard + 3,), 7.0, dtype=dtype, device="cuda")
                ref._core.decode(recv, grads[rank], out_c, world, rank, ref._core.begin(n))
                dev._core.decode(recv.cuda(), grads[rank].cuda(), out_g, world, rank, dev._core.begin(n))
                where = f"{case_name(method, cfg)} dtype={dtype} W={world} r={rank} n={n} own={own}"
                total += 1
                if not same_bits(out_c, out_g):
                    bad.append(f"{where}: decoded sums differ (first at {first_diff(out_c, out_g.cpu())})")
                ca, cb = ref.counters(), dev.counters()
                if ca["nonfinite_out"] != cb["nonfinite_out"]:
                    bad.append(f"{where}: nonfinite_out cpu {ca['nonfinite_out']} gpu {cb['nonfinite_out']}")
    return _report("loopback decode", bad, total)


def check_compress_decompress_single_payloads():
    """State.compress/decompress (the compressed all-gather's and the parameter all-gather's
    path), every method and config, the sparse, aggregate and stateful ones included (a second
    round's sketch sends its table alone): bytes and written size as the CPU's, and acc += alpha *
    D(payload) bit for bit; a refusal is a failure."""
    need_gpu()
    gen, bad, total, skipped = torch.Generator().manual_seed(5), [], 0, []
    for method, cfg in cuda_configs():
        c = dict(cfg, seed=99)
        for n in SIZES:
            x = torch.randn(n, generator=gen) * 2
            cpu, gpu = fsdpcomp.CommState(method, c), fsdpcomp.CommState(method, c)
            size = cpu._core.payload_bytes(n)
            pa = torch.zeros(size, dtype=torch.uint8)
            pb = torch.full((size,), 0xA5, dtype=torch.uint8, device="cuda")
            where = f"{case_name(method, cfg)} n={n}"
            try:
                wa = cpu._core.compress(x, pa, unit=3, chunk=5, world=3, rank=1)
                wb = gpu._core.compress(x.cuda(), pb, unit=3, chunk=5, world=3, rank=1)
            except TypeError as e:  # every method has a single-payload codec on CUDA
                bad.append(f"{where}: refused: {e}")
                break
            where = f"{case_name(method, cfg)} n={n}"
            total += 1
            if wa != wb:
                bad.append(f"{where}: written {wa} (cpu) vs {wb} (gpu)")
            if not torch.equal(pa[:wa], pb[:wa].cpu()):
                bad.append(f"{where}: payload byte {first_diff(pa[:wa], pb[:wa])} differs")
            for alpha in (1.0, -0.5):
                acc = torch.randn(n, generator=gen)
                acc_g = acc.cuda()
                cpu._core.decompress(pa[:wa], acc, alpha=alpha, unit=3, chunk=5, world=3)
                gpu._core.decompress(pa[:wa].cuda(), acc_g, alpha=alpha, unit=3, chunk=5, world=3)
                total += 1
                if not same_bits(acc, acc_g):
                    bad.append(f"{where} alpha={alpha}: decompressed sums differ (first at {first_diff(acc, acc_g)})")
        # a corrupt header: acc NaN, PayloadError at counters()
    st = fsdpcomp.CommState("none", {})
    p = torch.zeros(st._core.payload_bytes(100), dtype=torch.uint8, device="cuda")
    st._core.compress(torch.randn(100, device="cuda"), p)
    p[0] ^= 0xFF
    acc = torch.zeros(100, device="cuda")
    st._core.decompress(p, acc)
    try:
        st.counters()
        bad.append("a corrupt single payload raised nothing at counters()")
    except fsdpcomp.PayloadError as e:
        if "bad magic" not in str(e):
            bad.append(f"corrupt payload: unexpected message {e}")
    if not torch.isnan(acc).all():
        bad.append("corrupt payload: acc not poisoned with NaN")
    detail = _report("compress/decompress", bad, total)
    detail["skipped"] = skipped
    return detail
