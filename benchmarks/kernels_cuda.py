"""CUDA kernel throughput: encode and decode-accumulate GB/s per method at 16M-256M elements,
against device-to-device copy bandwidth measured in the same run. Validates each method
against the CPU reference first; exits non-zero when a result is wrong. GPU only."""
from __future__ import annotations

import argparse
import sys

import torch

import fsdpcomp

METHODS = [("none", {}), ("fp16", {}), ("bf16", {}), ("int8", {}), ("int8", {"stochastic": True})]


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
    """Payload bytes of a 1M+3 element gradient, CPU vs GPU: number of differing bytes."""
    g = torch.randn((1 << 20) + 3, generator=torch.Generator().manual_seed(0))
    out = []
    for dev in ("cpu", "cuda"):
        st = fsdpcomp.CommState(method, dict(cfg, compress_own_chunk=True))
        gg = g.to(dev)
        s, _ = st._core.plan(gg, 1, 0)
        send = torch.zeros(sum(s), dtype=torch.uint8, device=dev)
        st._core.encode(gg, send, 1, 0, st._core.begin(g.numel()))
        out.append(send.cpu())
    return int((out[0] != out[1]).sum())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="16M,64M,256M")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    print(f"{'method':<16}{'n':>12}{'enc ms':>9}{'enc GB/s':>10}{'enc %cp':>8}"
          f"{'dec ms':>9}{'dec GB/s':>10}{'dec %cp':>8}{'#wrong':>8}")
    failed = 0
    for size in (parse_size(s) for s in args.sizes.split(",")):
        src = torch.randn(size, device="cuda")
        dst = torch.empty_like(src)
        t_copy = timed(lambda: dst.copy_(src), args.reps)
        copy_bw = 2 * size * 4 / t_copy / 1e9
        print(f"{'d2d copy':<16}{size:>12}{t_copy * 1e3:>9.3f}{copy_bw:>10.1f}{100.0:>8.0f}")
        for method, cfg in METHODS:
            name = method + ("-sr" if cfg.get("stochastic") else "")
            wrong = validate(method, cfg)
            failed += wrong != 0
            st = fsdpcomp.CommState(method, dict(cfg, compress_own_chunk=True))
            s, r = st._core.plan(src, 1, 0)
            send = torch.empty(sum(s), dtype=torch.uint8, device="cuda")
            out = torch.empty(size, device="cuda")
            unit = st._core.begin(size)
            t_enc = timed(lambda: st._core.encode(src, send, 1, 0, unit), args.reps)
            t_dec = timed(lambda: st._core.decode(send, src, out, 1, 0, unit), args.reps)
            enc_bytes = size * 4 + send.numel()   # read g, write payload
            dec_bytes = send.numel() + size * 4   # read payload, write out
            eb, db = enc_bytes / t_enc / 1e9, dec_bytes / t_dec / 1e9
            print(f"{name:<16}{size:>12}{t_enc * 1e3:>9.3f}{eb:>10.1f}{100 * eb / copy_bw:>8.0f}"
                  f"{t_dec * 1e3:>9.3f}{db:>10.1f}{100 * db / copy_bw:>8.0f}{wrong:>8}")
        del src, dst
        torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
