"""``relu2 bisect``: from "the figures stepped somewhere between GOOD and BAD" to the commit.

The first-parent commits from GOOD to BAD are searched as ``git bisect`` does, but every step is a
measurement on this machine: the probe commit beside GOOD, then beside BAD (two paired comparisons,
``relu2 confirm``'s: interleaved rounds, each a fresh process a side, the order alternating), and
each cell gets one of three answers:

* **like GOOD**: BAD moved away from the probe, the probe did not move away from GOOD;
* **like BAD**: the probe moved away from GOOD the way BAD did, BAD did not move further;
* **unknown**: neither or both (noise, or a probe halfway along a cell that moved twice).  An
  unknown answer measures ``MIN_ROUNDS`` more rounds, up to the budget of rounds a step may take;
  a probe still unknown then is skipped for that cell, as an unmeasurable commit is.

"Moved" is the paired rule ``pair``: the gate's own verdict (``relu2.judge.rule.verdict_of``, paired:
round i of one side against the rounds around i of the other, so a box that speeds up or slows down
as a whole cancels) at the cell's factor and the gate's floor.  A cell's
factor is the same-box noise model's threshold for its family, mode and band on this machine's GPU
(``relu2 compare``'s model, the cells followed sharing its budget), or ``DEFAULT_FACTOR`` where the
model has none; ``--factor`` sets one for every cell.
Step 0 measures GOOD against BAD alone: a cell that did not move there is "not reproduced".

Commits that cannot be measured (older than the implementations interface, a failed build, a
failed cell) are skipped like ``git bisect skip``; the answer is then the range of commits the first
commit like BAD lies in.  Cells are searched each on its own bracket (a step measures every cell
whose bracket holds the probe), so cells that moved at different commits get different answers.

**By counters first.**  Where the work counters can be read (CUDA and Nsight Compute: ``relu2
counters``), GOOD and BAD are counted before any timing; a cell whose work differs between them (its
launches or an exact counter: ``relu2.records.work.Work.same_as``) is bisected by counters alone
(``work_search``): one count a commit, no rounds, no factor, and the answer is the first commit
whose work is not GOOD's.  The other cells are bisected by time as above.  Without counters that is
said once, and every cell is bisected by time.

Everything that decides is a small pure function over the steps done so far (``replay``,
``next_probe``, ``answer``, ``work_search``), the measuring is injected (``Oracle``, ``WorkOracle``),
and the steps are the state: what the counters decided, then every step, written to the state file
as they are made and replayed on the next run to resume (it never counts again).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from relu2.host import git
from relu2.host.files import atomic_write_text, finite
from relu2.host.machine import gpu_name_apart
from relu2.host.outputs import claim_file
from relu2.host.proc import ProcessFailed
from relu2.judge import noise
from relu2.judge.rule import FASTER, SAME, SLOWER, Rule, family_of, move, paired_figures, verdict_of
from relu2.measure import counters
from relu2.records.work import Work, describe_change
from relu2.runs import compare, confirm
from relu2.runs.asv_run import declared_implementations
from relu2.vocab.errors import UsageError
from relu2.vocab.schema import DEFAULT_FLOOR_S  # SKIPPED: a commit not measured for a cell, for whatever reason
from relu2.vocab.schema import MIN_ROUNDS, OK, SKIPPED, band_of, format_seconds

STATE_FORMAT = 1
DEFAULT_FACTOR = 1.2  # a step of 1.5x is found on a shared 2-core CPU; a noise model's per-cell ratio is finer
DEFAULT_BUDGET = 3 * MIN_ROUNDS  # rounds one step may take before its answer is "unknown"

# The answers, as the output and the state file spell them.
LIKE_GOOD, LIKE_BAD, UNKNOWN = "like GOOD", "like BAD", "unknown"
MOVED, NOT_REPRODUCED = "moved", "not reproduced"
# What the search says of a cell.
CULPRIT, RANGE, NOT_MEASURED = "culprit", "range", "not measured"
# What a pair of sides did, as ``pair`` says it.
UNCLEAR = None  # too few rounds to say: measure more


# --- the paired rule --------------------------------------------------------------------------------


def pair(a: Sequence[float], b: Sequence[float], factor: float) -> int | None:
    """How ``b`` compares with ``a``, round i of one measured beside round i of the other, by the gate's
    own rule (``relu2.judge.rule.verdict_of``, paired, at ``factor`` and the gate's floor): SLOWER,
    FASTER or SAME; UNCLEAR with fewer than MIN_ROUNDS pairs (measure more)."""
    figures = paired_figures(a, b, MIN_ROUNDS)
    if figures is None:
        return UNCLEAR
    return verdict_of(*figures, Rule(True, factor, DEFAULT_FLOOR_S), paired=True)


def paired_move(a: Sequence[float], b: Sequence[float]) -> float:
    """The factor ``pair`` judges: exp of the paired verdict's move of ``b`` from ``a`` (nan without pairs)."""
    figures = paired_figures(a, b)
    return math.exp(move(*figures, paired=True)) if figures else float("nan")


def reproduced(good: Sequence[float], bad: Sequence[float], factor: float) -> str:
    """Step 0's answer for one cell: MOVED, NOT_REPRODUCED, or UNKNOWN (measure more)."""
    moved = pair(good, bad, factor)
    return MOVED if moved in (SLOWER, FASTER) else NOT_REPRODUCED if moved == SAME else UNKNOWN


def direction(good: Sequence[float], bad: Sequence[float], factor: float) -> int:
    """SLOWER or FASTER: which way BAD moved from GOOD (0 when it did not)."""
    moved = pair(good, bad, factor)
    return moved if moved in (SLOWER, FASTER) else 0


def answer(good: Sequence[float], probe: Sequence[float], probe_b: Sequence[float], bad: Sequence[float], way: int,
           factor: float) -> str:
    """A probe's answer for one cell whose BAD moved ``way`` from GOOD: LIKE_GOOD, LIKE_BAD or UNKNOWN;
    from two paired comparisons, ``good`` beside ``probe`` and ``probe_b`` beside ``bad`` (the same
    commit measured in each)."""
    from_good, to_bad = pair(good, probe, factor), pair(probe_b, bad, factor)
    if from_good == way and to_bad not in (way, UNCLEAR):
        return LIKE_BAD
    if to_bad == way and from_good not in (way, UNCLEAR):
        return LIKE_GOOD
    return UNKNOWN


# --- the steps: what was measured, and what it says ----------------------------------------------


@dataclass
class CellStep:
    """One cell at one step: its answer, the medians per round of each side (step 0: GOOD, BAD; a
    probe: GOOD, the probe beside GOOD, the probe beside BAD, BAD), and why it was skipped ("" when
    it was not)."""

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


def replay(plan: Plan, steps: Iterable[Step]) -> dict[str, Track]:
    """Each cell's search after ``steps`` over the plan's range (GOOD first, BAD last), step 0 judged
    with the cell's factor."""
    tracks = {c: Track(c, 0, len(plan.commits) - 1) for c in plan.cells}
    for step in steps:
        for name, track in tracks.items():
            tracks[name] = advance(track, step, plan.factor_of(name))
    return tracks


def advance(track: Track, step: Step, factor: float) -> Track:
    """``track`` after one step."""
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
    verdict: str  # CULPRIT, RANGE, NOT_REPRODUCED or NOT_MEASURED (at GOOD or BAD)
    first_bad: str = ""  # the culprit (verdict "culprit"), or the last commit of the range
    last_good: str = ""  # its parent, the last commit like GOOD
    candidates: list[str] = field(default_factory=list)  # the range: every commit the culprit may be
    skipped: list[dict[str, str]] = field(default_factory=list)  # {"commit", "reason"} between last_good and first_bad
    figures: dict[str, dict] = field(default_factory=dict)  # "first_bad"/"last_good" -> the step that measured it
    by: str = "time"  # what decided: "time" (rounds) or "counters" (exact work: ``work_search``)
    work: str = ""  # by counters: how first_bad's work differs from last_good's, in words


def findings(commits: Sequence[str], tracks: Mapping[str, Track], steps: Sequence[Step]) -> list[Finding]:
    """One Finding per cell whose search is done."""
    out = []
    for track in tracks.values():
        if not track.way:
            first = steps[0].cells.get(track.cell) if steps else None
            if first is not None and first.answer == SKIPPED:
                out.append(Finding(track.cell, NOT_MEASURED, skipped=[{"commit": "", "reason": first.reason}]))
            else:
                bad = len(commits) - 1  # step 0's figures of BAD, its paired move from GOOD
                out.append(Finding(track.cell, NOT_REPRODUCED, figures={"step 0": _figures_of(track.cell, bad, steps, bad)}))
            continue
        out.append(bracketed(track, commits, figures={
            "first_bad": _figures_of(track.cell, track.hi, steps, len(commits) - 1),
            "last_good": _figures_of(track.cell, track.lo, steps, len(commits) - 1)}))
    return out


def bracketed(track: Track, commits: Sequence[str], **said) -> Finding:
    """A finished search's answer for its cell: the culprit, or the range when commits between its
    last like GOOD and first like BAD were skipped (each with why); ``said``: the Finding's other fields."""
    between = [(i, why) for i, why in sorted(track.skipped) if track.lo < i < track.hi]
    return Finding(track.cell, RANGE if between else CULPRIT, commits[track.hi], commits[track.lo],
                   candidates=list(commits[track.lo + 1:track.hi + 1]),
                   skipped=[{"commit": commits[i], "reason": why} for i, why in between], **said)


def _figures_of(cell: str, index: int, steps: Sequence[Step], last: int = -1) -> dict:
    """The medians over rounds of GOOD, the commit at ``index`` and BAD, from the step that measured it
    (step 0 for GOOD and BAD themselves), and ``vs_good``: the commit's paired move from GOOD, the very
    factor ``pair`` judged (a ratio of the two medians is not: on a noisy box it can sit below a
    factor the paired move passed)."""
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
                "vs_good": paired_move(got.figures[0], got.figures[side]) if side else 1.0}
    return {}


