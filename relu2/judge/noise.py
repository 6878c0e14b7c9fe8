"""The gate's noise model: how far identical code moves between two runs, per implementation family,
timing mode and band; learned from recorded runs, checked on boxes it did not learn from.

* **Groups.**  A threshold is learned per (family, mode, band): the families are those of
  ``relu2.judge.rule.family_of`` (the references, the fixed kernels, the compiled paths: the compiled
  paths move 3-4x more than fused between boxes, and must not set fused's threshold); the bands are
  bytes moved against the L2 (in the L2, 1-4x, beyond 4x), from machine.json's ``l2_bytes`` or
  ``KNOWN_L2``.
* **Two kinds of model.**  ``cross-box``: two results folders' runs of unchanged code on two boxes
  (a box is a results folder and a machine name, never the name alone), figures = medians of
  rounds.  ``same-box``: compare folders (``relu2 compare``, base and head measured side by side on
  one box), the paired move of ``relu2.judge.rule.move``.  One model per GPU model and kind; a GPU with
  none is refused by the gate (or gated by ``--factor`` only, saying so).
* **What a pair of runs moved.**  Per cell whose kernel did not change (same fingerprint, or a
  reference), of the methods its mode learns from (``relu2.vocab.schema.Mode.noise_versions``): the move
  after the references' move in its mode and band (as the gate judges it), beyond the cell's width:
  how far its rounds spread between processes, a robust figure, not the widest ever seen.  Cross-box:
  log(q90/q10) of its rounds over every run (``widths_of``); same-box: the median over sides of
  log(max/min) of one side's rounds (``paired_widths_of``), since a paired move never sees a box's
  level.  A cell noisier than its band (the 2^28 cells) is judged wider, and its band is not.
* **The threshold** of a group is an exponential tail fitted beyond the 90th percentile of those
  residuals, every pair of runs weighing the same whatever its cell count (no single pair sets a
  threshold), at each gated cell's share of the budget (``BUDGET`` / gated cells: at most 1 run of
  unchanged code in 20 fails).
* **How far a box moves** (``bounds``): the references' median move per mode and band, twice the
  second largest seen (what one pair showed alone does not set it), at least ``MIN_BOUND``.
* **Out of sample.**  Learning also leaves each box out in turn and judges the pairs that include it
  with the model learned without it: those cases (the move, the base figure, the width and the
  threshold they met) are kept per group, and the resolution a gate report prints is simulated on
  them at the real cells' widths, with the gate's own rule (``relu2.judge.rule.is_slower``).
  ``relu2 noise check`` prints the same leave-one-box-out figures as a table.

The shipped model is ``relu2/noise_model.json``, written by ``relu2 noise learn`` (docs/methodology.md
records the command).
"""

from __future__ import annotations

import bisect
import json
import math
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from relu2.host.files import atomic_write_text
from relu2.judge.rule import (AUTOTUNED, FAMILY_NAMES, GATED_MODES, REFERENCES, REPICK_BOUND, Figure, Rule, family_of,
                              is_slower, move, pairs, reference_moves)
from relu2.records.asv_names import SUMMARY, Cell
from relu2.records.asv_results import Measurement, Run, runs_in  # noqa: F401  (runs_in: what noise learns from)
from relu2.vocab.errors import UsageError
from relu2.vocab.schema import (BAND_NAMES, BANDS, BUDGET, DEFAULT_FLOOR_S, KNOWN_L2, LARGEST_BAND, OK,  # noqa: F401
                                Band, band_of, l2_of)
from relu2.vocab.schema import mode as mode_named
from relu2.vocab.schema import only_repicked, quantile

