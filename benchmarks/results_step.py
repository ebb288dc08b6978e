# The step_bench sections of docs/results.md (tables) and README (a few lines), from step_bench_*.json.
"""Used by make_results_md.py; only numbers found in the JSON are written."""
from __future__ import annotations

import os

from fmt import fmt, fmt_bytes, md_table

STEP_CMD = "sudo python benchmarks/step_bench.py --model gpt2-62m --world 2 3 --links 1 0.1"


def _pm(value, std, spec: str) -> str:
    return "-" if value is None else format(value, spec) + (f" ± {format(std, spec)}" if std else "")


def _config_notes(meta: dict) -> str:
    names = list(meta["configs"])
    notes = {"none": "`none`: fp32 gradients through fsdpcomp's reduce-scatter, torch's fp32 all-gather",
             "torch_bf16": "`torch_bf16`: plain FSDP2 with `MixedPrecisionPolicy(reduce_dtype=bfloat16)`, torch's own "
                           "bf16 reduce-scatter (FSDP2's form of torch's bf16 hook)",
             "int8": "`int8`: int8 gradients (block 256), torch's fp32 all-gather",
             "int8+int8": "`int8+int8`: int8 gradients and int8 parameter all-gathers (`param_gather: \"int8\"`, block 256)"}
    return "; ".join(notes.get(n, f"`{n}`") for n in names)


def step_section(data: dict, rel: str, reproduce: str, brief: bool = False) -> list[str]:
    m = data["meta"]
    title = f"## FSDP2 end to end: step time, bytes and quality, {m['model']} (benchmarks/step_bench.py)"
    timing, quality = data["timing"], data["quality"]
    if brief:
        out = [title, ""]
        for r in timing:
            if r["config"] == "int8+int8" and r["speedup"] is not None:
                out.append(f"- W={r['world']}, {r['link']}: int8 gradients + int8 parameter gathers send "
                           f"{r['bytes_ratio']:.2f}x fewer bytes per step and step {r['speedup']:.2f}x faster than "
                           f"`none` (Amdahl bound from the measured comm share {r['bound']:.2f}x, "
                           f"comm-free {r['comm_free_bound']:.2f}x).")
        for r in quality:
            if r["config"] == "int8+int8" and r["delta_ppl_pct"] is not None:
                out.append(f"- val ppl with int8 gathers: {_pm(r['delta_ppl_pct'], r['delta_ppl_pct_std'], '+.2f')}% "
                           f"vs `none` after {r['steps']} steps ({len(r['seeds'])} seed(s)).")
        return out + ["", "Tables, split per collective and the other configurations: "
                      "[docs/results.md](docs/results.md).", ""]
    out = [title, "",
           f"Measured {m['date']} on `{m['machine']}` ({m['cores']} cores), torch {m['torch']}, fsdpcomp {m['fsdpcomp']}: "
           f"{m['title']}; {fmt(m.get('model_params') and m['model_params'] / 1e6, '.1f')}M parameters, FSDP2 "
           "(`fully_shard` on every GPT-2 block and the root, `reshard_after_forward=True`: two all-gathers per "
           "block and step), AdamW, CPU ranks joined by gloo.", "",
           *([f"**Caveat:** {m['note']}", ""] if m.get("note") else []),
           f"- Configurations: {_config_notes(m)}.",
           "- Every all-gather and reduce-scatter call (torch's or fsdpcomp's) is timed; compute is the rest of "
           "the step (forward, backward, optimizer). Times are means over the timed steps of the mean over ranks.",
           "- Bytes per step and rank: the payloads (fsdpcomp's counters; for torch's collectives what they send "
           "in their dtype); `wire` is what left the rank's link (tx counter, TCP/IP included): gloo's "
           "reduce-scatter sends twice its payload (an all-reduce underneath).",
           "- `bound`: the Amdahl bound from `none`'s measured split: its step with the all-gather and the "
           "reduce-scatter time each scaled by this configuration's bytes on the wire for that collective (the "
           "link's tx counter read around every call; payload bytes on unshaped runs), compute unchanged. "
           "`no-comm bound`: the step with no communication at all. `of bound`: speedup / bound.", ""]
    for world in dict.fromkeys(r["world"] for r in timing):
        for link in dict.fromkeys(r["link"] for r in timing if r["world"] == world):
            rows = [r for r in timing if r["world"] == world and r["link"] == link]
            out += [f"### W={world}, {link} (point-to-point check {fmt(rows[0]['link_check_gbit'], '.2f')} Gbit/s), "
                    f"{rows[0]['timed_steps']} timed steps", ""]
            out += md_table(["config", "step ms", "compute ms", "all-gather ms", "reduce-scatter ms", "codec ms",
                              "comm share", "grad/step", "param/step", "wire/step", "bytes vs none", "speedup",
                              "bound", "of bound", "no-comm bound"],
                             [[r["config"], f"{r['step_s'] * 1e3:.0f}", f"{r['compute_s'] * 1e3:.0f}",
                               f"{r['all_gather_s'] * 1e3:.0f}", f"{r['reduce_scatter_s'] * 1e3:.0f}",
                               f"{r['codec_s'] * 1e3:.0f}", f"{r['comm_share']:.0%}", fmt_bytes(r["rs_bytes"]),
                               fmt_bytes(r["ag_bytes"]), fmt_bytes(r["wire_bytes"]), fmt(r["bytes_ratio"], ".2f"),
                               fmt(r["speedup"], ".2f"), fmt(r["bound"], ".2f"), fmt(r["of_bound"], ".0%"),
                               fmt(r["comm_free_bound"], ".2f")] for r in rows])
            out.append("")
    for world in dict.fromkeys(r["world"] for r in quality):
        rows = [r for r in quality if r["world"] == world]
        out += [f"### Quality at equal steps, W={world}, unshaped ({rows[0]['steps']} steps, seeds "
                f"{rows[0]['seeds']})", ""]
        out += md_table(["config", "val ppl", "Δppl vs none %", "train loss (last 10)"],
                         [[r["config"], _pm(r["val_ppl"], r["val_ppl_std"], ".3f"),
                           _pm(r["delta_ppl_pct"], r["delta_ppl_pct_std"], "+.2f"), fmt(r["train_loss"], ".4f")]
                          for r in rows])
        out.append("")
    if data["targets"]:
        out += ["Targets:", ""]
        for t in data["targets"]:
            state = "measured" if t["met"] is None else ("MET" if t["met"] else "MISSED")
            value = f"{t['value']:.0%}" if t["met"] is None else f"{t['value']:.3g}"
            out.append(f"- {state}: {t['target']}: {value} ({t['note']})")
        out.append("")
    png = m["stem"] + ".png"
    if os.path.exists(os.path.join(os.path.dirname(data["_path"]), png)):
        out += [f"![step split per configuration]({rel}/{png})", ""]
    return out + ["Reproduce:", "", "```", reproduce, "```", ""]