def exit_code(found: Sequence[Finding]) -> int:
    """0 when a culprit (or a range of unmeasurable commits) is named for a cell; 1 when no cell's step
    was reproduced between GOOD and BAD; 2 when no cell could be measured at GOOD and BAD."""
    if any(f.verdict in (CULPRIT, RANGE) for f in found):
        return 0
    return 1 if any(f.verdict == NOT_REPRODUCED for f in found) else 2


# --- by counters: one exact count a commit ----------------------------------------------------------

# (commit, cell names) -> per cell the work one call did at that commit, or why it was not counted
WorkOracle = Callable[[str, Sequence[str]], Mapping[str, "Work | str"]]
CHANGED = SLOWER  # a Track's way when the work changed: any change is the one a search by counters follows


def work_search(commits: Sequence[str], cells: Sequence[str], count: WorkOracle,
                say: Callable[[str], None] = lambda line: None) -> tuple[list[Finding], int, str]:
    """Bisect by counters: count GOOD and BAD; each cell whose work differs between them is searched,
    as the timing search halves brackets (``next_probe``), for the first commit whose work is not
    GOOD's: a probe that did GOOD's exact work is like GOOD, any other work is like BAD, a commit not
    counted is skipped.  The findings of those cells (the others are left to the timing search), the
    commits where some work was counted, and why some cells were not counted at GOOD or BAD ("")."""
    last = len(commits) - 1
    good, bad = count(commits[0], cells), count(commits[last], cells)
    works = {0: good, last: bad}
    lost = {c: w if isinstance(w, str) else "not counted" for c in cells
            for w in (good.get(c), bad.get(c)) if not isinstance(w, Work)}
    why = (f"{len(lost)} of {len(cells)} cell{'s' * (len(cells) != 1)} not counted at GOOD or BAD "
           f"({next(iter(lost.values()))})" if lost else "")
    if why:
        say(f"relu2 bisect: counters: {why}: timed")
    followed = [c for c in cells if c not in lost and not good[c].same_as(bad[c])]
    if followed:
        say(f"relu2 bisect: counters: {len(followed)} of {len(cells)} cell{'s' * (len(cells) != 1)} did other work at "
            f"BAD than at GOOD: " + ", ".join(followed) + "; bisected by counters, one count a commit")
    tracks = {c: Track(c, 0, last, way=CHANGED) for c in followed}
    while (probe := next_probe(tracks)) is not None:
        index, names = probe
        works[index] = got = count(commits[index], names)
        for name in names:
            work, track = got.get(name), tracks[name]
            if not isinstance(work, Work):
                tracks[name] = replace(track, skipped=(*track.skipped, (index, work or "not counted")))
            else:
                tracks[name] = replace(track, **{"lo" if work.same_as(good[name]) else "hi": index})
        said = "; ".join(f"{n} {'skipped' if not isinstance(got.get(n), Work) else 'like GOOD' if tracks[n].lo == index else 'like BAD'}"
                         for n in names)
        say(f"relu2 bisect: counted {commits[index][:10]} (#{index} of {last}): {said}")
    out = [bracketed(t, commits, by="counters", work=describe_change(works[t.lo][t.cell], works[t.hi][t.cell]))
           for t in tracks.values()]
    counted = sum(1 for got in works.values() if any(isinstance(w, Work) for w in got.values()))
    return out, counted, why


