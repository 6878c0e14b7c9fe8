"""The comparison of two commits' records: which cells match, which moved, which vanished.

What it decides, and where each rule lives:

* **What a cell is.**  A benchmark name is decoded once (``decode``) into a ``Cell``: suite, measure
  (a timing mode, or a figure: ``kernel``, ``peak_memory``, ``summary``) and parameters, with the
  implementation, dtype and shape it measured.  Cells are matched by that identity (their parameter
  dict), never by asv's layout: a parameter added or removed matches the cells that agree on every
  parameter both sides have.
* **One measurement, one judgment.**  A measurement listed by several suites (same implementation,
  dtype, shape and mode) is judged and flagged once; its other suites are named in ``also``.
* **Which result wins.**  A commit measured twice (two environments, two runs): the cell with the
  newest ``started_at`` wins, for figures and kernel fingerprints alike (``latest``).
* **Which modes are gated.**  The modes whose figure is the kernel's own time
  (``relu2.schema.Mode.kernel_time``); the others are reported.  A ``summary`` figure (a seconds
  benchmark with no parameters, ``Implementations.track_<impl>``: the geometric mean of an
  implementation's hot figures from 2^20 elements) is gated like the hot mode of the largest band:
  a mean is no noisier than its cells, so the largest band's rule is safe for it.
* **What counts as slower.**  ``is_slower``: head/base beyond the noise model's ratio times the
  cell's spread between processes (its recorded width, or its base rounds' if wider) AND the floor;
  when both sides carry per-round samples (``Mode.samples_are_rounds``), every head round must
  also be slower than every base round.  Samples replayed in one process are not tested: they
  agree within 1.5% while two boxes differ by 6%, so only the between-run spread means anything.
* **Judged against the references of the same runs.**  A box can be faster or slower as a whole (a
  clock, a memory part): on the H200 one freshly started box ran 1-2% faster than two others on every
  implementation.  eager and copy are torch's own kernels, the same at every commit of the kernel
  under test, so per mode and band the median head/base of their cells is how the box moved
  (``reference_offsets``), and every cell's ratio is judged after taking that out.  Too few
  references in a band (a run narrowed to other implementations) leave it as measured.
* **Confirmation** (``Remeasurement``): the data contract of a re-measurement of flagged cells.
"""

from __future__ import annotations

import fnmatch
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from relu2.asv_results import DEFAULT_DTYPE, Record, ResultsError
from relu2.noise import Rule, round_width
from relu2.schema import BASELINE, FAILED, MODES, OK, ROOFLINE, SKIPPED, bytes_moved, geometry, kernel_hex, \
    only_repicked, quantile
from relu2.schema import mode as mode_named

GATED_MODES: tuple[str, ...] = tuple(m.name for m in MODES if m.kernel_time)
TIMING_MODES: tuple[str, ...] = tuple(m.name for m in MODES)
SIZE_PARAMS = ("numel", "tokens", "hidden")
SUMMARY = "summary"
PEAK_MEMORY_RATIO = 1.01  # deterministic for identical code: any growth past rounding is real
MIN_ROUNDS = 3  # fewer rounds than this say nothing about the spread between them
NO_FINGERPRINT = (BASELINE, ROOFLINE)  # never generated or built: the same kernel at every commit
REFERENCES = NO_FINGERPRINT  # what says how the box moved: torch's own kernels, unchanged by any commit
MIN_REFERENCES = 5  # reference cells a mode and band needs before its offset is taken out


class VerdictInputError(ResultsError):
    """Two commits' records that must not be compared (one line says why, and the flag that overrides)."""


@dataclass(frozen=True)
class Cell:
    """A benchmark result decoded once: what it measured, and how to name it."""

    suite: str  # "bench_relu2.Grid"
    measure: str  # a mode ("hot"), "kernel", "peak_memory", "summary", or the method's own name
    params: tuple[tuple[str, str], ...]
    impl: str
    dtype: str
    shape: str  # "4096x4096"; "" when the benchmark names no size

    @property
    def extras(self) -> tuple[tuple[str, str], ...]:
        """Parameters beyond implementation, dtype and size."""
        return tuple((k, v) for k, v in self.params if k not in ("impl", "dtype", *SIZE_PARAMS))

    @property
    def identity(self) -> tuple:
        """What makes two cells one measurement, whichever suite lists it."""
        return (self.measure, self.impl, self.dtype, self.shape, self.extras)

    @property
    def numel(self) -> int:
        return math.prod(int(n) for n in self.shape.split("x")) if self.shape else 0

    @property
    def bytes(self) -> int:
        try:
            return bytes_moved(self.numel, self.dtype)
        except ValueError:
            return 0

    @property
    def timing_mode(self) -> str | None:
        """The mode whose noise rule judges this cell (a summary is judged as hot); None for non-timings."""
        if self.measure in TIMING_MODES:
            return self.measure
        return "hot" if self.measure == SUMMARY else None


