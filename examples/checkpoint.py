"""Checkpoints that resume a run on the same loss curve: per rank, the parameters it holds, the
optimizer state, the RNG states, the step (the data position: batches are a function of the
step) and the fsdpcomp state with its error-feedback residuals."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

DONE = "COMPLETE"


def run_identity(args, world: int) -> dict:
    """What must match for a checkpoint to continue this run."""
    return {"world_size": world, "model": args.model, "n_layer": args.n_layer, "n_embd": args.n_embd,
            "n_head": args.n_head, "parallel": args.parallel, "sharding_strategy": args.sharding_strategy,
            "bf16": args.bf16, "batch_size": args.batch_size, "max_length": args.max_length, "seed": args.seed,
            "comm_compress": args.comm_compress,
            # a held-out split changes the training documents; None (no split) is also what a
            # checkpoint from before this key reads as
            "val_fraction": getattr(args, "val_fraction", None) or None}


def save(path: str, wrapped, opt, rank: int, world: int, step: int, train_time_s: float,
         nonfinite_steps: int, identity: dict) -> None:
    """Every rank writes its file atomically; rank 0 marks the directory complete once all have."""
    os.makedirs(path, exist_ok=True)
    state = {
        "step": step, "train_time_s": train_time_s, "nonfinite_steps": nonfinite_steps, "identity": identity,
        "params": [p.detach().cpu().clone() for p in wrapped.local_params()],
        "optimizer": opt.state_dict(),
        "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "comm": wrapped.comm.state_dict(),
    }
    target = os.path.join(path, f"rank{rank}.pt")
    torch.save(state, target + ".tmp")
    os.replace(target + ".tmp", target)
    dist.barrier()
    if rank == 0:
        with open(os.path.join(path, DONE), "w") as f:
            f.write(f"{step}\n")


def load(path: str, wrapped, opt, rank: int, world: int, identity: dict) -> tuple[int, float, int]:
    """Restores everything save() wrote; returns (step, train_time_s, nonfinite_steps)."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"--resume_from {path}: no such checkpoint directory")
    if not os.path.exists(os.path.join(path, DONE)):
        raise ValueError(f"--resume_from {path}: checkpoint is incomplete (no {DONE} marker)")
    file = os.path.join(path, f"rank{rank}.pt")
    if not os.path.exists(file):
        raise ValueError(f"--resume_from {path}: no file for rank {rank}; it was written by another world size")
    state = torch.load(file, map_location="cpu", weights_only=False)
    diff = {k: (state["identity"].get(k), v) for k, v in identity.items() if state["identity"].get(k) != v}
    if diff:
        raise ValueError(f"--resume_from {path}: the run differs from the checkpoint's (saved, now): {diff}")
    params = wrapped.local_params()
    if [tuple(p.shape) for p in params] != [tuple(p.shape) for p in state["params"]]:
        raise ValueError(f"--resume_from {path}: parameter shapes differ from this model's")
    with torch.no_grad():
        for p, saved in zip(params, state["params"]):
            p.copy_(saved)
    opt.load_state_dict(state["optimizer"])
    wrapped.comm.load_state_dict(state["comm"])
    torch.set_rng_state(state["rng_cpu"])
    if state["rng_cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["rng_cuda"])
    return state["step"], state["train_time_s"], state["nonfinite_steps"]
