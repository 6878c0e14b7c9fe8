"""The regression gate: compare two commits' recorded asv results and say whether head got worse.

``asv compare`` always exits 0 and ``asv continuous`` exits 2 without a word when any benchmark
failed, so the gate is this small layer over asv's results API.  What it knows that asv does not:

* **How much identical code moves.**  A change is a regression only beyond what two runs of the
  same code on two freshly started boxes differ by (the A/A data in docs/results.md).  The noise
  model below holds, per timing mode and size band, the ratio a slowdown must exceed and an absolute
  floor it must exceed too (0.08 µs on a 1.1 µs kernel is not a regression anyone can act on); on
  top, the difference must be significant by asv's own statistics (``asv._stats.is_different``:
  Mann-Whitney U on the stored samples, or non-overlapping 99% confidence intervals).
* **Which modes it can judge.**  hot and cold are gated.  launch (host wall clock) moved 0.39-1.91x
  between two boxes of identical code: it is reported, never failing, unless ``--gate-launch``.
* **Silence is not success.**  A cell that had a result at BASE and has none at HEAD (failed,
  skipped, missing, its benchmark gone) fails the gate unless ``--allow-missing`` names it.
* **What ran.**  When a compiled path's figure moved, the report says whether the generated kernel
  changed (``track_kernel`` fingerprints).

Exit 0: no finding; 1: a regression, a new failure or a vanished cell; 2: unusable input.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from relu2.asv_results import (
    DEFAULT_DTYPE,
    Record,
    ResultsError,
    commit_dates,
    iso_date,
    load_records,
    machine_info,
    machines,
    resolve_commit,
)
from relu2.schema import MODE_NAMES, OK, geometry_numel, kernel_hex, quantile


class GateInputError(ResultsError):
    """The gate cannot judge: no results, unknown or ambiguous commit, ambiguous machine, unreadable file."""


# --- the noise model ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Band:
    """A range of input sizes (elements) that share a noise rule."""

    name: str
    lo: int
    hi: float  # exclusive; math.inf for the last


BANDS: tuple[Band, ...] = (
    Band("< 2^20", 0, 2**20),
    Band("2^20 .. 2^22", 2**20, 2**22),
    Band(">= 2^22", 2**22, math.inf),
)


def band_of(numel: int) -> Band:
    return next(b for b in BANDS if b.lo <= numel < b.hi)


@dataclass(frozen=True)
class Rule:
    """When a slower figure counts: ``ratio`` (head/base) AND ``floor_s`` (head - base) exceeded."""

    gated: bool
    ratio: float
    floor_s: float
    why: str = ""


# Measured, not chosen: two runs of 0b29c8e on two freshly started H200 boxes (docs/aa, the spread
# table in docs/results.md) moved at most 1.043x at 2^22 elements and up (cold, a 37 µs cell), 1.074x
# between 2^20 and 2^22 (a dynamic-shape compiled kernel of 5 µs) and up to 0.21 µs on the
# microsecond cells below.  Each rule sits just above that; between two runs on one box the
# compiled kernels of 2^20 elements moved up to 1.092x, hence 1.10 there.
KERNEL_TIME_RULES: dict[str, Rule] = {
    "< 2^20": Rule(True, 1.05, 0.25e-6),
    "2^20 .. 2^22": Rule(True, 1.10, 0.25e-6),
    ">= 2^22": Rule(True, 1.045, 0.0),
}
LAUNCH_WHY = ("host wall clock: identical code moved 0.39-1.91x between two freshly started boxes "
              "(docs/results.md), so launch is reported, not gated; --gate-launch RATIO gates it")
UNKNOWN_MODE_WHY = "no A/A data for this mode: reported, not gated"
CPU_WHY = ("a CPU machine (machine.json: gpu none): on a shared 2-core CPU, two commits with the same "
           "kernels moved up to 3.6x (results/cpu-2core), so its timings are reported, not gated; --factor "
           "gates them")
PEAK_MEMORY_RATIO = 1.01  # deterministic for identical code: any growth past rounding is real


def rule_for(mode: str, numel: int, factor: float | None = None, floor_s: float | None = None,
             gate_launch: float | None = None, cpu: bool = False) -> Rule:
    """The rule a timing cell of ``mode`` and ``numel`` elements is judged by (with any overrides).

    The ratios and floors were measured on a GPU; a CPU machine's timings are reported, not gated,
    unless ``factor`` says how much they may move.
    """
    if cpu and factor is None:
        return Rule(False, 1.10, 0.0 if floor_s is None else floor_s, CPU_WHY)
    if mode in ("hot", "cold"):
        base = KERNEL_TIME_RULES[band_of(numel).name]
        return Rule(True, factor or base.ratio, base.floor_s if floor_s is None else floor_s)
    if mode == "launch":
        if gate_launch:
            return Rule(True, gate_launch, 0.0 if floor_s is None else floor_s, "gated by --gate-launch")
        return Rule(False, factor or 1.10, 0.0 if floor_s is None else floor_s, LAUNCH_WHY)
    return Rule(False, factor or 1.10, 0.0, UNKNOWN_MODE_WHY)


# --- findings -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """One cell compared between base and head."""

    label: str  # "Grid.track_hot(impl=fused, dtype=bfloat16, numel=16777216)"
    benchmark: str
    params: tuple[tuple[str, str], ...]
    unit: str
    base: float | None  # None: failed; NaN: skipped
    head: float | None
    threshold: float = float("nan")
    kernel: str = ""  # "3f2a9c1b0e4d -> 77c0a1e2f9b3" when the generated kernel changed, "same" when not

    @property
    def ratio(self) -> float:
        """head / base (NaN when either is not a number)."""
        if not _is_number(self.base) or not _is_number(self.head) or self.base == 0:
            return float("nan")
        return self.head / self.base

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["params"] = dict(self.params)
        out["ratio"] = None if math.isnan(self.ratio) else self.ratio
        for key in ("base", "head", "threshold"):
            if isinstance(out[key], float) and math.isnan(out[key]):
                out[key] = None
        return out


@dataclass(frozen=True)
class Resolution:
    """The smallest slowdown the gate flags for one mode and size band, on the base's figures."""

    mode: str
    band: str
    gated: bool
    ratio: float
    floor_s: float
    fastest_s: float  # the smallest base median in the band
    smallest_detectable: float  # as a ratio: max(ratio, 1 + floor / fastest)