def decode(record: Record) -> Cell:
    """``bench_relu2.Grid.track_hot`` at (impl, dtype, numel) -> Cell(suite, "hot", ...)."""
    suite, method = record.benchmark.rsplit(".", 1)
    name = method.removeprefix("track_").removeprefix("time_")
    params = dict(record.params)
    if record.unit == "seconds" and name in TIMING_MODES:
        measure = name
    elif record.unit == "seconds" and not params:
        measure, params = SUMMARY, {"impl": name}
    elif name in ("kernel", "peak_memory"):
        measure = name
    else:
        measure = method
    try:
        shape = geometry(params)[1]
    except (ValueError, TypeError):
        shape = ""
    return Cell(suite, measure, record.params, params.get("impl", ""), params.get("dtype", DEFAULT_DTYPE), shape)


def latest(records: Iterable[Record]) -> list[Record]:
    """One record per (benchmark, parameters): the one measured last (newest ``started_at``)."""
    out: dict[Any, Record] = {}
    for r in records:
        if r.key not in out or r.started_at >= out[r.key].started_at:
            out[r.key] = r
    return list(out.values())


@dataclass(frozen=True)
class Entry:
    """A de-duplicated cell of one commit: its record, and the other suites that list it."""

    cell: Cell
    record: Record
    also: tuple[str, ...] = ()


def entries(records: Iterable[Record]) -> dict[tuple, Entry]:
    """Identity -> Entry over the newest records; the first suite (by name) holds a shared measurement."""
    out: dict[tuple, Entry] = {}
    for r in sorted(latest(records), key=lambda r: r.benchmark):
        cell = decode(r)
        if cell.identity in out:
            first = out[cell.identity]
            out[cell.identity] = replace(first, also=first.also + (cell.suite.rsplit(".", 1)[-1],))
        else:
            out[cell.identity] = Entry(cell, r)
    return out


def fingerprints(table: Mapping[tuple, Entry]) -> dict[tuple, str]:
    """(impl, dtype, shape, extras) -> the kernel fingerprint recorded for it."""
    return {(e.cell.impl, e.cell.dtype, e.cell.shape, e.cell.extras): kernel_hex(e.record.value)
            for e in table.values() if e.cell.measure == "kernel" and e.record.status == OK}


def kernel_of(cell: Cell, kernels: Mapping[tuple, str]) -> str | None:
    return kernels.get((cell.impl, cell.dtype, cell.shape, cell.extras))


def kernel_unchanged(cell: Cell, base_kernels: Mapping[tuple, str], head_kernels: Mapping[tuple, str]) -> bool:
    """True when the same kernel ran at both: equal fingerprints, or an implementation that has none."""
    if cell.impl in NO_FINGERPRINT:
        return True
    b, h = kernel_of(cell, base_kernels), kernel_of(cell, head_kernels)
    return b is not None and b == h


def samples_are_rounds(record: Record) -> bool:
    """Whether a record's samples are per-round medians: its mode's method, read from its version."""
    cell = decode(record)
    if cell.measure not in TIMING_MODES:
        return False
    return mode_named(cell.measure).samples_are_rounds(record.version)


@dataclass(frozen=True)
class Figure:
    """A cell's figure as the verdict sees it: the median, its samples, and whether they are rounds."""

    value: float
    samples: tuple[float, ...] = ()
    rounds: bool = False

    @classmethod
    def of(cls, record: Record) -> "Figure":
        clean = tuple(s for s in record.samples or () if s is not None and not math.isnan(s))
        return cls(float(record.value), clean, samples_are_rounds(record))

    @property
    def width(self) -> float:
        """log(max/min) of its rounds: the spread between processes this figure shows (0 without rounds)."""
        return round_width(self.samples) if self.rounds else 0.0

    def scaled(self, factor: float) -> "Figure":
        """The same figure times ``factor`` (its samples too): a head with the box's move taken out."""
        return Figure(self.value * factor, tuple(s * factor for s in self.samples), self.rounds)