def counting_oracle(repo: Path, targets: Mapping[str, "confirm.Target"], ruler: "compare.Ruler",
                    scratch: Path) -> WorkOracle:
    """The WorkOracle that counts with ``relu2 counters``' mechanism (``relu2.measure.counters.count``:
    one ncu process for all the cells asked) in a worktree of the commit, its package installed,
    measured by ``ruler`` (this checkout's instrument), as relu2 compare counts a side.  A commit that
    does not declare the interface, does not build or that ncu cannot count gives every cell the reason."""
    def oracle(commit: str, cells: Sequence[str]) -> dict[str, Work | str]:
        why = declared_implementations(repo, commit)[1]
        if why:
            return {c: why for c in cells}
        wanted = list(dict.fromkeys(targets[c].cell for c in cells))
        mine = scratch / f"count-{commit[:12]}"
        mine.mkdir()
        try:
            with compare.side(repo, "probe", commit, mine, lambda line: None) as side:
                counted = counters.count(wanted, env=compare.side_env(side, ruler), cwd=mine)
        except UsageError as e:  # it does not install
            return {c: _unmeasurable(str(e)) for c in cells}
        except (RuntimeError, ValueError, OSError) as e:  # ncu failed, or wrote what cannot be read
            return {c: f"not counted: {e}" for c in cells}
        finally:
            shutil.rmtree(mine, ignore_errors=True)
        return {c: counted.work(targets[c].cell) or counted.failed.get(targets[c].cell, "not counted") for c in cells}

    return oracle