@dataclass
class GateReport:
    """What the gate found between two commits (on one machine, or one per side)."""

    base_machine: str
    head_machine: str
    base: str  # full hashes
    head: str
    compared: int = 0
    regressions: list[Change] = field(default_factory=list)
    new_failures: list[Change] = field(default_factory=list)
    vanished: list[Change] = field(default_factory=list)  # ok at base; skipped or missing at head
    allowed: list[Change] = field(default_factory=list)  # vanished, but --allow-missing names them
    not_gated: list[Change] = field(default_factory=list)  # beyond the threshold in a mode not gated
    improvements: list[Change] = field(default_factory=list)
    resolution: list[Resolution] = field(default_factory=list)
    spread: list[Spread] = field(default_factory=list)
    base_date: str = ""
    head_date: str = ""
    cpu: bool = False  # both machines measured on the CPU: timings reported, not gated (without --factor)
    overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def machine(self) -> str:
        return self.base_machine if self.base_machine == self.head_machine else f"{self.base_machine} -> {self.head_machine}"

    @property
    def nothing_compared(self) -> str:
        """Why no cell could be compared ("" when some were): a gate that compared nothing passed nothing."""
        if self.compared:
            return ""
        return (f"base {self.base[:8]} on {self.base_machine} has no ok figure to compare with "
                "(its result file holds none): no comparison is not a pass")

    @property
    def exit_code(self) -> int:
        """1 when head regressed, newly fails or lost a cell somewhere, or nothing was compared; else 0."""
        return 1 if self.regressions or self.new_failures or self.vanished or self.nothing_compared else 0

    @property
    def verdict(self) -> str:
        return "FAIL" if self.exit_code else "PASS"

    def summary(self) -> str:
        return (f"{_count(self.regressions, 'regression')}, {_count(self.new_failures, 'new failure')}, "
                f"{_count(self.vanished, 'vanished cell')}; {_count(self.improvements, 'improvement')}, "
                f"{len(self.not_gated)} not gated; {self.compared} cells compared")

    def notes(self) -> list[str]:
        """What a reader must know before the tables: nothing compared; one commit on two machines."""
        notes = [self.nothing_compared] if self.nothing_compared else []
        if self.base == self.head:
            notes.append(f"base and head are one commit ({self.base[:8]}): an A/A between "
                         f"{self.base_machine} and {self.head_machine}")
        return notes

    def header(self) -> str:
        return (f"base {self.base[:8]} on {self.base_machine} ({self.base_date}) -> "
                f"head {self.head[:8]} on {self.head_machine} ({self.head_date})")

    # -- formats --------------------------------------------------------------------------------

    def format(self) -> str:
        """Plain text: verdict first, then each finding, then the resolution."""
        lines = [f"relu2 gate: {self.verdict} (exit {self.exit_code}): {self.summary()}", self.header()]
        lines += [f"relu2 gate: {note}" for note in self.notes()]
        lines += _table("REGRESSIONS (slower beyond the noise model, significant)", self.regressions)
        lines += _table("NEW FAILURES (ok at base, failed at head; see the asv log)", self.new_failures)
        lines += _table("VANISHED (ok at base, no result at head: skipped, missing or benchmark gone)", self.vanished)
        lines += _table("ALLOWED TO VANISH (--allow-missing)", self.allowed)
        lines += _table(f"NOT GATED ({self._not_gated_why()})", self.not_gated, limit=10)
        lines += _table("IMPROVEMENTS (faster beyond the noise model, significant)", self.improvements, limit=10)
        lines += ["", "RESOLUTION (the smallest slowdown flagged, per mode and size band, on base's figures)"]
        lines += ["  " + line for line in _resolution_lines(self.resolution)]
        return "\n".join(lines)

    def markdown(self) -> str:
        """A pull-request comment: verdict first, then the flagged cells, then the resolution."""
        mark = "❌" if self.exit_code else "✅"
        lines = [f"### {mark} relu2 gate: {self.verdict}", "", f"{self.summary()}.", "", self.header().replace("->", "→")]
        lines += [f"\n**{note}**" for note in self.notes()]
        for title, changes in (("Regressions", self.regressions), ("New failures", self.new_failures),
                               ("Vanished cells", self.vanished)):
            if changes:
                lines += ["", f"#### {title}", "", "| ratio | base | head | cell | kernel |", "|---:|---:|---:|---|---|"]
                lines += [f"| {_ratio(c)} | {format_value(c.base, c.unit)} | {format_value(c.head, c.unit)} | "
                          f"`{c.label}` | {c.kernel} |" for c in changes]
        if self.not_gated or self.improvements:
            lines += ["", "<details><summary>Not gated and improvements</summary>", "",
                      f"Not gated: {self._not_gated_why()}.", "",
                      "| ratio | base | head | cell |", "|---:|---:|---:|---|"]
            lines += [f"| {_ratio(c)} | {format_value(c.base, c.unit)} | {format_value(c.head, c.unit)} | `{c.label}` |"
                      for c in self.not_gated[:20] + self.improvements[:20]]
            lines += ["", "</details>"]
        lines += ["", "#### Resolution", "", "| mode | size | gated | ratio | floor | smallest flagged |",
                  "|---|---|---|---:|---:|---:|"]
        for r in self.resolution:
            lines.append(f"| {r.mode} | {r.band} | {'yes' if r.gated else 'no'} | {_threshold(r.ratio)} | "
                         f"{format_value(r.floor_s, 'seconds')} | {_detectable(r)} |")
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        """Machine-readable, stable keys (documented in docs/tracking.md)."""
        return {
            "verdict": self.verdict.lower(),
            "exit_code": self.exit_code,
            "base": {"commit": self.base, "machine": self.base_machine, "date": self.base_date},
            "head": {"commit": self.head, "machine": self.head_machine, "date": self.head_date},
            "compared": self.compared,
            "regressions": [c.as_json() for c in self.regressions],
            "new_failures": [c.as_json() for c in self.new_failures],
            "vanished": [c.as_json() for c in self.vanished],
            "allowed_to_vanish": [c.as_json() for c in self.allowed],
            "not_gated": [c.as_json() for c in self.not_gated],
            "improvements": [c.as_json() for c in self.improvements],
            "resolution": [asdict(r) for r in self.resolution],
            "spread": [asdict(s) for s in self.spread],
            "cpu": self.cpu,
            "overrides": self.overrides,
        }

    def _not_gated_why(self) -> str:
        return CPU_WHY if self.cpu and "factor" not in self.overrides else LAUNCH_WHY

    def render(self, fmt: str) -> str:
        if fmt == "json":  # strict JSON: NaN is no JSON value, and clients other than Python reject it
            return json.dumps(_json_safe(self.as_json()), indent=2, sort_keys=True, allow_nan=False)
        return self.markdown() if fmt == "markdown" else self.format()


