# One rank of one step_bench run: trains the examples' GPT-2 with FSDP2 for a few steps, timing every all-gather and reduce-scatter, and rank 0 writes JSON.
"""Run by step_bench.py (never by hand): `python benchmarks/step_worker.py CONFIG.json`, with
torchrun's environment. Model, data, learning-rate schedule and evaluation are those of
examples/fsdp_train.py (imported, not copied); sharding is FSDP2 with
reshard_after_forward=True on every GPT-2 block and the root. Every module's all-gather and
reduce-scatter, whichever is installed (torch's own or fsdpcomp's), is wrapped in a timer, so
each configuration's step splits into compute / all-gather / reduce-scatter the same way."""
from __future__ import annotations

import json
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist

# Its siblings and examples/ by path: under `python -P` / PYTHONSAFEPATH the script's own folder
# is not on sys.path. Neither holds an fsdpcomp, so the one launch.py chose stays first.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.join(os.path.dirname(_HERE), "examples")]

import fsdpcomp  # noqa: E402
import worker_end  # noqa: E402
import fsdp_train  # noqa: E402  (examples/: data, schedule, evaluation)
import gpt  # noqa: E402
from comm_worker import link_check  # noqa: E402

_DTYPES = {None: None, "bf16": torch.bfloat16}


class Timed:
    """Times one module's collective (torch's or fsdpcomp's), counts the bytes an uncompressed
    one would send from this rank in the dtype it is called with, and (shaped links) the bytes
    that left the rank's link during the call: bytes a call leaves queued in the socket are
    counted in the next call, so the split between the two collectives is approximate and
    their sum over a step exact."""

    def __init__(self, inner, totals: dict, kind: str, tx_path: str | None):
        self.inner, self.totals, self.kind, self.tx_path = inner, totals, kind, tx_path

    def allocate(self, size, *, dtype, device):
        return self.inner.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, *args, **kwargs):
        tx0 = _tx_bytes(self.tx_path)
        t0 = time.perf_counter()
        work = self.inner(output_tensor, input_tensor, *args, **kwargs)
        if work is not None:  # FSDP2 on CPU calls synchronously; wait so the time is the call's
            work.wait()
        self.totals[self.kind + "_s"] += time.perf_counter() - t0
        if tx0 is not None:
            self.totals[self.kind + "_wire_bytes"] += _tx_bytes(self.tx_path) - tx0
        # the shard is the all-gather's input and the reduce-scatter's output; the other is W shards
        shard, full = (input_tensor, output_tensor) if self.kind == "all_gather" else (output_tensor, input_tensor)
        self.totals[self.kind + "_raw_bytes"] += (full.numel() - shard.numel()) * shard.element_size()
        self.totals[self.kind + "_calls"] += 1
        return work


def _tx_bytes(path: str | None) -> int | None:
    if not path:
        return None
    with open(path) as f:
        return int(f.read())


