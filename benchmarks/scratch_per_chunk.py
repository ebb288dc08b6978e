# The C core's scratch_bytes per element of the largest chunk, for every method case of the tests (fp32, int8 residuals, bf16 grads and outputs), W ranks simulated in one process.
"""    python benchmarks/scratch_per_chunk.py                  # N = 16609, W = 2 and 4
    python benchmarks/scratch_per_chunk.py --numel 6241 --world 2
    python benchmarks/scratch_per_chunk.py --variant int8 bf16

Every case of tests/helpers/method_cases.py, with and without error feedback, in three variants
(fp32; residual_dtype "int8", error feedback on; bf16 gradients and outputs): W CommStates run
the collective's C calls (plan, begin, encode, decode; tests/helpers/wire_sim.py's routing, the
transport a copy) for two steps, and the largest counters()["scratch_bytes"] of the W is
printed, and divided by the elements of the largest chunk, ceil(N / W). Issue 38 holds it to
<= 8 B per element (tests/core/test_scratch_bound.py)."""
from __future__ import annotations

import argparse
import os
import sys

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.join(os.path.dirname(_HERE), "tests")]
import repo_path  # noqa: E402

repo_path.use_checkout()
import fsdpcomp  # noqa: E402
from helpers import wire_sim  # noqa: E402
from helpers.method_cases import CASES, case_id  # noqa: E402


# the table's variants: (label, extra config, gradient and output dtype)
VARIANTS = {"fp32": ({}, torch.float32), "int8": ({"residual_dtype": "int8"}, torch.float32),
            "bf16": ({}, torch.bfloat16)}


def scratch(method: str, cfg: dict, numel: int, world: int, dtype=torch.float32) -> int:
    states = [fsdpcomp.CommState(method, cfg) for _ in range(world)]
    g = torch.Generator().manual_seed(1)
    grads = [torch.randn(numel, generator=g).to(dtype) for _ in range(world)]
    outs = [torch.empty(-(-numel // world), dtype=dtype) for _ in range(world)]
    for _ in range(2):
        wire_sim.exchange(states, grads, outs)
        wire_sim.end_step(states)
    return max(s.counters()["scratch_bytes"] for s in states)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--numel", type=int, default=16609, help="elements of the unit (issue 38's FSDP1 unit)")
    ap.add_argument("--world", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--variant", nargs="+", default=list(VARIANTS), choices=list(VARIANTS),
                    help="fp32: fp32 grads and residuals; int8: residual_dtype int8 (EF rows "
                    "only); bf16: bf16 grads and outputs, fp32 residuals")
    args = ap.parse_args(argv)
    print("| case | variant | EF | " + " | ".join(f"W={w} bytes | W={w} B/elt" for w in args.world) + " |")
    print("|---|---|---|" + "---:|---:|" * len(args.world))
    worst = 0.0
    for method, cfg in CASES:
        for variant in args.variant:
            extra, dtype = VARIANTS[variant]
            for ef in (True, False) if variant != "int8" else (True,):
                cells = []
                for w in args.world:
                    b = scratch(method, dict(cfg, error_feedback=ef, **extra), args.numel, w, dtype)
                    per = -(-args.numel // w)
                    worst = max(worst, b / per)
                    cells += [f"{b:,}", f"{b / per:.2f}"]
                print(f"| {case_id((method, cfg))} | {variant} | {'on' if ef else 'off'} | " +
                      " | ".join(cells) + " |")
    print(f"\nlargest: {worst:.2f} B per element of the largest chunk")
    return 0


if __name__ == "__main__":
    sys.exit(main())