# ---------------------------------------------------------------------------------------------
# pure helpers


def _json_safe(value: Any) -> Any:
    """``value`` with every non-finite float (no figure) as None, which JSON spells null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _is_number(x: float | None) -> bool:
    return x is not None and not math.isnan(x)


def _count(items: list, noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def _three_digits(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def _threshold(x: float) -> str:
    """A noise-model ratio as written: 1.05x, 1.1x, 1.045x."""
    return f"{x:.3f}".rstrip("0").rstrip(".") + "x"


def _ratio(c: Change) -> str:
    return f"{c.ratio:.2f}x" if _is_number(c.ratio) else "-"


def _detectable(r: Resolution) -> str:
    if not r.gated:
        return "not gated"
    if not _is_number(r.fastest_s):
        return _threshold(r.ratio)
    return f"{_threshold(r.smallest_detectable)} (at {format_value(r.fastest_s, 'seconds')})"


def format_value(value: float | None, unit: str) -> str:
    """A figure in a readable unit: seconds as ns/µs/ms/s, bytes as KiB/MiB/GiB; "failed"/"n/a" otherwise."""
    if value is None:
        return "failed"
    if math.isnan(value):
        return "n/a"
    if unit == "seconds":
        for scale, suffix in ((1e-6, "ns"), (1e-3, "µs"), (1.0, "ms")):
            if abs(value) < scale:
                return f"{_three_digits(value / scale * 1e3)} {suffix}"
        return f"{_three_digits(value)} s"
    if unit == "bytes":
        for scale, suffix in ((2**10, "B"), (2**20, "KiB"), (2**30, "MiB")):
            if abs(value) < scale:
                return f"{_three_digits(value / scale * 2**10)} {suffix}"
        return f"{_three_digits(value / 2**30)} GiB"
    return f"{value:.4g} {unit}".strip()


def _table(title: str, changes: list[Change], limit: int | None = None) -> list[str]:
    if not changes:
        return []
    shown = changes[:limit] if limit else changes
    rows = [(_ratio(c), format_value(c.base, c.unit), format_value(c.head, c.unit),
             c.label + (f"  [kernel {c.kernel}]" if c.kernel and c.kernel != "same" else "")) for c in shown]
    header = ("ratio", "base", "head", "cell")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    out = ["", f"{title}: {len(changes)}"]
    for r in [header, *rows]:
        out.append("  " + "  ".join(r[i].rjust(widths[i]) for i in range(3)) + "  " + r[3])
    if limit and len(changes) > limit:
        out.append(f"  ... and {len(changes) - limit} more (--format json lists every one)")
    return out


def _resolution_lines(resolution: Sequence[Resolution]) -> list[str]:
    rows = [("mode", "size", "ratio", "floor", "smallest flagged")]
    rows += [(r.mode, r.band, _threshold(r.ratio) if r.gated else "-", format_value(r.floor_s, "seconds") if r.gated else "-",
              _detectable(r)) for r in resolution]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return ["  ".join(row[i].ljust(widths[i]) for i in range(5)) for row in rows]


def is_significant(base: Record, head: Record) -> bool:
    """Whether two ok cells differ: asv's own test, or interquartile ranges that do not overlap.

    asv's test (Mann-Whitney U at p < 0.002 on the samples, else non-overlapping 99% confidence
    intervals) needs every one of nine samples on its side; the first replays of a long graph are
    often slower, and two such samples hid a 9% step on 2^28 elements (the detection run in
    docs/results.md).  Separate quartiles say the same thing without being thrown by them.  With
    no statistics to test with, True.
    """
    from asv import _stats

    if not base.stats or not head.stats or base.stats.get("repeat", 0) == 1 or head.stats.get("repeat", 0) == 1:
        return True
    if not all(k in s for s in (base.stats, head.stats) for k in ("ci_99_a", "ci_99_b")):
        return True
    if _apart(base.stats, head.stats):
        return True
    return bool(_stats.is_different(base.samples, head.samples, base.stats, head.stats))


def _apart(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """True when the interquartile ranges of two cells' samples do not overlap."""
    try:
        lo_a, hi_a, lo_b, hi_b = (float(x) for x in (a["q_25"], a["q_75"], b["q_25"], b["q_75"]))
    except (KeyError, TypeError, ValueError):
        return False
    return hi_a < lo_b or hi_b < lo_a


