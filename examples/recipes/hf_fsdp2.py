"""Recipe: a Hugging Face model under FSDP2 (fully_shard per block, then the root) with int8
gradients and int8 parameter all-gathers. docs/recipes.md; tested by tests/distributed/test_recipes.py.

    torchrun --nproc_per_node=2 examples/recipes/hf_fsdp2.py      # CPU: gloo ranks
"""
import argparse

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from transformers import GPT2Config, GPT2LMHeadModel

import fsdpcomp


def batch(gen: torch.Generator, vocab: int, rows: int = 8, length: int = 32) -> torch.Tensor:
    """A learnable task: every row counts up from a random start (mod vocab)."""
    start = torch.randint(0, vocab, (rows, 1), generator=gen)
    return (start + torch.arange(length)) % vocab


def train(steps: int = 8, method: str = "int8") -> tuple[list[float], dict]:
    """Trains on an initialised process group; returns this rank's losses and counters."""
    torch.manual_seed(0)  # the same initial weights on every rank
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=32, vocab_size=128,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    for block in model.transformer.h:  # one FSDP unit per transformer block ...
        fully_shard(block)
    fully_shard(model)  # ... then the root (embeddings, final norm, tied lm_head)
    # after fully_shard, before the first forward: gradients and parameter all-gathers in int8
    state = fsdpcomp.register(model, method, {"error_feedback": True, "param_gather": "int8"})
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
    return losses, state.counters()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--method", default="int8")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    losses, counters = train(args.steps, args.method)
    if dist.get_rank() == 0:
        print("loss", " ".join(f"{x:.3f}" for x in losses))
        print(counters.table())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