def reference_offsets(moves: Iterable[tuple[Cell, float]],
                      band_of: Callable[[Cell], str]) -> dict[tuple[str, str], float]:
    """Per (mode, band): the median log(head/base) of the reference cells among ``moves`` ((cell, log
    ratio) of cells ok at both sides), where there are at least MIN_REFERENCES of them."""
    logs: dict[tuple[str, str], list[float]] = {}
    for cell, log_ratio in moves:
        if cell.impl in REFERENCES and cell.measure in TIMING_MODES:
            logs.setdefault((cell.measure, band_of(cell)), []).append(log_ratio)
    return {key: quantile(v, 0.5) for key, v in logs.items() if len(v) >= MIN_REFERENCES}


def offset_of(cell: Cell, offsets: Mapping[tuple[str, str], float], band_of: Callable[[Cell], str]) -> float:
    """The log offset a cell is judged after (a summary: its mode's in its band)."""
    mode = cell.timing_mode
    return offsets.get((mode, band_of(cell)), 0.0) if mode else 0.0


def is_slower(base: Figure, head: Figure, rule: Rule) -> bool:
    """head beyond ``rule`` (ratio times the cell's width, or the base rounds' width if wider, and the
    floor) over base; with rounds on both sides, every head round slower than every base round too
    (the spread between independent processes is what is tested)."""
    if not (head.value > base.value * rule.needed(base.width) and head.value - base.value > rule.floor_s):
        return False
    if base.rounds and head.rounds and min(len(base.samples), len(head.samples)) >= MIN_ROUNDS:
        return min(head.samples) > max(base.samples)
    return True


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
    threshold: float = float("nan")
    kernel: str = ""  # "3f2a9c1b0e4d -> 77c0a1e2f9b3" when the generated kernel changed, "same" when not
    also: tuple[str, ...] = ()  # other suites listing the same measurement

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
                "kernel": self.kernel, "also": list(self.also)}


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
    gated: int = 0  # of them, judged by a noise rule that can fail the gate
    regressions: list[Change] = field(default_factory=list)
    new_failures: list[Change] = field(default_factory=list)
    vanished: list[Change] = field(default_factory=list)  # ok at base; skipped or absent at head
    allowed: list[Change] = field(default_factory=list)
    failed_at_base: list[Change] = field(default_factory=list)  # not comparable: no figure at base
    not_gated: list[Change] = field(default_factory=list)
    improvements: list[Change] = field(default_factory=list)
    # Moved beyond the noise model with the same generated code and another autotuned pick: what
    # the box's autotuning chose, not the commit (reported, never failing; relu2.schema.only_repicked).
    repicked: list[Change] = field(default_factory=list)
    base_cells: int = 0  # measured cells at base (figures, not fingerprints)
    offsets: dict[tuple[str, str], float] = field(default_factory=dict)  # (mode, band) -> the references' log move


@dataclass(frozen=True)
class Pair:
    """One base entry and the head entry it is compared with (None: no counterpart)."""

    base: Entry
    head: Entry | None


def pairs(base: Mapping[tuple, Entry], head: Mapping[tuple, Entry]) -> list[Pair]:
    """Match by identity; failing that, by the parameters both sides have (a parameter added or removed)."""
    loose: dict[tuple, list[Entry]] = {}
    for e in head.values():
        loose.setdefault(e.cell.identity[:4], []).append(e)
    out = []
    for key, b in base.items():
        if key in head:
            out.append(Pair(b, head[key]))
            continue
        mine = dict(b.cell.extras)
        found = [h for h in loose.get(key[:4], []) if _nested(mine, dict(h.cell.extras))]
        out += [Pair(b, h) for h in found] or [Pair(b, None)]
    return out


def _nested(a: Mapping[str, str], b: Mapping[str, str]) -> bool:
    """One parameter dict agrees with the other on every name it has."""
    small, big = (a, b) if len(a) <= len(b) else (b, a)
    return all(big.get(k) == v for k, v in small.items())


def check_versions(base: Iterable[Record], head: Iterable[Record]) -> None:
    """VerdictInputError naming the first benchmark measured under two versions (asv refuses those too)."""
    seen = {r.benchmark: r.version for r in base}
    for r in head:
        if r.benchmark in seen and seen[r.benchmark] != r.version:
            raise VerdictInputError(
                f"{r.benchmark} was measured as version {_short(seen[r.benchmark])} at base and "
                f"{_short(r.version)} at head: its figures mean different things (asv refuses to compare "
                "them too); --across-versions compares anyway")


