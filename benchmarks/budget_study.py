# Per-weight codec choice under a byte budget (issue 39), measured on the tiny model's own gradients.
"""    python benchmarks/budget_study.py                       # tiny model, 600 steps, 4 samples
    python benchmarks/budget_study.py --steps 1000 --sample_at 100 400 700 1000 --ratios 8 16 32 44

Trains the reference tiny model in one process as `none` trains it on 2 ranks (both ranks' sequences in one batch) (AdamW,
lr schedule, batch 8 per rank, seed), and at the sampled steps takes one rank's gradient of each
weight (its first 8 sequences: what that rank's codec would see) and runs every candidate of
fsdpcomp._budget.LADDER on it through the library's codecs: bytes on the wire and squared error.
Then, for each ratio, the knapsack's per-weight choice under bytes = raw / ratio (errors summed
over the samples), against every single candidate applied to all weights that fits the same
bytes: the summed relative error ||D(C(g)) - g||^2 / ||g||^2 each leaves, and which weight got
which codec.

It answers the question the budget method rests on before any wire format is built for it: how
much less error does a per-weight choice leave at the same bytes, on these gradients."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from types import SimpleNamespace

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.join(os.path.dirname(_HERE), "examples")]
import repo_path  # noqa: E402

repo_path.use_checkout()
import fsdp_train  # noqa: E402
import gpt  # noqa: E402
import textdata  # noqa: E402
from fsdpcomp._budget import LADDER, choose, measure  # noqa: E402


def data(max_length: int):
    args = SimpleNamespace(data_path=None, val_path=None, cache_dir=None, vocab_size=None, model="tiny",
                           max_length=max_length, val_fraction=None)
    info = fsdp_train._prepare_rank0(args)
    return textdata.TokenBlocks(info["train_cache"])


def sample_costs(args):
    """{weight name: (numel, [summed Cost per candidate])} over the sampled steps, and ||g||^2 per weight."""
    ds = data(args.max_length)
    world = 2
    samplers = [textdata.StepSampler(len(ds), args.batch_size, world, r, args.seed) for r in range(world)]
    torch.manual_seed(args.seed)
    model = gpt.make_model(gpt.make_config("tiny"))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    targs = SimpleNamespace(lr=args.lr, lr_warmup_steps=10, max_steps=args.steps)
    named = [(n, p) for n, p in model.named_parameters()]
    costs: dict[str, list] = {}
    norms: dict[str, float] = {}
    want = set(args.sample_at)
    for step in range(args.steps):
        for grp in opt.param_groups:
            grp["lr"] = fsdp_train.lr_at(step, targs)
        opt.zero_grad(set_to_none=True)
        if step + 1 in want:  # rank 0's gradient alone: what its codec compresses
            x = torch.stack([ds[i] for i in samplers[0].indices(step)])
            model(input_ids=x, labels=x).loss.backward()
            t0 = time.perf_counter()
            for n, p in named:
                got = measure(p.grad, LADDER)
                old = costs.get(n)
                costs[n] = got if old is None else [type(a)(a.bytes + b.bytes, a.err_sq + b.err_sq)
                                                    for a, b in zip(old, got)]
                norms[n] = norms.get(n, 0.0) + float((p.grad.double() ** 2).sum())
            print(f"step {step + 1}: measured {len(LADDER)} candidates on {len(named)} weights in "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)
            opt.zero_grad(set_to_none=True)
        # the step itself: both ranks' sequences, as `none` on 2 ranks averages them
        x = torch.stack([ds[i] for r in range(world) for i in samplers[r].indices(step)])
        model(input_ids=x, labels=x).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    sizes = {n: p.numel() for n, p in named}
    return costs, norms, sizes


def _metrics(rows, pick, names, norms, sizes):
    """(summed error / summed ||g||^2, mean over parameters of each weight's relative error)."""
    total_norm, total_n = sum(norms.values()), sum(sizes.values())
    err = sum(rows[l][i].err_sq for l, i in enumerate(pick)) / total_norm
    per = sum(sizes[n] * rows[l][i].err_sq / max(norms[n], 1e-300) for l, (n, i) in enumerate(zip(names, pick)))
    return err, per / total_n


def report(costs, norms, sizes, ratios):
    """Two objectives: L-GreCo's summed squared error, and the same with each weight's error
    relative to its own ||g||^2 and weighted by its parameters ("per parameter"): AdamW divides
    every coordinate by its own running scale, so a weight with small gradients moves as far per
    step as one with large ones, and its relative error is what its step carries."""
    names = list(costs)
    rows = [costs[n] for n in names]
    rel_rows = [[type(c)(c.bytes, c.err_sq / max(norms[n], 1e-300) * sizes[n]) for c in costs[n]] for n in names]
    raw = sum(r[0].bytes for r in rows)  # fp32 ("none"): the ratio's reference
    out = {"ratios": {}}
    print(f"\n{len(names)} weights, {sum(sizes.values()):,} parameters; errors summed over the samples. "
          "err: sum ||D(C(g)) - g||^2 / sum ||g||^2; per-param: the parameters' mean of their weight's "
          "relative error\n")
    print("| target | how | bytes | ratio | err | per-param err |")
    print("|---:|---|---:|---:|---:|---:|")
    for ratio in ratios:
        budget = int(raw / ratio)
        cell = out["ratios"][str(ratio)] = {"budget": budget}
        for objective, obj_rows in (("l-greco", rows), ("per-param", rel_rows)):
            pick = choose(obj_rows, budget)
            b = sum(rows[l][i].bytes for l, i in enumerate(pick))
            e, pe = _metrics(rows, pick, names, norms, sizes)
            print(f"| {ratio}x | choice, {objective} objective | {b:,} | {raw / b:.1f}x | {e:.4f} | {pe:.4f} |")
            cell[objective] = {"bytes": b, "err": e, "per_param_err": pe,
                               "choice": {n: LADDER[i].name for n, i in zip(names, pick)}}
        fits = [j for j in range(len(LADDER)) if sum(r[j].bytes for r in rows) <= budget]
        for j in sorted(fits, key=lambda j: _metrics(rows, [j] * len(rows), names, norms, sizes)[1])[:2]:
            bj = sum(r[j].bytes for r in rows)
            e, pe = _metrics(rows, [j] * len(rows), names, norms, sizes)
            print(f"| {ratio}x | single: {LADDER[j].name} | {bj:,} | {raw / bj:.1f}x | {e:.4f} | {pe:.4f} |")
            cell.setdefault("singles", []).append({"name": LADDER[j].name, "bytes": bj, "err": e, "per_param_err": pe})
    for objective in ("l-greco", "per-param"):
        print(f"\nchoice per weight, {objective} objective\n")
        print("| weight | numel | share of ||g||^2 | " + " | ".join(f"{r}x" for r in ratios) + " |")
        print("|---|---:|---:|" + "---|" * len(ratios))
        total_norm = sum(norms.values())
        for n in names:
            cells = [out["ratios"][str(r)][objective]["choice"][n] for r in ratios]
            print(f"| {n} | {sizes[n]:,} | {norms[n] / total_norm:.3f} | " + " | ".join(cells) + " |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--sample_at", type=int, nargs="+", default=[50, 200, 400, 600])
    ap.add_argument("--ratios", type=float, nargs="+", default=[8, 16, 32, 44])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--batch_size", type=int, default=8)
    ap.add_argument("--max_length", type=int, default=128)
    ap.add_argument("--json", default=None, help="write the choices and numbers here")
    args = ap.parse_args(argv)
    if max(args.sample_at) > args.steps:
        ap.error(f"--sample_at {max(args.sample_at)} is past --steps {args.steps}")
    costs, norms, sizes = sample_costs(args)
    out = report(costs, norms, sizes, [int(r) if r == int(r) else r for r in args.ratios])
    if args.json:
        out["argv"] = sys.argv
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