DEFAULT_MODEL_PATH = Path(__file__).resolve().parents[1] / "noise_model.json"  # relu2/noise_model.json
MODEL_ENV = "RELU2_NOISE_MODEL"  # another model file as the default (a team's own GPUs)
DETECTION = 0.90  # "resolution": the slowdown caught in at least this share of out-of-sample cases
TAIL_FROM = 0.90  # residuals below this (pair-weighted) quantile are read as recorded; the tail is fitted
MIN_RATIO = 1.01  # no threshold below 1%: boxes move their references that much as a whole
MIN_BOUND = 0.03  # a median reference move within 3% is a box's, whatever few pairs showed (boxes: <2%)
CASES_KEPT = 300  # out-of-sample cases kept per group for the resolution
CROSS_BOX, SAME_BOX = "cross-box", "same-box"
KINDS = (CROSS_BOX, SAME_BOX)

def band_of_cell(cell: Cell, l2_bytes: int) -> str:
    """The band a cell is judged in: a summary figure in the largest (a mean is no noisier than its
    cells), any other cell by its bytes."""
    return LARGEST_BAND.name if cell.measure == SUMMARY else band_of(cell.bytes, l2_bytes).name


def group_of(cell: Cell, l2_bytes: int) -> tuple[str, str, str]:
    """(family, mode, band): what a cell's threshold is learned and looked up by."""
    return (family_of(cell.impl), cell.timing_mode or cell.measure, band_of_cell(cell, l2_bytes))


# --- the tail ---------------------------------------------------------------------------------------


