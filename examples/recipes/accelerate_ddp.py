"""Recipe: accelerate's DDP path (CPU: gloo ranks) with int8 gradients. fsdpcomp.register goes
after accelerator.prepare, which wraps the model in DistributedDataParallel, and before the first
backward. docs/recipes.md; tested by tests/distributed/test_recipes.py.

    torchrun --nproc_per_node=2 examples/recipes/accelerate_ddp.py    # or: accelerate launch --cpu ...
"""
import argparse

import torch
from accelerate import Accelerator
from transformers import GPT2Config, GPT2LMHeadModel

import fsdpcomp


def batch(gen: torch.Generator, vocab: int, rows: int = 8, length: int = 32) -> torch.Tensor:
    """A learnable task: every row counts up from a random start (mod vocab)."""
    start = torch.randint(0, vocab, (rows, 1), generator=gen)
    return (start + torch.arange(length)) % vocab


def train(steps: int = 8, method: str = "int8") -> tuple[list[float], dict]:
    """Trains under torchrun's (or accelerate launch's) environment; returns this rank's losses
    and counters."""
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=32, vocab_size=128,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, opt = accelerator.prepare(model, opt)  # model is now DistributedDataParallel
    state = fsdpcomp.register(model, method, {"error_feedback": True})
    gen = torch.Generator().manual_seed(1 + accelerator.process_index)  # each rank its own data
    losses = []
    for _ in range(steps):
        ids = batch(gen, config.vocab_size).to(accelerator.device)
        loss = model(input_ids=ids, labels=ids).loss
        accelerator.backward(loss)
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
    losses, counters = train(args.steps, args.method)
    accelerator = Accelerator()  # the same shared state as in train()
    if accelerator.is_main_process:
        print("loss", " ".join(f"{x:.3f}" for x in losses))
        print(counters.table())
    accelerator.end_training()  # destroys the process group


if __name__ == "__main__":
    main()
