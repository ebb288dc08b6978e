"""Recipe: accelerate's FSDP plugin (FSDP2) with int8 gradients and int8 parameter all-gathers.
fsdpcomp.register goes after accelerator.prepare, which applies fully_shard, and before the
first forward. docs/recipes.md.

    torchrun --nproc_per_node=N examples/recipes/accelerate_fsdp.py   # GPUs (not run yet)
    torchrun --nproc_per_node=2 examples/recipes/accelerate_fsdp.py   # CPU: see below

accelerate enables its FSDP plugin on GPUs only. Without one this script calls the function
accelerator.prepare uses for FSDP2 models (fsdp2_prepare_model) itself, so the wrapping is
accelerate's own (tests/distributed/test_recipes.py runs that on 2 gloo ranks).
"""
import argparse

import torch
from accelerate import Accelerator, FullyShardedDataParallelPlugin
from accelerate.utils.fsdp_utils import fsdp2_prepare_model
from transformers import GPT2Config, GPT2LMHeadModel

import fsdpcomp


def batch(gen: torch.Generator, vocab: int, rows: int = 8, length: int = 32) -> torch.Tensor:
    """A learnable task: every row counts up from a random start (mod vocab)."""
    start = torch.randint(0, vocab, (rows, 1), generator=gen)
    return (start + torch.arange(length)) % vocab


def train(steps: int = 8, method: str = "int8") -> tuple[list[float], dict]:
    """Trains under torchrun's environment; returns this rank's losses and counters."""
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["GPT2Block"],
                                            cpu_ram_efficient_loading=False)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=32, vocab_size=128,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    if torch.cuda.is_available():
        accelerator = Accelerator(fsdp_plugin=plugin)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        model, opt = accelerator.prepare(model, opt)  # fully_shard per GPT2Block, then the root
    else:
        accelerator = Accelerator(cpu=True)
        accelerator.state.fsdp_plugin = plugin
        model = fsdp2_prepare_model(accelerator, model)  # what prepare does on GPUs
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    state = fsdpcomp.register(model, method, {"error_feedback": True, "param_gather": "int8"})
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
