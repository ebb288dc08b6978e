"""Regenerates the method table of docs/methods.md from fsdpcomp.method_info(), so the table
can never disagree with the code (tests/tools/test_methods_doc.py checks it is up to date).

    PYTHONPATH=. python docs/gen_methods_table.py          # rewrite docs/methods.md in place
    PYTHONPATH=. python docs/gen_methods_table.py --check  # exit 1 if it is stale
"""
from __future__ import annotations

import argparse
import os
import sys

import fsdpcomp
from fsdpcomp import _C

DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "methods.md")
BEGIN, END = "<!-- methods-table:begin -->", "<!-- methods-table:end -->"
CHUNK = 1 << 20  # bits per element are measured on a chunk of this many fp32 elements


def fmt_default(key):
    d = key["default"]
    if isinstance(d, bool):
        return "true" if d else "false"
    if isinstance(d, str):
        return f'"{d}"'
    if isinstance(d, float):
        return f"{d:g}"
    return str(d)


def row(name):
    info = fsdpcomp.method_info(name)
    keys = ", ".join(f"`{k['name']}`={fmt_default(k)}" for k in info["keys"]) or "-"
    if name == "powersgd":  # no chunk codec: its factors' size is per matrix (n x m)
        bits = "32 r (n+m) / (n m)"
    else:
        lay = _C.State(name, {"error_feedback": False}).layout(CHUNK)
        bits = f"{8 * (lay['value_bytes'] + lay['meta_bytes'] + lay['index_bytes']) / CHUNK:.3g}"
    props = [
        "unbiased" if info["unbiased"] else "biased",
        "linear" if info["linear"] else "not linear",
    ]
    if info["varsize"]:
        props.append("data-dependent size")
    if info["error_feedback_default"]:
        props.append("EF on by default")
    return (f"| `{name}` | {'-' if info['id'] is None else info['id']} | {keys} | {bits} | {info['summary'].replace('|', chr(92) + '|')} | "
            f"{', '.join(props)} |")


def table():
    lines = [
        "| method | wire id | config keys (defaults) | bits/element at the defaults | on the wire | properties |",
        "|---|---|---|---|---|---|",
    ]
    lines += [row(m) for m in fsdpcomp.methods()]
    common = ", ".join(f"`{k['name']}`={fmt_default(k)}" for k in fsdpcomp.method_info("none")["common_keys"])
    lines += ["", f"Every method also takes the common keys: {common}.",
              f"Bits per element: body bytes * 8 / n for a chunk of n = {CHUNK} fp32 elements "
              "(thresholdv: the bound for k = n); the 32-byte header and 16-byte padding per "
              "chunk come on top."]
    return "\n".join(lines)


def render(text):
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if docs/methods.md is stale")
    a = p.parse_args(argv)
    with open(DOC) as f:
        text = f.read()
    new = render(text)
    if a.check:
        if new != text:
            print("docs/methods.md is stale: run PYTHONPATH=. python docs/gen_methods_table.py",
                  file=sys.stderr)
            return 1
        return 0
    with open(DOC, "w") as f:
        f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
