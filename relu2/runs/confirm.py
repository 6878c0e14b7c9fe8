"""``relu2 confirm``: measure flagged cells again, base and head, in fresh interleaved processes.

A gate that fails on one measurement of each side fails every so often on noise: a box's clocks, a
first replay, an L2 that happened to be warm.  Before a pull request is failed, the cells the gate
flagged are measured again on the same box: for each of ``rounds`` rounds, a fresh process measures
them with the base commit's implementations, another with the head's (the order alternating, so
neither side always runs first on a warm or a cold box).  Each round's median is one sample of the
between-process spread the noise model is about; ``relu2 gate --confirmed FILE`` fails only on the
cells that are slower again.

It is ``relu2 compare``'s mechanism (``relu2.runs.compare``: the sides built from worktrees, one
instrument, ABBA rounds of fresh processes) on the flagged cells only, with ``--rounds`` as many as
asked.  Before any round, it refuses (exit 2, one line) a cell neither side can measure here: an
implementation a commit does not have, one that cannot run on this device (triton on a CPU), a
dtype the instrument does not time.

Output (``--out``, JSON): relu2.records.confirmed's ``Remeasurement`` contract, ``{"base": sha, "head": sha,
"machine": str, "device": str, "rounds": int, "order": [side per process], "cells": [{"benchmark", "params", "base_rounds": [seconds per
round, null where a round failed], "head_rounds": [...], "impl", "dtype", "shape", "mode", "base_status", "head_status"}]}``;
``benchmark`` and ``params`` are the gate report's (empty for a cell named with ``--cell``).
"""

from __future__ import annotations

import pickle
import socket
import statistics
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from relu2.host import git
from relu2.host.machine import default_device
from relu2.records.asv_names import timed_cell
from relu2.runs import compare
from relu2.vocab.errors import UsageError
# relu2 gate --confirmed needs this many rounds a side to tell a step from the spread between them.
from relu2.vocab.schema import CONFIRM_ROUNDS, OK, SKIPPED, Cell, format_seconds

# A confirmation measures a few flagged cells, not the suites: twice a compare's rounds cost little.



@dataclass(frozen=True)
class Target:
    """One figure to confirm: a cell in one timing mode (and, from a gate report, the benchmark and
    parameters it was flagged under)."""

    cell: Cell
    mode: str
    benchmark: str = ""
    params: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        return f"{self.cell.describe()} {self.mode}"

    @property
    def name(self) -> str:
        return self.cell.name(self.mode)


@dataclass
class Confirmed:
    """The rounds of one target: each side's median per round (seconds); a round that failed is None in
    its place (round i of each side was measured side by side, and the gate pairs them so)."""

    impl: str
    dtype: str
    shape: str
    mode: str
    benchmark: str = ""
    params: dict[str, str] = field(default_factory=dict)
    base_rounds: list[float | None] = field(default_factory=list)
    head_rounds: list[float | None] = field(default_factory=list)
    base_status: str = OK
    head_status: str = OK

    @property
    def ratio(self) -> float:
        """head / base of the medians over rounds (NaN when a side has none)."""
        base, head = measured(self.base_rounds), measured(self.head_rounds)
        return statistics.median(head) / statistics.median(base) if base and head else float("nan")


def measured(rounds: Sequence[float | None]) -> list[float]:
    """A side's rounds that have a figure."""
    return [x for x in rounds if x is not None]


def parse_target(text: str) -> Target:
    """``IMPL:DTYPE:SHAPE:MODE`` ("fused:bfloat16:4096x4096:hot") -> a Target; ValueError otherwise."""
    return Target(*Cell.parse(text))


def targets_from_gate(report: dict) -> list[Target]:
    """The flagged cells of ``relu2 gate --format json``'s report: its regressions, one target per
    measurement (a cell listed by several suites once)."""
    out: dict[tuple, Target] = {}
    for change in report.get("regressions", []):
        found = timed_cell(change["benchmark"], change["params"], change.get("unit"))
        if found is not None:
            out.setdefault(found, Target(*found, change["benchmark"], tuple(sorted(change["params"].items()))))
    return list(out.values())


def not_cells_in_gate(report: dict) -> list[str]:
    """The flagged figures of a gate report that are not one cell in one timing mode (an
    ``Implementations`` summary, a mean over Grid cells): confirm cannot re-measure them, and the gate
    still fails on them (no evidence is not a pass)."""
    return list(dict.fromkeys(change["benchmark"].split(".", 1)[-1] for change in report.get("regressions", [])
                              if timed_cell(change["benchmark"], change["params"], change.get("unit")) is None))


