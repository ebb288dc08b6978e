"""Resident memory over many calls on 2 gloo ranks (thresholdv's RSS crept ~0.3 MB over 24k
calls where a bare gloo control did not). Each variant runs `--calls` calls and prints
rank 0's RSS every `--every` calls, from the first report on (warm-up excluded), so a variant
that creeps shows a rising column. The variants bisect the thresholdv call: the full call, its
size exchange alone (fresh or reused tensors), gloo all_to_all_single with the same varying
splits, with fixed ones and with none, an all-gather, the Python side alone, and int8. Findings:
docs/decisions.md, "Lessons".

    python benchmarks/rss_creep.py --calls 24000 --every 4000
    python benchmarks/rss_creep.py --variants thresholdv,a2a_varying --malloc_trim
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import repo_path  # noqa: E402

repo_path.use_checkout()  # the checkout's fsdpcomp when it was built in place

import fsdpcomp  # noqa: E402

VARIANTS = ("thresholdv", "size_exchange", "size_exchange_reused", "a2a_varying", "a2a_fixed",
            "a2a_plain", "all_gather", "tensor_tolist", "int8")


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def _varying_splits(g, world):
    """Byte splits that vary per call the way thresholdv's payload sizes do."""
    return [int(v) for v in torch.randint(2000, 6000, (world,), generator=g)]


def _rank(rank, world, store, variant, calls, every, n, trim, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    libc = ctypes.CDLL("libc.so.6") if trim else None
    g = torch.Generator().manual_seed(rank)
    grad = torch.randn(n, generator=g)
    shard = torch.empty(n // world)
    state = None
    if variant in ("thresholdv", "int8"):
        state = fsdpcomp.CommState(variant, {"threshold": 1.0} if variant == "thresholdv" else {})
    big = torch.zeros(world * 8192, dtype=torch.uint8)
    recv = torch.zeros(world * 8192, dtype=torch.uint8)
    sizes_out = torch.zeros(world, dtype=torch.int64)
    sizes_in = torch.zeros(world, dtype=torch.int64)
    rows = []
    for i in range(1, calls + 1):
        if state is not None:
            state.reduce_scatter(grad, shard)
            state.end_step()
        elif variant == "a2a_plain":  # equal splits, no split lists, no small tensors
            dist.all_to_all_single(recv, big)
        elif variant == "all_gather":  # another gloo collective of the same size
            dist.all_gather_single(recv[:world * 8192], big[:8192])
        elif variant == "tensor_tolist":  # the size exchange's Python side, no collective
            torch.tensor(_varying_splits(g, world), dtype=torch.int64).tolist()
            torch.empty(world, dtype=torch.int64)
        elif variant == "size_exchange_reused":  # the same values through tensors made once
            sizes_out.copy_(torch.tensor(_varying_splits(g, world), dtype=torch.int64))
            dist.all_to_all_single(sizes_in, sizes_out)
            sizes_in.tolist()
        elif variant == "size_exchange":
            out_sizes = torch.tensor(_varying_splits(g, world), dtype=torch.int64)
            in_sizes = torch.empty(world, dtype=torch.int64)
            dist.all_to_all_single(in_sizes, out_sizes)
            in_sizes.tolist()
        else:
            send_splits = _varying_splits(g, world) if variant == "a2a_varying" else [4096] * world
            sizes = torch.tensor(send_splits, dtype=torch.int64)
            back = torch.empty(world, dtype=torch.int64)
            dist.all_to_all_single(back, sizes)
            recv_splits = back.tolist()
            dist.all_to_all_single(recv[:sum(recv_splits)], big[:sum(send_splits)], recv_splits,
                                   send_splits)
        if libc is not None and i % every == 0:
            libc.malloc_trim(0)
        if i % every == 0:
            rows.append((i, rss_kib()))
    if rank == 0:
        torch.save(rows, out)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=24000)
    ap.add_argument("--every", type=int, default=4000)
    ap.add_argument("--numel", type=int, default=16384)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--malloc_trim", action="store_true", help="call malloc_trim(0) before each report")
    args = ap.parse_args()
    print(f"rank 0 VmRSS (KiB) every {args.every} calls; 2 gloo ranks, {args.numel} elements"
          f"{', malloc_trim before each report' if args.malloc_trim else ''}")
    print(f"{'variant':<20} " + " ".join(f"{i:>9}" for i in range(args.every, args.calls + 1, args.every))
          + f" {'growth':>9}")
    for variant in args.variants.split(","):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "rows.pt")
            mp.start_processes(_rank, args=(2, os.path.join(d, "store"), variant, args.calls, args.every,
                                            args.numel, args.malloc_trim, out),
                               nprocs=2, start_method="spawn")
            rows = torch.load(out)
        vals = [r for _, r in rows]
        print(f"{variant:<20} " + " ".join(f"{v:>9}" for v in vals) + f" {vals[-1] - vals[0]:>+9}")


if __name__ == "__main__":
    main()