def _mode(record: Record) -> str | None:
    method = record.benchmark.rsplit(".", 1)[-1]
    mode = method.removeprefix("track_")
    return mode if record.unit == "seconds" and mode in MODE_NAMES else None


def _kernel_change(base_kernels: dict, head_kernels: dict, record: Record) -> str:
    key = (record.benchmark.rsplit(".", 1)[0], record.params)
    b, h = base_kernels.get(key), head_kernels.get(key)
    if b is None or h is None:
        return ""
    return "same" if b == h else f"{b} -> {h}"


def _kernels(records: list[Record]) -> dict:
    return {(r.benchmark.rsplit(".", 1)[0], r.params): kernel_hex(r.value)
            for r in records if r.benchmark.endswith(".track_kernel") and r.status == "ok"}


@dataclass(frozen=True)
class Options:
    """What the command line may change in the noise model; None keeps the default.  ``cpu``: the
    machines compared measured on the CPU (their timings are reported, not gated)."""

    factor: float | None = None
    floor_s: float | None = None
    gate_launch: float | None = None
    allow_missing: tuple[str, ...] = ()
    cpu: bool = False


def compare(base: dict[Any, Record], head: dict[Any, Record], options: Options = Options(),
            base_kernels: dict | None = None, head_kernels: dict | None = None) -> dict[str, list]:
    """Sort the cells of two commits into regressions, new failures, vanished, not gated, improvements."""
    out: dict[str, list] = {k: [] for k in ("regressions", "new_failures", "vanished", "allowed", "not_gated",
                                            "improvements")}
    base_kernels, head_kernels = base_kernels or {}, head_kernels or {}
    for key, b in base.items():
        if b.status != "ok" or b.benchmark.endswith(".track_kernel"):
            continue  # nothing to regress from; a fingerprint is annotation, not a figure
        h = head.get(key)
        change = Change(label=b.label(), benchmark=b.benchmark, params=b.params, unit=b.unit, base=b.value,
                        head=h.value if h is not None else float("nan"))
        if h is None or h.status == "skipped":
            allowed = any(fnmatch.fnmatchcase(b.label(), p) for p in options.allow_missing)
            out["allowed" if allowed else "vanished"].append(change)
            continue
        if h.status == "failed":
            out["new_failures"].append(change)
            continue
        mode = _mode(b)
        if mode is None:  # peak memory: deterministic
            if b.unit == "bytes" and h.value > b.value * PEAK_MEMORY_RATIO:
                out["regressions"].append(Change(**{**asdict(change), "params": b.params,
                                                    "threshold": PEAK_MEMORY_RATIO}))
            continue
        rule = rule_for(mode, geometry_numel(dict(b.params)), options.factor, options.floor_s, options.gate_launch,
                        options.cpu)
        slower = h.value > b.value * rule.ratio and h.value - b.value > rule.floor_s
        faster = h.value < b.value / rule.ratio and b.value - h.value > rule.floor_s
        if not (slower or faster) or not is_significant(b, h):
            continue
        found = Change(**{**asdict(change), "params": b.params, "threshold": rule.ratio,
                          "kernel": _kernel_change(base_kernels, head_kernels, b)})
        if not rule.gated:
            out["not_gated"].append(found)
        elif faster:
            out["improvements"].append(found)
        else:
            out["regressions"].append(found)
    for name in ("regressions", "not_gated"):
        out[name].sort(key=lambda c: -c.ratio if _is_number(c.ratio) else 0)
    out["improvements"].sort(key=lambda c: c.ratio)
    return out


