"""Run folders. A run of fsdp_train.py writes <output_dir>/logs/<run_name>/ (TensorBoard,
metrics.jsonl, counters, run.json), checkpoints/<run_name>/ and final_model/<run_name>/. The
default run_name names the model, method, parallelism, world size and a hash of the settings
that change results, so runs that differ never share a folder; and a folder that already holds
a run is written into again only by a resume of that same run (its own checkpoint, the same
settings): anything else gets a fresh suffix (default names) or a refusal (--run_name), never a
merge of two runs' metrics, counters or models. Also: which saved model a folder names, for
generate.py and validate_model.py."""
from __future__ import annotations

import hashlib
import json
import os
import time

RUN_FILE = "run.json"  # in logs/<run_name>/: the settings behind the hash, and how far the run got
SUBDIRS = ("logs", "checkpoints", "final_model")
MODEL_FILE = "config.json"  # what every saved model folder holds (save_pretrained)


def settings(args, world: int, comm_config: dict) -> dict:
    """What changes a run's results (its curve, val_ppl, model): not where it writes, how often
    it logs or checkpoints, or which steps its timing leaves out."""
    return {
        "model": args.model, "n_layer": args.n_layer, "n_embd": args.n_embd, "n_head": args.n_head,
        "vocab_size": args.vocab_size, "parallel": args.parallel, "sharding_strategy": args.sharding_strategy,
        "bf16": args.bf16, "world_size": world, "comm_compress": args.comm_compress, "comm_config": comm_config,
        "data_path": args.data_path and os.path.abspath(args.data_path),
        "val_path": args.val_path and os.path.abspath(args.val_path), "val_fraction": args.val_fraction,
        "batch_size": args.batch_size, "max_length": args.max_length, "max_steps": args.max_steps,
        "lr": args.lr, "weight_decay": args.weight_decay, "lr_warmup_steps": args.lr_warmup_steps,
        "grad_clip": args.grad_clip, "seed": args.seed, "eval_batches": args.eval_batches or None,
    }


def settings_hash(s: dict) -> str:
    """8 hex digits of the settings (sorted JSON): the same settings, the same hash, on any machine."""
    return hashlib.sha256(json.dumps(s, sort_keys=True).encode()).hexdigest()[:8]


def default_name(args, world: int, digest: str) -> str:
    return f"{args.model}-{args.comm_compress}-{args.parallel}-w{world}-{digest}"


def held(output_dir: str, name: str) -> dict | None:
    """What holds the run folder `name`: its run.json; {} for a run written before run.json (or
    one that left only a checkpoint or a model); None when the name is free."""
    try:
        with open(os.path.join(output_dir, "logs", name, RUN_FILE), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        pass
    return {} if any(os.path.exists(os.path.join(output_dir, sub, name)) for sub in SUBDIRS) else None


def _owner(resume_from: str, output_dir: str) -> str | None:
    """The run whose checkpoint resume_from is (<output_dir>/checkpoints/<run>/step_N), if any."""
    parent = os.path.dirname(os.path.realpath(resume_from))
    if os.path.dirname(parent) == os.path.realpath(os.path.join(output_dir, "checkpoints")):
        return os.path.basename(parent)
    return None


def _describe(state: dict, s: dict) -> str:
    """What holds a folder, for the refusal: its status, and how its settings differ from s."""
    if not state:
        return "a run from before run.json"
    theirs = state.get("settings") or {}
    differ = [f"{k} {theirs.get(k)!r} (now {v!r})" for k, v in s.items() if theirs.get(k) != v]
    return (f"a run {state.get('status', '?')} at step {state.get('step', '?')} with "
            + (f"other settings: {', '.join(differ)}" if differ else "these settings"))


def choose(output_dir: str, base: str, explicit: bool, s: dict, resume_from: str | None) -> str:
    """The run folder this run (settings s) writes: a resume of a run of these settings from its
    own checkpoint continues in that run's folder; otherwise the first free name of base,
    base-2, base-3, ... (an explicit --run_name: base or a ValueError saying what holds it)."""
    digest = settings_hash(s)
    owner = _owner(resume_from, output_dir) if resume_from else None
    ours = owner == base or (not explicit and owner and owner.startswith(base + "-")
                             and owner[len(base) + 1:].isdigit())
    if ours:
        state = held(output_dir, owner)
        if state is not None and state.get("hash", digest) == digest:  # {}: an older run, as before
            return owner
    state = held(output_dir, base)
    if state is None:
        return base
    if explicit:
        raise ValueError(f"--run_name {base}: {os.path.join(output_dir, 'logs', base)} already holds "
                         f"{_describe(state, s)}; its folders would mix with this run's. Pick another "
                         "--run_name or --output_dir, remove its folders, or resume it with --resume_from "
                         "one of its own checkpoints and its settings")
    n = 2
    while held(output_dir, f"{base}-{n}") is not None:
        n += 1
    return f"{base}-{n}"


def claim(output_dir: str, name: str, digest: str, s: dict, step: int, resumed_from: str | None) -> None:
    """Writes run.json: this run now holds the name (status "running" until finish())."""
    _write(output_dir, name, {"run_name": name, "hash": digest, "status": "running", "step": step,
                              "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "resumed_from": resumed_from,
                              "settings": s})


def finish(output_dir: str, name: str, step: int) -> None:
    state = held(output_dir, name) or {"run_name": name}
    state.update(status="finished", step=step, finished=time.strftime("%Y-%m-%dT%H:%M:%S"))
    _write(output_dir, name, state)


def _write(output_dir: str, name: str, state: dict) -> None:
    path = os.path.join(output_dir, "logs", name, RUN_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(state, f, indent=1)
    os.replace(path + ".tmp", path)


def find_model(path: str) -> tuple[str, str | None]:
    """The saved model `path` names, and a note when it is not path itself: path when it holds
    one (config.json); the one run folder inside it (fsdp_train.py saves to
    <output_dir>/final_model/<run_name>/); ValueError listing them when there are several, or
    saying so when there is none (transformers' own error there is about tokenizers)."""
    if not os.path.isdir(path):
        raise ValueError(f"{path}: no such directory")
    if os.path.isfile(os.path.join(path, MODEL_FILE)):
        return path, None
    found = sorted(d for d in os.listdir(path) if os.path.isfile(os.path.join(path, d, MODEL_FILE)))
    if len(found) == 1:
        chosen = os.path.join(path, found[0])
        return chosen, f"{path} holds one run folder, {found[0]}: using {chosen}"
    if found:
        raise ValueError(f"{path} holds no saved model itself but {len(found)} run folders: {', '.join(found)}. "
                         f"Give one of them, e.g. {os.path.join(path, found[-1])}")
    raise ValueError(f"{path} holds no saved model (no {MODEL_FILE}) and no run folders with one: give a "
                     "run's folder, <output_dir>/final_model/<run_name>")
