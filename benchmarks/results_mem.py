# The memory section of docs/results.md (and mem_bench.py's printout): per-rank bytes per parameter, measured and computed, from mem_bench_*.json.
"""Used by make_results_md.py and mem_bench.py; only numbers found in the JSON are written."""
from __future__ import annotations

from fmt import fmt, md_table

MEM_CMD = ("python benchmarks/mem_bench.py --model gpt2-62m --world 2 4 "
           "--methods topk 'int8:{\"error_feedback\": true}' --residual_dtypes fp32 bf16 int8")
_PARTS = ("params", "grads", "optimizer", "residual", "buffers")


def measured_lines(data: dict) -> list[str]:
    m = data["meta"]
    out = [f"Measured: {m['model']} ({data['measured'][0]['model_params']:,} parameters), FSDP2 on W gloo CPU "
           f"ranks, {m['steps']} fsdpcomp steps after a plain one, batch {m['batch_size']}x{m['max_length']}. "
           "Bytes per parameter on the rank that holds most, from the tensors themselves; `computed` is "
           "mem_model.py's sum for that W, `measured / computed` the part furthest from 1.", ""] if data["measured"] else \
        [f"Measured: nothing ({m['model']}): every configuration was skipped.", ""]
    rows = []
    for r in data["measured"]:
        worst = max((v for v in r["ratio"].values() if v is not None), key=lambda v: abs(v - 1), default=None)
        total = sum(r[p] for p in _PARTS)
        rows.append([r["method"], r["residual_dtype"], str(r["world"]), *(f"{r[p]:.3f}" for p in _PARTS),
                     f"{total:.3f}", f"{sum(r[p + '_computed'] for p in _PARTS):.3f}", fmt(worst, ".4f"),
                     "yes" if r["counters_equal_tensors"] else "NO", f"{r['buffer_peak']:.3f}",
                     f"{r['rss_growth']:.3f}", f"{r['not_counted']:.3f}",
                     fmt(r.get("not_counted_per_shard_element"), ".1f")])
    if rows:
        out += md_table(["method", "residual", "W", "params", "grads", "AdamW", "residual", "buffers", "total",
                         "computed", "measured / computed", "counters = tensors", "buffer peak", "RSS growth",
                         "RSS not counted", "not counted, B per shard element"], rows) + [""]
    for s in data.get("skipped", []):
        out.append(f"- skipped: {s['method']} with residual_dtype {s['residual_dtype']}, refused by this fsdpcomp "
                   f"({s['why'][:160]}); the same command measures it once the config is accepted.")
    return out + ([""] if data.get("skipped") else [])


def computed_lines(data: dict) -> list[str]:
    out = []
    for model in dict.fromkeys(r["model"] for r in data["computed"]):
        rows = [r for r in data["computed"] if r["model"] == model]
        specs = list(rows[0]["buffers"])
        n = rows[0]["model_params"]
        out += [f"Computed: {model} ({n:,} parameters), bytes per parameter per rank (rank 0, FSDP2's "
                "padding included). FSDP2 = fp32 parameters + gradients + AdamW m, v; the residual is "
                "the same on every rank whatever W; buffers: fsdpcomp's send and receive buffers for the "
                "largest unit. GiB: FSDP2 alone, and with the fp32 / int8 residual and the first method's "
                "buffers.", ""]
        table = []
        for r in rows:
            fsdp = r["params"] + r["grads"] + r["optimizer"]
            extra = r["buffers"][specs[0]] if specs else 0.0
            gib = [fsdp * n / 2**30, (fsdp + r["residual_fp32"] + extra) * n / 2**30,
                   (fsdp + r["residual_int8"] + extra) * n / 2**30]
            table.append([str(r["world"]), f"{r['plain_fsdp2']:.3f}", f"{fsdp:.3f}", f"{r['residual_fp32']:.3f}",
                          f"{r['residual_bf16']:.3f}", f"{r['residual_int8']:.3f}",
                          *(f"{r['buffers'][s]:.4f}" for s in specs), f"{r['residual_fp32'] / fsdp:.2f}x",
                          f"{r['residual_int8'] / fsdp:.2f}x", " / ".join(f"{g:.1f}" if g >= 10 else f"{g:.2f}" for g in gib)])
        out += md_table(["W", "plain FSDP2, 16/W", "FSDP2, padded", "residual fp32", "bf16", "int8", *(f"buffers {s}" for s in specs),
                         "fp32 residual / FSDP2", "int8 residual / FSDP2", "GiB per rank"], table) + [""]
    return out


def mem_section(data: dict, reproduce: str) -> list[str]:
    m = data["meta"]
    out = [f"## Memory per rank: FSDP2's state beside fsdpcomp's residual and buffers (benchmarks/mem_bench.py, "
           f"`{m['stem']}`)", "",
           f"Measured {m['date']} on `{m['machine']}` ({m['cores']} cores), torch {m['torch']}, fsdpcomp "
           f"{m['fsdpcomp']}. Each rank sums the bytes of the storages it holds: FSDP2's sharded parameters, "
           "its gradients (at the optimizer step), AdamW's state, and fsdpcomp's residuals (`residual_bytes`) "
           "and buffers (`buffer_bytes`), whose counters must equal those tensors. `RSS growth`: the resident "
           "set after the fsdpcomp steps minus after the plain FSDP2 step (glibc's mmap threshold fixed, so "
           "freed tensors leave it); `RSS not counted` is what it grew by beyond the counted residual and "
           "buffers: the C codec's scratch (fp32 working copies sized by the largest unit's shard, from "
           "`malloc`, which no counter sees) and the process's other growth; the last column divides it by "
           "the elements of the largest unit's shard (4 B: one fp32 working copy of it).", ""]
    rows = data["measured"]
    missed = [r for r in rows if not r["within"] or not r["counters_equal_tensors"]]
    if rows:
        out += [f"{len(rows) - len(missed)} of {len(rows)} measured rows match the computed ones part by part "
                f"within {m['tolerance']:.0%}, with counters equal to the tensors"
                + (": " + ", ".join(f"{r['method']} {r['residual_dtype']} W={r['world']}" for r in missed)
                   + " do not." if missed else "."), ""]
    out += measured_lines(data) + computed_lines(data)
    return out + ["Reproduce:", "", "```", reproduce, "```", ""]