def resolution(base: Sequence[Record], options: Options = Options()) -> list[Resolution]:
    """Per mode and band: the rule, the fastest base figure in it, and the smallest slowdown flagged there."""
    fastest: dict[tuple[str, str], float] = {}
    for r in base:
        mode = _mode(r)
        if mode is None or r.status != "ok":
            continue
        band = band_of(geometry_numel(dict(r.params))).name
        fastest[(mode, band)] = min(fastest.get((mode, band), math.inf), r.value)
    out = []
    for mode in MODE_NAMES:
        for band in BANDS:
            rule = rule_for(mode, band.lo, options.factor, options.floor_s, options.gate_launch, options.cpu)
            quickest = fastest.get((mode, band.name), math.nan)
            detect = max(rule.ratio, 1 + rule.floor_s / quickest) if _is_number(quickest) else rule.ratio
            out.append(Resolution(mode, band.name, rule.gated, rule.ratio, rule.floor_s, quickest, detect))
    return out


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


def spread(base: dict[Any, Record], head: dict[Any, Record]) -> list[Spread]:
    """Per implementation and timing mode, the distribution of head/base over the cells ok in both.

    Run on two measurements of one commit (two boxes, ``--base-machine``/``--head-machine``) it is
    the A/A data a noise model is set from.  A cell measured once but listed by several suites counts once.
    """
    ratios: dict[tuple[str, str], dict[tuple, float]] = {}
    for key, b in base.items():
        h, mode = head.get(key), _mode(b)
        if mode is None or h is None or b.status != "ok" or h.status != "ok" or not b.value:
            continue
        params = dict(b.params)
        cell = (params.get("dtype", DEFAULT_DTYPE), geometry_numel(params), params.get("tokens"), b.value)
        ratios.setdefault((params["impl"], mode), {})[cell] = h.value / b.value
    out = []
    for (impl, mode), cells in ratios.items():
        values = sorted(cells.values())
        out.append(Spread(impl, mode, len(values), quantile(values, 0.5), quantile(values, 0.1), quantile(values, 0.9),
                          max(values, key=lambda r: max(r, 1 / r))))
    order = {m: i for i, m in enumerate(MODE_NAMES)}
    from relu2.schema import impl_order

    ranks = {name: i for i, name in enumerate(impl_order({s.impl for s in out}))}
    return sorted(out, key=lambda s: (ranks[s.impl], order.get(s.mode, 99)))


