"""``relu2 bisect``: from "the figures stepped somewhere between GOOD and BAD" to the commit.

The first-parent commits from GOOD to BAD are searched as ``git bisect`` does, but every step is a
measurement: the probe commit is measured on this machine in interleaved rounds beside GOOD and BAD
themselves (each round a fresh process a side, the order alternating), and each cell gets one of
three answers:

* **like GOOD**: BAD moved away from the probe, the probe did not move away from GOOD;
* **like BAD**: the probe moved away from GOOD the way BAD did, BAD did not move further;
* **unknown**: neither or both (noise, or a probe halfway along a cell that moved twice).  An
  unknown answer measures ``MIN_ROUNDS`` more rounds, up to the budget of rounds a step may take;
  a probe still unknown then is skipped for that cell, as an unmeasurable commit is.

"Moved" is the paired rule ``pair``: per round, the ratio of the two sides measured side by side in
that round (so a box that speeds up or slows down as a whole cancels); moved when the median of
those ratios is beyond ``factor`` and more than three quarters of them lie on the same side of 1.
Step 0 measures GOOD against BAD alone: a cell that did not move there is "not reproduced".

Commits that cannot be measured (older than the implementations interface, a failed build, a
failed cell) are skipped like ``git bisect skip``; the answer is then the range of commits the first
commit like BAD lies in.  Cells are searched each on its own bracket (a step measures every cell
whose bracket holds the probe), so cells that moved at different commits get different answers.

Everything that decides is a small pure function over the steps done so far (``replay``,
``next_probe``, ``answer``), the measuring is injected (``Oracle``), and the steps are the state:
written after every step to the state file, replayed on the next run to resume.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from relu2.verdict import MIN_ROUNDS

STATE_FORMAT = 1
DEFAULT_FACTOR = 1.2  # a step of 1.5x is found on a shared 2-core CPU; a noise model's per-cell ratio is finer
DEFAULT_BUDGET = 3 * MIN_ROUNDS  # rounds one step may take before its answer is "unknown"

# The answers, as the output and the state file spell them.
LIKE_GOOD, LIKE_BAD, UNKNOWN, SKIPPED = "like GOOD", "like BAD", "unknown", "skipped"
MOVED, NOT_REPRODUCED = "moved", "not reproduced"
# What a pair of sides did, as ``pair`` says it.
SLOWER, FASTER, SAME, UNCLEAR = 1, -1, 0, None


# --- the paired rule --------------------------------------------------------------------------------


def pair(a: Sequence[float], b: Sequence[float], factor: float) -> int | None:
    """How ``b`` compares with ``a``, round i of one beside round i of the other: SLOWER or FASTER
    when the median of b_i / a_i is beyond ``factor`` (either way) and more than three quarters of
    the ratios lie on that side of 1; SAME when the median is within ``factor``; UNCLEAR otherwise
    (the median says moved, the rounds disagree), and with fewer than MIN_ROUNDS pairs."""
    ratios = [y / x for x, y in zip(a, b) if x > 0 and y > 0 and math.isfinite(x) and math.isfinite(y)]
    if len(ratios) < MIN_ROUNDS:
        return UNCLEAR
    middle = statistics.median(ratios)
    if 1 / factor <= middle <= factor:
        return SAME
    way = SLOWER if middle > factor else FASTER
    agree = sum(1 for r in ratios if (r > 1) == (way == SLOWER) and r != 1)
    return way if agree > 0.75 * len(ratios) else UNCLEAR


def reproduced(good: Sequence[float], bad: Sequence[float], factor: float) -> str:
    """Step 0's answer for one cell: MOVED, NOT_REPRODUCED, or UNKNOWN (measure more)."""
    moved = pair(good, bad, factor)
    return MOVED if moved in (SLOWER, FASTER) else NOT_REPRODUCED if moved == SAME else UNKNOWN


def direction(good: Sequence[float], bad: Sequence[float], factor: float) -> int:
    """SLOWER or FASTER: which way BAD moved from GOOD (0 when it did not)."""
    moved = pair(good, bad, factor)
    return moved if moved in (SLOWER, FASTER) else 0


