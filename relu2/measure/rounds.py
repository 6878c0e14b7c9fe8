"""Figures measured in rounds: every cell measured by several independent worker processes, one a round.

Replays in one process agree within about 1.5% while the same cell on two boxes moves by several
percent (docs/lab/results.md): what a verdict must know is the spread between processes, so the asv
suites (and ``relu2 confirm``) measure each cell in ``MIN_ROUNDS`` rounds.  A round is a whole
pass over the cells with a fresh worker pool (``relu2.measure.sweep.measurer``): its own interpreters, CUDA
contexts, allocations and clocks.  asv's rounds are passes too: a slow drift of the box during one
pass then shows as spread, not as a step.

* **What a figure is.**  Each round times a cell with ``relu2.measure.timing.ROUND_BUDGET``; its median is
  the round's figure.  The merged cell's samples are those medians, one a round (asv keeps them:
  median, IQR), and the mode's method says so (``relu2.vocab.schema.Mode.rounds_from_method``), so the
  gate tests the spread between rounds rather than between replays.
* **Nothing lost.**  A cell that failed in any round failed, with that round's reason; one skipped in
  every round is skipped.  A cell whose generated code differs between rounds failed: its rounds
  timed two different kernels, and their median would be neither's figure.
* **Compiler state.**  Each implementation's inductor and Triton caches live for the whole
  measurement, empty at the first round (``relu2.measure.isolation``): the first round compiles and
  autotunes, the later ones generate the same code again (and find Triton's binaries).  Autotuning
  may still choose again in a later round: where its candidates are a coin toss (a kernel of a few
  thousand elements) a round can pick another one, as a process of the model would.  The cell is then
  the figure of every round, and its fingerprint names the picks seen (``relu2.vocab.schema.with_picks``):
  a commit whose rounds saw other picks reads as repicked, never as a slowdown.

Torch-free at import: ``relu2 asv run`` checks ``RELU2_ROUNDS`` before asv starts.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

from relu2.measure import sweep
from relu2.vocab.errors import UsageError
from relu2.vocab.schema import FAILED, MAX_ROUNDS, MIN_ROUNDS, OK, SKIPPED, Cell, with_picks

if TYPE_CHECKING:
    from relu2.measure.outcome import CellResult
    from relu2.measure.timing import Budget

ENV_ROUNDS = "RELU2_ROUNDS"
# A folder for the compiler caches that outlives one measurement: relu2 compare measures each round
# of a side in a process of its own, and its rounds share one side's caches as one measurement's do.
ENV_CACHES = "RELU2_ROUNDS_CACHES"
# Three rounds a side is the fewest in which "every head round slower than every base round" can
# happen by chance in only 1 of 20 orderings of identical code (relu2.judge.rule.MIN_ROUNDS).


def rounds_from_env(default: int = MIN_ROUNDS) -> int:
    """``$RELU2_ROUNDS``, else ``default``; UsageError (a ValueError) for anything but 1..MAX_ROUNDS."""
    text = os.environ.get(ENV_ROUNDS, "").strip()
    if not text:
        return default
    if not text.isdigit() or not 1 <= int(text) <= MAX_ROUNDS:
        raise UsageError(f"{ENV_ROUNDS}={text!r}: expected a whole number of rounds from 1 to {MAX_ROUNDS}")
    return int(text)


def merge(rounds: Sequence["CellResult"]) -> "CellResult":
    """One cell's results of several rounds as one: per mode, the rounds' medians as its samples."""
    from relu2.measure.outcome import CellResult, Outcome
    from relu2.measure.timing import Timing

    if not rounds:
        raise ValueError("merge needs at least one round")
    cell = rounds[0].cell
    if any(r.cell != cell for r in rounds):
        raise ValueError(f"the rounds are of different cells: {sorted({r.cell.describe() for r in rounds})}")
    seconds: dict[str, float] = {}
    for r in rounds:
        for phase, s in r.seconds.items():
            seconds[phase] = seconds.get(phase, 0.0) + s

    def which(i: int) -> str:
        return f"round {i + 1} of {len(rounds)}: " if len(rounds) > 1 else ""

    status, reason = _fate([(r.status, r.reason) for r in rounds], which)
    if status != OK:
        outcomes = {mode: Outcome(status, reason) for mode in rounds[0].outcomes}
        return CellResult(cell, status, reason, outcomes, None, rounds[0].kernel, seconds)
    kernel = with_picks(r.kernel for r in rounds)
    if kernel is None:
        kernels = list(dict.fromkeys(r.kernel for r in rounds))
        reason = (f"the generated code differed between rounds ({', '.join(k or 'none' for k in kernels)}): its "
                  "figure would mix two kernels")
        return CellResult(cell, FAILED, reason, {mode: Outcome(FAILED, reason) for mode in rounds[0].outcomes},
                          None, kernels[0], seconds)
    outcomes = {}
    for mode in rounds[0].outcomes:
        got = [r.outcomes.get(mode) for r in rounds]
        status, reason = _fate([(o.status, o.reason) if o else (FAILED, f"no {mode} figure") for o in got], which)
        outcomes[mode] = (Outcome(OK, timing=Timing(mode, tuple(o.median_s for o in got))) if status == OK
                          else Outcome(status, reason))
    peaks = [r.peak_bytes for r in rounds if r.peak_bytes is not None]
    return CellResult(cell, OK, "", outcomes, max(peaks) if peaks else None, kernel, seconds)


def _fate(fates: Sequence[tuple[str, str]], which: Callable[[int], str]) -> tuple[str, str]:
    """ok when every round is; else failed when any round failed, else skipped (with the first
    such round's reason; a reason every round gave is given once, without a round)."""
    for status in (FAILED, SKIPPED):
        found = [(i, r) for i, (s, r) in enumerate(fates) if s == status]
        if found:
            i, reason = found[0]
            same = len(found) == len(fates) and len({r for _, r in found}) == 1
            return status, reason if same else which(i) + reason
    return OK, ""


@dataclass
class Measured:
    """What a measurement in rounds gives: each cell merged, and where the time went."""

    cells: dict[Cell, "CellResult"]
    # every cell's merged result in the order measured, the references the sweeps added among them
    results: list["CellResult"] = field(default_factory=list)
    workers_s: list[float] = field(default_factory=list)  # each round's worker start-up
    closing_s: list[float] = field(default_factory=list)  # each round's workers leaving
    rounds_s: list[float] = field(default_factory=list)  # each round's whole wall time


def measure(plan: Sequence[tuple[str, Sequence[Cell]]], device: str, rounds: int = MIN_ROUNDS, *,
            budget: "Budget | None" = None, timeout_s: float | None = None,
            say: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> Measured:
    """Measure every cell of ``plan`` (named groups of cells, measured in order) in ``rounds`` rounds,
    each round a fresh worker pool over all of them; each cell merged (``merge``)."""
    from relu2.measure.timing import ROUND_BUDGET

    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    budget = budget or ROUND_BUDGET
    every = list(dict.fromkeys(c for _, cells in plan for c in cells))
    per_round: list[dict[Cell, CellResult]] = []
    out = Measured({})
    kept = os.environ.get(ENV_CACHES, "").strip()
    caches = kept or tempfile.mkdtemp(prefix="relu2-rounds-")
    try:
        for r in range(rounds):
            began = time.perf_counter()
            got: dict[Cell, CellResult] = {}
            with sweep.measurer(every, device, timeout_s=timeout_s, cache_root=caches) as measurer:
                out.workers_s.append(time.perf_counter() - began)
                say(f"relu2: round {r + 1}/{rounds}: workers ready in {out.workers_s[-1]:.0f} s")
                for name, cells in plan:
                    t0 = time.perf_counter()
                    swept = sweep.run_sweep(cells, device=device, budget=budget, measurer=measurer)
                    for result in [*swept.results, *swept.references.values()]:
                        got.setdefault(result.cell, result)
                    say(f"relu2: round {r + 1}/{rounds}: {name}: {len(cells)} cells in {time.perf_counter() - t0:.0f} s")
                measured_at = time.perf_counter()
            out.closing_s.append(time.perf_counter() - measured_at)
            per_round.append(got)
            out.rounds_s.append(time.perf_counter() - began)
    finally:
        if not kept:
            shutil.rmtree(caches, ignore_errors=True)
    for cell in dict.fromkeys([*every, *(c for got in per_round for c in got)]):
        seen = [got[cell] for got in per_round if cell in got]
        if seen:
            out.results.append(merge(seen))
    wanted = set(every)
    out.cells = {r.cell: r for r in out.results if r.cell in wanted}
    return out
