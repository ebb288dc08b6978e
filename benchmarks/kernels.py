"""CPU throughput of every compressor's encode and decode-accumulate, one core, at 1M..64M
elements, against memcpy measured in the same run. Results are validated before anything is
timed; a wrong result makes the exit status non-zero. Prints a fixed-width table, writes JSON.

    PYTHONPATH=. python benchmarks/kernels.py                      # 1M and 4M elements
    PYTHONPATH=. python benchmarks/kernels.py --max-size 64M --json kernels.json

Backends are columns: CpuBackend here; benchmarks/kernels_cuda.py adds a CUDA one through
`run(backends=...)` with the same validation and table.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # beside this file: repo_path
import repo_path  # noqa: E402

repo_path.use_checkout()  # fsdpcomp built in place, else the installed one
import fsdpcomp  # noqa: E402
from fsdpcomp import _C  # noqa: E402

# the configurations timed: each method's defaults, sparsifiers at 1%
CONFIGS = {
    "none": {}, "fp16": {}, "bf16": {}, "int8": {}, "int8-stoch": ("int8", {"stochastic": True}),
    "fp8": {}, "intN": {"bits": 4}, "intN-2": ("intN", {"bits": 2}), "intN-3": ("intN", {"bits": 3}),
    "intN-3mm": ("intN", {"bits": 3, "scheme": "minmax"}), "qsgd": {}, "nc": {},
    "topk": {"ratio": 0.01}, "topk-int8": ("topk", {"ratio": 0.01, "quantize": "int8"}),
    "randomk": {"ratio": 0.01}, "thresholdv": {"threshold": 2.5},
    "sketch": {"rows": 3, "cols": 65536, "k": 4096}, "gradiveq": {"dim": 32, "k": 4},
    "signsgd": {}, "onebit": {}, "dct": {}, "dct-int4": ("dct", {"k": 4, "quantize": "intN"}),
}
# the quantisers held to >= 50% of memcpy on one core
QUANTISERS = {"fp16", "bf16", "fp8", "int8", "int8-stoch", "intN", "intN-2", "intN-3", "intN-3mm", "nc", "signsgd",
              "onebit", "qsgd"}


def resolve(label):
    spec = CONFIGS[label]
    return spec if isinstance(spec, tuple) else (label, spec)


def parse_size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
    return int(text[:-1] if text[-1] in "KMG" else text) * mult


def best_of(fn, reps):
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


class CpuBackend:
    """fsdpcomp._C on CPU tensors: State.compress (encode) and State.decompress (decode_add)."""
    name = "cpu"

    def prepare(self, x):
        return x

    def sync(self):
        pass

    def memcpy_seconds(self, x, reps):
        dst = torch.empty_like(x)
        return best_of(lambda: dst.copy_(x), reps)

    def state(self, method, cfg):
        return _C.State(method, dict(cfg, error_feedback=False))

    def buffers(self, state, x):
        return torch.empty(state.payload_bytes(x.numel()), dtype=torch.uint8), torch.zeros_like(x)

    def encode(self, state, x, payload):
        return state.compress(x, payload)

    def decode(self, state, payload, acc):
        state.decompress(payload, acc)


def sparse_k(cfg, n):
    """k of topk/randomk for a chunk of n, as documented: max(1, ceil(ratio * n))."""
    return min(n, max(1, math.ceil(cfg["ratio"] * n)))


def validate(method, cfg, x, backend):
    """Checks one round trip on the benchmark data; returns how many things are wrong."""
    s = backend.state(method, cfg)
    payload, acc = backend.buffers(s, x)
    w = backend.encode(s, x, payload)
    first = payload[:w].clone()
    w2 = backend.encode(s, x, payload)
    wrong = int(w2 != w or not torch.equal(payload[:w], first))  # deterministic bytes
    acc.zero_()
    backend.decode(s, payload[:w], acc)
    d = acc.clone()
    backend.decode(s, payload[:w], acc)
    wrong += int((acc != 2 * d).sum())  # decode *accumulates*
    xs, ds = x.cpu(), d.cpu()
    rel = float((ds - xs).norm() / xs.norm())
    n = xs.numel()
    limits = {"none": 0.0, "fp16": 1e-3, "bf16": 5e-3, "int8": 2e-2, "fp8": 6e-2, "intN": 0.9,
              "qsgd": 1.0, "nc": 0.4, "signsgd": 0.7, "onebit": 0.7,
              "dct": 1.0}  # dct: a projection on a few coefficients per block (noise keeps ~k/64)
    if method in limits:
        wrong += int(not rel <= limits[method])
    elif method == "topk":
        k = sparse_k(cfg, n)
        top = xs.abs().topk(k).indices
        wrong += int((ds != 0).sum() != k) + int((ds[top] == 0).sum())
        if cfg.get("quantize", "none") == "none":
            wrong += int((ds[top] != xs[top]).sum())
    elif method == "randomk":
        wrong += int((ds != 0).sum() > sparse_k(cfg, n))
    elif method == "thresholdv":
        wrong += int(((xs.abs() > cfg["threshold"]) != (ds != 0)).sum())
    elif method == "sketch":
        wrong += int((ds != 0).sum() > cfg["k"])
    elif method == "gradiveq":
        wrong += int(not ds.norm() <= xs.norm() * (1 + 1e-5))
    if method == "dct":  # the kept coefficients never hold more than the block's energy
        wrong += int(not ds.norm() <= xs.norm() * (1 + 1e-3))
    return wrong, w


def run(sizes, labels, backends, reps, out=sys.stdout):
    rows = []
    gen = torch.Generator().manual_seed(0)
    for n in sizes:
        x_cpu = torch.randn(n, generator=gen)
        for be in backends:
            x = be.prepare(x_cpu)
            t_copy = be.memcpy_seconds(x, reps)
            copy_gbs = 4 * n / t_copy / 1e9
            for label in labels:
                method, cfg = resolve(label)
                wrong, w = validate(method, cfg, x, be)
                s = be.state(method, cfg)
                payload, acc = be.buffers(s, x)
                t_enc = best_of(lambda: (be.encode(s, x, payload), be.sync()), reps)
                t_dec = best_of(lambda: (be.decode(s, payload[:w], acc), be.sync()), reps)
                enc_gbs, dec_gbs = 4 * n / t_enc / 1e9, 4 * n / t_dec / 1e9
                rows.append(dict(backend=be.name, label=label, method=method, config=cfg, n=n,
                                 payload_bytes=w, ratio=4 * n / w, memcpy_gbs=copy_gbs,
                                 encode_s=t_enc, decode_s=t_dec, encode_gbs=enc_gbs,
                                 decode_gbs=dec_gbs, encode_frac=enc_gbs / copy_gbs,
                                 decode_frac=dec_gbs / copy_gbs, wrong=wrong))
    print_table(rows, out)
    return rows


def print_table(rows, out):
    head = (f"{'backend':<7} {'method':<11} {'elements':>10} {'ratio':>7} {'memcpy':>8} "
            f"{'enc GB/s':>9} {'enc/cpy':>8} {'dec GB/s':>9} {'dec/cpy':>8} {'#wrong':>7}")
    print(head, file=out)
    print("-" * len(head), file=out)
    for r in rows:
        print(f"{r['backend']:<7} {r['label']:<11} {r['n']:>10} {r['ratio']:>7.2f} "
              f"{r['memcpy_gbs']:>8.2f} {r['encode_gbs']:>9.2f} {r['encode_frac']:>8.0%} "
              f"{r['decode_gbs']:>9.2f} {r['decode_frac']:>8.0%} {r['wrong']:>7}", file=out)
    print("GB/s: fp32 input bytes per second; memcpy: torch copy_ of the same tensor, same run.",
          file=out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-size", default="4M", help="largest size (sizes go 1M, 4M, 16M, 64M up to it)")
    p.add_argument("--methods", default=",".join(CONFIGS), help="comma-separated labels: " + ",".join(CONFIGS))
    p.add_argument("--reps", type=int, default=3, help="timed repetitions; the best counts")
    p.add_argument("--json", default=None, help="write the rows to this JSON file")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the C kernels use one core)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    top = parse_size(a.max_size)
    sizes = [s for s in (1 << 20, 1 << 22, 1 << 24, 1 << 26) if s <= top] or [top]
    labels = [m.strip() for m in a.methods.split(",") if m.strip()]
    bad = [m for m in labels if m not in CONFIGS]
    if bad:
        p.error(f"unknown method labels {bad}; valid: {', '.join(CONFIGS)}")
    rows = run(sizes, labels, [CpuBackend()], a.reps)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"fsdpcomp": fsdpcomp.__version__, "rows": rows}, f, indent=1)
    wrong = sum(r["wrong"] for r in rows)
    if wrong:
        print(f"FAILED: {wrong} wrong results", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
