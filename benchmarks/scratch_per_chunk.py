# The C core's scratch_bytes per element of the largest chunk, for every method case of the tests, W ranks simulated in one process.
"""    python benchmarks/scratch_per_chunk.py                  # N = 16609, W = 2 and 4
    python benchmarks/scratch_per_chunk.py --numel 6241 --world 2

Every case of tests/helpers/method_cases.py, with and without error feedback: W CommStates run
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


def scratch(method: str, cfg: dict, numel: int, world: int) -> int:
    states = [fsdpcomp.CommState(method, cfg) for _ in range(world)]
    g = torch.Generator().manual_seed(1)
    grads = [torch.randn(numel, generator=g) for _ in range(world)]
    outs = [torch.empty(-(-numel // world)) for _ in range(world)]
    for _ in range(2):
        wire_sim.exchange(states, grads, outs)
        wire_sim.end_step(states)
    return max(s.counters()["scratch_bytes"] for s in states)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--numel", type=int, default=16609, help="elements of the unit (issue 38's FSDP1 unit)")
    ap.add_argument("--world", type=int, nargs="+", default=[2, 4])
    args = ap.parse_args(argv)
    print("| case | EF | " + " | ".join(f"W={w} bytes | W={w} B/elt" for w in args.world) + " |")
    print("|---|---|" + "---:|---:|" * len(args.world))
    worst = 0.0
    for method, cfg in CASES:
        for ef in (True, False):
            cells = []
            for w in args.world:
                b = scratch(method, dict(cfg, error_feedback=ef), args.numel, w)
                per = -(-args.numel // w)
                worst = max(worst, b / per)
                cells += [f"{b:,}", f"{b / per:.2f}"]
            print(f"| {case_id((method, cfg))} | {'on' if ef else 'off'} | " + " | ".join(cells) + " |")
    print(f"\nlargest: {worst:.2f} B per element of the largest chunk")
    return 0


if __name__ == "__main__":
    sys.exit(main())