def answer(good: Sequence[float], probe: Sequence[float], bad: Sequence[float], way: int, factor: float) -> str:
    """A probe's answer for one cell whose BAD moved ``way`` from GOOD: LIKE_GOOD, LIKE_BAD or UNKNOWN."""
    from_good, to_bad = pair(good, probe, factor), pair(probe, bad, factor)
    if from_good == way and to_bad not in (way, UNCLEAR):
        return LIKE_BAD
    if to_bad == way and from_good not in (way, UNCLEAR):
        return LIKE_GOOD
    return UNKNOWN


# --- the steps: what was measured, and what it says ----------------------------------------------


@dataclass
class CellStep:
    """One cell at one step: its answer, each side's median per round (GOOD, [probe,] BAD), and why
    it was skipped ("" when it was not)."""

    answer: str
    figures: list[list[float]] = field(default_factory=list)
    reason: str = ""


@dataclass
class Step:
    """One probe: the commit's index in the range, the rounds it took, each cell's answer; a commit
    that could not be measured at all has ``reason`` and no cells."""

    number: int
    index: int
    commit: str
    rounds: int = 0
    seconds: float = 0.0
    reason: str = ""
    cells: dict[str, CellStep] = field(default_factory=dict)

    @property
    def measured(self) -> bool:
        return not self.reason

    @classmethod
    def from_json(cls, data: Mapping) -> "Step":
        cells = {name: CellStep(**c) for name, c in data.get("cells", {}).items()}
        return cls(**{**data, "cells": cells})


@dataclass(frozen=True)
class Track:
    """One cell's search: ``lo`` the last commit like GOOD, ``hi`` the first like BAD (indices into
    the range, GOOD being 0), the commits skipped for it with why, and which way BAD moved (0: not
    reproduced, None: step 0 not done)."""

    cell: str
    lo: int
    hi: int
    way: int | None = None
    skipped: tuple[tuple[int, str], ...] = ()

    @property
    def candidates(self) -> list[int]:
        """The commits still to probe: strictly between lo and hi, not skipped."""
        gone = {i for i, _ in self.skipped}
        return [i for i in range(self.lo + 1, self.hi) if i not in gone] if self.way else []


def replay(cells: Sequence[str], count: int, steps: Iterable[Step], factor: float) -> dict[str, Track]:
    """Each cell's search after ``steps`` over a range of ``count`` commits (GOOD first, BAD last),
    step 0 judged with ``factor``."""
    tracks = {c: Track(c, 0, count - 1) for c in cells}
    for step in steps:
        for name, track in tracks.items():
            tracks[name] = advance(track, step, factor)
    return tracks


def advance(track: Track, step: Step, factor: float) -> Track:
    """``track`` after one step."""
    from dataclasses import replace

    if step.number == 0:
        got = step.cells.get(track.cell)
        if got is None:
            return track
        way = direction(got.figures[0], got.figures[-1], factor) if got.answer == MOVED else 0
        return replace(track, way=way)
    if not track.lo < step.index < track.hi:
        return track
    if step.reason:
        return replace(track, skipped=(*track.skipped, (step.index, step.reason)))
    got = step.cells.get(track.cell)
    if got is None:
        return track
    if got.answer == LIKE_BAD:
        return replace(track, hi=step.index)
    if got.answer == LIKE_GOOD:
        return replace(track, lo=step.index)
    return replace(track, skipped=(*track.skipped, (step.index, got.reason or f"{got.answer} after "
                                                   f"{len(got.figures[0]) if got.figures else 0} rounds")))


def next_probe(tracks: Mapping[str, Track]) -> tuple[int, list[str]] | None:
    """The commit to measure next and the cells to measure there (None: every search is done).

    The probe halves the widest bracket: of its candidates, the one nearest its middle; every other
    cell whose candidates hold the same commit is measured in the same step."""
    open_ = [t for t in tracks.values() if t.candidates]
    if not open_:
        return None
    widest = max(open_, key=lambda t: (len(t.candidates), -list(tracks).index(t.cell)))
    middle = (widest.lo + widest.hi) / 2
    probe = min(widest.candidates, key=lambda i: (abs(i - middle), i))
    return probe, [t.cell for t in open_ if probe in t.candidates]


# --- the answer -------------------------------------------------------------------------------------


