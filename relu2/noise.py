"""The gate's noise model: how far identical code moves between two runs, per timing mode and band.

* **Bands by bytes against the L2**, not by element count: a kernel whose bytes fit in the L2 is
  timed from the L2 (and moves most between boxes), one of 1-4x the L2 is partly cached, one beyond
  4x the L2 streams from DRAM.  bytes = ``relu2.schema.bytes_moved``; the L2 comes from machine.json's
  ``l2_bytes`` (recorded by ``relu2.machine.machine_info`` from now on) or from ``KNOWN_L2``.
* **Learned, not chosen.**  ``learn_from`` takes every pair of runs in some results folders (same GPU
  model) and, per cell whose generated kernel did not change between the two (same fingerprint;
  the baseline and the roofline have none and never change) and whose figures are of a method the
  mode learns from (``relu2.schema.Mode.noise_versions``: today's, and earlier ones that differ only
  in how many processes and samples make a figure), the log of the ratio of the two medians.  Each
  pair is its own box-to-box draw, so A/A runs of earlier boxes keep teaching the tail.  Per mode and
  band it fits what the pairs moved (beyond each cell's width and the references' move, below) with
  an exponential tail beyond its 90th percentile (``TailFit``), never below the largest it saw: the
  tail of a handful of A/A runs is heavier than a normal's.
* **Each cell's own spread, learned from its rounds.**  A figure is the median of rounds, each a fresh
  process, and some cells are bimodal between processes (on the H200, kernels moving more than a
  gigabyte ran about 334 or 371 µs, a process's allocation deciding which): their median can jump
  by the gap between two runs of identical code.  Every run's rounds show that spread, so the model
  keeps, per cell and kernel, the widest log(max/min) of its rounds in any recorded run
  (``widths``); a cell with none recorded takes its band's median.  A cell is slower only beyond its
  width (or its base's rounds', if wider) times the band's ratio, and the band's tail is fitted to
  what the pairs moved beyond the widths: one bimodal cell no longer coarsens its whole band.
* **Relative to the references.**  Each pair's log ratios are taken after the median move of its
  reference cells (eager, copy) in the same mode and band, as the gate judges them
  (``relu2.verdict.reference_offsets``): a box faster as a whole is not noise of every cell.
* **Sized to a budget for the whole run.**  At most ``BUDGET`` (1 in 20) of the runs of unchanged
  code may fail: each of the N gated cells of a comparison gets ``BUDGET / N`` (Bonferroni), and
  its threshold is the fitted tail's quantile there.  N is counted per comparison, so a small run gets
  tighter thresholds than a full one.
* **Resolution by simulation.**  The model keeps an even sample of the recorded log ratios (with
  the base figure, for the floor, and the cell's width); the smallest slowdown detected in 90% of them
  is found by multiplying the head figure by a factor and applying the rule.

The learned model is ``relu2/noise_model.json``, written by ``relu2 noise learn`` (docs/methodology.md
records the command); the gate loads it by default.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from relu2.machine import UsageError
from relu2.schema import OK, quantile

DEFAULT_MODEL_PATH = Path(__file__).with_name("noise_model.json")
BUDGET = 0.05  # at most 1 run of unchanged code in 20 may fail: fewer and nobody trusts a FAIL
DETECTION = 0.90  # "resolution": the slowdown caught in at least this share of recorded cases
DEFAULT_FLOOR_S = 0.25e-6  # not learned: a slowdown of less than this is nothing anyone can act on
SIMULATION_SAMPLE = 400  # recorded (log ratio, base seconds) pairs kept per mode and band

# L2 per GPU model (bytes), for machine.json files that predate ``l2_bytes``.  H200: 60 MiB, torch's
# ``L2_cache_size`` on the lent H200 (``relu2 info``, docs/results.md's first paragraph).  H100 SXM
# and PCIe: 50 MiB (NVIDIA H100 Tensor Core GPU Architecture whitepaper, "50 MB L2 cache"; torch
# reports 52428800).  Matched by substring of machine.json's ``gpu``.
KNOWN_L2: Mapping[str, int] = {"H200": 60 * 2**20, "H100": 50 * 2**20}


@dataclass(frozen=True)
class Band:
    """Cells whose bytes moved lie in [lo, hi) times the L2."""

    name: str
    lo: float
    hi: float


BANDS: tuple[Band, ...] = (
    Band("in L2", 0.0, 1.0),
    Band("1-4x L2", 1.0, 4.0),
    Band("> 4x L2", 4.0, math.inf),
)
BAND_NAMES: tuple[str, ...] = tuple(b.name for b in BANDS)
LARGEST_BAND = BANDS[-1]


def band_of(bytes_moved: float, l2_bytes: int) -> Band:
    x = bytes_moved / l2_bytes
    return next(b for b in BANDS if b.lo <= x < b.hi)


def band_of_cell(cell, l2_bytes: int) -> str:
    """The band a decoded cell (``relu2.verdict.Cell``) is judged in: a summary figure in the largest
    (a mean is no noisier than its cells), any other cell by its bytes."""
    from relu2.verdict import SUMMARY

    return LARGEST_BAND.name if cell.measure == SUMMARY else band_of(cell.bytes, l2_bytes).name


def l2_of(machine: Mapping[str, Any]) -> int | None:
    """A machine's L2 in bytes: machine.json's ``l2_bytes``, else ``KNOWN_L2`` by GPU name, else None."""
    recorded = machine.get("l2_bytes")
    if recorded not in (None, "", "none"):
        try:
            return int(recorded)
        except (TypeError, ValueError):
            pass
    gpu = str(machine.get("gpu", ""))
    return next((size for name, size in KNOWN_L2.items() if name in gpu), None)


@dataclass(frozen=True)
class Rule:
    """When a slower figure counts: ``ratio`` times the cell's spread (head/base) AND ``floor_s``
    (head - base) exceeded.  ``width`` is the cell's recorded spread between processes, as a log
    (0: none); the ratio a cell must pass is ``ratio * exp(width)`` (``needed``)."""

    gated: bool
    ratio: float
    floor_s: float
    why: str = ""
    width: float = 0.0

    def needed(self, width: float | None = None) -> float:
        """The head/base ratio a cell of spread ``max(width, self.width)`` must exceed."""
        return self.ratio * math.exp(max(self.width, width or 0.0))


# --- the tail of |log ratio| ----------------------------------------------------------------------

TAIL_FROM = 0.90  # the body below this quantile of |log ratio| is read as recorded; the tail is fitted


@dataclass(frozen=True)
class TailFit:
    """|log(head/base)| of unchanged code: recorded up to its ``TAIL_FROM`` quantile ``knee``, an
    exponential tail of mean excess ``excess`` beyond (peaks over a threshold, generalized Pareto
    with shape 0).  Heavier than a normal's tail, and it needs no shape parameter, which the few
    hundred recorded cases of a band cannot pin down (a Student t's degrees of freedom came out
    anywhere between 1.5 and 100 on them, and its 1-in-40,000 quantile with them)."""

    knee: float
    excess: float
    mad: float = 0.0  # the median |log ratio|: the robust scale, for the record
    largest: float = 0.0  # the largest |log ratio| recorded

    def threshold(self, p: float) -> float:
        """The head/base ratio a cell of unchanged code exceeds (slower) with probability ``p``.  Never
        below the largest recorded: a quantile far beyond 1 in n that falls short of what n cases
        already showed says the fitted tail is too light, not that the case was impossible."""
        both_ways = 2 * p  # the fit is of |log ratio|: a slowdown is one side of it
        tail = 1 - TAIL_FROM
        if both_ways >= tail:
            return math.exp(self.knee)
        return math.exp(max(self.knee + self.excess * math.log(tail / both_ways), self.largest))


def fit_tail(log_ratios: Sequence[float]) -> TailFit:
    """The knee (``TAIL_FROM`` quantile of |log ratio|) and the mean excess over it."""
    mags = sorted(abs(r) for r in log_ratios)
    if not mags:
        return TailFit(0.0, 0.0)
    knee = mags[min(int(TAIL_FROM * len(mags)), len(mags) - 1)]
    over = [m - knee for m in mags if m > knee]
    return TailFit(knee, sum(over) / len(over) if over else 0.0, quantile(mags, 0.5) if mags else math.nan, mags[-1])


# --- the model ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    """One cell of unchanged code seen in two runs: the log of the ratio of its medians, the base
    figure, and the cell's width (its recorded spread between processes, a log)."""

    log_ratio: float
    base_s: float
    width: float = 0.0

    @property
    def residual(self) -> float:
        """How far the two runs moved beyond the cell's own spread (what the band's tail is fitted to)."""
        return max(0.0, abs(self.log_ratio) - self.width)


