"""The figures of a cell measured once for a whole run, after its timings (``schema.CELL_FIGURES``
beside peak memory, which each cell measures itself): one list of producers, so a new figure is a line
in the schema and its producer here.

A producer takes every cell and the device, and gives each cell's figures by column, and why it gave
none ("" when it did): the work counters (``relu2.measure.counters``) are the first.
"""

from __future__ import annotations

from typing import Callable, Sequence

from relu2.measure import counters
from relu2.vocab.schema import Cell

Producer = Callable[[Sequence[Cell], str], tuple[dict[Cell, dict[str, float]], str]]
PRODUCERS: tuple[Producer, ...] = (counters.figures,)


def measure(cells: Sequence[Cell], device: str, say: Callable[[str], None] | None = None
            ) -> tuple[dict[Cell, dict[str, float]], str]:
    """Every producer's figures of ``cells``, merged by cell; why some were not measured, said once each."""
    found: dict[Cell, dict[str, float]] = {}
    why: list[str] = []
    for produce in PRODUCERS:
        got, not_here = produce(cells, device)
        for cell, values in got.items():
            found.setdefault(cell, {}).update(values)
        if not_here:
            why.append(not_here)
            if say is not None:
                say(not_here)
    return found, "; ".join(why)
