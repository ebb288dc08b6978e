"""Counters: the C state's counters as a dict that also renders as a table in Jupyter."""
from __future__ import annotations

import html
from typing import Any

# Display order and units for the table; any other key is shown after these.
_ORDER = [
    ("method", ""), ("calls", ""), ("elements", ""), ("bytes_raw", "B"), ("bytes_sent", "B"),
    ("ratio", "x"), ("header_bytes", "B"), ("meta_bytes", "B"), ("index_bytes", "B"),
    ("value_bytes", "B"), ("density", ""), ("compress_time_s", "s"), ("decompress_time_s", "s"),
    ("comm_time_s", "s"), ("extra_collectives", ""), ("extra_collective_time_s", "s"),
    ("grad_rel_error", ""), ("grad_cos_sim", ""), ("residual_norm", ""), ("residual_bytes", "B"),
    ("buffer_bytes", "B"), ("buffer_peak_bytes", "B"), ("scratch_bytes", "B"),
    ("nonfinite_in", ""), ("nonfinite_out", ""), ("saturated", ""), ("calls_uncompressed", ""),
    ("warmup_calls_exact", ""), ("warmup_steps_exact", ""), ("fallback_units", ""), ("step", ""), ("units", ""),
]


def _fmt(value: Any, unit: str) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        text = f"{value:.4g}"
    elif isinstance(value, int) and unit == "B" and value >= 1024:
        size, suffix = float(value), "B"
        for suffix in ("KiB", "MiB", "GiB", "TiB"):
            size /= 1024.0
            if size < 1024:
                break
        return f"{size:.2f} {suffix}"
    else:
        text = str(value)
    return f"{text} {unit}".strip() if unit and unit != "B" else text


class Counters(dict):
    """A snapshot of one state's counters (a plain dict underneath). README lists every key,
    docs/design.md ("Counters") what each counts.

    ``header_bytes`` is not only the payloads' headers and padding: it includes the ranks'
    handshakes (fsdpcomp/_agree.py: an 8-byte digest to every other rank the first time a unit
    shape, or a parameter-gather shard shape, meets a process group), which ``bytes_sent``
    counts too. So a short run's header_bytes is larger than its payloads' headers, and
    ``ratio`` pays for the handshakes; they are also in ``extra_collectives``."""

    def _rows(self) -> list[tuple[str, str]]:
        known = [(k, _fmt(self[k], u)) for k, u in _ORDER if k in self]
        rest = [(k, _fmt(v, "")) for k, v in self.items() if k not in dict(_ORDER)]
        return known + rest

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td style='text-align:left'>{html.escape(k)}</td><td style='text-align:right'>{html.escape(v)}</td></tr>"
            for k, v in self._rows())
        return ("<table class='fsdpcomp-counters'><thead><tr><th>counter</th><th>value</th></tr></thead>"
                f"<tbody>{rows}</tbody></table>")

    def table(self) -> str:
        """A fixed-width text table, for logs."""
        rows = self._rows()
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