@dataclass(frozen=True)
class BandFit:
    """What the model knows about one (mode, band)."""

    mode: str
    band: str
    cells: int  # observations the fit used (cells x pairs of runs)
    pairs: int  # pairs of runs they came from
    knee: float
    excess: float
    mad: float
    max_ratio: float  # the largest head/base (either way) seen
    # (log ratio, base seconds, width), an even sample for simulation
    sample: tuple[tuple[float, ...], ...] = ()
    typical_width: float = 0.0  # the median width of the band's cells: the width of a cell with none recorded
    largest: float = 0.0  # the largest residual (log) the fit saw

    @property
    def fit(self) -> TailFit:
        return TailFit(self.knee, self.excess, self.mad, self.largest)


@dataclass(frozen=True)
class NoiseModel:
    """Per (mode, band) fits for one GPU model, plus how thresholds are sized."""

    gpu: str
    l2_bytes: int
    budget: float = BUDGET
    floor_s: float = DEFAULT_FLOOR_S
    fits: tuple[BandFit, ...] = ()
    sources: tuple[str, ...] = ()  # the results folders it was learned from, and what was left out
    command: str = ""
    widths: Mapping[str, float] = field(default_factory=dict)  # width_key -> log(max/min) of its rounds

    def fit_for(self, mode: str, band: str) -> BandFit | None:
        return next((f for f in self.fits if f.mode == mode and f.band == band), None)

    def width(self, key: str, mode: str, band: str) -> float:
        """A cell's recorded spread between processes (a log); its band's median when none is recorded."""
        if key in self.widths:
            return self.widths[key]
        f = self.fit_for(mode, band)
        return f.typical_width if f else 0.0

    def per_cell(self, gated_cells: int) -> float:
        """Each cell's share of the run's budget (Bonferroni)."""
        return self.budget / max(gated_cells, 1)

    def threshold(self, mode: str, band: str, gated_cells: int) -> float | None:
        """The head/base ratio a cell must exceed in a run of ``gated_cells`` gated cells; None when unfitted."""
        f = self.fit_for(mode, band)
        return f.fit.threshold(self.per_cell(gated_cells)) if f else None

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["fits"] = [{**asdict(f), "sample": [list(s) for s in f.sample]} for f in self.fits]
        out["widths"] = dict(sorted(self.widths.items()))
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "NoiseModel":
        fits = tuple(BandFit(**{**f, "sample": tuple(tuple(s) for s in f.get("sample", ()))}) for f in data["fits"])
        return cls(gpu=data["gpu"], l2_bytes=int(data["l2_bytes"]), budget=float(data["budget"]),
                   floor_s=float(data["floor_s"]), fits=fits, sources=tuple(data.get("sources", ())),
                   command=data.get("command", ""),
                   widths={str(k): float(v) for k, v in data.get("widths", {}).items()})