def weighted_quantile(values: Sequence[float], weights: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` each of weight ``weights`` (the lower one at a tie)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    total, run = sum(weights), 0.0
    for i in order:
        run += weights[i]
        if run >= q * total:
            return values[i]
    return values[order[-1]]


@dataclass(frozen=True)
class Tail:
    """Residuals (logs) of unchanged code: recorded up to their ``TAIL_FROM`` quantile ``knee``, an
    exponential tail of mean excess ``excess`` beyond (peaks over a threshold with shape 0: heavier
    than a normal's, and no shape parameter, which a few pairs of boxes cannot pin down)."""

    knee: float
    excess: float

    def ratio(self, p: float) -> float:
        """The head/base ratio unchanged code exceeds (slower) with probability ``p``."""
        both_ways = 2 * p  # residuals are |moves|: a slowdown is one side
        if both_ways >= 1 - TAIL_FROM:
            return max(MIN_RATIO, math.exp(self.knee))
        return max(MIN_RATIO, math.exp(self.knee + self.excess * math.log((1 - TAIL_FROM) / both_ways)))


def fit_tail(residuals_by_pair: Sequence[Sequence[float]]) -> Tail:
    """The tail of the residuals, each pair of runs weighing the same."""
    values = [r for rs in residuals_by_pair for r in rs]
    weights = [1 / len(rs) for rs in residuals_by_pair for _ in rs]
    if not values:
        return Tail(0.0, 0.0)
    knee = weighted_quantile(values, weights, TAIL_FROM)
    over = [(v - knee, w) for v, w in zip(values, weights) if v > knee]
    excess = sum(d * w for d, w in over) / sum(w for _, w in over) if over else 0.0
    return Tail(knee, excess)


# --- the model ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupFit:
    """What the model knows about one (family, mode, band)."""

    family: str
    mode: str
    band: str
    cells: int  # observations (cells x pairs of runs)
    pairs: int
    knee: float
    excess: float
    typical_width: float = 0.0  # a cell with no recorded width takes this (the group's median)
    # out of sample: (move less the references', base seconds, width, log threshold it met)
    held_out: tuple[tuple[float, ...], ...] = ()

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.family, self.mode, self.band)

    @property
    def tail(self) -> Tail:
        return Tail(self.knee, self.excess)


@dataclass(frozen=True)
class NoiseModel:
    """Per (family, mode, band) fits for one GPU model and one kind of comparison."""

    gpu: str
    kind: str
    l2_bytes: int
    budget: float = BUDGET
    floor_s: float = DEFAULT_FLOOR_S
    fits: tuple[GroupFit, ...] = ()
    bounds: Mapping[str, float] = field(default_factory=dict)  # "mode|band" -> how far a box moves (log)
    widths: Mapping[str, float] = field(default_factory=dict)  # width_key -> log spread of its rounds (widths_of)
    repick_bound: float = REPICK_BOUND  # the raw ratio an autotuned repick may move (beyond: a regression)
    sources: tuple[str, ...] = ()
    command: str = ""
    # Same-box: the rounds a side of every compare it learned from had.  A paired move over n rounds
    # is the median of n logs, whose spread shrinks as 1/sqrt(n) (the H200's A/As: scripts/changed_rounds.py),
    # so its bars are read at sqrt(rounds / n) of the learned ones; 0: never scaled.
    rounds: int = 0
    # Judges only the cells whose exact work changed: its out-of-sample check failed more no-change
    # comparisons than the budget allows, which a cell of unchanged work could meet, and one whose
    # work changed cannot (docs/methodology.md).  The other cells keep the GPU's cross-box model, or,
    # where it has none (the H100), are reported, not gated.
    changed_work_only: bool = False

    @property
    def name(self) -> str:
        """``NVIDIA H200 (cross-box)``; a model learned without a GPU (recorded gpu "none") is the CPU's."""
        return f"{self.gpu if is_gpu(self.gpu) else 'CPU'} ({self.kind})"

    def fit_for(self, key: tuple[str, str, str]) -> GroupFit | None:
        return next((f for f in self.fits if f.key == key), None)

    def width(self, m: Measurement, key: tuple[str, str, str]) -> float:
        """A cell's spread between processes (a log); its group's median when none is recorded."""
        w = self.widths.get(width_key(m))
        if w is not None:
            return w
        f = self.fit_for(key)
        return f.typical_width if f else 0.0

    def per_cell(self, gated_cells: int) -> float:
        """Each gated cell's share of the run's budget."""
        return self.budget / max(gated_cells, 1)

    def ratio(self, key: tuple[str, str, str], gated_cells: int) -> float | None:
        """The head/base ratio (before the cell's width) in a run of ``gated_cells``; None when unfitted."""
        f = self.fit_for(key)
        return f.tail.ratio(self.per_cell(gated_cells)) if f else None

    def scale(self, rounds: int) -> float:
        """The factor on a log bar learned at ``self.rounds`` rounds for a move over ``rounds`` (1: none)."""
        return math.sqrt(self.rounds / rounds) if self.rounds and rounds else 1.0

    def bound_map(self) -> dict[tuple[str, str], float]:
        return {tuple(k.split("|", 1)): v for k, v in self.bounds.items()}  # type: ignore[misc]

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["fits"] = [{**asdict(f), "held_out": [list(c) for c in f.held_out]} for f in self.fits]
        out["widths"] = dict(sorted(self.widths.items()))
        out["bounds"] = dict(sorted(self.bounds.items()))
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "NoiseModel":
        fits = tuple(GroupFit(**{**f, "held_out": tuple(tuple(c) for c in f.get("held_out", ()))})
                     for f in data["fits"])
        return cls(gpu=str(data["gpu"]), kind=str(data["kind"]), l2_bytes=int(data["l2_bytes"]),
                   budget=float(data["budget"]), floor_s=float(data["floor_s"]), fits=fits,
                   bounds={str(k): float(v) for k, v in data.get("bounds", {}).items()},
                   widths={str(k): float(v) for k, v in data.get("widths", {}).items()},
                   repick_bound=float(data.get("repick_bound", REPICK_BOUND)),
                   sources=tuple(data.get("sources", ())), command=str(data.get("command", "")),
                   rounds=int(data.get("rounds", 0)), changed_work_only=bool(data.get("changed_work_only", False)))


class NoiseModelError(UsageError):
    """The noise model file cannot be read, or holds no model for what is asked."""


def default_model_path() -> Path:
    """``$RELU2_NOISE_MODEL`` when set, else the shipped model."""
    return Path(os.environ.get(MODEL_ENV) or DEFAULT_MODEL_PATH)


def holds_models(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a noise model file (``relu2 noise learn`` adds to one, keeping its other models)."""
    try:
        return bool(load_models(path))
    except NoiseModelError:
        return False


def load_models(path: str | os.PathLike | None = None) -> list[NoiseModel]:
    """Every model in a model file (``{"format": 2, "models": [...]}``; default: ``default_model_path``)."""
    path = path or default_model_path()
    try:
        data = json.loads(Path(path).read_text())
        if data.get("format") != 2:
            raise ValueError(f"format {data.get('format')!r}, not 2")
        return [NoiseModel.from_json(m) for m in data["models"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise NoiseModelError(f"{path}: not a relu2 noise model file ({e}); relu2 noise learn writes one") from None


def model_for(models: Sequence[NoiseModel], gpu: str, kind: str) -> NoiseModel | None:
    """The model of exactly this GPU model and kind (None: there is none; another GPU's never stands in)."""
    return next((m for m in models if m.gpu == gpu and m.kind == kind), None)


def save_models(models: Sequence[NoiseModel], path: str | os.PathLike) -> None:
    atomic_write_text(path, json.dumps({"format": 2, "models": [m.as_json() for m in models]}, indent=1,
                                       sort_keys=True) + "\n")


# --- recorded runs (relu2.records.asv_results.Run) ---------------------------------------------------


def cross_box_pairs(runs: Sequence[Run]) -> list[tuple[Run, Run]]:
    """Every pair of runs of one results folder and one GPU model on two boxes (a folder's copy of
    another's file is no new draw, so folders are not mixed)."""
    return [(a, b) for i, a in enumerate(runs) for b in runs[i + 1:]
            if a.source == b.source and a.box != b.box and a.gpu == b.gpu and is_gpu(a.gpu)]


def is_gpu(gpu: str) -> bool:
    return gpu.lower() not in ("", "none")


def width_key(m: Measurement) -> str:
    """What a width is recorded under: the measurement and the kernel that ran ("" for the references)."""
    c = m.cell
    extras = ",".join(f"{k}={v}" for k, v in c.extras)
    return "|".join((c.measure, c.impl, c.dtype, c.shape, extras, m.fingerprint))


def run_identity(run: Run) -> tuple:
    """What makes two runs one (a result file copied into another folder is the same run)."""
    return (run.machine, run.commit, min((m.started_at for m in run.measurements), default=0))


class WidthBook:
    """Widths learned from ``runs`` less some boxes' runs (and their copies in other folders): a pair
    of runs is judged at widths that its own rounds did not make, as the gate judges two new runs."""

    def __init__(self, runs: Sequence[Run], measure: Callable[[Sequence[Run]], dict[str, float]] | None = None) -> None:
        self.runs = list(runs)
        self.measure = measure or widths_of
        self._cache: dict[frozenset, dict[str, float]] = {}

    def without(self, boxes: Iterable[str] = ()) -> dict[str, float]:
        key = frozenset(boxes)
        if key not in self._cache:
            gone = {run_identity(r) for r in self.runs if r.box in key}
            self._cache[key] = self.measure([r for r in self.runs if run_identity(r) not in gone])
        return self._cache[key]


def _learned_method(m: Measurement) -> int | None:
    """The method of a gated figure with rounds that its mode learns noise from (None: not such a figure)."""
    if m.cell.measure not in GATED_MODES or m.status != OK or not m.rounds:
        return None
    mode = mode_named(m.cell.measure)
    return mode.method_of(m.version) if m.version in mode.noise_versions else None


def _newest(by_method: Mapping[str, Mapping[int, list[float]]]) -> dict[str, list[float]]:
    """Per cell, the values of the newest method that recorded it: an earlier method's (as noisy as
    today's or noisier: ``Mode.noise_versions``) only where today's has none, never pooled with it
    (a new method may move a cell's level, which pooled rounds would read as spread)."""
    return {key: methods[max(methods)] for key, methods in by_method.items()}


def widths_of(runs: Sequence[Run]) -> dict[str, float]:
    """Per cell and kernel, how far its rounds spread between processes: log(q90/q10) of every round
    recorded for it by its newest method (``_newest``), over distinct runs (a run copied into two folders
    counts once).  A cell bimodal between processes (333 or 368 µs, a process's allocations deciding)
    has a wide one wherever its processes landed; quantiles, not the extremes, so one odd round does not."""
    rounds: dict[str, dict[int, list[float]]] = {}
    seen_runs: set[tuple] = set()
    for run in runs:
        for m in run.measurements:
            method = _learned_method(m)
            once = (m.machine, m.commit, m.started_at, m.cell.identity)
            if method is None or once in seen_runs:
                continue
            seen_runs.add(once)
            rounds.setdefault(width_key(m), {}).setdefault(method, []).extend(s for s in m.samples if s > 0)
    return {k: math.log(quantile(v, 0.9) / quantile(v, 0.1)) for k, v in _newest(rounds).items() if len(v) >= 2}


def paired_widths_of(runs: Sequence[Run]) -> dict[str, float]:
    """Per cell and kernel, how far its rounds spread within one side of a compare: the median over
    sides (of its newest method, ``_newest``) of log(max/min) of its rounds.  Within a side, not pooled
    over sides as ``widths_of`` does: boxes differ in a cell's level (2^28 cells by 1-3%), and a paired
    move never sees that."""
    spreads: dict[str, dict[int, list[float]]] = {}
    for run in runs:
        for m in run.measurements:
            clean = [s for s in m.samples if s > 0]
            method = _learned_method(m)
            if method is not None and len(clean) >= 2:
                spreads.setdefault(width_key(m), {}).setdefault(method, []).append(math.log(max(clean) / min(clean)))
    return {k: quantile(v, 0.5) for k, v in _newest(spreads).items()}


@dataclass(frozen=True)
class Observation:
    """One gated cell of unchanged code in one pair of runs."""

    group: tuple[str, str, str]
    moved: float  # log move less the references' move (signed, base -> head)
    base_s: float
    own_width: float  # the base figure's own rounds' spread (cross-box)
    key: str  # its width_key
    other_width: float = 0.0  # the head figure's: the base's when the pair is read the other way round

    def width(self, widths: Mapping[str, float], typical: float = 0.0, reverse: bool = False) -> float:
        return max(widths.get(self.key, typical), self.other_width if reverse else self.own_width)


def observe(a: Run, b: Run, l2_bytes: int, paired: bool) -> list[Observation]:
    """The gated cells of unchanged code ok in both runs, of one method each, of the methods their
    mode learns from, judged as the gate judges them (after the references' move)."""
    kept = [(x, y) for x, y in pairs(a.measurements, b.measurements)
            if y is not None and x.cell.measure in GATED_MODES and x.status == OK and y.status == OK
            and x.version == y.version and x.version in mode_named(x.cell.measure).noise_versions
            and (x.cell.impl in REFERENCES or (x.fingerprint and x.fingerprint == y.fingerprint))
            and x.value and y.value]
    band = lambda cell: band_of_cell(cell, l2_bytes)  # noqa: E731
    offsets = reference_moves(kept, band, paired, bands=BAND_NAMES)
    out = []
    for x, y in kept:
        group = group_of(x.cell, l2_bytes)
        moved = move(Figure.of(x), Figure.of(y), paired) - offsets.get((x.cell.measure, group[2]), 0.0)
        out.append(Observation(group, moved, float(x.value), 0.0 if paired else x.width,
                               width_key(x), 0.0 if paired else y.width))
    return out


@dataclass(frozen=True)
class PairSeen:
    """What one pair of runs showed: its boxes, its observations and its references' moves."""

    boxes: tuple[str, str]
    observations: tuple[Observation, ...]
    offsets: Mapping[tuple[str, str], float]
    repicks: tuple[float, ...] = ()  # |move| of the autotuned cells whose pick alone changed
    today: bool = False  # its figures are of today's methods (rounds), as the gate judges new runs
    label: str = ""  # a same-box pair's compare folder: one box makes many, each its own comparison


def seen_in(a: Run, b: Run, l2_bytes: int, paired: bool) -> PairSeen:
    kept = [(x, y) for x, y in pairs(a.measurements, b.measurements)
            if y is not None and x.status == OK and y.status == OK and x.version == y.version]
    offsets = reference_moves(kept, lambda cell: band_of_cell(cell, l2_bytes), paired, bands=BAND_NAMES)
    repicks = tuple(abs(move(Figure.of(x), Figure.of(y), paired)) for x, y in kept
                    if x.cell.measure in GATED_MODES and family_of(x.cell.impl) in AUTOTUNED and x.value and y.value
                    and x.fingerprint and y.fingerprint and only_repicked(x.fingerprint, y.fingerprint))

    today = any(x.version == mode_named(x.cell.measure).asv_version for x, _ in kept if x.cell.measure in GATED_MODES)
    label = f"{a.machine}: {os.path.basename(os.path.normpath(a.source))}" if paired and a.source else ""
    return PairSeen((a.box, b.box), tuple(observe(a, b, l2_bytes, paired)), offsets, repicks, today, label)


def fit(seen: Sequence[PairSeen], *, gpu: str, kind: str, l2_bytes: int, book: WidthBook | None = None,
        exclude: Iterable[str] = (), budget: float = BUDGET, floor_s: float = DEFAULT_FLOOR_S,
        sources: Iterable[str] = (), command: str = "") -> NoiseModel:
    """The model of what ``seen`` moved beyond each cell's width (no out-of-sample cases: ``learn``
    adds those).  A pair's residuals are taken at widths learned without its two boxes (``book``),
    the model's widths without ``exclude``."""
    exclude = frozenset(exclude)
    widths = book.without(exclude) if book is not None else {}
    by: dict[tuple, list[float]] = {}
    for p in seen:
        for o in p.observations:
            if o.key in widths:
                by.setdefault(o.group, []).append(widths[o.key])
    typical = {g: quantile(v, 0.5) for g, v in by.items()}
    by_group: dict[tuple[str, str, str], list[list[float]]] = {}
    for p in seen:
        own = book.without(exclude | set(p.boxes)) if book is not None else {}
        mine: dict[tuple[str, str, str], list[float]] = {}
        for o in p.observations:  # both directions: each with its base's rounds
            for reverse in (False, True):
                mine.setdefault(o.group, []).append(
                    max(0.0, abs(o.moved) - o.width(own, typical.get(o.group, 0.0), reverse)))
        for g, rs in mine.items():
            by_group.setdefault(g, []).append(rs)
    fits = []
    for g in sorted(by_group, key=_group_order):
        t = fit_tail(by_group[g])
        fits.append(GroupFit(*g, cells=sum(map(len, by_group[g])) // 2, pairs=len(by_group[g]), knee=round(t.knee, 6),
                             excess=round(t.excess, 6), typical_width=round(typical.get(g, 0.0), 6)))
    moves: dict[tuple[str, str], list[float]] = {}
    for p in seen:
        for key, v in p.offsets.items():
            moves.setdefault(key, []).append(abs(v))
    bounds = {f"{k[0]}|{k[1]}": round(max(MIN_BOUND, 2 * sorted(v)[-2] if len(v) > 1 else MIN_BOUND), 6)
              for k, v in moves.items()}
    # what a repick moved: the second largest of the pairs' largest (recurring), with a tenth to spare
    most = sorted(max(p.repicks) for p in seen if p.repicks)
    repick = round(math.exp(most[-2] if len(most) > 1 else 0.0) * 1.1, 3) if most else REPICK_BOUND
    return NoiseModel(gpu, kind, l2_bytes, budget, floor_s, tuple(fits), bounds,
                      {k: round(v, 6) for k, v in widths.items()}, max(repick, REPICK_BOUND), tuple(sources), command)


def _group_order(g: tuple[str, str, str]) -> tuple:
    family, mode, band = g
    return (FAMILY_NAMES.index(family) if family in FAMILY_NAMES else 99, mode, BAND_NAMES.index(band))


def held_out(seen: Sequence[PairSeen], box: str, **kwargs: Any) -> tuple[NoiseModel, list]:
    """The model learned without ``box`` (its pairs and its rounds' widths), and the cases of the pairs
    that include it, both directions: (group, move, base seconds, width, log ratio it had to exceed,
    comparison: "<base box> -> <head box>"), each at widths neither of its boxes made."""
    model = fit([p for p in seen if box not in p.boxes], exclude={box}, **kwargs)
    book = kwargs.get("book")
    cases = []
    for p in seen:
        if box not in p.boxes:
            continue
        widths = book.without(p.boxes) if book is not None else {}
        gated = len(p.observations)
        for o in p.observations:
            ratio = model.ratio(o.group, gated)
            if ratio is None:
                continue
            typical = model.fit_for(o.group).typical_width
            a, b = p.boxes
            ahead, back = (p.label, f"{p.label}, reversed") if p.label else (f"{a} -> {b}", f"{b} -> {a}")
            for moved, base_s, name, reverse in ((o.moved, o.base_s, ahead, False),
                                                 (-o.moved, o.base_s * math.exp(o.moved), back, True)):
                width = o.width(widths, typical, reverse)
                cases.append((o.group, moved, base_s, width, math.log(ratio), name, p.today))
    return model, cases


def even(cases: Sequence[tuple], n: int = CASES_KEPT) -> tuple[tuple[float, ...], ...]:
    """``n`` cases spread evenly over the sorted moves (the extremes kept), rounded for the file."""
    ordered = sorted(cases)
    picked = ordered if len(ordered) <= n else [ordered[round(i * (len(ordered) - 1) / (n - 1))] for i in range(n)]
    return tuple((round(c[0], 6), float(f"{c[1]:.4g}"), round(c[2], 6), round(c[3], 6)) for c in picked)


def learn(seen: Sequence[PairSeen], **kwargs: Any) -> NoiseModel:
    """The model of every pair in ``seen``, with its out-of-sample cases (each box left out in turn)."""
    model = fit(seen, **kwargs)
    cases: dict[tuple, list[tuple]] = {}
    for box in sorted({b for p in seen for b in p.boxes}):
        for c in held_out(seen, box, **kwargs)[1]:
            cases.setdefault(c[0], []).append(c[1:5])
    return replace(model, fits=tuple(replace(f, held_out=even(cases.get(f.key, ()))) for f in model.fits))


def resolution(cases: Sequence[Sequence[float]], widths: Sequence[float], floor_s: float,
               slowdowns: Sequence[float]) -> float:
    """The smallest of ``slowdowns`` (ascending) flagged, by the gate's rule, in at least DETECTION of
    the out-of-sample ``cases`` (each at one of the real cells' ``widths`` in turn, at the threshold
    it met); NaN if none."""
    if not cases:
        return math.nan
    widths = list(widths) or [0.0]
    return smallest_caught([(moved, base_s, Rule(True, math.exp(log_ratio), floor_s, width=widths[i % len(widths)]))
                            for i, (moved, base_s, _, log_ratio) in enumerate(cases)], slowdowns)


def smallest_caught(judged: Sequence[tuple[float, float, Rule]], slowdowns: Sequence[float]) -> float:
    """The smallest of ``slowdowns`` (ascending) that ``is_slower`` flags in at least DETECTION of the
    ``(move, base seconds, rule)`` cases, each case's move times the slowdown; NaN if none.

    A larger slowdown moves every case further past the same rule, so the share caught only grows
    along ``slowdowns``: the smallest is found by bisection, a few of them tried instead of all."""
    if not judged:
        return math.nan

    def detected(f: float) -> bool:
        caught = sum(is_slower(Figure(base_s), Figure(base_s * math.exp(moved) * f), rule)
                     for moved, base_s, rule in judged)
        return caught >= DETECTION * len(judged)

    i = bisect.bisect_left(slowdowns, True, key=detected)
    return slowdowns[i] if i < len(slowdowns) else math.nan


SLOWDOWNS: tuple[float, ...] = tuple(round(1 + i / 200, 3) for i in range(1, 201))  # 1.005 .. 2.0
