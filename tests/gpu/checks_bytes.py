"""GPU checks, group `bytes` (tests/gpu/run.sh bytes, ~3-6 min): every method with CUDA kernels,
every config of tests/helpers/method_cases.py (and each method's defaults), against the CPU path bit for
bit: payload bytes and residuals of the collective's encode at odd sizes (1, 255, 257, 2^20+3)
and one case above 2^31 bytes, NaN/Inf in both `nonfinite` modes, the loopback decode of W
payloads, and the single-payload compress/decompress."""
from __future__ import annotations

import torch

import fsdpcomp
from gpu_common import (EMULATED, DEV, CheckFailed, Skip, case_name, cuda_configs, dev_state, first_diff, need_gpu,
                        need_real_gpu, same_bits, sync, to_dev)

# emulated (run.sh --emulated, CI): the same checks at sizes the host emulation runs in seconds
SIZES = [1, 257] if EMULATED else [1, 255, 257, (1 << 20) + 3]
BIG = 4099 if EMULATED else (1 << 20) + 3
# the loopback decode's (world, rank, n, compress_own_chunk)
LOOPBACK = [(4, 2, 9, False), (4, 2, 4099, False), (3, 1, 257, True), (1, 0, 1, True)]
if not EMULATED:
    LOOPBACK += [(4, 2, 65536 * 3 + 5, False), (4, 0, (1 << 20) + 3, False)]
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def _encode(st, grad, world, rank):
    """The payloads encode() wrote, back to back (as long as the sizes it returns: a
    data-dependent method packs them, the plan's sizes are upper bounds; the rest of the
    plan-sized buffer is not payload), the residual (a copy), the unit, and the sizes."""
    unit = st._core.begin(grad.numel())
    s, _ = st._core.plan(grad, world, rank)
    send = torch.full((sum(s),), 0xA5, dtype=torch.uint8, device=grad.device)  # unwritten bytes show
    sizes = st._core.encode(grad, send, world, rank, unit)
    res = st._core.residuals()[unit] if unit < len(st._core.residuals()) else None
    return (send[:sum(sizes)].cpu().clone(), (None if res is None else res.cpu().clone()), unit, list(sizes))


def _report(what: str, bad: list, total: int) -> dict:
    detail = {"compared": total, "mismatches": len(bad), "first": bad[:20]}
    if bad:
        raise CheckFailed(f"{what}: {len(bad)} of {total} comparisons differ from the CPU", detail)
    return detail