class NoiseModelError(UsageError):
    """The noise model file cannot be read."""


def load_model(path: str | Path = DEFAULT_MODEL_PATH) -> NoiseModel:
    try:
        return NoiseModel.from_json(json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise NoiseModelError(f"{path}: not a relu2 noise model ({e}); relu2 noise learn writes one") from None


def save_model(model: NoiseModel, path: str | Path) -> None:
    from relu2.results import atomic_write_text

    atomic_write_text(path, json.dumps(model.as_json(), indent=1, sort_keys=True) + "\n")


def even_sample(obs: Sequence[Observation], n: int = SIMULATION_SAMPLE) -> tuple[tuple[float, ...], ...]:
    """``n`` observations spread evenly over the sorted log ratios (the extremes always kept)."""
    ordered = sorted(obs, key=lambda o: (o.log_ratio, o.base_s, o.width))  # ties: in no order of reading
    if len(ordered) <= n:
        picked = ordered
    else:
        picked = [ordered[round(i * (len(ordered) - 1) / (n - 1))] for i in range(n)]
    return tuple((round(o.log_ratio, 6), float(f"{o.base_s:.4g}"), round(o.width, 6)) for o in picked)


def learn(observations: Mapping[tuple[str, str], Sequence[Observation]], pairs: Mapping[tuple[str, str], int], *,
          gpu: str, l2_bytes: int, budget: float = BUDGET, floor_s: float = DEFAULT_FLOOR_S,
          sources: Iterable[str] = (), command: str = "", widths: Mapping[str, float] | None = None,
          band_widths: Mapping[tuple[str, str], Sequence[float]] | None = None) -> NoiseModel:
    """Fit each (mode, band) from its observations (what they moved beyond their widths), both
    directions of each pair; ``band_widths``: the widths of each band's cells, for its typical one."""
    fits = []
    for (mode, band), obs in sorted(observations.items(), key=lambda kv: (kv[0][0], BAND_NAMES.index(kv[0][1]))):
        if not obs:
            continue
        t = fit_tail([o.residual for o in obs])
        typical = quantile(band_widths[(mode, band)], 0.5) if band_widths and band_widths.get((mode, band)) else 0.0
        fits.append(BandFit(mode, band, len(obs), pairs.get((mode, band), 0), round(t.knee, 6), round(t.excess, 6),
                            round(t.mad, 6), round(math.exp(max(abs(o.log_ratio) for o in obs)), 4), even_sample(obs),
                            round(typical, 6), round(t.largest, 6)))
    return NoiseModel(gpu, l2_bytes, budget, floor_s, tuple(fits), tuple(sources), command,
                      {k: round(v, 6) for k, v in (widths or {}).items()})


def detects(case: Sequence[float], slowdown: float, rule: Rule) -> bool:
    """Whether a recorded no-change cell ``(log ratio, base seconds[, width])``, its head made
    ``slowdown`` times slower, is flagged by ``rule`` (at the cell's recorded width)."""
    log_ratio, base_s = case[0], case[1]
    width = case[2] if len(case) > 2 else 0.0
    ratio = math.exp(log_ratio) * slowdown
    return ratio > rule.needed(width) and base_s * (ratio - 1) > rule.floor_s


SLOWDOWNS: tuple[float, ...] = tuple(round(1 + i / 200, 3) for i in range(1, 201))  # 1.005 .. 2.0


def resolution(sample: Sequence[Sequence[float]], rule: Rule, detection: float = DETECTION) -> float:
    """The smallest slowdown (of SLOWDOWNS) flagged in at least ``detection`` of the recorded cases; NaN if none.

    Each recorded case is used both ways round (a pair of runs has no direction), at its own width."""
    cases = [tuple(c) for c in sample] + [(-c[0], c[1] * math.exp(c[0]), *c[2:]) for c in sample]
    if not cases:
        return math.nan
    for f in SLOWDOWNS:
        if sum(detects(c, f, rule) for c in cases) >= detection * len(cases):
            return f
    return math.nan


@dataclass(frozen=True)
class Resolution:
    """The rule for one mode and band in one comparison, and the smallest slowdown it catches 90% of the time."""

    mode: str
    band: str
    gated: bool
    ratio: float
    floor_s: float
    fastest_s: float  # the smallest base median in the band
    smallest_detectable: float  # simulated on the model's recorded no-change cases (NaN: not known)
    per_cell: float = math.nan  # the false-flag probability each cell is allowed
    cells: int = 0  # gated cells of this mode and band in this comparison
    learned_from: int = 0  # recorded no-change cases behind the rule
    notes: list[str] = field(default_factory=list)


# --- learning from recorded runs --------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One commit measured on one machine, in one results folder."""

    folder: str
    machine: str
    commit: str
    gpu: str
    l2_bytes: int | None
    records: tuple = ()

    @property
    def name(self) -> str:
        return f"{Path(self.folder).name}/{self.machine}@{self.commit[:8]}"


def runs_in(results_dir: str | Path, exclude_machines: Sequence[str] = ()) -> list[Run]:
    """Every (machine, commit) with results in ``results_dir``, but those of ``exclude_machines``.

    Ordered by machine, commit date and hash, never by the git graph (as ``commits`` breaks ties):
    a pair's direction decides whose figure is its base, and the model learned must be the same in
    a clone that lacks a branch of the commits measured."""
    from relu2.asv_results import commit_dates, load_records, machine_info, machines

    out = []
    for m in machines(results_dir):
        if m in exclude_machines:
            continue
        info = machine_info(results_dir, m)
        dates = commit_dates(results_dir, m)
        for c in sorted(dates, key=lambda h: (dates[h], h)):
            out.append(Run(str(results_dir), m, c, str(info.get("gpu", "")), l2_of(info),
                           tuple(load_records(results_dir, m, c))))
    return out


def no_change_pairs(runs: Sequence[Run]) -> list[tuple[Run, Run]]:
    """Every pair of runs of one folder and one GPU model: an A/A across boxes, or two commits
    (whose unchanged cells ``observe`` picks out by kernel fingerprint)."""
    return [(a, b) for i, a in enumerate(runs) for b in runs[i + 1:]
            if a.folder == b.folder and a.gpu == b.gpu and a.gpu.lower() not in ("", "none")]


def width_key(cell, kernel: str | None) -> str:
    """What a width is recorded under: the measurement (mode, implementation, dtype, shape, other
    parameters; any suite) and the kernel that ran (its fingerprint; "" for eager and copy)."""
    extras = ",".join(f"{k}={v}" for k, v in cell.extras)
    return "|".join((cell.measure, cell.impl, cell.dtype, cell.shape, extras, kernel or ""))


def round_width(samples: Sequence[float] | None) -> float:
    """log(max/min) of per-round figures (0 for fewer than two)."""
    clean = [s for s in samples or () if s is not None and s > 0 and not math.isnan(s)]
    return math.log(max(clean) / min(clean)) if len(clean) >= 2 else 0.0


def widths_of(runs: Sequence[Run], l2_bytes: int) -> tuple[dict[str, float], dict[tuple[str, str], list[float]]]:
    """Per cell and kernel, the widest spread of its rounds in any of ``runs`` (today's methods only);
    and, per (mode, band), the widths of its cells (for the band's typical width)."""
    from relu2.schema import mode as mode_named
    from relu2.verdict import GATED_MODES, Figure, entries, fingerprints, kernel_of

    out: dict[str, float] = {}
    bands: dict[str, tuple[str, str]] = {}
    for run in runs:
        table = entries(run.records)
        kernels = fingerprints(table)
        for e in table.values():
            cell, record = e.cell, e.record
            figure = Figure.of(record) if record.status == OK else None
            if (cell.measure not in GATED_MODES or figure is None or not figure.rounds
                    or record.version != mode_named(cell.measure).asv_version):
                continue
            key = width_key(cell, kernel_of(cell, kernels))
            out[key] = max(out.get(key, 0.0), figure.width)
            bands[key] = (cell.measure, band_of_cell(cell, l2_bytes))
    by_band: dict[tuple[str, str], list[float]] = {}
    for key, w in out.items():
        by_band.setdefault(bands[key], []).append(w)
    return out, by_band


def observe(a: Run, b: Run, l2_bytes: int,
            widths: Mapping[str, float] | None = None) -> dict[tuple[str, str], list[Observation]]:
    """Per (gated mode, band): the cells of unchanged code ok in both runs, as observations.  Only
    figures of the methods the mode learns its noise from count (``relu2.schema.Mode.noise_versions``),
    both runs of one method."""
    from relu2.schema import mode as mode_named
    from relu2.verdict import GATED_MODES, Figure, entries, fingerprints, kernel_of, kernel_unchanged, \
        reference_offsets

    widths = widths or {}
    ta, tb = entries(a.records), entries(b.records)
    ka, kb = fingerprints(ta), fingerprints(tb)
    kept = []
    for key, ea in ta.items():
        eb = tb.get(key)
        cell = ea.cell
        if (eb is None or cell.measure not in GATED_MODES or ea.record.status != OK or eb.record.status != OK
                or ea.record.version != eb.record.version
                or ea.record.version not in mode_named(cell.measure).noise_versions
                or not kernel_unchanged(cell, ka, kb) or not ea.record.value or not eb.record.value):
            continue
        kept.append((ea, math.log(eb.record.value / ea.record.value)))
    # As the gate judges them: after the move of the pair's references in the cell's mode and band.
    band = partial(band_of_cell, l2_bytes=l2_bytes)
    offsets = reference_offsets(((e.cell, lr) for e, lr in kept), band)
    out: dict[tuple[str, str], list[Observation]] = {}
    for ea, log_ratio in kept:
        cell = ea.cell
        band_name = band(cell)
        width = max(widths.get(width_key(cell, kernel_of(cell, ka)), 0.0), Figure.of(ea.record).width)
        moved = log_ratio - offsets.get((cell.measure, band_name), 0.0)
        out.setdefault((cell.measure, band_name), []).append(Observation(moved, float(ea.record.value), width))
    return out


def learn_from(runs: Sequence[Run], *, budget: float = BUDGET, floor_s: float = DEFAULT_FLOOR_S,
               sources: Iterable[str] = (), command: str = "") -> NoiseModel:
    """The model of the GPU model most runs were measured on, from every no-change pair among them."""
    gpus = [r.gpu for r in runs if r.gpu.lower() not in ("", "none")]
    if not gpus:
        raise NoiseModelError("no GPU runs to learn from (a CPU machine's timings are not gated)")
    gpu = max(set(gpus), key=gpus.count)
    l2 = next((r.l2_bytes for r in runs if r.gpu == gpu and r.l2_bytes), None)
    if l2 is None:
        raise NoiseModelError(f"no L2 size known for {gpu!r}: record l2_bytes in machine.json")
    mine = [r for r in runs if r.gpu == gpu]
    widths, band_widths = widths_of(mine, l2)
    obs: dict[tuple[str, str], list[Observation]] = {}
    pair_count: dict[tuple[str, str], int] = {}
    for a, b in no_change_pairs(mine):
        for key, seen in observe(a, b, l2, widths).items():
            obs.setdefault(key, []).extend(seen)
            pair_count[key] = pair_count.get(key, 0) + 1
    return learn(obs, pair_count, gpu=gpu, l2_bytes=l2, budget=budget, floor_s=floor_s, sources=sources,
                 command=command, widths=widths, band_widths=band_widths)
