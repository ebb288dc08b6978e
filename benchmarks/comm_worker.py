# One rank of comm_bench: times every baseline and fsdpcomp method on one link, validates each result, rank 0 writes JSON.
"""Run by comm_bench.py (never by hand): `python benchmarks/comm_worker.py CONFIG.json`, with
torchrun's environment. Every rank draws its gradient from a generator keyed by (seed, size,
rank, chunk), so each rank can rebuild the exact fp64 mean of its own shard and check every
method against it before trusting its time."""
from __future__ import annotations

import json
import math
import statistics
import sys
import time
import warnings

import torch
import torch.distributed as dist

import fsdpcomp
import worker_end

# Torch baselines; everything else in the table is an fsdpcomp method name.
TORCH_RS = "torch_reduce_scatter"
BF16_HOOK = "torch_bf16_hook"

# Largest relative L2 error a correct implementation shows on N(0,1) data (a looser value
# would hide a wrong result, a tighter one would flag rounding).
_TOLERANCE = {TORCH_RS: 1e-6, "none": 1e-6, BF16_HOOK: 1e-2, "bf16": 1e-2, "fp16": 1e-3,
              "int8": 2e-2}


def _chunk(seed: int, numel: int, rank: int, chunk: int, shard: int) -> torch.Tensor:
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + numel) * 131 + rank * 17 + chunk)
    return torch.randn(shard, generator=g, dtype=torch.float32)


def _gradient(seed: int, numel: int, rank: int, world: int) -> torch.Tensor:
    shard = numel // world
    return torch.cat([_chunk(seed, numel, rank, c, shard) for c in range(world)])


def _reference(seed: int, numel: int, rank: int, world: int) -> torch.Tensor:
    shard = numel // world
    acc = torch.zeros(shard, dtype=torch.float64)
    for r in range(world):
        acc += _chunk(seed, numel, r, rank, shard).double()
    return acc / world


def _rs_single(out: torch.Tensor, inp: torch.Tensor) -> None:
    # torch 2.13 renamed reduce_scatter_tensor; either is the same collective.
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn(out, inp)


def _tx_bytes(path: str | None) -> int | None:
    if not path:
        return None
    with open(path) as f:
        return int(f.read())


class _Case:
    """One thing to time: prepare() (untimed) then call() (timed) then finish() (untimed)."""

    def __init__(self, name: str, world: int, numel: int, config: dict | None = None):
        self.name, self.world, self.numel = name, world, numel
        self.shard = numel // world
        self.state = None
        if name == BF16_HOOK:
            from torch.distributed.algorithms._comm_hooks import default_hooks
            self._rs_hook = default_hooks.reduce_scatter_hook
            self._hook_state = default_hooks.LowPrecisionState(dist.group.WORLD, parameter_type=torch.float32)
        elif name != TORCH_RS:
            self.state = fsdpcomp.CommState(name, config)

    def prepare(self, base: torch.Tensor) -> None:
        # The bf16 hook re-types its arguments in place: fresh tensors for every call.
        self.grad = base.clone()
        self.out = torch.empty(self.shard, dtype=torch.float32)

    def call(self) -> None:
        if self.name == TORCH_RS:
            _rs_single(self.out, self.grad)
            self.out.div_(self.world)  # gloo has no AVG: FSDP's own post-divide
        elif self.name == BF16_HOOK:
            # bf16_compress_hook's own steps: its last one, record_stream, exists only for CUDA
            # tensors (on CPU it raises "unknown parameter type"), so on CPU it is left out.
            grad16 = self.grad.to(torch.bfloat16)
            out16 = torch.empty(self.shard, dtype=torch.bfloat16)
            self._rs_hook(self._hook_state, grad16, out16)
            self.out.copy_(out16)
        else:
            self.state.reduce_scatter(self.grad, self.out)

    def finish(self) -> None:
        if self.state is not None:
            self.state.end_step()  # outside autograd nothing else marks the step


