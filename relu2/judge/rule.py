"""The verdict on two commits' measurements: which cells match, which moved, which vanished.

One rule judges every cell, in both kinds of comparison, and the resolution a report prints is
simulated with it (``relu2.judge.noise.resolution``):

* **What a cell is** (``relu2.records.asv_names``): cells are matched by what they measured (their
  parameters), never by asv's layout; a parameter added or removed matches the cells that agree on
  every parameter both sides have; a measurement several suites list is judged once.
* **The figure** (``move``): cross-box (two results folders) it is the median of a cell's rounds,
  and a cell moves by log(head/base); paired (base and head measured side by side on one box, round i
  beside round i: ``relu2 compare``) each head round is set against the median of base rounds i-1, i,
  i+1 and the cell moves by the median of those log ratios: the box's drift between rounds cancels.
* **Slower** (``is_slower``): the move beyond the rule's ratio times the cell's width (its spread
  between processes, cross-box only) AND beyond the floor in seconds.  Nothing else: a cell 1.15x
  slower in two rounds of three moved its median 1.15x, and that is what is judged.
* **Judged against the references of the same runs.**  eager and copy are torch's own kernels, the
  same at every commit of the kernel under test: per mode and band, the median move of their cells is
  how the box moved, and is taken out of every cell's move, but only as far as boxes move.  A larger common move is the stack's or a shared path's, not a box's: it is reported
  and left in, so a regression that moves everything fails instead of reading as improvements.
* **What does not pass**: a cell the head lost (vanished, failed), and a cell the head measured whose
  base has no figure (failed or skipped there: ``unjudged``).
* **Repicked**: the same generated code with another autotuned pick is reported, not failing, only
  for the implementations that autotune (``AUTOTUNED``) and only within ``REPICK_BOUND``.
* **Work that changed**: a cell whose exact work differs (a compare's count, else the counters both
  commits recorded: ``relu2.records.work.work_changes``) is judged at its share of the budget among
  the cells that changed.  Unchanged code changes no counter, so an A/A is judged as without them;
  an autotuned repick, or sides of other software, are not other work (docs/methodology.md).
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from relu2.records.asv_names import Cell
from relu2.records.asv_results import Measurement
from relu2.records.confirmed import Remeasurement
from relu2.records.work import work_changes
from relu2.vocab.errors import ResultsError
from relu2.vocab.schema import (BASELINE, FAILED, MIN_ROUNDS, MODES, OK, ROOFLINE, SKIPPED, impl_order,
                                only_repicked, quantile)

GATED_MODES: tuple[str, ...] = tuple(m.name for m in MODES if m.kernel_time)
TIMING_MODES: tuple[str, ...] = tuple(m.name for m in MODES)
PEAK_MEMORY_RATIO = 1.01  # deterministic for identical code: any growth past rounding is real
REFERENCES = (BASELINE, ROOFLINE)  # torch's own kernels: unchanged by any commit, no fingerprint
MIN_REFERENCES = 5  # reference cells a mode and band needs before its move is taken out
# Families of implementations whose noise is alike (learned per family, mode and band: relu2.judge.noise).
COMPILED = "compiled paths"
FAMILIES: Mapping[str, str] = {
    BASELINE: "references", ROOFLINE: "references",
    "fused": "fixed kernels", "triton": "fixed kernels", "vllm_cuda": "fixed kernels", "eager_inplace": "fixed kernels",
}
FAMILY_NAMES: tuple[str, ...] = ("references", "fixed kernels", COMPILED)
# Only inductor autotunes here (relu2.measure.compiled): the hand-written kernels have one launch configuration.
AUTOTUNED = (COMPILED,)
# A repick exemption covers what two picks of one kernel were seen to differ by (the model's
# repick_bound, learned by relu2 noise learn), never more; this when no model says.
REPICK_BOUND = 1.5


def family_of(impl: str) -> str:
    """The family an implementation's noise is learned in: the compiled paths (every ``compile*``), the
    references, the fixed kernels; an implementation this instrument does not know is a fixed kernel."""
    if impl.startswith("compile"):
        return COMPILED
    return FAMILIES.get(impl, "fixed kernels")


@dataclass(frozen=True)
class Rule:
    """When a slower figure counts: a move beyond ``ratio`` times the cell's spread AND beyond
    ``floor_s`` seconds.  ``width`` is the cell's spread between processes (a log, from its noise model)."""

    gated: bool
    ratio: float
    floor_s: float
    why: str = ""
    width: float = 0.0
    # A cell whose work changed (relu2.judge.gate.changed_rule): the ratio unchanged code exceeds one
    # comparison in ten, and the smallest slowdown it must be told apart from none (0: no such cell).
    usual: float = 0.0
    matters: float = 0.0

    def needed(self, width: float | None = None) -> float:
        """The head/base ratio a cell of spread ``max(width, self.width)`` must exceed."""
        return self.ratio * math.exp(max(self.width, width or 0.0))


