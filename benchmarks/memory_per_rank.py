# fsdpcomp's own memory per rank (residual + buffers + the C core's scratch), per parameter: measured on W gloo CPU ranks under FSDP2, computed to W = 1024.
"""    python benchmarks/memory_per_rank.py                 # W = 2 and 4 measured, the table
    python benchmarks/memory_per_rank.py --world 2 4 8 --json out.json

Measured: a small MLP (three blocks of Linear(256, 1024) + Linear(1024, 256), each its own FSDP2
unit, and a root with a Linear(256, 10) head) under fully_shard on W gloo CPU ranks, with
fsdpcomp.register, three steps of SGD. Each rank reads its counters(): residual_bytes (the
error-feedback residuals it keeps), buffer_bytes (its send/receive buffers) and scratch_bytes
(the C core's grow-only scratch; on the CPU an 8-bit residual is packed in place, with no
unpacked workspace);
the rank that holds most is reported, divided by the model's parameters.

Computed, for any W, from the units' shapes (FSDP2 pads dim 0 to a multiple of W; rank 0's
shard is the largest), with S = the largest unit's shard (elements of the largest chunk):

- residual: the residual dtype's bytes (fp32 4, int8 1 + 4/64) per element of every unit's
  whole padded gradient: r * sum_u W * shard_u, whatever W.
- buffers: a send and a receive buffer, grown to the largest unit's payloads to the W - 1
  other ranks: 2 (W - 1) payload(S) (benchmarks/mem_model.py's rule).
- scratch: the fp32 working copy of the chunk being encoded, which a decode reuses for its
  sum, 4 S, plus the method's own scratch for a chunk of S (int8: none; topk: k indices and k
  values, 8 k(S) + 64), each rounded up to 64 bytes; with the int8 residual also its carry:
  the per-peer parts (FSDP's path on the CPU) stage a block of 64 that a chunk start cuts,
  272 bytes a block (64 fp32 values and the block's index), at most 3 at once in their order,
  whatever W (before 2026-11-29: the fp32 workspace the largest unit's residual was unpacked
  into for a call, 4 W S).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
import repo_path  # noqa: E402

repo_path.use_checkout()
import mem_model  # noqa: E402

DIM, FF, BLOCKS, CLASSES, BATCH = 256, 1024, 3, 10, 16
UNITS = [[(FF, DIM), (FF,), (DIM, FF), (DIM,)]] * BLOCKS + [[(CLASSES, DIM), (CLASSES,)]]
METHODS = [("int8", {"error_feedback": True}), ("topk", {"ratio": 0.01})]
RESIDUALS = ["fp32", "int8"]


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(DIM, FF), torch.nn.ReLU(), torch.nn.Linear(FF, DIM))
            for _ in range(BLOCKS))
        self.head = torch.nn.Linear(DIM, CLASSES)

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


def _rank(rank: int, world: int, store: str, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    from torch.distributed.fsdp import fully_shard

    import fsdpcomp

    rows = []
    for method, cfg in METHODS:
        for rdt in RESIDUALS:
            torch.manual_seed(0)
            model = MLP()
            for b in model.blocks:
                fully_shard(b)
            fully_shard(model)
            state = fsdpcomp.register(model, method, dict(cfg, residual_dtype=rdt))
            opt = torch.optim.SGD(model.parameters(), lr=1e-3)
            g = torch.Generator().manual_seed(rank)
            for _ in range(3):
                x = torch.randn(BATCH, DIM, generator=g)
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            c = state.counters()
            mine = {k: c[k] for k in ("residual_bytes", "buffer_bytes", "scratch_bytes")}
            every = [None] * world
            dist.all_gather_object(every, mine)
            rows.append({"method": method, "config": cfg, "residual_dtype": rdt, "world": world,
                         **{k: max(r[k] for r in every) for k in mine}})
            del state, model, opt
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f)
    dist.barrier()
    dist.destroy_process_group()


def measure(world: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rows.json")
        mp.start_processes(_rank, args=(world, os.path.join(d, "store"), out), nprocs=world,
                           start_method="spawn")
        with open(out) as f:
            return json.load(f)


def _up64(b: float) -> float:
    return math.ceil(b / 64) * 64


def computed(method: str, cfg: dict, rdt: str, world: int, payload) -> dict:
    shards = [sum(mem_model._shard(s, world) for s in u) for u in UNITS]
    S = max(shards)
    pr = mem_model.per_rank(UNITS, world, payload)
    scratch = _up64(4 * S)
    if method == "topk":
        k = max(1, min(S, math.ceil(cfg["ratio"] * S)))
        scratch += _up64(8 * k + 64)
    if rdt == "int8":  # the carry (fc_res8.c): a slot per block a chunk start cuts, at most 3
        scratch += max(_up64(272 * min(3, sum(c * s % 64 != 0 for c in range(1, world)))) for s in shards)
    return {"residual_bytes": pr["residual_" + rdt], "buffer_bytes": pr["buffers"], "scratch_bytes": scratch}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, nargs="+", default=[2, 4], help="measured world sizes")
    ap.add_argument("--json", default=os.path.join(_HERE, "results", "memory_per_rank.json"),
                    help="where the measured and computed rows go (make_results_md.py reads them)")
    args = ap.parse_args(argv)
    import datetime
    import platform

    import fsdpcomp

    payloads = {m: fsdpcomp.CommState(m, c)._core.payload_bytes for m, c in METHODS}
    measured = []
    for w in args.world:
        for r in measure(w):
            r["computed"] = computed(r["method"], r["config"], r["residual_dtype"], w, payloads[r["method"]])
            r["largest_chunk"] = max(sum(mem_model._shard(s, w) for s in u) for u in UNITS)
            measured.append(r)
    table = [{"world": w, "rows": [dict(computed(m, c, rdt, w, payloads[m]), method=m, config=c, residual_dtype=rdt)
                                   for m, c in METHODS for rdt in RESIDUALS]}
             for w in [2 ** i for i in range(1, 11)]]
    data = {"meta": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                     "machine": platform.node(), "cores": os.cpu_count(), "torch": torch.__version__,
                     "fsdpcomp": fsdpcomp.__version__, "worlds": args.world,
                     "argv": ["benchmarks/memory_per_rank.py"] + (sys.argv[1:] if argv is None else list(argv))},
            "params": mem_model.n_params(UNITS), "units": len(UNITS), "measured": measured, "computed": table}
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(data, f, indent=1)
    import results_mem

    print("\n".join(results_mem.fsdpcomp_section(data, " ".join(["python"] + data["meta"]["argv"]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
