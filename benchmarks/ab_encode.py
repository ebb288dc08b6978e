"""Two builds of fsdpcomp timed alternately on one method's CPU encode and decode, one core:
rounds of (A, B) in fresh processes, each the best of `reps` calls; the best of each side over
the rounds and their ratio. For a change to a codec's wire format or kernels (issue 39's dct
ranks: the tree before the change built beside it).

    python benchmarks/ab_encode.py --a /tmp/dct_old --b . --method dct --cfg '{}' --size 4M
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ONE = r"""
import json, sys, time, torch
torch.set_num_threads(1)
from fsdpcomp import _C
method, cfg, n, reps = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
x = torch.randn(n, generator=torch.Generator().manual_seed(0))
s = _C.State(method, cfg)
p = torch.zeros(s.payload_bytes(n), dtype=torch.uint8)
out = torch.zeros(n)
enc = dec = float("inf")
for _ in range(reps):
    t0 = time.perf_counter(); w = s.compress(x, p); enc = min(enc, time.perf_counter() - t0)
    t0 = time.perf_counter(); s.decompress(p[:w], out); dec = min(dec, time.perf_counter() - t0)
print(json.dumps({"encode_s": enc, "decode_s": dec, "bytes": w}))
"""


def parse_size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20}.get(text[-1], 1)
    return int(text.rstrip("KM")) * mult


def run(tree: str, method: str, cfg: str, n: int, reps: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", ONE, method, cfg, str(n), str(reps)], env=env, check=True,
                         capture_output=True, text=True, cwd=os.path.abspath(tree)).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", required=True, help="tree (or copy) holding the first build's fsdpcomp/")
    p.add_argument("--b", required=True, help="the second")
    p.add_argument("--method", default="dct")
    p.add_argument("--cfg", default="{}")
    p.add_argument("--size", default="4M")
    p.add_argument("--reps", type=int, default=5, help="calls per process; the best counts")
    p.add_argument("--rounds", type=int, default=4, help="alternations of A and B")
    args = p.parse_args()
    n = parse_size(args.size)
    best = {"a": {}, "b": {}}
    for _ in range(args.rounds):
        for side in ("a", "b"):
            r = run(getattr(args, side), args.method, args.cfg, n, args.reps)
            for key, v in r.items():
                best[side][key] = min(best[side].get(key, v), v)
    for key in ("encode_s", "decode_s"):
        a, b = best["a"][key], best["b"][key]
        print(f"{key}: A {a * 1e3:.2f} ms, B {b * 1e3:.2f} ms, B/A {b / a:.3f}")
    print(f"bytes: A {best['a']['bytes']}, B {best['b']['bytes']}, A/B {best['a']['bytes'] / best['b']['bytes']:.3f}")


if __name__ == "__main__":
    main()