@dataclass(frozen=True)
class Figure:
    """A cell's figure as the verdict sees it: the median, its samples, and whether they are rounds."""

    value: float
    samples: tuple[float, ...] = ()
    rounds: bool = False

    @classmethod
    def of(cls, m: Measurement) -> "Figure":
        return cls(float(m.value), m.samples, m.rounds)

    @property
    def width(self) -> float:
        """log(max/min) of its rounds: the spread between processes this figure shows (0 without rounds)."""
        clean = [s for s in self.samples if s > 0]
        return math.log(max(clean) / min(clean)) if self.rounds and len(clean) >= 2 else 0.0

    def scaled(self, factor: float) -> "Figure":
        """The same figure times ``factor`` (its samples too)."""
        return Figure(self.value * factor, tuple(s * factor for s in self.samples), self.rounds)


def move(base: Figure, head: Figure, paired: bool = False) -> float:
    """How far head moved from base, as a log.  Cross-box: log of the medians' ratio.  Paired (round i
    of each side measured side by side): the median over rounds of log(head_i / median(base_{i-1..i+1}))."""
    if paired and base.samples and len(base.samples) == len(head.samples):
        b = base.samples
        logs = [math.log(h / quantile(b[max(0, i - 1):i + 2], 0.5)) for i, h in enumerate(head.samples)]
        return quantile(logs, 0.5)
    return math.log(head.value / base.value)


def is_slower(base: Figure, head: Figure, rule: Rule, paired: bool = False, offset: float = 0.0) -> bool:
    """The rule: head's move (less ``offset``, how the box moved) beyond ``rule`` (its ratio times the
    cell's width, or base's rounds' width if wider; cross-box only) and beyond its floor in seconds.  Never
    the head's rounds: a step in two rounds of three widens them."""
    moved = move(base, head, paired) - offset
    width = 0.0 if paired else base.width
    return moved > math.log(rule.needed(width)) and base.value * math.expm1(moved) > rule.floor_s


def settled(base: Figure, head: Figure, rule: Rule, paired: bool = False, offset: float = 0.0) -> bool:
    """Whether more rounds would not change a cell's answer: it is slower by the rule, or it moved so
    little that a slowdown of ``rule.matters`` would have read higher at least nine times in ten.  Between
    the two it is unknown, and is measured again (Pinpoint's "unknown: measure more").  A cell
    without ``matters`` (its work did not change) is always settled."""
    if not rule.matters or is_slower(base, head, rule, paired, offset):
        return True
    return move(base, head, paired) - offset < math.log(rule.matters / rule.usual) - rule.width


SLOWER, FASTER, SAME = 1, -1, 0  # what the rule says of one cell


def verdict_of(base: Figure, head: Figure, rule: Rule, paired: bool = False, offset: float = 0.0) -> int:
    """The rule's answer for one cell: SLOWER, FASTER (the same rule the other way round) or SAME.  The
    gate sorts cells by it, bisect answers its probes by it: one rule."""
    if is_slower(base, head, rule, paired, offset):
        return SLOWER
    return FASTER if is_slower(head.scaled(math.exp(-offset)), base, rule, paired) else SAME