# --- the whole confirmation: relu2 compare's rounds, on the flagged cells ---------------------------


def confirm(repo: Path, base: str, head: str, targets: Sequence[Target], rounds: int = CONFIRM_ROUNDS,
            device: str | None = None, progress: bool = True, machine: str = "", first: int = 1) -> dict:
    """Measure ``targets`` ``rounds`` times on each side with relu2 compare's mechanism (worktrees, one
    instrument, ABBA rounds, a fresh process per side and round); the report as plain data.  ``first``:
    the number of the first round, so more rounds of one comparison go on its ABBA order.

    UsageError before any round when a side cannot run a target's implementation on ``device``."""
    device = device or default_device()
    say = compare._stderr if progress else (lambda line: None)
    base_sha, head_sha = git.resolve(repo, base), git.resolve(repo, head)
    compare.check_declared(repo, {base: base_sha, head: head_sha})
    compare.check_instrument_env()
    instrument = compare.instrument_state()  # before the ruler copies it, as a compare names its own
    results = {_key_of(t): Confirmed(t.cell.impl, t.cell.dtype, t.cell.shape_str, t.mode, t.benchmark, dict(t.params))
               for t in targets}
    cells = list(dict.fromkeys(t.cell for t in targets))
    impls = list(dict.fromkeys(c.impl for c in cells))
    with tempfile.TemporaryDirectory(prefix="relu2-confirm-") as tmp:
        scratch = Path(tmp)
        with compare.ruler(scratch) as ruler, compare.sides(repo, base_sha, head_sha, scratch, say, "relu2 confirm") as (b, h):
            compare.check_measured_env([b.measured, h.measured])
            for side in (b, h):
                bad = compare.unsupported(side, ruler, scratch, impls, device)
                if bad:
                    name, why = next(iter(bad.items()))
                    raise UsageError(f"{side.name} ({side.commit[:8]}) cannot measure {name} on {device}: {why}")
            done = compare.measure_sides(b, h, ruler, scratch, rounds, device, cells=cells, say=say,
                                         label="relu2 confirm", first=first)
            for side in (b, h):
                for path in done.rounds[side.name]:
                    _take_round(results, side.name, pickle.loads(path.read_bytes()))
    return {"base": base_sha, "head": head_sha, "machine": machine or socket.gethostname(), "device": device,
            "instrument": instrument, "rounds": rounds, "order": done.order, "cells": [asdict(c) for c in results.values()]}


def _key_of(t: Target) -> tuple:
    return (t.cell.impl, t.cell.dtype, t.cell.shape_str, t.mode)


def _take_round(results: dict[tuple, Confirmed], side: str, got: dict) -> None:
    """One round of one side (a pickled ``relu2.measure.rounds.measure`` of the cells) into ``results``."""
    by_cell = {(r.cell.impl, r.cell.dtype, r.cell.shape_str): r for r in got.get("results", [])}
    for (impl, dtype, shape, mode), entry in results.items():
        result = by_cell.get((impl, dtype, shape))
        outcome = result.outcomes.get(mode) if result else None
        ok = outcome is not None and outcome.status == OK
        getattr(entry, f"{side}_rounds").append(outcome.median_s if ok else None)
        if not ok:  # the reason stays; the other rounds' figures still count
            setattr(entry, f"{side}_status", (outcome.reason or outcome.status) if outcome else
                    got.get(SKIPPED) or "not measured")


def not_measured(report: dict) -> list[str]:
    """The targets of a confirmation that have no figure on a side: named, for exit 1."""
    return [f"{c['impl']} {c['dtype']} {c['shape']} {c['mode']}" for c in report["cells"]
            if not measured(c["base_rounds"]) or not measured(c["head_rounds"])]


def format_confirmation(report: dict) -> str:
    """One line per target: the medians over rounds and their ratio."""
    lines = [f"base {report['base'][:8]}  head {report['head'][:8]}  {report['rounds']} rounds on {report['device']}"]
    for c in report["cells"]:
        entry = Confirmed(**c)
        base, head = measured(entry.base_rounds), measured(entry.head_rounds)
        b = format_seconds(statistics.median(base)) if base else entry.base_status
        h = format_seconds(statistics.median(head)) if head else entry.head_status
        lines.append(f"  {entry.ratio:6.3f}x  {b:>10} -> {h:>10}  {entry.impl} {entry.dtype} {entry.shape} {entry.mode}")
    return "\n".join(lines)