def format_spread(rows: Sequence[Spread], markdown: bool = False) -> str:
    """The spread table: one line per implementation and mode."""
    header = ("impl", "mode", "cells", "median", "p10", "p90", "max")
    body = [(s.impl, s.mode, str(s.cells), f"{s.median:.3f}", f"{s.p10:.3f}", f"{s.p90:.3f}", f"{s.max:.3f}")
            for s in rows]
    if markdown:
        return "\n".join(["| " + " | ".join(header) + " |", "|---|---|---:|---:|---:|---:|---:|"] +
                         ["| " + " | ".join(r) + " |" for r in body])
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    return "\n".join("  ".join(r[i].rjust(widths[i]) if i > 1 else r[i].ljust(widths[i]) for i in range(len(r)))
                     for r in [header, *body])


def _by_key(records: list[Record]) -> dict[Any, Record]:
    # When one commit has results from several environments, the most recently run one wins.
    return {r.key: r for r in sorted(records, key=lambda r: r.started_at)}


# ---------------------------------------------------------------------------------------------
# the gate


def pick_machine(results_dir: str | os.PathLike, machine: str | None) -> str:
    """``machine`` if it has results; the only machine when None; GateInputError otherwise."""
    try:
        known = machines(results_dir)
    except ResultsError as e:
        raise GateInputError(str(e)) from None
    if machine is not None:
        if machine not in known:
            raise GateInputError(f"no results for machine {machine!r} in {results_dir} "
                                 f"(machines: {', '.join(known) or 'none'})")
        return machine
    if not known:
        raise GateInputError(f"no asv results in {results_dir} (no <machine>/machine.json with results)")
    if len(known) > 1:
        raise GateInputError(f"several machines in {results_dir}: {', '.join(known)}; choose one with --machine "
                             "(or --base-machine and --head-machine)")
    return known[0]