def paired_figures(a: Sequence[float], b: Sequence[float], least: int = 1) -> tuple[Figure, Figure] | None:
    """Two sides' rounds measured side by side (round i of each) as the paired verdict's figures; a
    round either side lost (nan, 0) drops its pair; None with fewer than ``least`` pairs."""
    kept = [(x, y) for x, y in zip(a, b) if x > 0 and y > 0 and math.isfinite(x) and math.isfinite(y)]
    if len(kept) < max(1, least):
        return None
    sides = [tuple(side) for side in zip(*kept)]
    return Figure(quantile(sides[0], 0.5), sides[0], True), Figure(quantile(sides[1], 0.5), sides[1], True)


def reference_moves(pairs: Iterable[tuple[Measurement, Measurement]], band_of: Callable[[Cell], str],
                    paired: bool = False, bands: Sequence[str] = ()) -> dict[tuple[str, str], float]:
    """Per (mode, band): the median move of the reference cells among ``pairs`` (ok at both sides),
    where there are at least MIN_REFERENCES of them; a band with fewer takes its mode's over every
    band (a box moves as a whole), when that has enough."""
    logs: dict[tuple[str, str], list[float]] = {}
    for b, h in pairs:
        if b.cell.impl in REFERENCES and b.cell.measure in TIMING_MODES and _positive(b.value) and _positive(h.value):
            logs.setdefault((b.cell.measure, band_of(b.cell)), []).append(move(Figure.of(b), Figure.of(h), paired))
    out = {key: quantile(v, 0.5) for key, v in logs.items() if len(v) >= MIN_REFERENCES}
    for mode in {m for m, _ in logs}:
        every = [x for (m, _), v in logs.items() if m == mode for x in v]
        if len(every) >= MIN_REFERENCES:
            for band in {*bands, *(b for m, b in logs if m == mode)}:
                out.setdefault((mode, band), quantile(every, 0.5))
    return out


# --- findings -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """One cell compared between base and head."""

    label: str  # "Grid.track_hot(impl=fused, dtype=bfloat16, numel=16777216)"
    benchmark: str
    params: tuple[tuple[str, str], ...]
    unit: str
    base: float | None  # None: failed; NaN: skipped or absent
    head: float | None
    threshold: float = float("nan")  # the raw head/base it had to exceed (NaN: not gated)
    kernel: str = ""  # "3f2a9c1b0e4d -> 77c0a1e2f9b3" when the generated kernel changed, "same" when not
    also: tuple[str, ...] = ()  # other suites listing the same measurement
    family: str = ""
    why: str = ""  # why it is listed where it is, when the list's title does not say
    moved: float = float("nan")  # the ratio the rule judged (paired: the rounds' median move), the box's move out
    work: str | None = None  # how its work changed ("" the same work; None: not counted)

    @property
    def ratio(self) -> float:
        """head / base (NaN when either is not a number)."""
        if not _is_number(self.base) or not _is_number(self.head) or self.base == 0:
            return float("nan")
        return self.head / self.base

    def as_json(self) -> dict[str, Any]:
        return {"label": self.label, "benchmark": self.benchmark, "params": dict(self.params), "unit": self.unit,
                "base": _number_or_none(self.base), "head": _number_or_none(self.head),
                "ratio": _number_or_none(self.ratio), "threshold": _number_or_none(self.threshold),
                "moved": _number_or_none(self.moved), "kernel": self.kernel, "also": list(self.also),
                "family": self.family, "why": self.why, "work": self.work}


def _positive(x: float | None) -> bool:
    return x is not None and not math.isnan(x) and x > 0


def _is_number(x: float | None) -> bool:
    return x is not None and not math.isnan(x)


def _number_or_none(x: float | None) -> float | None:
    return x if _is_number(x) else None


