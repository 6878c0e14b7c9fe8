"""Plain-text tables: the one column layout every table of the judge's reports uses."""

from __future__ import annotations

from typing import Callable, Sequence


def aligned(rows: Sequence[Sequence[str]], right: Callable[[int], bool] = lambda column: False,
            indent: str = "") -> list[str]:
    """``rows`` in columns two spaces apart, each as wide as its widest cell (right-aligned where
    ``right(column)``), one line a row, its trailing spaces dropped."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [(indent + "  ".join(cell.rjust(w) if right(i) else cell.ljust(w)
                                for i, (cell, w) in enumerate(zip(row, widths)))).rstrip() for row in rows]
