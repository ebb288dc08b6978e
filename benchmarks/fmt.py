"""Number formatting shared by the benchmarks' tables and the results page generator."""
from __future__ import annotations


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n:.0f} B"


def fmt(x: float | None, spec: str) -> str:
    """x formatted with spec, or '-' when it was not measured."""
    return "-" if x is None else format(x, spec)


def md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table: the first column left-aligned, the others right-aligned (numbers)."""
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|"]
    return out + ["| " + " | ".join(r) + " |" for r in rows]