def build(cfg: dict, rank: int, world: int):
    """Data, model, FSDP2, the compressor and the optimizer, as fsdp_train.py builds them."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    args = fsdp_train.parse_args(["--model", cfg["model"], "--batch_size", str(cfg["batch_size"]),
                                  "--max_length", str(cfg["max_length"]), "--max_steps", str(cfg["steps"]),
                                  "--seed", str(cfg["seed"]), "--eval_batches", str(cfg["eval_batches"]),
                                  "--warmup_steps_discard", "0"] + cfg.get("data_args", []))
    info = fsdp_train.prepare_data(args, rank)
    tok = fsdp_train.bpe.Tokenizer.from_file(info["tokenizer"])
    train_ds = fsdp_train.textdata.TokenBlocks(info["train_cache"])
    val_ds = fsdp_train.textdata.TokenBlocks(info["val_cache"]) if info["val_cache"] else None
    sampler = fsdp_train.textdata.StepSampler(len(train_ds), args.batch_size, world, rank, args.seed)
    config = gpt.make_config(args.model, vocab_size=tok.get_vocab_size(),
                             n_positions=max(args.max_length, gpt.PRESETS[args.model]["n_positions"]))
    torch.manual_seed(args.seed)
    model = gpt.make_model(config)
    mp = MixedPrecisionPolicy(reduce_dtype=_DTYPES[cfg.get("reduce_dtype")])
    for block in [m for m in model.modules() if isinstance(m, GPT2Block)]:
        fully_shard(block, mp_policy=mp, reshard_after_forward=True)
    fully_shard(model, mp_policy=mp, reshard_after_forward=True)
    state = fsdpcomp.register(model, cfg["method"], cfg["config"]) if cfg["fsdpcomp"] else None
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.95))
    return args, model, state, opt, train_ds, val_ds, sampler, gpt.n_params(model)


def wrap_collectives(model, tx_path: str | None) -> dict:
    totals = {f"{kind}_{what}": 0 for kind in ("all_gather", "reduce_scatter")
              for what in ("s", "raw_bytes", "wire_bytes", "calls")}
    for _, module in fsdpcomp.integrations.fsdp2_modules(model):
        (group,) = module._get_fsdp_state()._fsdp_param_groups
        module.set_custom_all_gather(Timed(group._all_gather_comm, totals, "all_gather", tx_path))
        module.set_custom_reduce_scatter(Timed(group._reduce_scatter_comm, totals, "reduce_scatter", tx_path))
    return totals


def _codec_s(counters: dict | None) -> float:
    if counters is None:
        return 0.0
    return counters["compress_time_s"] + counters["decompress_time_s"] + counters["param_gather_codec_time_s"]


def main(config_path: str) -> None:
    with open(config_path) as f:
        cfg = json.load(f)
    warnings.filterwarnings("ignore", category=FutureWarning)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # ranks share the cores
    args, model, state, opt, train_ds, val_ds, sampler, n_params = build(cfg, rank, world)
    totals = wrap_collectives(model, cfg.get("tx_path"))
    link = None
    if cfg.get("link_check_bytes"):
        link = link_check(world, rank, cfg["link_check_bytes"])
    steps, losses, evals = [], [], []
    snap = None
    for step in range(cfg["steps"]):
        if step == cfg["warmup"]:  # timing (and bytes) from here on
            dist.barrier()
            snap = (dict(totals), dict(state.counters()) if state else None, _tx_bytes(cfg.get("tx_path")))
        before, codec0 = dict(totals), _codec_s(state.counters() if state else None)
        t0 = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = fsdp_train.lr_at(step, args)
        x = fsdp_train.batch_of(train_ds, sampler.indices(step), torch.device("cpu"))
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        steps.append({"step_s": dt, "all_gather_s": totals["all_gather_s"] - before["all_gather_s"],
                      "reduce_scatter_s": totals["reduce_scatter_s"] - before["reduce_scatter_s"],
                      "codec_s": _codec_s(state.counters() if state else None) - codec0})
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
        last = step + 1 == cfg["steps"]
        if val_ds is not None and cfg["eval"] and (last or (cfg["eval_every"] and (step + 1) % cfg["eval_every"] == 0)):
            val_loss, val_ppl = fsdp_train.evaluate(model, val_ds, args, rank, world, torch.device("cpu"))
            evals.append({"step": step + 1, "val_loss": val_loss, "val_ppl": val_ppl})
        if rank == 0 and ((step + 1) % cfg["log_every"] == 0 or last):
            print(f"step {step + 1}/{cfg['steps']}: loss {losses[-1]:.4f}, {dt:.2f} s "
                  f"(all-gather {steps[-1]['all_gather_s']:.2f} s, reduce-scatter {steps[-1]['reduce_scatter_s']:.2f} s)",
                  flush=True)
    dist.barrier()
    tx1 = _tx_bytes(cfg.get("tx_path"))
    timed = max(cfg["steps"] - cfg["warmup"], 0)
    counters = dict(state.counters()) if state else None
    mine = {"steps": steps, "totals": totals, "counters": counters, "snap": snap,
            "wire_tx_bytes": None if snap is None or snap[2] is None else tx1 - snap[2]}
    every = [None] * world
    dist.all_gather_object(every, mine)
    result = None
    if rank == 0:
        result = {"config": cfg, "world": world, "model_params": n_params, "link_check_gbit": link,
                  "timed_steps": timed, "losses": losses, "evals": evals, "ranks": every,
                  "torch": torch.__version__, "fsdpcomp": fsdpcomp.__version__}
    worker_end.finish(rank, result, cfg["out"])


if __name__ == "__main__":
    main(sys.argv[1])
    worker_end.exit_now()
