"""Trains a GPT-2 with FSDP and a fsdpcomp gradient compressor, and appends one line of
measurements per run to results.jsonl.

    torchrun --nproc_per_node=2 examples/fsdp_train.py --model tiny --max_steps 30 \
        --comm_compress int8 --comm_config_json '{"block_size": 256, "error_feedback": true}'

NCCL on GPUs, gloo on CPU; plain `python examples/fsdp_train.py` runs one rank. With no
--data_path it uses the built-in WordNet dataset (built on first use from wordnet-base). A run
writes <output_dir>/logs/<run_name>/, checkpoints/<run_name>/ and final_model/<run_name>/; the
default run_name is <model>-<method>-<parallel>-w<world>-<hash of the settings> (examples/runs.py).
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import resource
import socket
import sys
import time
import traceback
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fsdpcomp  # noqa: E402
import bpe  # noqa: E402
import checkpoint  # noqa: E402
import comm_timing  # noqa: E402
import gpt  # noqa: E402
import profiling  # noqa: E402
import runs  # noqa: E402
import textdata  # noqa: E402
from parallel import SHARDING, WRAPPERS  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BUILTIN_DIR = os.path.join(os.path.dirname(HERE), "data", "wordnet")
log = logging.getLogger("fsdp_train")
DEFAULT_VAL_FRACTION = 0.05  # of the documents of --data_path, when no --val_path is given
# FSDP1's state_dict_type is deprecated in favour of DCP's API; the message is noise here.
warnings.filterwarnings("ignore", message=r"FSDP\.state_dict_type\(\) and FSDP\.set_state_dict_type")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="GPT-2 training with FSDP and fsdpcomp gradient compression")
    p.add_argument("--data_path", default=None,
                   help=".json array of {id,title,text}, .jsonl or .txt (default: built-in WordNet glosses)")
    p.add_argument("--val_path", default=None, help="held-out file for val_loss/val_ppl (built-in data: its val split)")
    p.add_argument("--val_fraction", type=float, default=None,
                   help=f"with --data_path and no --val_path: the fraction of its documents held out for "
                        f"val_loss/val_ppl, chosen by a hash of each document (default {DEFAULT_VAL_FRACTION}; "
                        "0: no validation)"),
    p.add_argument("--cache_dir", default=None, help="tokenizer and token cache (default: <data dir>/cache)")
    p.add_argument("--output_dir", default="outputs")
    p.add_argument("--run_name", default=None,
                   help="its folders under --output_dir (default: <model>-<method>-<parallel>-w<world>-<hash of "
                        "the settings>, -2, -3, ... when taken); a name another run holds is refused")
    p.add_argument("--results_file", default=None, help="default: <output_dir>/results.jsonl")
    p.add_argument("--model", default="tiny", choices=list(gpt.PRESETS))
    p.add_argument("--n_layer", type=int), p.add_argument("--n_embd", type=int)
    p.add_argument("--n_head", type=int), p.add_argument("--vocab_size", type=int)
    p.add_argument("--parallel", default="fsdp1", choices=list(WRAPPERS))
    p.add_argument("--sharding_strategy", default="FULL_SHARD", choices=SHARDING)
    p.add_argument("--bf16", action="store_true", help="bf16 mixed precision (params, reduce, buffers)")
    p.add_argument("--max_steps", type=int, default=50)
    p.add_argument("--batch_size", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--max_length", type=int, default=128, help="tokens per sequence")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight_decay", type=float, default=0.1)
    p.add_argument("--lr_warmup_steps", type=int, default=10)
    p.add_argument("--grad_clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval_every", type=int, default=0, help="evaluate every N steps (0: at the end only)")
    p.add_argument("--eval_batches", type=int, default=None,
                   help="validation batches per rank (default, or 0: the whole validation split)")
    p.add_argument("--warmup_steps_discard", type=int, default=3, help="steps left out of timing statistics")
    p.add_argument("--target_ppl", type=float, default=None, help="records time_to_target_ppl_s")
    p.add_argument("--fixed_time_s", type=float, default=None, help="records ppl_at_fixed_time")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--profile_steps", default="3", help="N steps after the discarded warm-up, or A:B")
    p.add_argument("--save_every", type=int, default=0, help="checkpoint every N steps (0: never)")
    p.add_argument("--resume_from", default=None, help="a checkpoint directory written by --save_every")
    p.add_argument("--log_every", type=int, default=10)
    fsdpcomp.add_argparse_args(p)
    args = p.parse_args(argv)
    for name in ("max_steps", "batch_size", "max_length"):
        if getattr(args, name) <= 0:
            p.error(f"--{name} must be positive, got {getattr(args, name)}")
    if args.eval_batches is not None and args.eval_batches < 0:
        p.error(f"--eval_batches must be 0 (the whole split) or positive, got {args.eval_batches}")
    if args.warmup_steps_discard < 0 or args.warmup_steps_discard >= args.max_steps:
        p.error(f"--warmup_steps_discard must be in [0, max_steps), got {args.warmup_steps_discard}")
    if args.val_fraction is not None:
        if not 0.0 <= args.val_fraction < 1.0:
            p.error(f"--val_fraction must be in [0, 1), got {args.val_fraction}")
        if args.data_path is None or args.val_path is not None:
            p.error("--val_fraction holds out part of --data_path; it does not combine with "
                    + ("--val_path" if args.val_path is not None else "the built-in data, which has its own split"))
    elif args.data_path is not None and args.val_path is None:
        args.val_fraction = DEFAULT_VAL_FRACTION
    return args


def init_distributed() -> tuple[int, int, int, torch.device]:
    """torchrun's environment, or a one-rank group when run with plain python."""
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    # Long timeout: the other ranks wait in a collective while rank 0 builds the token cache.
    dist.init_process_group(backend, timeout=timedelta(minutes=60))
    return dist.get_rank(), dist.get_world_size(), local_rank, device