def remembered(count: WorkOracle, kept: Mapping[str, Mapping[str, dict | str]],
               keep: Callable[[dict], None]) -> WorkOracle:
    """``count`` that answers from ``kept`` (an interrupted run's counts: commit -> cell -> Work as JSON,
    or why not counted) without counting again, and hands every new commit's counts to ``keep`` as
    they come, so an interrupt loses at most the count in progress."""
    counts = {commit: dict(cells) for commit, cells in kept.items()}

    def ask(commit: str, cells: Sequence[str]) -> dict[str, Work | str]:
        have = counts.setdefault(commit, {})
        missing = [c for c in cells if c not in have]
        if missing:
            have.update({c: w.to_json() if isinstance(w, Work) else w for c, w in count(commit, missing).items()})
            keep(counts)
        return {c: have[c] if isinstance(have[c], str) else Work.from_json(have[c]) for c in cells}

    return ask


def count_first(repo: Path, commits: Sequence[str], targets: Mapping[str, "confirm.Target"], device: str,
                say: Callable[[str], None], kept: Mapping[str, Mapping] | None = None,
                keep: Callable[[dict], None] = lambda counts: None) -> dict:
    """What the counters decide before any timing, as the state file keeps it: ``cells`` (the findings
    of the cells bisected by counters, as dicts), ``commits`` (commits counted) and ``why`` (why the
    counters could not be read, or some cells not counted at GOOD or BAD; "" when they were).  Counts
    ``kept`` are not made again; each new one goes to ``keep`` (``remembered``)."""
    why = counters.unavailable(device)
    if why:
        say(f"relu2 bisect: work counters {why}: every cell is bisected by its time")
        return {"cells": [], "commits": 0, "why": why}
    with tempfile.TemporaryDirectory(prefix="relu2-bisect-") as tmp, compare.ruler(Path(tmp)) as ruler:
        count = remembered(counting_oracle(repo, targets, ruler, Path(tmp)), kept or {}, keep)
        found, counted, why = work_search(commits, list(targets), count, say)
    return {"cells": [asdict(f) for f in found], "commits": counted, "why": why}


# --- measuring one step ---------------------------------------------------------------------------


class Unmeasurable(Exception):
    """A commit that cannot be measured at all (older than the interface, a failed build)."""


# (sides: commits in the order GOOD, [probe,] BAD; cells; rounds; the first round's number)
#   -> per cell, the medians of each round measured ok (or the reason a round failed) of: GOOD and BAD
#   (step 0); GOOD, the probe beside GOOD, the probe beside BAD, BAD (a probe: two paired comparisons).
Oracle = Callable[[Sequence[str], Sequence[str], int, int], dict[str, list[list[float] | str]]]
FIGURES_OF_A_PROBE = 4


