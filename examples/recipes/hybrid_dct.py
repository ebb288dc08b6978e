"""Recipe: the hybrid shape for slow links between nodes (FlexDeMo's, arXiv 2502.06728): FSDP2
shards inside a node with torch's own exact reduce-scatter, and the mean across nodes (the
replica all-reduce) goes through the `dct` codec (44.3x fewer bytes). docs/recipes.md;
tested by tests/distributed/test_recipes.py.

    torchrun --nproc_per_node=4 examples/recipes/hybrid_dct.py     # 2 "nodes" of 2 ranks
"""
import argparse

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import GPT2Config, GPT2LMHeadModel

import fsdpcomp


def batch(gen: torch.Generator, vocab: int, rows: int = 8, length: int = 32) -> torch.Tensor:
    """A learnable task: every row counts up from a random start (mod vocab)."""
    start = torch.randint(0, vocab, (rows, 1), generator=gen)
    return (start + torch.arange(length)) % vocab


def train(steps: int, method: str, shard: int) -> tuple[list[float], dict]:
    """Trains on an initialised process group of nodes x `shard` ranks; returns this rank's
    losses and the cross-node state's counters."""
    torch.manual_seed(0)  # the same initial weights on every rank
    nodes = dist.get_world_size() // shard
    mesh = init_device_mesh("cpu", (nodes, shard), mesh_dim_names=("replicate", "shard"))
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=32, vocab_size=128,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    for block in model.transformer.h:  # sharded over the ranks of one node (the 1-D shard mesh)
        fully_shard(block, mesh=mesh["shard"])
    fully_shard(model, mesh=mesh["shard"])
    # across nodes: the reduce-scatter's output averaged over replicas; dct at its defaults (12
    # of each 128 DCT coefficients in 3 bits, no error feedback: with AdamW it hurt)
    across = fsdpcomp.CommState(method, {}, process_group=mesh["replicate"].get_group())
    fsdpcomp.register_replicate(model, across)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(1 + dist.get_rank())  # each rank its own data
    losses = []
    for _ in range(steps):
        ids = batch(gen, config.vocab_size)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, across.counters()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--method", default="dct")
    parser.add_argument("--shard", type=int, default=2, help="ranks per node")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    losses, counters = train(args.steps, args.method, args.shard)
    if dist.get_rank() == 0:
        print("loss", " ".join(f"{x:.3f}" for x in losses))
        print(counters.table())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