def prepare_data(args, rank: int) -> dict:
    """Rank 0 builds the dataset (built-in), tokenizer and token caches; the others wait for its
    answer, then for the caches' finalized flag. A failure on rank 0 is raised on every rank."""
    info: dict = {}
    if rank == 0:
        try:
            info = _prepare_rank0(args)
        except (textdata.DataError, OSError) as e:
            info = {"error": f"{type(e).__name__}: {e}"}
    box = [info]
    dist.broadcast_object_list(box, src=0)
    info = box[0]
    if "error" in info:
        raise textdata.DataError(info["error"])
    for key in ("train_cache", "val_cache"):
        if info.get(key):
            textdata.wait_finalized(info[key])
    return info


def _prepare_rank0(args) -> dict:
    data_path, val_path = args.data_path, args.val_path
    if data_path is None:
        data_path, val_path = os.path.join(BUILTIN_DIR, "train.json"), val_path or os.path.join(BUILTIN_DIR, "val.json")
        if not (os.path.exists(data_path) and os.path.exists(val_path)):
            import make_wordnet_dataset
            log.info("building the built-in WordNet dataset in %s", BUILTIN_DIR)
            make_wordnet_dataset.build(BUILTIN_DIR)
    cache_root = args.cache_dir or os.path.join(os.path.dirname(os.path.abspath(data_path)), "cache")
    for path in (data_path, val_path):
        if path is not None and not os.path.isfile(path):
            raise textdata.DataError(f"{path}: no such file")
    vocab = args.vocab_size or gpt.PRESETS[args.model]["vocab_size"]
    tok, tok_path = bpe.load_or_train(cache_root, data_path, vocab)
    tok_id = bpe.tokenizer_id(tok_path)
    eos = tok.token_to_id(bpe.EOS)

    def encode(texts):
        return [e.ids for e in tok.encode_batch(texts)]

    info = {"data_path": data_path, "val_path": val_path, "tokenizer": tok_path, "val_cache": None}
    parts = [("train_cache", data_path, None, None), ("val_cache", val_path, None, None)]
    frac = args.val_fraction or 0.0
    if frac > 0:  # the validation split is held out of the training file, document by document
        parts = [("train_cache", data_path, textdata.split_part(frac, "train"),
                  lambda text: not textdata.held_out(text, frac)),
                 ("val_cache", data_path, textdata.split_part(frac, "val"),
                  lambda text: textdata.held_out(text, frac))]
    for key, path, part, keep in parts:
        if path is None:
            continue
        cdir = textdata.cache_dir_for(cache_root, path, tok_id, args.max_length, part)
        meta = textdata.read_meta(cdir)
        if not (meta and meta.get("finalized")):
            log.info("tokenising %s%s into %s%s", path, f" ({part})" if part else "", cdir,
                     f" (resuming after {meta['processed_samples']} documents)" if meta else "")
        try:
            textdata.build_cache(path, cdir, encode, eos, args.max_length, keep=keep)
        except textdata.DataError as e:
            if key == "val_cache" and part:
                raise textdata.DataError(f"--val_fraction {frac} held out too little of {path} for one "
                                         f"block of {args.max_length} tokens: raise it, or pass --val_path") from e
            raise
        info[key] = cdir
    return info