@dataclass
class Finding:
    """What the search says about one cell."""

    cell: str
    verdict: str  # "culprit", "range" or NOT_REPRODUCED
    first_bad: str = ""  # the culprit (verdict "culprit"), or the last commit of the range
    last_good: str = ""  # its parent, the last commit like GOOD
    candidates: list[str] = field(default_factory=list)  # the range: every commit the culprit may be
    skipped: list[dict[str, str]] = field(default_factory=list)  # {"commit", "reason"} between last_good and first_bad
    figures: dict[str, dict] = field(default_factory=dict)  # "first_bad"/"last_good" -> the step that measured it


def findings(commits: Sequence[str], tracks: Mapping[str, Track], steps: Sequence[Step]) -> list[Finding]:
    """One Finding per cell whose search is done."""
    out = []
    for track in tracks.values():
        if not track.way:
            out.append(Finding(track.cell, NOT_REPRODUCED, figures={"step 0": _figures_of(track.cell, 0, steps)}))
            continue
        between = [(i, why) for i, why in sorted(track.skipped) if track.lo < i < track.hi]
        verdict = "range" if between else "culprit"
        out.append(Finding(
            track.cell, verdict, commits[track.hi], commits[track.lo],
            candidates=list(commits[track.lo + 1:track.hi + 1]),
            skipped=[{"commit": commits[i], "reason": why} for i, why in between],
            figures={"first_bad": _figures_of(track.cell, track.hi, steps, len(commits) - 1),
                     "last_good": _figures_of(track.cell, track.lo, steps, len(commits) - 1)}))
    return out


def _figures_of(cell: str, index: int, steps: Sequence[Step], last: int = -1) -> dict:
    """The medians over rounds of GOOD, the commit at ``index`` and BAD, from the step that measured it
    (step 0 for GOOD and BAD themselves)."""
    for step in steps:
        got = step.cells.get(cell)
        if got is None or not got.figures:
            continue
        if step.number == 0 and index in (0, last):
            side = 0 if index == 0 else len(got.figures) - 1
        elif step.number > 0 and step.index == index:
            side = 1
        else:
            continue
        medians = [statistics.median(f) if f else float("nan") for f in got.figures]
        return {"step": step.number, "rounds": len(got.figures[0]), "median_s": medians[side],
                "good_s": medians[0], "bad_s": medians[-1],
                "vs_good": medians[side] / medians[0] if medians[0] else float("nan")}
    return {}


def exit_code(found: Sequence[Finding]) -> int:
    """0 when a culprit (or a range of unmeasurable commits) is named for a cell, 1 when no cell's step
    was reproduced between GOOD and BAD."""
    return 0 if any(f.verdict != NOT_REPRODUCED for f in found) else 1


# --- measuring one step ---------------------------------------------------------------------------


class Unmeasurable(Exception):
    """A commit that cannot be measured at all (older than the interface, a failed build)."""


# (sides: commits in the order GOOD, [probe,] BAD; cells; rounds; the first round's number)
#   -> per cell, per side, the median of each round measured ok, or the reason a round failed.
Oracle = Callable[[Sequence[str], Sequence[str], int, int], dict[str, list[list[float] | str]]]


def measure_step(oracle: Oracle, sides: Sequence[str], cells: Sequence[str],
                 judge: Callable[[str, list[list[float]]], str], budget: int) -> tuple[dict[str, CellStep], int]:
    """Measure ``cells`` on ``sides``, MIN_ROUNDS rounds at a time, until every cell's answer
    (``judge(cell, figures)``) is known or ``budget`` rounds are spent; each cell's CellStep and the
    rounds taken.  A side whose round failed for a cell skips that cell, with the reason."""
    figures: dict[str, list[list[float]]] = {c: [[] for _ in sides] for c in cells}
    done: dict[str, CellStep] = {}
    rounds = 0
    while rounds < budget:
        todo = [c for c in cells if c not in done]
        if not todo:
            break
        got = oracle(sides, todo, min(MIN_ROUNDS, budget - rounds), rounds)
        rounds += min(MIN_ROUNDS, budget - rounds)
        for cell in todo:
            per_side = got.get(cell) or ["not measured"] * len(sides)
            failed = next((s for s in per_side if isinstance(s, str)), "")
            for mine, new in zip(figures[cell], per_side):
                mine.extend(new if not isinstance(new, str) else [])
            if failed:
                done[cell] = CellStep(SKIPPED, figures[cell], failed)
                continue
            said = judge(cell, figures[cell])
            if said != UNKNOWN:
                done[cell] = CellStep(said, figures[cell])
    for cell in cells:
        done.setdefault(cell, CellStep(UNKNOWN, figures[cell], f"unknown after {rounds} rounds"))
    return {c: done[c] for c in cells}, rounds


