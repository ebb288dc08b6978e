"""One rank of a short job for tests/tools/test_exit_codes.py: run as a script with RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, as torchrun sets them.

  mismatch   rank 0 and rank 1 register different int8 block sizes: the handshake's ValueError
             ends the script right after a collective (exit 1, never SIGABRT)
  exchange   a DDP model with int8 does 3 steps and the script ends right after the last
             compressed all-reduce, without destroy_process_group (exit 0)
  payload    the ranks' configs differ in a key the handshake does not see (a state rebuilt
             after the shape was settled), so the pipelined per-peer exchange meets a
             PayloadError mid-flight (exit 1)"""
import sys

import torch
import torch.distributed as dist

import fsdpcomp


def main(mode: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    if mode == "mismatch":
        state = fsdpcomp.CommState("int8", {"block_size": 64 if rank == 0 else 128})
        state.reduce_scatter(torch.randn(4096), torch.empty(2048))
    elif mode == "exchange":
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 16))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        fsdpcomp.register(ddp, "int8", {"error_feedback": True})
        for _ in range(3):
            ddp(torch.randn(8, 256)).square().mean().backward()
    elif mode == "payload":
        first = fsdpcomp.CommState("int8", {"block_size": 64, "pipeline": True})
        first.reduce_scatter(torch.randn(8192), torch.empty(4096))  # settles the shape
        # same payload sizes, another fingerprint on rank 1: the header check fails on decode
        second = fsdpcomp.CommState("int8", {"block_size": 64, "pipeline": True,
                                             "stochastic": rank == 1})
        second.reduce_scatter(torch.randn(8192), torch.empty(4096))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1])