def _short(version: str | None) -> str:
    if version is None:
        return "none"
    return version if len(version) <= 20 else version[:12]  # asv's hashes are long; "cold-method-2" is not


def compare(base: Iterable[Record], head: Iterable[Record], rule_for: Callable[[Cell, int, str | None], Rule],
            allow_missing: Sequence[str] = (), band_of: Callable[[Cell], str] = lambda cell: "") -> Findings:
    """Sort two commits' cells into regressions, new failures, vanished, failed at base, not gated,
    improvements.  ``rule_for(cell, gated, kernel)`` is the noise rule of a cell (its kernel at
    base: None when it has no fingerprint) in a comparison of ``gated`` gated cells (the budget is
    for the whole run); each cell is judged after its mode's and band's (``band_of``) reference offset."""
    b_table, h_table = entries(base), entries(head)
    b_kernels, h_kernels = fingerprints(b_table), fingerprints(h_table)
    out = Findings()
    comparable: list[tuple[Pair, Change]] = []
    for pair in pairs(b_table, h_table):
        b, h = pair.base.record, pair.head.record if pair.head else None
        if pair.base.cell.measure == "kernel":
            continue  # a fingerprint is annotation, not a figure
        change = Change(label=b.label(), benchmark=b.benchmark, params=b.params, unit=b.unit, base=b.value,
                        head=h.value if h is not None else float("nan"), also=pair.base.also)
        if h is not None and pair.head.cell.params != pair.base.cell.params:
            change = replace(change, label=f"{b.label()} -> {h.label()}")
        if b.status == SKIPPED:
            continue
        out.base_cells += 1
        if b.status == FAILED:
            out.failed_at_base.append(change)
            continue
        if h is None or h.status == SKIPPED:
            allowed = any(fnmatch.fnmatchcase(b.label(), p) for p in allow_missing)
            (out.allowed if allowed else out.vanished).append(change)
            continue
        if h.status == FAILED:
            out.new_failures.append(change)
            continue
        comparable.append((pair, change))
    out.compared = len(comparable)
    out.gated = sum(1 for p, _ in comparable if p.base.cell.timing_mode in GATED_MODES)
    out.offsets = reference_offsets(((p.base.cell, math.log(p.head.record.value / p.base.record.value))
                                     for p, _ in comparable if _positive(p.base.record.value)
                                     and _positive(p.head.record.value)), band_of)
    for pair, change in comparable:
        b, h, cell = pair.base.record, pair.head.record, pair.base.cell
        if cell.timing_mode is None:
            if b.unit == "bytes" and h.value > b.value * PEAK_MEMORY_RATIO:
                out.regressions.append(replace(change, threshold=PEAK_MEMORY_RATIO))
            continue
        kb, kh = kernel_of(cell, b_kernels), kernel_of(cell, h_kernels)
        rule = rule_for(cell, out.gated, kb)
        moved = math.exp(offset_of(cell, out.offsets, band_of))  # how the box moved: taken out of head
        fb, fh = Figure.of(b), Figure.of(h).scaled(1 / moved)
        slower, faster = is_slower(fb, fh, rule), is_slower(fh, fb, rule)
        if not (slower or faster):
            continue
        kernel = "" if kb is None or kh is None else "same" if kb == kh else f"{kb} -> {kh}"
        # the threshold in the ratio as shown (raw head/base): the rule's, moved with the box
        found = replace(change, threshold=rule.needed(fb.width) * moved, kernel=kernel)
        if kb is not None and kh is not None and only_repicked(kb, kh):
            out.repicked.append(found)
            continue
        (out.not_gated if not rule.gated else out.improvements if faster else out.regressions).append(found)
    for changes in (out.regressions, out.not_gated):
        changes.sort(key=lambda c: -c.ratio if _is_number(c.ratio) else 0)
    out.improvements.sort(key=lambda c: c.ratio)
    return out


