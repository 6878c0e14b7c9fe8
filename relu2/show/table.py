"""What the commands print: the sweep's table and the agreement matrix, readable in a terminal.

The table's figure columns are the ``relu2.vocab.schema.COLUMNS`` that have a ``header``; speed-up over the
baseline is computed here, across rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from relu2.vocab.schema import BASELINE, COLUMNS, FLAG_DOCS, OK

if TYPE_CHECKING:
    from relu2.measure.agreement import Matrix
    from relu2.records.rows import Row

__all__ = ["format_matrix", "format_table", "speedups"]

_KEY_WIDTHS = (("impl", 22), ("dtype", 10), ("shape", 14), ("mode", 8))
_SHOWN = tuple(c for c in COLUMNS if c.header and c.name != "flags")
_WIDTH = 11


def speedups(rows: Iterable["Row"]) -> dict[int, float]:
    """id(row) -> baseline median / row median, for ok rows whose baseline twin (dtype, shape, mode) is ok."""
    rows = list(rows)
    base = {(r.dtype, r.shape, r.mode): r.median_s for r in rows if r.impl == BASELINE and r.status == OK}
    return {
        id(r): base[(r.dtype, r.shape, r.mode)] / r.median_s
        for r in rows
        if r.status == OK and (r.dtype, r.shape, r.mode) in base and r.median_s > 0
    }


def format_table(rows: Iterable["Row"]) -> str:
    """One line per figure: the schema's shown columns, speed-up over the baseline, and flags (!).

    Failed and skipped figures show their reason instead; a legend explains any flag shown.
    """
    rows = list(rows)
    speedup = speedups(rows)
    vs = f"vs {BASELINE}"
    header = "".join(f"{name:<{w}}" for name, w in _KEY_WIDTHS)
    header += "".join(f"{c.header:>{_WIDTH}}" for c in _SHOWN) + f"{vs:>{_WIDTH}}  flags"
    lines = [header, "-" * len(header)]
    seen_flags: set[str] = set()
    for r in rows:
        left = "".join(f"{getattr(r, name):<{w}}" for name, w in _KEY_WIDTHS)
        if r.status != OK:
            reason = r.reason.splitlines()[0][:90] if r.reason else ""
            lines.append(f"{left}{r.status.upper():>{_WIDTH}}  {reason}")
            continue
        figures = "".join(f"{c.format(getattr(r, c.name)):>{_WIDTH}}" for c in _SHOWN)
        ratio = f"{speedup[id(r)]:.2f}x" if id(r) in speedup else "-"
        flags = f"  ! {r.flags}" if r.flags else ""
        seen_flags.update(f for f in r.flags.split(";") if f)
        lines.append(f"{left}{figures}{ratio:>{_WIDTH}}{flags}")
    for flag in sorted(seen_flags):
        lines.append(f"! {flag}: {FLAG_DOCS.get(flag, 'see relu2.vocab.schema.FLAG_DOCS')}")
    return "\n".join(lines)


def format_matrix(matrix: "Matrix") -> str:
    """``relu2 check``'s output: the matrix, then why some could not run, then every failing case."""
    lines = [f"agreement with the eager native path, bitwise, on {matrix.device}",
             f"{'impl':<22}" + "".join(f"{d:<12}" for d in matrix.dtypes)]
    verdicts: dict[str, list[str]] = {}
    for entry in matrix.entries:
        verdicts.setdefault(entry.impl, []).append(entry.verdict)
    for impl, cells in verdicts.items():
        row = f"{impl:<22}" + "".join(f"{c:<12}" for c in cells)
        if impl in matrix.declared:  # what "ok" was held to: a declared exception, never a silent one
            row += f"(declared: {', '.join(matrix.declared[impl])})"
        lines.append(row)
    for impl, why in matrix.not_here.items():
        lines.append(f"  n/a {impl}: {why.splitlines()[0][:200]}")
    for impl, why in matrix.broken.items():
        lines.append(f"  FAIL {impl}: cannot run: {_tail(why)}")
    for entry in matrix.entries:
        lines += [f"  FAIL {entry.impl} {entry.dtype} {f}" for f in entry.failures]
    return "\n".join(lines)


def _tail(text: str, lines: int = 12) -> str:
    """A build error's first line and its last lines (where the compiler says what is wrong)."""
    parts = text.strip().splitlines()
    if len(parts) <= lines + 1:
        return "\n    ".join(parts)
    return "\n    ".join([parts[0], "..."] + parts[-lines:])
