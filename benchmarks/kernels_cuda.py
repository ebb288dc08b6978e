"""CUDA kernel throughput: encode and decode-accumulate GB/s per method at 16M-256M elements,
against device-to-device copy bandwidth measured in the same run. Validates each method
against the CPU reference first (payload bytes of the encode, bits of the decode); exits
non-zero when a result is wrong. GPU only.

GB/s counts the bytes a kernel must move: encode reads g (and with --ef reads and writes the
fp32 residual) and writes the payload; decode reads the payload and the own chunk is not
involved (W = 1, own chunk compressed) and writes the fp32 output. Copy: 2 x 4n bytes."""
from __future__ import annotations

import argparse
import sys

import torch

import fsdpcomp

METHODS = [
    ("none", {}), ("fp16", {}), ("bf16", {}), ("int8", {}), ("int8", {"stochastic": True}),
    ("fp8", {}), ("fp8", {"format": "e5m2"}), ("intN", {}), ("intN", {"bits": 2, "stochastic": True}),
    ("intN", {"bits": 3}), ("intN", {"bits": 3, "scheme": "minmax"}), ("qsgd", {}), ("nc", {}), ("onebit", {}),
]


def label(method: str, cfg: dict) -> str:
    return method + "".join(f"-{v}" if isinstance(v, str) else f"-{k[:2]}{int(v)}" for k, v in cfg.items())


def parse_size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1], 1)
    return int(s.rstrip("KMG")) * mult


def timed(fn, reps: int) -> float:
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def validate(method: str, cfg: dict) -> int:
    """A 1M+3 element gradient, CPU vs GPU: differing payload bytes plus differing decoded values
    (NaN never appears: the data is finite)."""
    g = torch.randn((1 << 20) + 3, generator=torch.Generator().manual_seed(0))
    sends, outs = [], []
    for dev in ("cpu", "cuda"):
        st = fsdpcomp.CommState(method, dict(cfg, compress_own_chunk=True, seed=5))
        gg = g.to(dev)
        s, _ = st._core.plan(gg, 1, 0)
        send = torch.zeros(sum(s), dtype=torch.uint8, device=dev)
        unit = st._core.begin(g.numel())
        st._core.encode(gg, send, 1, 0, unit)
        out = torch.empty_like(gg)
        st._core.decode(sends[0].to(dev) if sends else send, gg, out, 1, 0, unit)  # both decode the CPU's
        sends.append(send.cpu())
        outs.append(out.cpu())
    return int((sends[0] != sends[1]).sum()) + int((outs[0].view(torch.int32) != outs[1].view(torch.int32)).sum())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="16M,64M,256M")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--methods", default="", help="comma-separated labels (as printed) to run; all by default")
    ap.add_argument("--ef", action="store_true", help="encode with error feedback (fp32 residual)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    chosen = [(m, c) for m, c in METHODS if not args.methods or label(m, c) in args.methods.split(",")]
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  error feedback: {args.ef}")
    print(f"{'method':<18}{'n':>12}{'enc ms':>9}{'enc GB/s':>10}{'enc %cp':>8}"
          f"{'dec ms':>9}{'dec GB/s':>10}{'dec %cp':>8}{'#wrong':>8}")
    wrong = {label(m, c): validate(m, c) for m, c in chosen}
    for size in (parse_size(s) for s in args.sizes.split(",")):
        src = torch.randn(size, device="cuda")
        dst = torch.empty_like(src)
        t_copy = timed(lambda: dst.copy_(src), args.reps)
        copy_bw = 2 * size * 4 / t_copy / 1e9
        print(f"{'d2d copy':<18}{size:>12}{t_copy * 1e3:>9.3f}{copy_bw:>10.1f}{100.0:>8.0f}")
        for method, cfg in chosen:
            st = fsdpcomp.CommState(method, dict(cfg, compress_own_chunk=True, error_feedback=args.ef,
                                                 error_stats_every=0))
            s, _ = st._core.plan(src, 1, 0)
            send = torch.empty(sum(s), dtype=torch.uint8, device="cuda")
            out = torch.empty(size, device="cuda")
            unit = st._core.begin(size)
            t_enc = timed(lambda: st._core.encode(src, send, 1, 0, unit), args.reps)
            t_dec = timed(lambda: st._core.decode(send, src, out, 1, 0, unit), args.reps)
            ef = args.ef and st._core.residuals()[unit] is not None
            enc_bytes = size * 4 * (3 if ef else 1) + send.numel()  # read g (and e), write e and payload
            dec_bytes = send.numel() + size * 4  # read payload, write out
            eb, db = enc_bytes / t_enc / 1e9, dec_bytes / t_dec / 1e9
            name = label(method, cfg)
            print(f"{name:<18}{size:>12}{t_enc * 1e3:>9.3f}{eb:>10.1f}{100 * eb / copy_bw:>8.0f}"
                  f"{t_dec * 1e3:>9.3f}{db:>10.1f}{100 * db / copy_bw:>8.0f}{wrong[name]:>8}")
            del st, send, out
        del src, dst
        torch.cuda.empty_cache()
    return 1 if any(wrong.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