# --- the whole search -----------------------------------------------------------------------------


@dataclass
class Plan:
    """What is bisected: the range (GOOD first, BAD last, first parent), the cells, the rule."""

    commits: list[str]
    cells: list[str]
    factor: float = DEFAULT_FACTOR
    budget: int = DEFAULT_BUDGET

    def same_search(self, other: Mapping) -> bool:
        return (other.get("commits"), other.get("cells"), other.get("factor"), other.get("budget")) == \
            (self.commits, self.cells, self.factor, self.budget)


def load_steps(plan: Plan, state: Path | None) -> list[Step]:
    """The steps of an earlier run of the same search from ``state`` ([] when there is none);
    UsageError when the file holds another search, or is not a state file."""
    from relu2.machine import UsageError

    if state is None or not state.exists():
        return []
    try:
        data = json.loads(state.read_text(encoding="utf-8"))
        if data.get("format") != STATE_FORMAT:
            raise ValueError(f"format {data.get('format')!r}, not {STATE_FORMAT}")
        steps = [Step.from_json(s) for s in data["steps"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{state}: not a relu2 bisect state file ({e})") from None
    if not plan.same_search(data):
        raise UsageError(f"{state} holds another bisection (other commits, cells, factor or budget): "
                         "name another --state, or remove it to start again")
    return steps


def save_steps(plan: Plan, steps: Sequence[Step], state: Path | None) -> None:
    if state is None:
        return
    from relu2.results import atomic_write_text

    atomic_write_text(state, json.dumps({"format": STATE_FORMAT, **asdict(plan), "steps": [asdict(s) for s in steps]},
                                        indent=1, allow_nan=True) + "\n")


def search(plan: Plan, oracle: Oracle, steps: list[Step] | None = None, state: Path | None = None,
           progress: Callable[[str], None] | None = None) -> list[Step]:
    """Bisect ``plan`` from ``steps`` already done (a resumed run) to the end; every step saved to
    ``state`` as soon as it is done.  The steps, in order."""
    steps = list(steps or [])
    say = progress or (lambda line: None)
    last = len(plan.commits) - 1
    if not steps:
        started = time.monotonic()
        sides = [plan.commits[0], plan.commits[last]]
        cells, rounds = measure_step(oracle, sides, plan.cells, lambda _, f: reproduced(f[0], f[1], plan.factor),
                                     plan.budget)
        steps.append(Step(0, last, plan.commits[last], rounds, time.monotonic() - started, cells=cells))
        save_steps(plan, steps, state)
        say(progress_line(steps[-1], plan))
    while True:
        tracks = replay(plan.cells, len(plan.commits), steps, plan.factor)
        probe = next_probe(tracks)
        if probe is None:
            return steps
        index, cells = probe
        started, commit = time.monotonic(), plan.commits[index]
        sides = [plan.commits[0], commit, plan.commits[last]]
        try:
            done, rounds = measure_step(
                oracle, sides, cells, budget=plan.budget,
                judge=lambda cell, f: answer(f[0], f[1], f[2], tracks[cell].way or 0, plan.factor))
            step = Step(len(steps), index, commit, rounds, time.monotonic() - started, cells=done)
        except Unmeasurable as e:
            step = Step(len(steps), index, commit, 0, time.monotonic() - started, reason=str(e))
        steps.append(step)
        save_steps(plan, steps, state)
        say(progress_line(step, plan))


def progress_line(step: Step, plan: Plan) -> str:
    """``relu2 bisect: step N  <commit>  <cell> <answer> ...  (R rounds, S s)``."""
    head = f"relu2 bisect: step {step.number} {step.commit[:10]}"
    if step.reason:
        return f"{head} skipped: {step.reason}"
    said = "; ".join(f"{cell} {c.answer}" + (f" ({c.reason})" if c.reason and c.answer == SKIPPED else "")
                     for cell, c in step.cells.items())
    return f"{head} {said} ({step.rounds} rounds, {step.seconds:.0f} s)"
