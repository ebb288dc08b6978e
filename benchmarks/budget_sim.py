# A prototype of the budget method for quality runs (issue 39): fsdp_train.py under DDP with each rank's per-weight gradient replaced by its codec's roundtrip.
"""    python benchmarks/train_bench.py --setting cpu --link unshaped --seeds 1 --max_steps 1000 \\
        --eval_every 100 --tag budget_sim --train_script benchmarks/budget_sim.py \\
        --methods 'none:{"sim": "dct 15/128"}' 'none:{"sim": "budget", "sim_ratio": 32}' \\
        -- --parallel ddp

What it answers before a wire format is built: does a per-weight codec choice under a byte
budget (fsdpcomp._budget: L-GreCo's knapsack over measured errors) train better than one codec
for every weight at the same bytes? It is a simulation, not the library's method:

- Every rank's gradient of every weight is replaced, before DDP averages it exactly, by what
  the library's reduce-scatter would make of it: the weight cut in W chunks, the chunk the rank
  owns kept exact, every other chunk through its codec's roundtrip D(C(g))
  (fsdpcomp._budget.roundtrip: the library's encode and decode of one chunk). The real
  collective cuts a flat unit of several weights, so chunk edges differ; the error per element
  carried is the same. `"sim_own": "codec"` sends the own chunk through the codec too (the
  first runs, with about twice the error variance).
- `"sim": "budget"`: every `sim_every` steps (50) each rank measures every candidate of
  fsdpcomp._budget.LADDER on the chunks of each weight it sends; the bytes and errors are summed
  over ranks (all-reduces on a group of their own), and every rank solves the same knapsack for
  bytes = what `none` would send / `sim_ratio`, minimising `sim_objective` ("l-greco": summed squared error, or
  "per-param": each weight's relative error times its parameters). Step 0 goes exact (it is
  the first measurement); the choice holds until the next.
- `"sim": "<candidate name>"` (e.g. "dct 15/128", "intN 3-bit"): that codec for every weight.

The "sim" keys are taken out of --comm_config_json before fsdp_train.py reads it; the rest (the
library's `none` over DDP) trains as usual. Rank 0 writes the bytes the simulated codecs would
send and every choice made to budget_sim_<run name>.json in $BUDGET_SIM_OUT (default: the run's
--output_dir); results.jsonl's ratio is `none`'s."""
from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.join(os.path.dirname(_HERE), "examples")]
import repo_path  # noqa: E402

repo_path.use_checkout()
import fsdp_train  # noqa: E402
import parallel  # noqa: E402
from fsdpcomp._budget import LADDER, Cost, choose, measure, roundtrip  # noqa: E402

BY_NAME = {c.name: i for i, c in enumerate(LADDER)}