def lr_at(step: int, args) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < args.lr_warmup_steps:
        return args.lr * (step + 1) / args.lr_warmup_steps
    t = (step - args.lr_warmup_steps) / max(1, args.max_steps - args.lr_warmup_steps)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def batch_of(ds, indices, device) -> torch.Tensor:
    return torch.stack([ds[i] for i in indices]).to(device, non_blocking=True)


def eval_extent(n_blocks: int, args, world: int) -> tuple[int, int]:
    """(blocks, batches per rank) an evaluation covers: the whole split, or with --eval_batches N
    the first N batches per rank. Batch b of rank r holds blocks (b * world + r) * batch_size on."""
    per_round = args.batch_size * world
    blocks = min(n_blocks, args.eval_batches * per_round) if args.eval_batches else n_blocks
    return blocks, -(-blocks // per_round)


@torch.no_grad()
def evaluate(module, val_ds, args, rank, world, device) -> tuple[float, float]:
    """Mean token loss over the same val blocks every time: all of them by default (what
    validate_model.py computes on the file), so val_ppl is the split's. Every rank runs the
    same number of forwards (FSDP's gathers are collectives): in the last batch a rank left
    without blocks runs block 0 and counts none of its tokens."""
    if len(val_ds) < args.batch_size * world:
        raise textdata.DataError(f"the validation data has {len(val_ds)} blocks, fewer than one "
                                 f"batch per rank ({args.batch_size} x {world})")
    blocks, n_batches = eval_extent(len(val_ds), args, world)
    module.eval()
    tot = torch.zeros(2, dtype=torch.float64, device=device)
    for b in range(n_batches):
        start = (b * world + rank) * args.batch_size
        stop = min(start + args.batch_size, blocks)
        x = batch_of(val_ds, range(start, stop) if start < stop else range(1), device)
        loss = module(input_ids=x, labels=x).loss
        n = x.numel() - x.shape[0] if start < stop else 0  # predicted tokens: a row's first has no target
        tot += torch.tensor([loss.double().item() * n, n], dtype=torch.float64, device=device)
    dist.all_reduce(tot)
    module.train()
    val_loss = (tot[0] / tot[1]).item()
    return val_loss, math.exp(min(val_loss, 700.0))


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv=None) -> int:
    args = parse_args(argv)
    rank, world, _, device = init_distributed()
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format="%(asctime)s %(name)s: %(message)s")
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # ranks share the cores
    try:
        rc = train(args, rank, world, device)
        dist.barrier()  # leave together: rank 0 hosts the TCPStore the others still talk to
        return rc
    except (textdata.DataError, FileNotFoundError, ValueError) as e:
        # Bad input: one clear line per rank instead of a traceback.
        print(f"fsdp_train.py: error (rank {rank}): {e}", file=sys.stderr)
        return 1
    finally:
        dist.destroy_process_group()
        # FSDP's modules and hooks hold the process group in reference cycles, so destroying it
        # leaves gloo's worker threads alive until the interpreter's last garbage collection; a
        # C++ thread that takes the GIL while Python finalizes aborts the process (SIGABRT,
        # "terminate called without an active exception"). Collected here, the threads end here.
        gc.collect()