def _encode_case(method, cfg, dtype, world, rank, n, gen, extra, bad, steps=2):
    c = dict(cfg, seed=1234, compress_own_chunk=world == 1, **extra)
    cpu, gpu = fsdpcomp.CommState(method, c), dev_state(method, c)
    for step in range(steps):  # the second step encodes with a non-zero residual
        g = (torch.randn(n, generator=gen) * 3).to(dtype)
        if extra.get("nonfinite"):
            for at, v in ((0, float("nan")), (n // 2, float("inf")), (n - 1, float("-inf"))):
                g[at] = v
        a, ra, _, sa = _encode(cpu, g, world, rank)
        b, rb, _, sb = _encode(gpu, to_dev(g), world, rank)
        where = f"{case_name(method, cfg)} {extra} dtype={dtype} W={world} r={rank} n={n} step={step}"
        if sa != sb:
            bad.append(f"{where}: payload sizes cpu {sa} gpu {sb}")
        elif not torch.equal(a, b):
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
    """The collective's encode: payload bytes and residuals (fp32, bf16, int8) equal the CPU's."""
    need_gpu()
    gen, bad, total = torch.Generator().manual_seed(1), [], 0
    for method, cfg in cuda_configs():
        for dname, dtype in DTYPES.items():
            for world, rank in ((1, 0), (3, 1), (4, 3)):
                for n in SIZES:
                    # fp32, bf16 and the packed int8 residual (csrc/common/fc_res8.h) each in some cases
                    res = ("bf16" if (world == 3 and dname == "f32") else
                           "int8" if (world == 4 and dname == "f32") else "fp32")
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
                for n in (257, BIG):
                    _encode_case(method, cfg, torch.float32, world, rank, n, gen,
                                 {"error_feedback": True, "nonfinite": mode}, bad)
                    total += 2
    return _report("encode of NaN/Inf", bad, total)


def check_encode_above_2_31_bytes():
    """64-bit offsets: a 2^29 + 17 element fp32 gradient (2 GiB + 68 bytes): `none` with its own
    chunk compressed (a single 2 GiB payload, offsets past 2^31) and int8 at W = 2; then the
    loopback decode of the 2 GiB `none` payload."""
    need_real_gpu("2 GiB of device memory")
    n = (1 << 29) + 17
    free, _ = torch.cuda.mem_get_info()
    if free < 12 * (1 << 30):
        raise Skip(f"needs ~12 GiB of free GPU memory, has {free / 2**30:.1f}")
    g = torch.randn(n, generator=torch.Generator().manual_seed(3))
    detail, bad = {}, []
    for method, world, rank in (("none", 1, 0), ("int8", 2, 1)):
        c = {"compress_own_chunk": world == 1}
        a, _, _, _ = _encode(fsdpcomp.CommState(method, c), g, world, rank)
        gd = g.cuda()
        dev = fsdpcomp.CommState(method, c)
        b, _, unit, _ = _encode(dev, gd, world, rank)
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
            for world, rank, n, own in LOOPBACK:
                grads = [(torch.randn(n, generator=gen) * 2).to(dtype) for _ in range(world)]
                slots = []
                for r in range(world):  # what rank r sends to `rank`
                    st = fsdpcomp.CommState(method, dict(c, compress_own_chunk=own))
                    send, _, _, ss = _encode(st, grads[r], world, r)
                    off = sum(ss[:rank])  # encode()'s sizes: thresholdv packs its payloads
                    slots.append(send[off:off + ss[rank]])
                recv = torch.cat([s for r, s in enumerate(slots) if own or r != rank])
                shard = -(-n // world)
                ref = fsdpcomp.CommState(method, dict(c, compress_own_chunk=own))
                dev = fsdpcomp.CommState(method, dict(c, compress_own_chunk=own))
                # a padded output (the tail is zeroed), both filled alike: what a decode leaves
                # unwritten (a second round's first decode only picks coordinates) compares equal
                out_c = torch.full((shard + 3,), 7.0, dtype=dtype)
                out_g = torch.full((shard + 3,), 7.0, dtype=dtype, device=DEV)
                ref._core.decode(recv, grads[rank], out_c, world, rank, ref._core.begin(n))
                dev._core.decode(to_dev(recv), to_dev(grads[rank]), out_g, world, rank, dev._core.begin(n))
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
            cpu, gpu = fsdpcomp.CommState(method, c), dev_state(method, c)
            size = cpu._core.payload_bytes(n)
            pa = torch.zeros(size, dtype=torch.uint8)
            pb = torch.full((size,), 0xA5, dtype=torch.uint8, device=DEV)
            where = f"{case_name(method, cfg)} n={n}"
            try:
                wa = cpu._core.compress(x, pa, unit=3, chunk=5, world=3, rank=1)
                wb = gpu._core.compress(to_dev(x), pb, unit=3, chunk=5, world=3, rank=1)
            except TypeError as e:  # every method has a single-payload codec on CUDA
                bad.append(f"{where}: refused: {e}")
                break
            where = f"{case_name(method, cfg)} n={n}"
            total += 1
            if wa != wb:
                bad.append(f"{where}: written {wa} (cpu) vs {wb} (gpu)")
            elif not torch.equal(pa[:wa], pb[:wb].cpu()):
                bad.append(f"{where}: payload byte {first_diff(pa[:wa], pb[:wb])} differs")
            for alpha in (1.0, -0.5):
                acc = torch.randn(n, generator=gen)
                acc_g = to_dev(acc)  # its own copy: on the emulation's "cpu" device too
                cpu._core.decompress(pa[:wa], acc, alpha=alpha, unit=3, chunk=5, world=3)
                gpu._core.decompress(to_dev(pa[:wa]), acc_g, alpha=alpha, unit=3, chunk=5, world=3)
                total += 1
                if not same_bits(acc, acc_g):
                    bad.append(f"{where} alpha={alpha}: decompressed sums differ (first at {first_diff(acc, acc_g)})")
        # a corrupt header: acc NaN, PayloadError at counters()
    st = dev_state("none", {})
    p = torch.zeros(st._core.payload_bytes(100), dtype=torch.uint8, device=DEV)
    st._core.compress(torch.randn(100, device=DEV), p)
    p[0] ^= 0xFF
    acc = torch.zeros(100, device=DEV)
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