def gate(
    results_dir: str | os.PathLike, base: str, head: str, machine: str | None = None, factor: float | None = None,
    *, base_machine: str | None = None, head_machine: str | None = None, floor_s: float | None = None,
    gate_launch: float | None = None, allow_missing: Sequence[str] = (), with_spread: bool = False,
) -> GateReport:
    """Compare ``head`` against ``base`` (any git ref, hash or unique prefix) in a results folder.

    ``machine`` names the machine of both sides; ``base_machine``/``head_machine`` one side each
    (two sessions of one commit, an H100 against an H200).  ``factor`` and ``floor_s`` override the
    noise model's ratio and floor for every gated cell; ``gate_launch`` gates launch at that ratio;
    ``allow_missing`` holds fnmatch patterns of cell labels allowed to vanish.  Raises
    GateInputError (a ResultsError) when the input is unusable.
    """
    if factor is not None and not factor >= 1.0:
        raise GateInputError(f"factor must be >= 1, got {factor}")
    if gate_launch is not None and not gate_launch >= 1.0:
        raise GateInputError(f"--gate-launch must be >= 1, got {gate_launch}")
    if floor_s is not None and not floor_s >= 0:
        raise GateInputError(f"floor must be >= 0, got {floor_s}")
    bm = pick_machine(results_dir, base_machine or machine)
    hm = pick_machine(results_dir, head_machine or machine)
    try:
        cpu = all(str(machine_info(results_dir, m).get("gpu", "")).lower() == "none" for m in (bm, hm))
    except ResultsError as e:
        raise GateInputError(str(e)) from None
    options = Options(factor, floor_s, gate_launch, tuple(allow_missing), cpu)
    try:
        base_full = resolve_commit(results_dir, base, bm)
        head_full = resolve_commit(results_dir, head, hm)
        base_records = load_records(results_dir, bm, base_full)
        head_records = load_records(results_dir, hm, head_full)
        base_dates, head_dates = commit_dates(results_dir, bm), commit_dates(results_dir, hm)
    except GateInputError:
        raise
    except ResultsError as e:
        raise GateInputError(str(e)) from None
    if base_full == head_full and bm == hm:
        raise GateInputError(f"base {base!r} and head {head!r} are one commit ({base_full[:8]}) on one machine "
                             f"({bm}): nothing to compare; an A/A across two machines takes --base-machine and "
                             "--head-machine")
    base_by_key, head_by_key = _by_key(base_records), _by_key(head_records)
    found = compare(base_by_key, head_by_key, options, _kernels(base_records), _kernels(head_records))
    return GateReport(
        base_machine=bm, head_machine=hm, base=base_full, head=head_full,
        compared=sum(1 for r in base_by_key.values() if r.status == OK and not r.benchmark.endswith(".track_kernel")),
        base_date=iso_date(base_dates.get(base_full))[:10], head_date=iso_date(head_dates.get(head_full))[:10],
        resolution=resolution(list(base_by_key.values()), options),
        spread=spread(base_by_key, head_by_key) if with_spread else [], cpu=options.cpu,
        overrides={k: v for k, v in asdict(options).items() if k != "cpu" and v not in (None, ())}, **found,
    )