@dataclass
class Findings:
    """The cells of a comparison, sorted by fate."""

    compared: int = 0  # comparisons made: ok at both sides
    gated: int = 0  # of them, judged by a rule that can fail the gate
    work_changed: int = 0  # of the gated, those whose work changed: judged at their own share of the budget
    regressions: list[Change] = field(default_factory=list)
    new_failures: list[Change] = field(default_factory=list)
    vanished: list[Change] = field(default_factory=list)  # ok at base; skipped or absent at head
    allowed: list[Change] = field(default_factory=list)  # lost or unjudged, but --allow-missing names them
    unjudged: list[Change] = field(default_factory=list)  # ok at head; failed or skipped at base: not a pass
    failed_at_base: list[Change] = field(default_factory=list)  # failed at base, no figure at head either
    not_gated: list[Change] = field(default_factory=list)
    improvements: list[Change] = field(default_factory=list)
    repicked: list[Change] = field(default_factory=list)  # same code, another autotuned pick, within the bound
    # paired: cells whose work changed and whose rounds do not settle them yet (relu2 compare measures
    # them again; at its last round each is judged as it stands)
    undecided: list[Change] = field(default_factory=list)
    cells: list[Change] = field(default_factory=list)  # every timed cell compared, as judged
    base_cells: int = 0  # cells with a result at base (ok or failed)
    base_failures: int = 0  # of them, failed
    offsets: dict[tuple[str, str], float] = field(default_factory=dict)  # (mode, band) -> the move taken out
    stack_moves: dict[tuple[str, str], float] = field(default_factory=dict)  # references moved beyond a box


def pairs(base: Sequence[Measurement], head: Sequence[Measurement]) -> list[tuple[Measurement, Measurement | None]]:
    """Match by identity; failing that, by the parameters both sides have (a parameter added or removed)."""
    by_id = {m.cell.identity: m for m in head}
    loose: dict[tuple, list[Measurement]] = {}
    for m in head:
        loose.setdefault(m.cell.identity[:4], []).append(m)
    out: list[tuple[Measurement, Measurement | None]] = []
    for b in base:
        key = b.cell.identity
        if key in by_id:
            out.append((b, by_id[key]))
            continue
        mine = dict(b.cell.extras)
        found = [h for h in loose.get(key[:4], []) if _nested(mine, dict(h.cell.extras))]
        out += [(b, h) for h in found] or [(b, None)]
    return out


def _nested(a: Mapping[str, str], b: Mapping[str, str]) -> bool:
    """One parameter dict agrees with the other on every name it has."""
    small, big = (a, b) if len(a) <= len(b) else (b, a)
    return all(big.get(k) == v for k, v in small.items())


def check_versions(base: Iterable[Measurement], head: Iterable[Measurement]) -> None:
    """ResultsError naming the first benchmark measured under two versions (asv refuses those too)."""
    seen = {m.benchmark: m.version for m in base}
    for m in head:
        if m.benchmark in seen and seen[m.benchmark] != m.version:
            raise ResultsError(
                f"{m.benchmark} was measured as version {_short(seen[m.benchmark])} at base and "
                f"{_short(m.version)} at head: its figures mean different things (asv refuses to compare "
                "them too); --across-versions compares anyway")


def _short(version: str | None) -> str:
    if version is None:
        return "none"
    return version if len(version) <= 20 else version[:12]  # asv's hashes are long; "cold-method-2" is not


def change_of(b: Measurement, h: Measurement | None) -> Change:
    label = b.label() if h is None or h.params == b.params else f"{b.label()} -> {h.label()}"
    return Change(label=label, benchmark=b.benchmark, params=b.params, unit=b.unit, base=b.value,
                  head=h.value if h is not None else float("nan"), also=b.also, family=family_of(b.cell.impl))


