"""CUDA kernel throughput: encode and decode-accumulate GB/s per method at 16M-256M elements,
against device-to-device copy bandwidth measured in the same run. Every method with CUDA kernels
(method_info(name)["cuda"]) at its defaults (thresholdv at a threshold that keeps ~1% of
N(0, 1) data: its default keeps nearly all, which goes as `none`), and the variants that run
other kernel paths (int8 stochastic, fp8 e5m2, intN 2-bit stochastic, 3-bit, 3-bit min-max;
signsgd majority, the sparsifiers' value codecs, thresholdv's sign bits, the bitmap index coding),
each validated against the CPU reference first (payload bytes of the encode, bits of the decode);
exits non-zero when a result is wrong. The targets (quantisers >= 80% of copy bandwidth,
top-k / selection >= 25%) are reported per row, not enforced. GPU only; `--list` prints the
cases (and this build's CUDA flags) without one.

GB/s counts the bytes a kernel must move: encode reads g (with --ef also reads and writes the
fp32 residual) and writes the payload; decode reads the payload and writes the fp32 output
(W = 1, own chunk compressed). Copy: 2 x 4n bytes.

    python benchmarks/kernels_cuda.py [--sizes 16M,64M,256M] [--reps 20] [--ef] [--methods a,b] [--json FILE]
    python benchmarks/kernels_cuda.py --profile quick|rest [--json FILE]
    python benchmarks/kernels_cuda.py --list [--profile quick|rest]

--profile splits the full table (every case at 16M, 64M, 256M) for tests/gpu/run.sh's two GPU
commands: quick times the six codecs users reach for first (int8, fp8, intN, topk, sketch,
onebit, at their defaults) at 16M and 64M; rest times every other row. Each case runs
min(--reps, what fits in about half a second) repetitions (at least 3), so a slow kernel costs
seconds, not minutes (gradiveq's encode took 1.4 s at 64M on an H200).
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

import fsdpcomp

SELECTION = {"topk", "randomk", "thresholdv"}  # target: >= 25% of copy bandwidth
NO_TARGET = {"sketch", "gradiveq"}              # compressed-domain sums: no target set
QUANTISER_TARGET, SELECTION_TARGET = 0.80, 0.25
# configs besides the defaults whose kernels take other paths
VARIANTS = {"int8": [{"stochastic": True}], "fp8": [{"format": "e5m2"}],
            "intN": [{"bits": 2, "stochastic": True}, {"bits": 3}, {"bits": 3, "scheme": "minmax"}],
            "signsgd": [{"mode": "majority"}],
            "topk": [{"quantize": "int8"}, {"quantize": "fp16"}, {"ratio": 0.3}],  # 0.3: a bitmap
            "randomk": [{"quantize": "int8"}],
            "thresholdv": [{"threshold": 2.5, "values": "sign"}, {"threshold": 2.5, "quantize": "int8"}]}
# a method's benchmarked defaults where its own would measure something else
BASE = {"thresholdv": {"threshold": 2.5}}
FULL_SIZES = (16 << 20, 64 << 20, 256 << 20)
QUICK_LABELS, QUICK_SIZES = ("int8", "fp8", "intN", "topk", "sketch", "onebit"), (16 << 20, 64 << 20)
REP_SECONDS = 0.5  # about this long per timed case, within [3, --reps] repetitions


def label(method: str, cfg: dict) -> str:
    def part(k, v):
        if isinstance(v, str):
            return f"-{v}"
        return f"-{k[:2]}{int(v) if isinstance(v, (bool, int)) else format(v, 'g')}"
    return method + "".join(part(k, v) for k, v in cfg.items())


def parse_size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1], 1)
    return int(s.rstrip("KMG")) * mult


def cases_of(methods) -> list[tuple[str, dict]]:
    """Each method at its (BASE) defaults and in VARIANTS."""
    out = []
    for m in methods:
        out += [(m, dict(BASE.get(m, {})))] + [(m, c) for c in VARIANTS.get(m, [])]
    return out


def cuda_methods() -> list[tuple[str, dict]]:
    """Every method this build runs on CUDA tensors: method_info's "cuda" flag, else a probe;
    each at its defaults and in VARIANTS."""
    have = []
    for m in fsdpcomp.codecs():
        info = fsdpcomp.method_info(m)
        if "cuda" in info:
            has = info["cuda"]
        else:
            st = fsdpcomp.CommState(m, {"compress_own_chunk": True})
            g = torch.randn(64, device="cuda")
            s, _ = st._core.plan(g, 1, 0)
            try:
                st._core.encode(g, torch.empty(sum(s), dtype=torch.uint8, device="cuda"), 1, 0, st._core.begin(64))
                has = True
            except TypeError:
                has = False
        if has:
            have.append(m)
    return cases_of(have)


def timed(fn, reps: int) -> float:
    """Seconds per call: one warm-up call, timed, sets how many of at most `reps` fit in
    REP_SECONDS (at least 3); the mean of those, by CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    once = start.elapsed_time(end) / 1e3
    reps = max(3, min(reps, int(REP_SECONDS / max(once, 1e-6))))
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def rows_of(cases: list[tuple[str, dict]], profile: str, sizes: tuple[int, ...]) -> list[tuple[str, dict, int]]:
    """(method, cfg, n) to time: every case at `sizes` (all), or the quick / rest part of the
    full table."""
    every = [(m, c, n) for n in (sizes if profile == "all" else FULL_SIZES) for m, c in cases]
    def quick(row):
        return label(row[0], row[1]) in QUICK_LABELS and row[2] in QUICK_SIZES
    if profile == "quick":
        return [r for r in every if quick(r)]
    if profile == "rest":
        return [r for r in every if not quick(r)]
    return every


