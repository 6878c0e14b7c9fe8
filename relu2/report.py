"""The table printed at the end of a sweep: one line per figure, readable in a terminal."""

from __future__ import annotations

import math
from typing import Iterable

from relu2.results import Row


def _speedup_over_eager(rows: list[Row]) -> dict[tuple, float]:
    eager = {(r.dtype, r.shape, r.mode): r.median_s for r in rows if r.impl == "eager" and r.status == "ok"}
    return {
        id(r): eager[(r.dtype, r.shape, r.mode)] / r.median_s
        for r in rows
        if r.status == "ok" and (r.dtype, r.shape, r.mode) in eager and r.median_s > 0
    }


def format_table(rows: Iterable[Row]) -> str:
    """Median, GB/s, % of copy and speed-up over eager per figure; failed and skipped cells with their reason."""
    rows = list(rows)
    speedup = _speedup_over_eager(rows)
    header = f"{'impl':<16}{'dtype':<10}{'shape':<14}{'mode':<8}{'median':>12}{'GB/s':>9}{'% copy':>8}{'vs eager':>9}"
    lines = [header, "-" * len(header)]
    for r in rows:
        left = f"{r.impl:<16}{r.dtype:<10}{r.shape:<14}{r.mode:<8}"
        if r.status != "ok":
            lines.append(f"{left}{r.status.upper():>12}  {r.reason.splitlines()[0][:70] if r.reason else ''}")
            continue
        pct = f"{100 * r.roofline_fraction:.0f}%" if not math.isnan(r.roofline_fraction) else "-"
        vs = f"{speedup[id(r)]:.2f}x" if id(r) in speedup else "-"
        lines.append(f"{left}{format_seconds(r.median_s):>12}{r.gbps:>9.1f}{pct:>8}{vs:>9}")
    return "\n".join(lines)


def format_seconds(s: float) -> str:
    """Seconds in the unit that reads best: ns, µs, ms or s."""
    if math.isnan(s):
        return "nan"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"