def compare(base: Sequence[Measurement], head: Sequence[Measurement], rule_for: Callable[[Measurement, int], Rule],
            allow_missing: Sequence[str] = (), band_of: Callable[[Cell], str] = lambda cell: "",
            paired: bool = False, bounds: Mapping[tuple[str, str], float] | None = None,
            repick_bound: float = REPICK_BOUND, work: Callable[[Cell], str | None] = lambda cell: None,
            count_work: bool = True) -> Findings:
    """Sort two commits' measurements into regressions, new failures, vanished, unjudged, not gated,
    improvements, repicked.  ``rule_for(base measurement, gated)`` is a cell's rule in a comparison
    of ``gated`` gated cells; ``bounds`` how far a box moves per (mode, band) (a log, held to in the
    modes whose cells are gated; None: any move is a box's); ``work(cell)`` how a cell's work changed
    ("" the same, None: not known), where the comparison counted it (a compare's DIR/work.json), else
    the counters the sides recorded say; ``count_work`` False: no cell's work is known (the sides ran
    other software)."""
    out = Findings()
    comparable: list[tuple[Measurement, Measurement, Change]] = []
    allowed = lambda change: any(fnmatch.fnmatchcase(change.label.split(" -> ")[0], p) for p in allow_missing)  # noqa: E731
    for b, h in pairs(base, head):
        change = change_of(b, h)
        if b.status != OK:
            out.base_cells += b.status == FAILED
            out.base_failures += b.status == FAILED
            if h is not None and h.status == OK:  # the head measured it; nothing to judge it against
                (out.allowed if allowed(change) else out.unjudged).append(
                    replace(change, why=f"{b.status} at base"))
            elif b.status == FAILED:
                out.failed_at_base.append(change)
            elif h is not None and h.status == FAILED:  # could not run at base; at head it runs and fails
                out.new_failures.append(replace(change, why="skipped at base"))
            continue
        out.base_cells += 1
        if h is None or h.status == SKIPPED:
            (out.allowed if allowed(change) else out.vanished).append(change)
        elif h.status == FAILED:
            out.new_failures.append(change)
        else:
            comparable.append((b, h, change))
    out.compared = len(comparable)
    recorded = work_changes((b, h) for b, h, _ in comparable)

    def work_of(b: Measurement, h: Measurement) -> str | None:
        if not count_work or (b.fingerprint and h.fingerprint and only_repicked(b.fingerprint, h.fingerprint)):
            return None
        counted = work(b.cell)
        return counted if counted is not None else recorded.get(b.cell.input)

    works = {id(b): work_of(b, h) for b, h, _ in comparable}
    rules = {id(b): rule_for(b, 0, bool(works[id(b)])) for b, _, _ in comparable}  # a GPU may judge only changed cells
    out.gated = sum(1 for b, _, _ in comparable if rules[id(b)].gated)
    out.work_changed = sum(1 for b, _, _ in comparable
                           if rules[id(b)].gated and b.cell.timing_mode is not None and works[id(b)])
    moves = reference_moves(((b, h) for b, h, _ in comparable), band_of, paired,
                            bands=sorted({band_of(b.cell) for b, _, _ in comparable}))
    gated_modes = {b.cell.timing_mode for b, _, _ in comparable if rules[id(b)].gated}  # launch too, when asked
    for key, moved in moves.items():
        limit = bounds.get(key, math.inf) if bounds is not None and key[0] in gated_modes else math.inf
        if abs(moved) <= limit:
            out.offsets[key] = moved
        else:
            out.stack_moves[key] = moved
    for b, h, change in comparable:
        cell = b.cell
        if cell.timing_mode is None:
            if b.unit == "bytes" and h.value > b.value * PEAK_MEMORY_RATIO:
                out.regressions.append(replace(change, threshold=PEAK_MEMORY_RATIO))
            continue
        changed = bool(works[id(b)])
        rule = rule_for(b, out.work_changed if changed else out.gated, changed)
        offset = out.offsets.get((cell.timing_mode, band_of(cell)), 0.0)
        fb, fh = Figure.of(b), Figure.of(h)
        verdict = verdict_of(fb, fh, rule, paired, offset)
        slower, faster = verdict == SLOWER, verdict == FASTER
        kb, kh = b.fingerprint, h.fingerprint
        kernel = "" if not kb or not kh else "same" if kb == kh else f"{kb} -> {kh}"
        width = 0.0 if paired else fb.width
        found = replace(change, threshold=rule.needed(width) * math.exp(offset) if rule.gated else math.nan,
                        kernel=kernel, why=rule.why, moved=math.exp(move(fb, fh, paired) - offset),
                        work=works[id(b)])
        out.cells.append(found)
        if paired and rule.gated and not settled(fb, fh, rule, paired, offset):
            out.undecided.append(found)
        if not (slower or faster):
            continue
        if kb and kh and only_repicked(kb, kh) and family_of(cell.impl) in AUTOTUNED:
            if faster or found.ratio <= repick_bound:
                out.repicked.append(found)
                continue
            found = replace(found, why=f"another autotuned pick, but {found.ratio:.2f}x is beyond the {repick_bound:g}x "
                                       "a pick of the same code was seen to move")
        (out.not_gated if not rule.gated else out.improvements if faster else out.regressions).append(found)
    for changes in (out.regressions, out.not_gated):
        changes.sort(key=lambda c: -c.ratio if _is_number(c.ratio) else 0)
    out.improvements.sort(key=lambda c: c.ratio)
    out.undecided.sort(key=lambda c: c.label)
    return out