def validate(method: str, cfg: dict) -> int:
    """A 1M+3 element gradient, CPU vs GPU: differing payload bytes plus differing decoded values
    of the CPU's payload (no NaN: the data is finite)."""
    g = torch.randn((1 << 20) + 3, generator=torch.Generator().manual_seed(0))
    sends, outs = [], []
    for dev in ("cpu", "cuda"):
        st = fsdpcomp.CommState(method, dict(cfg, compress_own_chunk=True, seed=5))
        gg = g.to(dev)
        s, _ = st._core.plan(gg, 1, 0)
        send = torch.zeros(sum(s), dtype=torch.uint8, device=dev)
        unit = st._core.begin(g.numel())
        # the plan's sizes are upper bounds: a data-dependent method packs fewer bytes, and
        # decode takes exactly the bytes encode wrote
        send = send[:sum(st._core.encode(gg, send, 1, 0, unit))]
        out = torch.empty_like(gg)
        st._core.decode(sends[0].to(dev) if sends else send, gg, out, 1, 0, unit)  # both decode the CPU's
        sends.append(send.cpu())
        outs.append(out.cpu())
    return int((sends[0] != sends[1]).sum()) + int((outs[0].view(torch.int32) != outs[1].view(torch.int32)).sum())


def target_of(method: str):
    return None if method in NO_TARGET else SELECTION_TARGET if method in SELECTION else QUANTISER_TARGET


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="16M,64M,256M")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--ef", action="store_true", help="encode with error feedback (fp32 residual)")
    ap.add_argument("--methods", default="", help="comma-separated labels (as printed) to run; all by default")
    ap.add_argument("--json", default=None, help="also write the table (and the device) here")
    ap.add_argument("--profile", choices=("all", "quick", "rest"), default="all",
                    help="quick / rest: the two halves of the full table (tests/gpu/run.sh); all: --sizes")
    ap.add_argument("--list", action="store_true", help="print the rows and their targets, then exit (no GPU needed)")
    args = ap.parse_args(argv)
    try:
        sizes = [parse_size(x) for x in args.sizes.split(",")]
    except ValueError:
        ap.error(f"--sizes must be comma-separated counts like 16M or 1024, got {args.sizes!r}")
    if any(n <= 0 for n in sizes) or args.reps < 1:
        ap.error(f"--sizes must be positive and --reps at least 1, got {args.sizes!r} and {args.reps}")
    return args