# --- confirmation ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Remeasured:
    """One flagged cell measured again: per-round medians (seconds), each round a fresh process,
    base and head rounds interleaved on one box."""

    benchmark: str  # as in the report: "bench_relu2.Grid.track_hot"
    params: tuple[tuple[str, str], ...]  # as in the report's ``params``
    base_rounds: tuple[float, ...]
    head_rounds: tuple[float, ...]

    def figures(self) -> tuple[Figure, Figure]:
        return (Figure(quantile(self.base_rounds, 0.5), self.base_rounds, True),
                Figure(quantile(self.head_rounds, 0.5), self.head_rounds, True))


@dataclass(frozen=True)
class Remeasurement:
    """What ``relu2 gate --confirmed FILE`` reads (written by the re-measuring side, relu2/confirm.py):

    ``{"base": FULL_HASH, "head": FULL_HASH, "machine": NAME,
       "cells": [{"benchmark": ..., "params": {...}, "base_rounds": [s, ...], "head_rounds": [s, ...]}]}``

    ``cells`` are the report's flagged regressions (``--format json``: each has ``benchmark`` and
    ``params``), at least ``MIN_ROUNDS`` rounds a side."""

    base: str
    head: str
    machine: str
    cells: tuple[Remeasured, ...]

    def find(self, change: Change) -> Remeasured | None:
        """The re-measurement of ``change`` with at least MIN_ROUNDS rounds a side (None: not re-measured).
        Parameters match as a mapping: the report's JSON sorts them, asv's records keep their order."""
        wanted = dict(change.params)
        return next((c for c in self.cells if c.benchmark == change.benchmark and dict(c.params) == wanted
                     and min(len(c.base_rounds), len(c.head_rounds)) >= MIN_ROUNDS), None)


def read_remeasurement(path: str | Path) -> Remeasurement:
    """The file of a re-measurement; VerdictInputError naming it when it is not one."""
    try:
        data = json.loads(Path(path).read_text())
        cells = tuple(Remeasured(
            str(c["benchmark"]), tuple((str(k), str(v)) for k, v in c["params"].items()),
            tuple(float(x) for x in c["base_rounds"]), tuple(float(x) for x in c["head_rounds"]),
        ) for c in data["cells"])
        out = Remeasurement(str(data["base"]), str(data["head"]), str(data.get("machine", "")), cells)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise VerdictInputError(f"{path}: not a re-measurement of flagged cells ({type(e).__name__}: {e})") from None
    # A cell with fewer than MIN_ROUNDS rounds a side (a round failed) counts as not re-measured: it
    # still fails, while the others are judged.
    return out


@dataclass(frozen=True)
class Confirmation:
    """What a re-measurement said about the flagged cells."""

    confirmed: list[Change]  # flagged again: regressions
    unconfirmed: list[Change]  # not flagged again: reported, not failing
    not_remeasured: list[Change]  # absent from the file: still failing (no evidence is not a pass)


def confirm(flagged: Sequence[Change], remeasured: Remeasurement, rule_of: Callable[[Change], Rule]) -> Confirmation:
    """Judge each flagged cell again on its rounds, by the rule that flagged it."""
    out = Confirmation([], [], [])
    for change in flagged:
        again = remeasured.find(change)
        if again is None:
            out.not_remeasured.append(change)
            continue
        b, h = again.figures()
        (out.confirmed if is_slower(b, h, rule_of(change)) else out.unconfirmed).append(
            replace(change, base=b.value, head=h.value))
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


def spread(base: Iterable[Record], head: Iterable[Record]) -> list[Spread]:
    """Per implementation and timing mode, head/base over the de-duplicated cells ok in both.

    Run on two measurements of one commit (two boxes) it is the A/A data a noise model is learned from."""
    from relu2.schema import impl_order, quantile

    b_table, h_table = entries(base), entries(head)
    ratios: dict[tuple[str, str], list[float]] = {}
    for key, b in b_table.items():
        h = h_table.get(key)
        if (b.cell.measure not in TIMING_MODES or h is None or b.record.status != OK or h.record.status != OK
                or not b.record.value):
            continue
        ratios.setdefault((b.cell.impl, b.cell.measure), []).append(h.record.value / b.record.value)
    out = [Spread(impl, mode, len(v), quantile(v, 0.5), quantile(v, 0.1), quantile(v, 0.9),
                  max(v, key=lambda r: max(r, 1 / r))) for (impl, mode), v in ratios.items()]
    ranks = {name: i for i, name in enumerate(impl_order({s.impl for s in out}))}
    return sorted(out, key=lambda s: (ranks[s.impl], TIMING_MODES.index(s.mode)))