# A re-measurement that clears every one of this many flagged cells or more contradicts the first
# pass beyond what noise does: the model allows one failing run of unchanged code in 20, and a run
# that flags several cells which all come back clean is a disturbed pass or a forged re-measurement.
CONTRADICTED_FROM = 3


@dataclass(frozen=True)
class Confirmation:
    """What a re-measurement said about the flagged cells."""

    confirmed: list[Change]  # flagged again: regressions
    unconfirmed: list[Change]  # not flagged again: reported, not failing
    not_remeasured: list[Change]  # absent from the file: still failing (no evidence is not a pass)

    @property
    def contradicted(self) -> bool:
        """It clears all of CONTRADICTED_FROM or more flagged cells: that fails too (a person reads it)."""
        return len(self.unconfirmed) >= CONTRADICTED_FROM and not self.confirmed and not self.not_remeasured


def confirm(flagged: Sequence[Change], remeasured: Remeasurement, rule_of: Callable[[Change], Rule],
            paired: bool = False) -> Confirmation:
    """Judge each flagged cell again on its rounds, by the rule that flagged it: ``paired`` for a
    compare's cells (the re-measurement's rounds are side by side too, so the box's drift cancels)."""
    out = Confirmation([], [], [])
    for change in flagged:
        again = remeasured.find(change.benchmark, change.params)
        figures = again and paired_figures(again.base_rounds, again.head_rounds, MIN_ROUNDS)
        if not figures:  # too few pairs is no evidence: it still fails
            out.not_remeasured.append(change)
            continue
        b, h = figures
        (out.confirmed if is_slower(b, h, rule_of(change), paired) else out.unconfirmed).append(
            replace(change, base=b.value, head=h.value, moved=math.exp(move(b, h, paired))))
    return out


# --- spread (an A/A's figures) --------------------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    """How one implementation's figures in one mode moved between two runs: head/base ratio quantiles."""

    impl: str
    mode: str
    cells: int
    median: float
    p10: float
    p90: float
    max: float  # the ratio furthest from 1, either way


def spread(base: Iterable[Measurement], head: Iterable[Measurement]) -> list[Spread]:
    """Per implementation and timing mode, head/base over the cells ok in both.

    Run on two measurements of one commit (two boxes) it is the A/A data a noise model is learned from."""
    ratios: dict[tuple[str, str], list[float]] = {}
    for b, h in pairs(list(base), list(head)):
        if (b.cell.measure not in TIMING_MODES or h is None or b.status != OK or h.status != OK or not b.value):
            continue
        ratios.setdefault((b.cell.impl, b.cell.measure), []).append(h.value / b.value)
    out = [Spread(impl, mode, len(v), quantile(v, 0.5), quantile(v, 0.1), quantile(v, 0.9),
                  max(v, key=lambda r: max(r, 1 / r))) for (impl, mode), v in ratios.items()]
    ranks = {name: i for i, name in enumerate(impl_order({s.impl for s in out}))}
    return sorted(out, key=lambda s: (ranks[s.impl], TIMING_MODES.index(s.mode)))
