# One rank of one mem_bench run: FSDP2 GPT-2 with AdamW, one plain step, then fsdpcomp steps; counts the bytes this rank holds, and rank 0 writes JSON.
"""Run by mem_bench.py (never by hand): `python benchmarks/mem_worker.py CONFIG.json`, with
torchrun's environment. The model is examples/gpt.py's, sharded as step_worker.py shards it
(fully_shard on every GPT-2 block and the root); the data is random tokens (memory does not
depend on them).

The first step runs plain FSDP2 (torch's reduce-scatter), so the optimizer state exists and the
resident set (RSS) after it is the baseline; then fsdpcomp is registered and runs the other
steps. What fsdpcomp adds is counted three ways: its counters, the tensors it keeps
(mem_count.py), and the RSS growth since the baseline. mem_bench.py starts the ranks with
MALLOC_MMAP_THRESHOLD_ fixed, so every large block is its own mapping and a freed tensor leaves
the RSS at once: between steps the RSS is what is held, not glibc's free lists."""
from __future__ import annotations

import gc
import json
import os
import sys
import warnings

import torch
import torch.distributed as dist

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.join(os.path.dirname(_HERE), "examples")]

import fsdpcomp  # noqa: E402
import worker_end  # noqa: E402
import gpt  # noqa: E402
import mem_count  # noqa: E402


def build(cfg: dict):
    from torch.distributed.fsdp import fully_shard
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    torch.manual_seed(cfg["seed"])  # the same weights on every rank before sharding
    model = gpt.make_model(gpt.make_config(cfg["model"]))
    n_params = gpt.n_params(model)
    for block in [m for m in model.modules() if isinstance(m, GPT2Block)]:
        fully_shard(block, reshard_after_forward=True)
    fully_shard(model, reshard_after_forward=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    return model, opt, n_params


def quiet_rss() -> int:
    """The RSS at a point where the step's transients are gone."""
    gc.collect()
    return mem_count.rss_bytes()


def main(config_path: str) -> None:
    with open(config_path) as f:
        cfg = json.load(f)
    warnings.filterwarnings("ignore", category=FutureWarning)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # ranks share the cores
    model, opt, n_params = build(cfg)
    g = torch.Generator().manual_seed(cfg["seed"] * 1000 + rank)
    x = torch.randint(0, model.config.vocab_size, (cfg["batch_size"], cfg["max_length"]), generator=g)
    state, grads, losses = None, None, []
    for step in range(1 + cfg["steps"]):
        if step == 1:  # the baseline: plain FSDP2 with its optimizer state
            rss_plain = quiet_rss()
            plain = {"params": mem_count.params_bytes(model), "optimizer": mem_count.optimizer_bytes(opt)}
            state = fsdpcomp.register(model, cfg["method"], cfg["config"])
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        if step == cfg["steps"]:  # held from the backward to the optimizer step
            grads = mem_count.grads_bytes(model)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
    rss_end = quiet_rss()
    c = dict(state.counters())
    mine = {"rank": rank, "params": mem_count.params_bytes(model), "grads": grads,
            "optimizer": mem_count.optimizer_bytes(opt), "residual": mem_count.residual_bytes(state),
            "buffers_by_kind": mem_count.buffer_bytes(state), "plain": plain,
            "rss_plain": rss_plain, "rss_end": rss_end,
            "counters": {k: c[k] for k in ("residual_bytes", "buffer_bytes", "buffer_peak_bytes", "units", "calls")}}
    mine["buffers"] = sum(mine["buffers_by_kind"].values())
    every = [None] * world
    dist.all_gather_object(every, mine)
    result = None
    if rank == 0:
        result = {"config": cfg, "world": world, "model_params": n_params, "losses": losses, "ranks": every,
                  "resolved_config": state.config, "torch": torch.__version__, "fsdpcomp": fsdpcomp.__version__}
    worker_end.finish(rank, result, cfg["out"])


if __name__ == "__main__":
    main(sys.argv[1])
    worker_end.exit_now()