def list_rows(args) -> int:
    """Every row the arguments time (all of fsdpcomp's codecs: no GPU needed to list them), its
    target, and whether this build runs it on CUDA."""
    print(f"{'case':<22}{'n':>12}{'target':>8}  cuda")
    cases = [(m, c) for m, c in cases_of(fsdpcomp.codecs()) if not args.methods or label(m, c) in args.methods.split(",")]
    for method, cfg, n in rows_of(cases, args.profile, tuple(parse_size(x) for x in args.sizes.split(","))):
        target = target_of(method)
        has = fsdpcomp.method_info(method).get("cuda")
        print(f"{label(method, cfg):<22}{n:>12}{'-' if target is None else f'{target:.0%}':>8}  {has}")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        return list_rows(args)
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    methods = [(m, c) for m, c in cuda_methods() if not args.methods or label(m, c) in args.methods.split(",")]
    rows = rows_of(methods, args.profile, tuple(parse_size(x) for x in args.sizes.split(",")))
    methods = [mc for mc in methods if any(label(*mc) == label(m, c) for m, c, _ in rows)]
    device = torch.cuda.get_device_name()
    print(f"device: {device}  torch {torch.__version__}  error feedback: {args.ef}")
    print(f"{'method':<18}{'n':>12}{'enc ms':>9}{'enc GB/s':>10}{'enc %cp':>8}"
          f"{'dec ms':>9}{'dec GB/s':>10}{'dec %cp':>8}{'#wrong':>8}{'target':>8}")
    wrong = {label(m, c): validate(m, c) for m, c in methods}  # validate before timing
    timed_rows, rows = rows, []
    for size in sorted({n for _, _, n in timed_rows}):
        src = torch.randn(size, device="cuda")
        dst = torch.empty_like(src)
        t_copy = timed(lambda: dst.copy_(src), args.reps)
        copy_bw = 2 * size * 4 / t_copy / 1e9
        print(f"{'d2d copy':<18}{size:>12}{t_copy * 1e3:>9.3f}{copy_bw:>10.1f}{100.0:>8.0f}")
        rows.append({"method": "d2d copy", "n": size, "ms": t_copy * 1e3, "GBps": copy_bw})
        for method, cfg in [(m, c) for m, c, n in timed_rows if n == size]:
            name = label(method, cfg)
            st = fsdpcomp.CommState(method, dict(cfg, compress_own_chunk=True, error_feedback=args.ef,
                                                 error_stats_every=0))
            s, _ = st._core.plan(src, 1, 0)
            send = torch.empty(sum(s), dtype=torch.uint8, device="cuda")
            out = torch.empty(size, device="cuda")
            unit = st._core.begin(size)
            t_enc = timed(lambda: st._core.encode(src, send, 1, 0, unit), args.reps)
            wrote = sum(st._core.encode(src, send, 1, 0, unit))  # <= the plan's (data-dependent packing)
            t_dec = timed(lambda: st._core.decode(send[:wrote], src, out, 1, 0, unit), args.reps)
            ef = args.ef and st._core.residuals()[unit] is not None
            enc_bytes = size * 4 * (3 if ef else 1) + wrote  # read g (and e), write e and payload
            dec_bytes = wrote + size * 4  # read payload, write out
            eb, db = enc_bytes / t_enc / 1e9, dec_bytes / t_dec / 1e9
            target = target_of(method)
            met = None if target is None else bool(min(eb, db) >= target * copy_bw)
            mark = "-" if met is None else ("MET" if met else "MISSED")
            print(f"{name:<18}{size:>12}{t_enc * 1e3:>9.3f}{eb:>10.1f}{100 * eb / copy_bw:>8.0f}"
                  f"{t_dec * 1e3:>9.3f}{db:>10.1f}{100 * db / copy_bw:>8.0f}{wrong[name]:>8}{mark:>8}")
            rows.append({"method": name, "n": size, "ef": ef, "enc_ms": t_enc * 1e3, "enc_GBps": eb,
                         "enc_frac_copy": eb / copy_bw, "dec_ms": t_dec * 1e3, "dec_GBps": db,
                         "dec_frac_copy": db / copy_bw, "wrong": wrong[name], "target": target,
                         "target_met": met})
            del send, out, st
        del src, dst
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "torch": torch.__version__, "ef": args.ef, "profile": args.profile, "rows": rows,
                       "methods_wrong": sum(1 for v in wrong.values() if v)}, f, indent=1)
    return 1 if any(wrong.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