def train(args, rank: int, world: int, device: torch.device) -> int:
    from torch.utils.tensorboard import SummaryWriter
    from tqdm import tqdm
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    info = prepare_data(args, rank)
    tok = bpe.Tokenizer.from_file(info["tokenizer"])
    train_ds = textdata.TokenBlocks(info["train_cache"])
    val_ds = textdata.TokenBlocks(info["val_cache"]) if info["val_cache"] else None
    if val_ds is not None and len(val_ds) < args.batch_size * world:
        hint = "raise --val_fraction, or pass --val_path" if args.val_fraction else "use more validation data"
        raise textdata.DataError(f"the validation data has {len(val_ds)} blocks of {args.max_length} tokens, "
                                 f"fewer than one batch per rank ({args.batch_size} x {world}): {hint}")
    sampler = textdata.StepSampler(len(train_ds), args.batch_size, world, rank, args.seed)

    config = gpt.make_config(args.model, n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head,
                             vocab_size=tok.get_vocab_size(), n_positions=max(args.max_length,
                                                                             gpt.PRESETS[args.model]["n_positions"]))
    torch.manual_seed(args.seed)
    model = gpt.make_model(config)
    n_params = gpt.n_params(model)
    comm = fsdpcomp.from_args(args)
    wrapped = WRAPPERS[args.parallel](model, comm, device=device, block_cls=GPT2Block,
                                      sharding=args.sharding_strategy, bf16=args.bf16)
    module = wrapped.module
    gathers = comm_timing.attach(module, args.parallel)  # FSDP's parameter all-gathers, timed steps only
    opt = torch.optim.AdamW(module.parameters(), lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.95))

    settings = runs.settings(args, world, comm.config)
    digest = runs.settings_hash(settings)
    run_name = name_run(args, rank, world, settings)
    log_dir = os.path.join(args.output_dir, "logs", run_name)
    ckpt_root = os.path.join(args.output_dir, "checkpoints", run_name)
    start_step, train_time_s, nonfinite_steps = 0, 0.0, 0
    if args.resume_from:
        start_step, train_time_s, nonfinite_steps = checkpoint.load(
            args.resume_from, wrapped, opt, rank, world, checkpoint.run_identity(args, world))
        log.info("resumed from %s at step %d", args.resume_from, start_step)
    if start_step >= args.max_steps:
        raise ValueError(f"the checkpoint is at step {start_step}, not before --max_steps {args.max_steps}")

    if rank == 0:  # this run holds the name now, and run.json says what the hash stands for
        runs.claim(args.output_dir, run_name, digest, settings, start_step, args.resume_from)
    os.makedirs(log_dir, exist_ok=True)
    writer = SummaryWriter(log_dir) if rank == 0 else None
    metrics = open(os.path.join(log_dir, "metrics.jsonl"), "a", encoding="utf-8") if rank == 0 else None
    if rank == 0:
        log.info("%s: %s (%.2fM params), %d ranks on %s, %s %s, %d train blocks of %d tokens", run_name,
                 args.model, n_params / 1e6, world, device.type, comm.method, json.dumps(comm.config),
                 len(train_ds), args.max_length)
        if val_ds is not None:
            blocks, batches = eval_extent(len(val_ds), args, world)
            log.info("val_loss over %d of the %d validation blocks (%d tokens), %d batches per rank", blocks,
                     len(val_ds), blocks * (args.max_length - 1), batches)

    timed_from = start_step + args.warmup_steps_discard
    prof, prof_range = None, None
    if args.profile:
        prof_range = profiling.parse_steps(args.profile_steps, timed_from, args.max_steps)
        prof = profiling.make_profiler(os.path.join(log_dir, "profiler"), prof_range[0] - start_step,
                                       prof_range[1] - start_step, device.type == "cuda")
        prof.start()

    step_times, losses, evals = [], [], []
    counters_at_timing = None
    tokens_per_step = args.batch_size * args.max_length * world
    target_time = None
    bar = tqdm(total=args.max_steps, initial=start_step, disable=rank != 0, desc=run_name, dynamic_ncols=True)
    val_loss = val_ppl = None
    for step in range(start_step, args.max_steps):
        if step == timed_from:
            counters_at_timing = comm.counters()
        gathers.active = step >= timed_from
        sync(device)
        t0 = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        x = batch_of(train_ds, sampler.indices(step), device)
        loss = module(input_ids=x, labels=x).loss
        loss.backward()
        gnorm = wrapped.clip_grad_norm(args.grad_clip)
        finite = bool(torch.isfinite(loss).item()) and bool(torch.isfinite(gnorm).item())
        if finite:
            opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        dt = time.perf_counter() - t0
        gathers.active = False  # evaluation and logging are not training time
        gathers.step_done()
        train_time_s += dt
        if prof is not None:
            prof.step()
        if step >= timed_from:
            step_times.append(dt)
        nonfinite_steps += 0 if finite else 1
        mean_loss = loss.detach().float().clone()
        dist.all_reduce(mean_loss)
        mean_loss = mean_loss.item() / world
        losses.append(mean_loss)
        if rank == 0:
            metrics.write(json.dumps({"step": step, "loss": mean_loss, "lr": lr_at(step, args),
                                      "step_time_ms": dt * 1e3, "train_time_s": train_time_s}) + "\n")
            metrics.flush()
            writer.add_scalar("train/loss", mean_loss, step)
            writer.add_scalar("train/lr", lr_at(step, args), step)
            writer.add_scalar("train/step_time_ms", dt * 1e3, step)
            writer.add_scalar("train/grad_norm", gnorm.item(), step)
            bar.set_postfix(loss=f"{mean_loss:.3f}")
        bar.update(1)
        last = step + 1 == args.max_steps
        if val_ds is not None and (last or (args.eval_every and (step + 1) % args.eval_every == 0)):
            t_eval = time.perf_counter()
            val_loss, val_ppl = evaluate(module, val_ds, args, rank, world, device)
            t_eval = time.perf_counter() - t_eval
            evals.append((step + 1, train_time_s, val_loss, val_ppl))
            if args.target_ppl is not None and target_time is None and val_ppl <= args.target_ppl:
                target_time = train_time_s
            if rank == 0:
                writer.add_scalar("val/loss", val_loss, step + 1)
                writer.add_scalar("val/ppl", val_ppl, step + 1)
                metrics.write(json.dumps({"step": step + 1, "val_loss": val_loss, "val_ppl": val_ppl,
                                          "train_time_s": train_time_s, "eval_time_s": t_eval}) + "\n")
        if rank == 0 and (step + 1) % args.log_every == 0:
            c = comm.counters()
            writer.add_scalar("comm/ratio", c["ratio"], step + 1)
            writer.add_scalar("comm/bytes_sent", c["bytes_sent"], step + 1)
            bar.write(f"step {step + 1}: loss {mean_loss:.4f}, {dt * 1e3:.0f} ms, ratio {c['ratio']:.2f}")
        if args.save_every and (step + 1) % args.save_every == 0 and not last:
            checkpoint.save(os.path.join(ckpt_root, f"step_{step + 1}"), wrapped, opt, rank, world, step + 1,
                            train_time_s, nonfinite_steps, checkpoint.run_identity(args, world))
    bar.close()

    prof_rows = None
    if prof is not None:
        prof.stop()
        prof_rows = profiling.summarize(prof, prof_range[0])
        if rank == 0:
            profiling.save(prof_rows, os.path.join(log_dir, "profile_summary.json"))
            print(profiling.table(prof_rows))

    # Counters: bytes over the whole run, times over the timed steps only; all ranks combined.
    local = fsdpcomp.results.subtract_times(comm.counters(), counters_at_timing)
    with open(os.path.join(log_dir, f"counters_rank{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(comm.counters(), f)
    # with each rank's counters: its peak resident set (KiB on Linux), the CPU's memory peak,
    # and its all-gather time (averaged over ranks, as the counters' times are)
    gathered = [None] * world
    dist.all_gather_object(gathered, (local, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, gathers.ms()))
    combined = fsdpcomp.combine_counters([g[0] for g in gathered])
    peak_rss_gb = max(g[1] for g in gathered) / 2**20
    gather_ms = None if gathers.why_none else sum(g[2] for g in gathered) / world

    full = wrapped.full_state_dict()
    if rank == 0:
        save_final(full, config, tok, os.path.join(args.output_dir, "final_model", run_name))
        by_op = None
        if prof_rows:
            # Profiled steps only: scale to the timed steps so totals match step_time statistics.
            scale = len(step_times) / len(prof_rows)
            by_op = {op: v * scale for op, v in profiling.totals_ms(prof_rows).items()}
        elif gathers.why_none:
            log.warning("all-gather time not measured: %s", gathers.why_none)
        fixed_ppl = None
        if args.fixed_time_s is not None:
            within = [e for e in evals if e[1] <= args.fixed_time_s]
            fixed_ppl = within[-1][3] if within else None
        # GPU: torch's allocator on rank 0. CPU: the largest peak RSS over the ranks; there is
        # no allocator cache to tell apart from it, so nothing to report as reserved.
        mem = (torch.cuda.max_memory_allocated(device) / 2**30, torch.cuda.max_memory_reserved(device) / 2**30) \
            if device.type == "cuda" else (peak_rss_gb, None)
        tail = losses[-min(len(losses), 10):]
        run = {
            "run_name": run_name, "world_size": world, "model": args.model, "model_params": n_params,
            "dataset": os.path.basename(info["data_path"]) if args.data_path else "wordnet-builtin",
            "val_dataset": val_dataset_name(args, info), "val_fraction": args.val_fraction,
            "max_length": args.max_length, "batch_size": args.batch_size, "compress_method": comm.method,
            "compress_config": comm.config, "seed": args.seed,
            "train_loss": sum(tail) / len(tail), "val_loss": val_loss, "val_ppl": val_ppl,
            "mem_peak_alloc_gb": mem[0], "mem_peak_reserved_gb": mem[1],
            "mem_peak_source": "cuda allocator, rank 0" if device.type == "cuda" else "peak RSS, max over ranks",
            "time_to_target_ppl_s": target_time, "target_ppl": args.target_ppl,
            "ppl_at_fixed_time": fixed_ppl, "fixed_time_s": args.fixed_time_s,
            "nonfinite_steps": nonfinite_steps,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({os.cpu_count()} cores)",
            "parallel": args.parallel, "sharding_strategy": args.sharding_strategy, "bf16": args.bf16,
            "max_steps": args.max_steps, "start_step": start_step, "steps_timed": len(step_times),
            "lr": args.lr, "comm_time_source": "profiler" if by_op else "counters", "run_hash": digest,
            **val_extent(val_ds, args, world),
        }
        rec = fsdpcomp.build_record(run=run, step_times_s=step_times, tokens_per_step=tokens_per_step,
                                    counters=combined, comm_time_ms_by_op=by_op,
                                    measured_ms=None if by_op else {"all_gather": gather_ms})
        path = args.results_file or os.path.join(args.output_dir, "results.jsonl")
        fsdpcomp.append_result(path, rec)
        runs.finish(args.output_dir, run_name, args.max_steps)
        log.info("appended to %s: loss %.4f, val_ppl %s, %.1f ms/step, ratio %s%s", path, rec["train_loss"],
                 rec["val_ppl"], rec["step_time_ms_mean"] or float("nan"), rec["compression_ratio"],
                 warmup_note(rec, comm, args.max_steps - start_step))
        metrics.close()
        writer.close()
    return 0


def name_run(args, rank: int, world: int, settings: dict) -> str:
    """The run's folder name (runs.choose): rank 0 picks it and says so when it is not the name
    asked for; every rank gets it, or the refusal as a ValueError."""
    answer: dict = {}
    if rank == 0:
        base = args.run_name or runs.default_name(args, world, runs.settings_hash(settings))
        try:
            answer = {"name": runs.choose(args.output_dir, base, args.run_name is not None, settings,
                                          args.resume_from)}
        except ValueError as e:
            answer = {"error": str(e)}
        if answer.get("name", base) != base:
            why = "resuming its own checkpoint" if args.resume_from else f"{base} holds another run"
            log.info("this run is %s (%s)", answer["name"], why)
    box = [answer]
    dist.broadcast_object_list(box, src=0)
    if "error" in box[0]:
        raise ValueError(box[0]["error"])
    return box[0]["name"]


def val_extent(val_ds, args, world: int) -> dict:
    """results.jsonl's record of what val_loss covers: predicted tokens and batches per rank."""
    if val_ds is None:
        return {"val_tokens": None, "val_batches": None}
    blocks, batches = eval_extent(len(val_ds), args, world)
    return {"val_tokens": blocks * (args.max_length - 1), "val_batches": batches}


def warmup_note(rec: dict, comm, steps: int) -> str:
    """The last log line's word on steps a warm-up sent exact (powersgd's start_iter), which
    otherwise show only as a ratio near 1."""
    exact = rec.get("warmup_steps_exact") or 0
    if not exact:
        return ""
    return f"; {exact} of {steps} steps sent exact (powersgd's warm-up, start_iter {comm.config.get('start_iter')})"


def val_dataset_name(args, info: dict) -> str | None:
    """Where val_loss comes from: a file, a held-out part of the training file, or nowhere."""
    if args.data_path is None:
        return "wordnet-builtin"
    if info["val_path"]:
        return os.path.basename(info["val_path"])
    if args.val_fraction:
        return f"{args.val_fraction:g} of {os.path.basename(info['data_path'])} (held out)"
    return None


def save_final(state_dict: dict, config, tok, out_dir: str) -> None:
    """A plain transformers model directory: weights, config and tokenizer."""
    model = gpt.make_model(config)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"final weights do not match the model: missing {missing}, unexpected {unexpected}")
    model.save_pretrained(out_dir)
    bpe.as_hf(tok).save_pretrained(out_dir)


if __name__ == "__main__":
    try:
        status = main()
    except Exception:  # an unexpected error leaves the same way, with its traceback
        traceback.print_exc()
        status = 1
    # Leave without finalizing the interpreter. torch's process group can outlive
    # destroy_process_group (FSDP2's hooks hold it until exit), and a gloo thread that takes the
    # GIL while Python finalizes aborts the job (SIGABRT, "terminate called without an active
    # exception"; about one CI run in fifty). Everything this script writes is closed by now.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