class Sim:
    """Per-weight codecs applied by gradient hooks; the choice remade from measured costs."""

    def __init__(self, spec: dict, named: list[tuple[str, torch.nn.Parameter]]):
        self.kind = spec["sim"]
        if self.kind != "budget" and self.kind not in BY_NAME:
            raise ValueError(f"sim must be 'budget' or one of {sorted(BY_NAME)}, got {self.kind!r}")
        self.ratio = float(spec.get("sim_ratio", 32))
        self.every = int(spec.get("sim_every", 50))
        self.objective = spec.get("sim_objective", "l-greco")
        self.names = [n for n, _ in named]
        self.sizes = {n: p.numel() for n, p in named}
        self.calls = {n: 0 for n in self.names}
        self.costs: dict[str, list[Cost]] = {}
        self.norms: dict[str, float] = {}
        self.choice = {n: (BY_NAME["fp32"] if self.kind == "budget" else BY_NAME[self.kind]) for n in self.names}
        self.sent = 0
        self.raw = 0
        self.sent_per_step: list[int] = []  # one rank's bytes, step by step
        self.history: list[dict] = []
        self.budget = 0  # all ranks' bytes per step under the latest choice
        self.chosen_at = -1  # the step whose choice is made: once, by its first weight
        self.group = dist.new_group(backend="gloo")  # the costs' all-reduce, apart from DDP's
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.own = spec.get("sim_own", "exact")
        if self.own not in ("exact", "codec"):
            raise ValueError(f"sim_own must be 'exact' or 'codec', got {self.own!r}")

    def hook(self, name: str):
        def apply(grad: torch.Tensor) -> torch.Tensor:
            step = self.calls[name]
            self.calls[name] += 1
            if self.kind == "budget" and step > 0 and step % self.every == 1 and self.costs:
                self._choose(step)
            g = grad.detach().reshape(-1).float().contiguous()
            if self.kind == "budget" and step % self.every == 0:
                self.costs[name] = self._measure(g)
                self.norms[name] = float((g.double() ** 2).sum())
            c = LADDER[self.choice[name]]
            sent_n = g.numel() - (0 if self.own == "codec" else torch.tensor_split(g, self.world)[self.rank].numel())
            out, size = (grad, 4 * sent_n + 32) if c.method == "none" else self._send(g, c)
            self.raw += 4 * sent_n  # what `none` sends of it: the ratio is the library's
            self.sent += size
            while len(self.sent_per_step) <= step:
                self.sent_per_step.append(0)
            self.sent_per_step[step] += size
            return out if out is grad else out.view_as(grad).to(grad.dtype)
        return apply

    def _sent_chunks(self, g: torch.Tensor) -> list[torch.Tensor]:
        """The parts of this rank's gradient that go through a codec (see _send)."""
        if self.own == "codec":
            return [g]
        return [ch.contiguous() for q, ch in enumerate(torch.tensor_split(g, self.world))
                if q != self.rank and ch.numel() > 0]

    def _measure(self, g: torch.Tensor) -> list[Cost]:
        """Every candidate's bytes and error on what this rank sends: the choice's budget is then
        in the bytes the run sends."""
        rows = [measure(ch) for ch in self._sent_chunks(g)]
        return [Cost(sum(r[j].bytes for r in rows), sum(r[j].err_sq for r in rows)) for j in range(len(LADDER))]

    def _send(self, g: torch.Tensor, c) -> tuple[torch.Tensor, int]:
        """What the mean over ranks sees of this rank's gradient, and the bytes it sends. "exact"
        (as the library's reduce-scatter): the weight cut in W chunks as FSDP cuts a flat unit, the
        chunk this rank owns kept exact, each other chunk through the codec. "codec": all of it."""
        if self.own == "codec":
            return roundtrip(g, c)
        parts, size = [], 0
        for q, chunk in enumerate(torch.tensor_split(g, self.world)):
            if q == self.rank or chunk.numel() == 0:
                parts.append(chunk)
                continue
            out, n = roundtrip(chunk.contiguous(), c)
            parts.append(out)
            size += n
        return torch.cat(parts), size

    def _choose(self, step: int) -> None:
        """Every rank the same choice: the costs summed over ranks, then the one knapsack. The first
        weight to get its gradient at the step after a measurement makes it, for all."""
        if self.chosen_at == step:
            return
        self.chosen_at = step
        errs = torch.tensor([[c.err_sq for c in self.costs[n]] for n in self.names], dtype=torch.float64)
        sizes = torch.tensor([[c.bytes for c in self.costs[n]] for n in self.names], dtype=torch.float64)
        norms = torch.tensor([self.norms[n] for n in self.names], dtype=torch.float64)
        for t in (errs, sizes, norms):  # summed over ranks: every rank the same numbers
            dist.all_reduce(t, group=self.group)
        rows = []
        for i, n in enumerate(self.names):
            scale = self.sizes[n] / max(float(norms[i]), 1e-300) if self.objective == "per-param" else 1.0
            rows.append([Cost(int(sizes[i, j]), float(errs[i, j]) * scale) for j in range(len(LADDER))])
        raw = sum(r[BY_NAME["fp32"]].bytes for r in rows)
        self.budget = int(raw / self.ratio)  # all ranks' bytes per step
        pick = choose(rows, self.budget)
        self.choice = dict(zip(self.names, pick))
        self.history.append({"step": step, "choice": {n: LADDER[i].name for n, i in self.choice.items()}})


def install(model: torch.nn.Module, spec: dict) -> Sim:
    named = list(model.named_parameters())  # tied weights once: the embedding is the head
    sim = Sim(spec, named)
    for n, p in named:
        p.register_hook(sim.hook(n))
    return sim


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    spec = {}
    if "--comm_config_json" in argv:
        i = argv.index("--comm_config_json") + 1
        cfg = json.loads(argv[i])
        spec = {k: cfg.pop(k) for k in list(cfg) if k == "sim" or k.startswith("sim_")}
        argv[i] = json.dumps(cfg)
    sims = []
    if spec:
        plain = parallel.WRAPPERS["ddp"]

        def wrap_ddp_sim(model, comm, **kw):
            sims.append(install(model, spec))  # before DDP: the hooks see each rank's own gradient
            return plain(model, comm, **kw)

        parallel.WRAPPERS["ddp"] = wrap_ddp_sim
    rc = fsdp_train.main(argv)
    if sims and sims[0].rank == 0:  # beside results.jsonl: what the simulated codecs would send
        s = sims[0]
        where = os.environ.get("BUDGET_SIM_OUT") or _arg(argv, "--output_dir", "outputs")
        os.makedirs(where, exist_ok=True)
        out = os.path.join(where, f"budget_sim_{_arg(argv, '--run_name', 'run')}.json")
        with open(out, "w") as f:
            json.dump({"spec": spec, "raw_bytes": s.raw, "sent_bytes": s.sent, "ratio": s.raw / max(s.sent, 1),
                       "budget_per_step": s.budget // s.world if s.kind == "budget" else None,
                       "sent_per_step": s.sent_per_step, "choices": s.history}, f)
        print(f"budget_sim: {s.raw / max(s.sent, 1):.2f}x ({s.sent:,} of {s.raw:,} bytes); {out}", flush=True)
    return rc


def _arg(argv: list[str], flag: str, default: str) -> str:
    return argv[argv.index(flag) + 1] if flag in argv else default


if __name__ == "__main__":
    sys.exit(main())
