"""What a kernel did, as Nsight Compute counts it: the counters (which are exact), one kernel's launch
and counts, a call's kernels (``Work``), a change of work said in words, ncu's CSV read, and the
counters file ``relu2 counters`` (and a compare) writes, read back.

Torch-free, and below the measuring: the judge reads these to say whose work changed.
docs/methodology.md ("Work counters") says which counters were measured exact on the H200 and how.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from relu2.records.asv_results import Measurement
from relu2.vocab.schema import COUNTERS, EXACT, FAILED, Cell

# --- the vocabulary ---------------------------------------------------------------------------------


# The launch itself: ncu's columns of every kernel row, and one metric.
REGISTERS_METRIC = "launch__registers_per_thread"
METRICS: tuple[str, ...] = tuple(c.metric for c in COUNTERS) + (REGISTERS_METRIC,)
MARKER = "spin_kernel"  # torch.cuda._sleep's kernel: opens every profiled launch


# --- what one kernel did ------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelWork:
    """One kernel launch as ncu saw it: its name, launch and counters (by ``Counter.name``)."""

    name: str
    grid: str  # "(x, y, z)"
    block: str
    registers: int
    counts: Mapping[str, float]

    @property
    def launch(self) -> tuple[str, str, str, int]:
        return (self.name, self.grid, self.block, self.registers)


@dataclass(frozen=True)
class Work:
    """What one call of a cell launched, in order."""

    kernels: tuple[KernelWork, ...]

    def total(self, counter: str) -> float:
        return sum(k.counts.get(counter, math.nan) for k in self.kernels)

    @property
    def launches(self) -> tuple[tuple[str, str, str, int], ...]:
        return tuple(k.launch for k in self.kernels)

    def exact(self) -> tuple:
        """Everything that must be equal for the work to be the same: launches and exact counters."""
        return (self.launches, tuple(tuple(_figure(k.counts.get(c)) for c in EXACT) for k in self.kernels))

    def same_as(self, other: "Work") -> bool:
        return self.exact() == other.exact()

    def to_json(self) -> list[dict[str, Any]]:
        return [asdict(k) | {"counts": dict(k.counts)} for k in self.kernels]

    @classmethod
    def from_json(cls, data: Sequence[Mapping[str, Any]]) -> "Work":
        return cls(tuple(KernelWork(k["name"], k["grid"], k["block"], int(k["registers"]),
                                    {c: float(v) for c, v in k["counts"].items()}) for k in data))


def _figure(value: float | None) -> float | None:
    """A counter as ``Work.exact`` compares it: one this ncu lacks (NaN) is None, so two readings of the
    same work compare equal whichever NaN object each holds (a JSON round trip makes new ones)."""
    return None if value is None or math.isnan(value) else value


def describe_change(base: Work, head: Work) -> str:
    """How ``head``'s work differs from ``base``'s, "" when it is the same: the kernels launched (name,
    grid, block), registers, then each exact counter's move in total over the call, with DRAM bytes read
    beside them (not exact, but what a memory-bound kernel's time follows)."""
    if base.same_as(head):
        return ""

    def kernels(w: Work) -> str:
        return " + ".join(f"{k.name.split('(')[0]} {k.grid}x{k.block}" for k in w.kernels) or "nothing"

    parts = []
    if [k.launch[:3] for k in base.kernels] != [k.launch[:3] for k in head.kernels]:
        parts.append(f"launches {kernels(base)} -> {kernels(head)}")
    elif [k.registers for k in base.kernels] != [k.registers for k in head.kernels]:
        parts.append("registers " + ",".join(str(k.registers) for k in base.kernels) + " -> "
                     + ",".join(str(k.registers) for k in head.kernels))
    names = [c.name for c in COUNTERS if c.exact or c.name == "dram_read_bytes"]
    moved = describe_counts({n: base.total(n) for n in names}, {n: head.total(n) for n in names})
    # Other work is never said as "": the counts may move between kernels and keep their totals.
    return ", ".join(parts + ([moved] if moved else [])) or "the same totals, counted in other kernels"


def describe_counts(base: Mapping[str, float], head: Mapping[str, float]) -> str:
    """Each counter both sides counted that moved, in COUNTERS' order ("instructions +6.0%, global_loads
    +5.0%"); "" when none moved.  A counter either side lacks (NaN, absent) is not said."""
    parts = []
    for c in COUNTERS:
        a, b = base.get(c.name, math.nan), head.get(c.name, math.nan)
        if a != b and not (math.isnan(a) or math.isnan(b)):
            parts.append(f"{c.name} {_relative(a, b)}")
    return ", ".join(parts)


def _relative(a: float, b: float) -> str:
    if a == 0:
        return f"{a:g} -> {b:g}"
    return f"{(b / a - 1) * 100:+.1f}%"


def work_changes(pairs: Iterable[tuple[Measurement, Measurement]]) -> dict[tuple, str]:
    """Per cell (``relu2.records.asv_names.Cell.input``): how its work changed, from the exact counters
    two sides recorded as figures; "" the same work; a cell either side did
    not count in every exact counter is absent (its work is not known)."""
    counts: dict[tuple, tuple[dict[str, float], dict[str, float]]] = {}
    for b, h in pairs:
        if b.cell.measure in EXACT and _counted(b.value) and _counted(h.value):
            at_base, at_head = counts.setdefault(b.cell.input, ({}, {}))
            at_base[b.cell.measure], at_head[b.cell.measure] = float(b.value), float(h.value)
    return {key: describe_counts(b, h) for key, (b, h) in counts.items() if len(b) == len(EXACT)}


def _counted(x: float | None) -> bool:
    return x is not None and not math.isnan(x)


# --- reading ncu's CSV ----------------------------------------------------------------------------


class NcuOutputError(ValueError):
    """ncu's output is not the CSV this module asked for."""


def parse_ncu_csv(text: str) -> list[KernelWork]:
    """Every kernel row of ``ncu --csv --page raw --print-units base`` output, in launch order.

    Lines before the header (ncu's ``==PROF==`` messages, the program's own output) are skipped; the
    row after the header holds units.  Numbers may carry thousands separators.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID",')), None)
    if start is None:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header, body = rows[0], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    missing = [n for n in ("Kernel Name", "Grid Size", "Block Size") if n not in col]
    if missing:
        raise NcuOutputError(f"ncu's CSV lacks {', '.join(missing)}")
    kernels = []
    for row in body:
        if len(row) != len(header) or not row[0].strip().isdigit():
            continue
        # A metric this ncu does not know has no column: NaN, never a guess.
        counts = {c.name: _number(row[col[c.metric]]) if c.metric in col else math.nan for c in COUNTERS}
        registers = _number(row[col[REGISTERS_METRIC]]) if REGISTERS_METRIC in col else math.nan
        kernels.append(KernelWork(row[col["Kernel Name"]], row[col["Grid Size"]], row[col["Block Size"]],
                                  -1 if math.isnan(registers) else int(registers), counts))
    return kernels


def _number(text: str) -> float:
    t = text.replace(",", "").strip()
    try:
        return float(t)
    except ValueError:
        return math.nan


def split_launches(kernels: Sequence[KernelWork]) -> list[Work]:
    """The kernels after each marker, up to the next: one Work per profiled launch."""
    launches: list[list[KernelWork]] = []
    for k in kernels:
        if MARKER in k.name:
            launches.append([])
        elif launches:
            launches[-1].append(k)
    return [Work(tuple(group)) for group in launches]


@dataclass
class Counted:
    """What one counting run found: each cell's Work per launch, or why it has none."""

    works: dict[Cell, list[Work]] = field(default_factory=dict)
    failed: dict[Cell, str] = field(default_factory=dict)
    raw_csv: str = ""
    seconds: float = 0.0

    def work(self, cell: Cell) -> Work | None:
        launches = self.works.get(cell)
        return launches[0] if launches else None


def report_json(counted: Counted) -> dict[str, Any]:
    return {
        "counters": [asdict(c) for c in COUNTERS],
        "cells": [{"cell": cell.to_json(), "launches": [w.to_json() for w in works]}
                  for cell, works in counted.works.items()],
        "uncounted": [{"cell": cell.to_json(), "reason": reason} for cell, reason in counted.failed.items()],
        "seconds": counted.seconds,
    }


def counted_from_json(data: Mapping[str, Any]) -> Counted:
    """``report_json``'s data back."""
    counted = Counted(seconds=float(data.get("seconds", 0.0)))
    for entry in data["cells"]:
        counted.works[Cell.from_json(entry["cell"])] = [Work.from_json(w) for w in entry["launches"]]
    for entry in data.get("uncounted", data.get(FAILED, [])):  # the first runs (docs/aa) named it so
        counted.failed[Cell.from_json(entry["cell"])] = entry["reason"]
    return counted


def read_report(folder: Path) -> Counted:
    """A folder ``relu2 counters`` wrote (counters.json, or counters.json.gz as docs/aa keeps it)."""
    plain, packed = folder / "counters.json", folder / "counters.json.gz"
    text = plain.read_text() if plain.exists() else gzip.decompress(packed.read_bytes()).decode()
    return counted_from_json(json.loads(text))