def _measure(case: _Case, base: torch.Tensor, ref: torch.Tensor, reps: int, tx_path: str | None) -> dict:
    case.prepare(base)
    case.call()  # warm-up, and the call whose result is checked (residuals still zero)
    case.finish()
    out = case.out.to(torch.float32).double()
    finite = bool(torch.isfinite(out).all())
    rel_err = float((out - ref).norm() / ref.norm()) if finite else math.inf
    if case.state is not None:
        case.state.reset_counters()
    times = []
    # Sends return once the socket holds the data; a barrier on the same connections makes sure
    # the bytes have left before the interface counter is read.
    dist.barrier()
    tx0 = _tx_bytes(tx_path)
    for _ in range(reps):
        case.prepare(base)
        dist.barrier()
        t0 = time.perf_counter()
        case.call()
        times.append(time.perf_counter() - t0)
        case.finish()
    dist.barrier()
    tx1 = _tx_bytes(tx_path)
    # A collective is as slow as its slowest rank.
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    row = {"method": case.name, "rel_err": rel_err, "finite": finite, "times_s": t.tolist(),
           "wire_tx_bytes": None if tx0 is None else (tx1 - tx0) / reps}
    if case.state is not None:
        k = case.state.counters()
        calls = max(k["calls"], 1)
        row.update(bytes_raw=k["bytes_raw"] / calls, bytes_sent=k["bytes_sent"] / calls,
                   ratio=k["ratio"], density=k["density"], compress_s=k["compress_time_s"] / calls,
                   decompress_s=k["decompress_time_s"] / calls, comm_s=k["comm_time_s"] / calls,
                   config=case.state.config)
    else:
        # What a reduce-scatter must move from each rank, in the dtype it is sent in.
        elem = 2 if case.name == BF16_HOOK else 4
        raw = (case.world - 1) * case.shard * 4
        row.update(bytes_raw=raw, bytes_sent=(case.world - 1) * case.shard * elem, ratio=raw / ((case.world - 1) * case.shard * elem),
                   density=1.0, compress_s=None, decompress_s=None, comm_s=None, config=None)
    return row


def link_check(world: int, rank: int, nbytes: int) -> float:
    """Gbit/s of a plain point-to-point send from rank 0 to rank 1 (the last of three)."""
    buf = torch.empty(nbytes // 4, dtype=torch.float32)
    rate = 0.0
    for _ in range(3):
        dist.barrier()
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(buf, 1)
        elif rank == 1:
            dist.recv(buf, 0)
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        rate = nbytes * 8 / dt.item() / 1e9
    return rate


def main(config_path: str) -> None:
    with open(config_path) as f:
        cfg = json.load(f)
    warnings.filterwarnings("ignore", category=FutureWarning)
    torch.set_num_threads(1)  # W ranks share the cores
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    methods = [m for m in fsdpcomp.codecs() if m != "none"]
    if cfg.get("methods"):
        methods = [m for m in methods if m in cfg["methods"]]
    names = [TORCH_RS, "none", BF16_HOOK] + methods
    result = {"link_check_gbit": link_check(world, rank, cfg["link_check_bytes"]), "sizes": []}
    for numel in cfg["sizes"]:
        numel = -(-numel // world) * world  # FSDP pads the flat gradient to a multiple of W
        base = _gradient(cfg["seed"], numel, rank, world)
        ref = _reference(cfg["seed"], numel, rank, world)
        reps = cfg["reps"] if numel <= cfg["reps_cutoff"] else max(3, cfg["reps"] // 2)
        rows = []
        for name in names:
            case = _Case(name, world, numel, cfg.get("config"))
            row = _measure(case, base, ref, reps, cfg.get("tx_path"))
            tol = _TOLERANCE.get(name)
            row["tolerance"] = tol
            row["wrong"] = (not row["finite"]) or (tol is not None and row["rel_err"] > tol)
            rows.append(row)
            if rank == 0:
                print(f"{numel:>10} {name:<22} median {statistics.median(row['times_s'])*1e3:9.2f} ms"
                      f"  rel_err {row['rel_err']:.2e}", flush=True)
        result["sizes"].append({"numel": numel, "reps": reps, "rows": rows})
        del base, ref
    worker_end.finish(rank, result, cfg["out"])


if __name__ == "__main__":
    main(sys.argv[1])
    worker_end.exit_now()