def measure_step(oracle: Oracle, sides: Sequence[str], cells: Sequence[str],
                 judge: Callable[[str, list[list[float]]], str], budget: int) -> tuple[dict[str, CellStep], int]:
    """Measure ``cells`` on ``sides``, MIN_ROUNDS rounds at a time, until every cell's answer
    (``judge(cell, figures)``) is known or ``budget`` rounds are spent; each cell's CellStep and the
    rounds taken.  A side whose round failed for a cell skips that cell, with the reason."""
    width = 2 if len(sides) == 2 else FIGURES_OF_A_PROBE
    figures: dict[str, list[list[float]]] = {c: [[] for _ in range(width)] for c in cells}
    done: dict[str, CellStep] = {}
    rounds = 0
    while rounds < budget:
        todo = [c for c in cells if c not in done]
        if not todo:
            break
        got = oracle(sides, todo, min(MIN_ROUNDS, budget - rounds), rounds)
        rounds += min(MIN_ROUNDS, budget - rounds)
        for cell in todo:
            per_side = got.get(cell) or ["not measured"] * width
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
    factor: float = DEFAULT_FACTOR  # where ``factors`` names no factor for a cell
    budget: int = DEFAULT_BUDGET
    factors: dict[str, float] = field(default_factory=dict)  # per cell, from the same-box model
    counted: dict = field(default_factory=dict)  # what the counters decided first (``count_first``), kept
    gpu: str = ""  # what measures: the GPU's name, "none" on the CPU (a state file older than it: "")

    def factor_of(self, cell: str) -> float:
        return self.factors.get(cell, self.factor)

    def same_search(self, other: Mapping) -> bool:
        return (other.get("commits"), other.get("cells"), other.get("factor"), other.get("budget"),
                other.get("factors", {})) == (self.commits, self.cells, self.factor, self.budget, self.factors)


