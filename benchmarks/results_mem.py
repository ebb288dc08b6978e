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


FSDPCOMP_MEM_CMD = "python benchmarks/memory_per_rank.py --world 2 4"
_FC_PARTS = ("residual_bytes", "buffer_bytes", "scratch_bytes")


def _label(r: dict) -> str:
    return f"{r['method']} {r['residual_dtype']}"


def fsdpcomp_section(data: dict, reproduce: str = FSDPCOMP_MEM_CMD) -> list[str]:
    """docs/results.md's table of fsdpcomp's own memory per rank (benchmarks/memory_per_rank.py):
    residual + buffers + the C core's scratch per parameter, measured and computed to W = 1024."""
    m, n = data["meta"], data["params"]
    out = ["## fsdpcomp's own memory per rank: residual + buffers + scratch (benchmarks/memory_per_rank.py)", "",
           f"Measured {m['date']} on `{m['machine']}` ({m['cores']} cores), torch {m['torch']}, fsdpcomp "
           f"{m['fsdpcomp']}: a small MLP ({n:,} parameters in {data['units']} FSDP2 units: three blocks of "
           "Linear(256, 1024) + Linear(1024, 256) and the root's Linear(256, 10) head) under fully_shard on W "
           "gloo CPU ranks, fsdpcomp.register, three SGD steps. Bytes per parameter from each rank's "
           "counters() (`residual_bytes`, `buffer_bytes`, `scratch_bytes`), the rank that holds most; "
           "`computed` is the formula below for that W; the last column is scratch_bytes per element of the "
           "largest chunk (the largest unit's shard), which issue 38 holds to <= 8 B.", ""]
    rows = [[r["method"], r["residual_dtype"], str(r["world"]), *(f"{r[p] / n:.3f}" for p in _FC_PARTS),
             f"{sum(r[p] for p in _FC_PARTS) / n:.3f}", f"{sum(r['computed'][p] for p in _FC_PARTS) / n:.3f}",
             f"{r['scratch_bytes'] / r['largest_chunk']:.2f}"] for r in data["measured"]]
    out += md_table(["method", "residual", "W", "residual", "buffers", "scratch", "total", "computed total",
                     "scratch, B per element of the largest chunk"], rows) + [""]
    out += ["Computed for any W from the units' shapes (FSDP2 pads dim 0 to a multiple of W; rank 0's shard is "
            "the largest), S = the largest unit's shard, r = the residual dtype's bytes (fp32 4, int8 1 + 4/64):", "",
            "- residual: r per element of every unit's whole padded gradient, r * sum_u W * shard_u: it does not "
            "divide by W, so it is ~r per parameter at any W (more once FSDP2's padding grows, W >= 512 here).",
            "- buffers: a send and a receive buffer grown to the largest unit's payloads to the W - 1 other "
            "ranks, 2 (W - 1) payload(S): ~2 payload bytes per element, times (W - 1) / W of the largest unit.",
            "- scratch: the fp32 working copy of the chunk being encoded, which a decode reuses for its sum (4 S), "
            "plus the method's own scratch for a chunk of S (int8: none; topk: k indices and k values, "
            "8 k(S) + 64), each rounded up to 64 bytes: <= 8 B per element of the largest chunk, so it divides "
            "by W. The int8 residual is read and packed in place on the CPU (no unpacked workspace since "
            "2026-11-29): add only its carry, 272 bytes (64 fp32 values and an index) per block of 64 that a chunk "
            "start cuts, at most 3 at once in the per-peer path's order (the whole encode: 1), whatever W; on a GPU the fp32 workspace the largest unit's residual is unpacked "
            "into for a call, 4 W S, is still held.", ""]
    cols = data["computed"][0]["rows"]
    head = ["W"] + [f"total {_label(r)}" for r in cols] + [f"scratch {_label(r)}" for r in cols]
    rows = [[str(t["world"])] + [f"{sum(r[p] for p in _FC_PARTS) / n:.3f}" for r in t["rows"]]
            + [f"{r['scratch_bytes'] / n:.3f}" for r in t["rows"]] for t in data["computed"]]
    out += [f"Computed, bytes per parameter per rank ({cols[0]['method']}: {json_cfg(cols[0]['config'])}; "
            f"{cols[-1]['method']}: {json_cfg(cols[-1]['config'])}):", ""]
    out += md_table(head, rows) + [""]
    out += ["Reproduce:", "", "```", reproduce, "```", ""]
    return out


def json_cfg(cfg: dict) -> str:
    import json
    return json.dumps(cfg)
