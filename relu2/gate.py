"""The regression gate: compare two commits' recorded asv results and say whether head got worse.

``asv compare`` always exits 0 and ``asv continuous`` exits 2 without a word when any benchmark
failed, so the gate is this small layer over asv's results API and asv's own statistics
(``asv._stats.is_different``: Mann-Whitney U on the stored samples, or non-overlapping 99%
confidence intervals when there are too few).  A cell is a regression when head is slower than
``factor`` x base AND the difference is significant; a cell without statistics (one sample, or a
plain figure such as peak memory) is judged on the factor alone, as ``asv compare`` does.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from relu2.asv_results import Record, ResultsError, commit_dates, iso_date, load_records, machines, resolve_commit


class GateInputError(ResultsError):
    """The gate cannot judge: no results, unknown or ambiguous commit, ambiguous machine, unreadable file."""


@dataclass(frozen=True)
class Change:
    """One cell compared between base and head."""

    label: str  # "Grid.track_hot(impl=fused, dtype=bfloat16, numel=16777216)"
    benchmark: str
    params: tuple[tuple[str, str], ...]
    unit: str
    base: float | None  # None: failed; NaN: skipped
    head: float | None
    significant: bool

    @property
    def ratio(self) -> float:
        """head / base (NaN when either is not a number)."""
        if not _is_number(self.base) or not _is_number(self.head) or self.base == 0:
            return float("nan")
        return self.head / self.base


@dataclass
class GateReport:
    """What the gate found between two commits on one machine."""

    machine: str
    base: str  # full hashes
    head: str
    factor: float
    compared: int = 0
    regressions: list[Change] = field(default_factory=list)
    new_failures: list[Change] = field(default_factory=list)
    improvements: list[Change] = field(default_factory=list)
    new_skips: list[Change] = field(default_factory=list)  # ok at base, n/a at head: reported, not failing
    missing: list[str] = field(default_factory=list)  # cells recorded at base but absent at head
    base_date: str = ""
    head_date: str = ""

    @property
    def exit_code(self) -> int:
        """1 when head regressed or newly fails somewhere, else 0."""
        return 1 if self.regressions or self.new_failures else 0

    def format(self) -> str:
        """A readable report: header, one table per finding, verdict last."""
        lines = [
            f"relu2 gate on {self.machine}: base {self.base[:8]} ({self.base_date}) -> head {self.head[:8]} "
            f"({self.head_date}), factor {self.factor:g}",
            f"compared {self.compared} cells: {_count(self.regressions, 'regression')}, "
            f"{_count(self.new_failures, 'new failure')}, {_count(self.improvements, 'improvement')}",
        ]
        lines += _table(f"REGRESSIONS (slower than {self.factor:g}x base, significant)", self.regressions)
        lines += _table("NEW FAILURES (ok at base, failed at head; see the asv log)", self.new_failures)
        lines += _table(f"IMPROVEMENTS (faster than base / {self.factor:g}, significant)", self.improvements)
        lines += _table("NEWLY SKIPPED (ok at base, n/a at head; not counted as failures)", self.new_skips)
        if self.missing:
            lines += ["", f"{len(self.missing)} cells recorded at base have no result at head (not judged)."]
        verdict = "FAIL" if self.exit_code else "PASS"
        lines += ["", f"{verdict} (exit {self.exit_code})"]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# pure helpers


def _is_number(x: float | None) -> bool:
    return x is not None and not math.isnan(x)


def _count(items: list, noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def _three_digits(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


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


def _table(title: str, changes: list[Change]) -> list[str]:
    if not changes:
        return []
    rows = [(f"{c.ratio:.2f}x" if _is_number(c.ratio) else "-", format_value(c.base, c.unit),
             format_value(c.head, c.unit), c.label) for c in changes]
    header = ("ratio", "base", "head", "cell")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    out = ["", title]
    for r in [header, *rows]:
        out.append("  " + "  ".join(r[i].rjust(widths[i]) for i in range(3)) + "  " + r[3])
    return out


def is_significant(base: Record, head: Record) -> bool:
    """asv's own test of whether two ok cells differ; True when there are no statistics to test with."""
    from asv import _stats

    if not base.stats or not head.stats or base.stats.get("repeat", 0) == 1 or head.stats.get("repeat", 0) == 1:
        return True
    if not all(k in s for s in (base.stats, head.stats) for k in ("ci_99_a", "ci_99_b")):
        return True
    return bool(_stats.is_different(base.samples, head.samples, base.stats, head.stats))


def compare_cells(base: dict[Any, Record], head: dict[Any, Record], factor: float) -> dict[str, list]:
    """Sort the cells of two commits into regressions, new failures, improvements, new skips, missing."""
    out: dict[str, list] = {"regressions": [], "new_failures": [], "improvements": [], "new_skips": [],
                            "missing": []}
    for key, b in base.items():
        h = head.get(key)
        if h is None:
            out["missing"].append(b.label())
            continue

        def change(significant: bool, b: Record = b, h: Record = h) -> Change:
            return Change(label=b.label(), benchmark=b.benchmark, params=b.params, unit=b.unit,
                          base=b.value, head=h.value, significant=significant)

        if b.status != "ok":
            continue  # nothing to regress from
        if h.status == "failed":
            out["new_failures"].append(change(True))
        elif h.status == "skipped":
            out["new_skips"].append(change(False))
        elif h.value > b.value * factor and is_significant(b, h):
            out["regressions"].append(change(True))
        elif h.value < b.value / factor and is_significant(b, h):
            out["improvements"].append(change(True))
    out["regressions"].sort(key=lambda c: -c.ratio)
    out["improvements"].sort(key=lambda c: c.ratio)
    return out


def _by_key(cells: list[Record]) -> dict[Any, Record]:
    # When one commit has results from several environments, the most recently run one wins.
    return {c.key: c for c in sorted(cells, key=lambda c: c.started_at)}


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
        raise GateInputError(f"no asv results in {results_dir} (no <machine>/machine.json)")
    if len(known) > 1:
        raise GateInputError(f"several machines in {results_dir}: {', '.join(known)}; choose one")
    return known[0]


def gate(
    results_dir: str | os.PathLike, base: str, head: str, machine: str | None = None, factor: float = 1.05
) -> GateReport:
    """Compare ``head`` against ``base`` (hashes or unique prefixes) on one machine's recorded results.

    Raises GateInputError (a ResultsError) when the input is unusable: no results, an unknown or
    ambiguous commit, several machines and none chosen, a malformed file (named in the message).
    """
    if not (factor >= 1.0):
        raise GateInputError(f"factor must be >= 1, got {factor}")
    m = pick_machine(results_dir, machine)
    try:
        base_full = resolve_commit(results_dir, base, m)
        head_full = resolve_commit(results_dir, head, m)
        base_cells = load_records(results_dir, m, base_full)
        head_cells = load_records(results_dir, m, head_full)
        dates = commit_dates(results_dir, m)
    except GateInputError:
        raise
    except ResultsError as e:
        raise GateInputError(str(e)) from None
    base_by_key = _by_key(base_cells)
    found = compare_cells(base_by_key, _by_key(head_cells), factor)
    return GateReport(
        machine=m, base=base_full, head=head_full, factor=factor, compared=len(base_by_key),
        base_date=iso_date(dates.get(base_full))[:10], head_date=iso_date(dates.get(head_full))[:10],
        **found,
    )