def read_state(state: Path | None) -> dict | None:
    """A state file's data (None when there is none); UsageError when it is not a state file."""
    if state is None or not state.exists():
        return None
    try:
        data = json.loads(state.read_text(encoding="utf-8"))
        if data.get("format") != STATE_FORMAT:
            raise ValueError(f"format {data.get('format')!r}, not {STATE_FORMAT}")
        data["steps"] = [Step.from_json(s) for s in data["steps"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UsageError(f"{state}: not a relu2 bisect state file ({e})") from None
    return data


ANOTHER = ("holds another bisection (other commits, cells, factor, budget or GPU): name another --state, or remove it "
           "to start again")


def load_steps(plan: Plan, state: Path | None) -> list[Step]:
    """The steps of an earlier run of the same search from ``state`` ([] when there is none);
    UsageError when the file holds another search, or is not a state file."""
    data = read_state(state)
    if data is None:
        return []
    if not plan.same_search(data):
        raise UsageError(f"{state} {ANOTHER}")
    return data["steps"]


def save_steps(plan: Plan, steps: Sequence[Step], state: Path | None) -> None:
    if state is None:
        return

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
        say(f"relu2 bisect: step 0: GOOD beside BAD, {len(plan.cells)} cell{'s' * (len(plan.cells) != 1)}")
        try:
            cells, rounds = measure_step(oracle, sides, plan.cells, lambda cell, f: reproduced(f[0], f[1], plan.factor_of(cell)),
                                         plan.budget)
        except Unmeasurable as e:
            raise UsageError(f"GOOD or BAD cannot be measured: {e}") from None
        steps.append(Step(0, last, plan.commits[last], rounds, time.monotonic() - started, cells=cells))
        save_steps(plan, steps, state)
        say(progress_line(steps[-1], plan))
    while True:
        tracks = replay(plan, steps)
        probe = next_probe(tracks)
        if probe is None:
            return steps
        index, cells = probe
        started, commit = time.monotonic(), plan.commits[index]
        sides = [plan.commits[0], commit, plan.commits[last]]
        say(f"relu2 bisect: step {len(steps)}: {commit[:10]} (#{index} of {last}) beside GOOD, then beside BAD, "
            f"{len(cells)} cell{'s' * (len(cells) != 1)}")
        try:
            done, rounds = measure_step(
                oracle, sides, cells, budget=plan.budget,
                judge=lambda cell, f: answer(f[0], f[1], f[2], f[3], tracks[cell].way or 0,
                                                 plan.factor_of(cell)))
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


# --- the range and the cells, decoded once at the edge ------------------------------------------------


def first_parent_range(repo: Path, good: str, bad: str) -> list[str]:
    """GOOD, then the first-parent commits after it up to BAD (full hashes); UsageError when GOOD is
    not an ancestor of BAD, or is BAD."""
    good_sha, bad_sha = git.resolve(repo, good), git.resolve(repo, bad)
    if good_sha == bad_sha:
        raise UsageError(f"GOOD and BAD are the same commit ({good_sha[:10]}): nothing to bisect")
    if not git.is_ancestor(repo, good_sha, bad_sha):
        raise UsageError(f"GOOD {good} ({good_sha[:10]}) is not an ancestor of BAD {bad} ({bad_sha[:10]})")
    return [good_sha, *git.first_parents(repo, good_sha, bad_sha)]


def default_state(repo: Path, commits: Sequence[str], cells: Sequence[str]) -> Path:
    """Where a bisection keeps its steps unless told: in the repository's git folder (as git bisect
    does), named by its range and cells, so the same command run again resumes it."""
    common = git.common_dir(repo)
    key = hashlib.sha256("\n".join([*commits, *cells]).encode()).hexdigest()[:8]
    return common / "relu2-bisect" / f"{commits[0][:8]}-{commits[-1][:8]}-{key}.json"


# --- the real oracle: two relu2 confirm comparisons a probe ----------------------------------------


def confirm_oracle(repo: Path, targets: Mapping[str, object], device: str) -> Oracle:
    """The Oracle that measures with ``relu2 confirm`` (relu2 compare's mechanism: worktrees of both
    commits, this checkout's instrument, interleaved rounds of a fresh process per side): step 0 one
    comparison, GOOD beside BAD; a probe two, GOOD beside it and it beside BAD.  A probe that does not
    declare the interface or does not build is Unmeasurable."""
    def compared(base: str, head: str, cells: Sequence[str], rounds: int, first: int) -> dict[str, tuple]:
        report = confirm.confirm(repo, base, head, [targets[c] for c in cells], rounds, device, progress=False,
                                 first=first + 1)  # a step's later batches go on its ABBA order
        by_key = {f"{c['impl']}:{c['dtype']}:{c['shape']}:{c['mode']}": c for c in report["cells"]}
        return {cell: (_side(by_key.get(cell), "base", base), _side(by_key.get(cell), "head", head))
                for cell in cells}

    def oracle(sides: Sequence[str], cells: Sequence[str], rounds: int, first: int) -> dict[str, list]:
        if len(sides) == 2:
            return {cell: list(pairs) for cell, pairs in compared(sides[0], sides[1], cells, rounds, first).items()}
        good, probe, bad = sides
        why = declared_implementations(repo, probe)[1]
        if why:
            raise Unmeasurable(why)
        try:
            before = compared(good, probe, cells, rounds, first)
            after = compared(probe, bad, cells, rounds, first)
        except UsageError as e:  # the probe does not install, or cannot run a cell's implementation here
            raise Unmeasurable(_unmeasurable(str(e))) from None
        except ProcessFailed as e:  # a round's process died (out of memory, a crash): skipped, as git bisect skip
            raise Unmeasurable(str(e)) from None
        return {cell: [*before[cell], *after[cell]] for cell in cells}

    return oracle


def _side(cell: Mapping | None, side: str, commit: str) -> list[float] | str:
    """One side's rounds of a confirm report's cell, or why it has none."""
    if cell is None:
        return f"not measured at {commit[:10]}"
    status = cell[f"{side}_status"]
    return list(cell[f"{side}_rounds"]) if status == OK else f"{status} at {commit[:10]}"


def _unmeasurable(message: str) -> str:
    """confirm's refusal, said as a skip: "does not build: ..." for an install that failed."""
    head, _, why = message.partition(" does not install: ")
    return f"does not build: {why}" if why else message


# --- the command --------------------------------------------------------------------------------------


@dataclass
class Report:
    """A bisection as the command shows it."""

    repo: str
    plan: Plan
    steps: list[Step]
    findings: list[Finding]
    subjects: dict[str, str]
    state: str
    counted: int = 0  # commits where some cell's work was counted (``count_first``)
    counters_why: str = ""  # why the counters could not be read, or some cells not counted ("": every cell was)

    @property
    def exit_code(self) -> int:
        return exit_code(self.findings)

    def as_json(self) -> dict:
        """The report as plain data, a figure that is not a number as null (strict JSON)."""
        return finite({"format": STATE_FORMAT, "repo": self.repo, "good": self.plan.commits[0], "bad": self.plan.commits[-1],
                "commits": self.plan.commits, "factor": self.plan.factor, "factors": self.plan.factors,
                "budget": self.plan.budget,
                "measured_steps": sum(s.measured for s in self.steps), "state": self.state,
                "counted_commits": self.counted, "counters": self.counters_why or "counted",
                "cells": [asdict(f) for f in self.findings], "steps": [asdict(s) for s in self.steps],
                "exit": self.exit_code})


def model_factors(targets: Mapping[str, object], gpu: str) -> dict[str, float]:
    """Per cell followed (name -> confirm.Target): the same-box model's threshold for its family, mode
    and band on ``gpu`` ("none": the CPU), the cells followed sharing the model's budget, times its
    group's typical width (the gate reads each cell's own; a bisect target names no kernel to read it
    by); a cell whose group the model lacks (or a GPU without a same-box model for every cell: the
    timing search follows cells whose work did not change, or was not counted) is left out."""
    model = noise.model_for(noise.load_models(), gpu, noise.SAME_BOX)
    if model is None or model.changed_work_only:
        return {}
    found = {}
    for name, t in targets.items():
        key = (family_of(t.cell.impl), t.mode, band_of(t.cell.bytes, model.l2_bytes).name)
        ratio = model.ratio(key, len(targets))
        if ratio is not None:
            found[name] = round(ratio * math.exp(model.fit_for(key).typical_width), 6)
    return found


def run(repo: Path, good: str, bad: str, targets: Sequence, *, factor: float | None = None,
        budget: int = DEFAULT_BUDGET, state: Path | None = None, device: str = "cpu",
        progress: Callable[[str], None] | None = None) -> Report:
    """Bisect GOOD..BAD of ``repo`` on ``targets`` (confirm.Target): by counters the cells whose work
    differs between GOOD and BAD, where counters can be read (``work_search``); the others by relu2
    confirm's rounds, resuming from ``state`` (default: in the repository's git folder).  ``factor``
    None: each timed cell's factor from the same-box model (``model_factors``), else ``DEFAULT_FACTOR``."""
    by_name = {t.name: t for t in targets}
    commits = first_parent_range(repo, good, bad)
    state = state or default_state(repo, commits, list(by_name))
    # Written after the counts and every step: a state file that cannot be written, is not a state
    # file or is of other commits is refused before anything is measured, and one that is not this
    # search's own is never replaced (load_steps refuses it).
    claim_file(state, "--state", own=lambda _: True)
    saved = read_state(state)
    if saved is not None and saved.get("commits") != commits:
        raise UsageError(f"{state} {ANOTHER}")
    say = progress or (lambda line: None)
    gpu = _gpu(device)
    if saved is not None and saved.get("gpu") not in (None, "", gpu):
        raise UsageError(f"{state} was measured on {saved['gpu']}, this run on {gpu}: {ANOTHER}")
    counting = saved is None or "counting" in saved  # a new search, or one interrupted while counting
    if counting and saved is not None and saved.get("cells") != list(by_name):
        raise UsageError(f"{state} {ANOTHER}")
    if counting:
        def keep(counts: dict) -> None:
            atomic_write_text(state, json.dumps({"format": STATE_FORMAT, "commits": commits, "cells": list(by_name),
                                                 "gpu": gpu, "counting": counts, "steps": []}, indent=1) + "\n")
        counted = count_first(repo, commits, by_name, device, say, (saved or {}).get("counting"), keep)
    else:  # a resumed search keeps what the counters decided (one begun before bisect counted: nothing)
        counted = saved.get("counted") or {"cells": [], "commits": 0, "why": "a bisection begun without counters"}
    by_counters = [Finding(**f) for f in counted["cells"]]
    timed = {name: t for name, t in by_name.items() if name not in {f.cell for f in by_counters}}
    factors = {} if factor is not None else model_factors(timed, gpu)
    plan = Plan(commits, list(timed), factor or DEFAULT_FACTOR, budget, factors, counted, gpu)
    steps = [] if counting else load_steps(plan, state)
    if counting and counted["commits"]:
        save_steps(plan, steps, state)  # the counts are kept: the same command never counts again
    if timed:
        say(f"relu2 bisect: {len(commits) - 1} commit{'s' * (len(commits) != 2)} after GOOD {commits[0][:10]} up to BAD "
            f"{commits[-1][:10]} (first parent), {len(timed)} cell{'s' * (len(timed) != 1)} timed; state {state}"
            + (f": resuming after {len(steps)} step{'s' * (len(steps) != 1)}" if steps else " (the same command resumes)"))
        steps = search(plan, confirm_oracle(repo, timed, device), steps, state, say)
    tracks = replay(plan, steps)
    return Report(str(repo), plan, steps, by_counters + findings(commits, tracks, steps), git.subjects(repo, commits),
                  str(state), counted["commits"], counted["why"])


def _gpu(device: str) -> str:
    """The GPU model a noise model is learned for: the device's name, "none" on the CPU."""
    return (gpu_name_apart() or "cuda") if device == "cuda" else "none"  # apart: no CUDA context beside the rounds


def _rule(plan: Plan) -> str:
    """What decided "moved": the same-box model's factors, the default, or --factor."""
    if not plan.factors:
        return f"paired factor {plan.factor:g}"
    ratios = sorted(set(plan.factors.values()))
    rest = len(plan.cells) - len(plan.factors)
    return (f"paired factor {ratios[0]:g}" + (f"-{ratios[-1]:g}" if len(ratios) > 1 else "") + " from the same-box "
            "noise model" + (f" ({rest} cell{'s' * (rest != 1)} outside it: {plan.factor:g})" if rest else ""))


def format_text(report: Report) -> str:
    """The answer per cell (the culprit with its figures and its parent's, or the range), then the steps."""
    commits, names = report.plan.commits, report.subjects
    index = {c: i for i, c in enumerate(commits)}

    def commit(sha: str) -> str:
        return f"{sha[:10]} (#{index[sha]} of {len(commits) - 1}) {names.get(sha, '')}".rstrip()

    def figure(label: str, f: Mapping) -> str:
        if not f:
            return f"    {label}: not measured"
        return (f"    {label} {format_seconds(f['median_s'])}, {f['vs_good']:.2f}x GOOD paired (step {f['step']}, "
                f"{f['rounds']} rounds: GOOD {format_seconds(f['good_s'])}, BAD {format_seconds(f['bad_s'])})")

    measured = sum(s.measured for s in report.steps)
    skipped = len(report.steps) - measured
    lines = [f"relu2 bisect GOOD {commits[0][:10]} .. BAD {commits[-1][:10]}: {len(commits) - 1} "
             f"commit{'s' * (len(commits) != 2)}, "
             + (f"{report.counted} commits counted by counters, " if report.counted else "")
             + f"{measured} measured steps" + (f", {skipped} skipped unmeasured" if skipped else "")
             + (f", {_rule(report.plan)}, at most {report.plan.budget} rounds a step" if report.plan.cells else "")]
    for f in report.findings:
        if f.by == "counters":
            lines.append(f"{f.cell}: the first commit whose work is not GOOD's is "
                         + (commit(f.first_bad) if f.verdict == CULPRIT else f"one of {len(f.candidates)}, up to "
                            f"{commit(f.first_bad)} ({len(f.skipped)} not counted)")
                         + f": {f.work} (by counters, exact)")
        elif f.verdict == CULPRIT:
            lines += [f"{f.cell}: the first commit like BAD is {commit(f.first_bad)}",
                      figure("it:", f.figures.get("first_bad", {})),
                      figure(f"its parent {f.last_good[:10]}:", f.figures.get("last_good", {}))]
        elif f.verdict == RANGE:
            lines += [f"{f.cell}: the first commit like BAD is one of {len(f.candidates)}, after {commit(f.last_good)}:"]
            lines += [f"    {commit(c)}" + next((f": skipped, {s['reason']}" for s in f.skipped if s["commit"] == c),
                                                ": like BAD" if c == f.first_bad else "") for c in f.candidates]
            lines += [figure(f"like BAD, {f.first_bad[:10]}:", f.figures.get("first_bad", {})),
                      figure(f"like GOOD, {f.last_good[:10]}:", f.figures.get("last_good", {}))]
        elif f.verdict == NOT_REPRODUCED:
            step0 = f.figures.get("step 0", {})
            ratio = step0.get("vs_good", float("nan"))
            lines.append(f"{f.cell}: not reproduced: BAD is {ratio:.2f}x GOOD paired on this machine, within the "
                         f"factor {report.plan.factor_of(f.cell):g} or unclear after the budget")
        else:
            lines.append(f"{f.cell}: not measured at GOOD or BAD: {f.skipped[0]['reason'] if f.skipped else '?'}")
    lines.append("steps:")
    for s in report.steps:
        what = "GOOD vs BAD" if s.number == 0 else f"probe {commit(s.commit)}"
        if s.reason:
            lines.append(f"  {s.number}  {what}: skipped, {s.reason}")
            continue
        lines.append(f"  {s.number}  {what} ({s.rounds} rounds, {s.seconds:.0f} s)")
        for cell, c in s.cells.items():
            medians = [format_seconds(statistics.median(x)) if x else "-" for x in c.figures]
            shown = (f"GOOD {medians[0]}, BAD {medians[1]}" if len(medians) == 2 else
                     f"GOOD {medians[0]}, it {medians[1]} | it {medians[2]}, BAD {medians[3]}" if len(medians) == 4 else "")
            lines.append(f"       {cell}: {c.answer}" + (f" ({c.reason})" if c.reason else "") + f"  [{shown}]")
    return "\n".join(lines)
