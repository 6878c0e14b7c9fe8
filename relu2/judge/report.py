"""What the gate found, rendered: plain text, a pull-request comment (markdown) and JSON (stable keys,
docs/tracking.md).  Figures are written with relu2.vocab.schema's formatters."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Sequence

from relu2.host.files import json_text
from relu2.judge.rule import Change, Spread
from relu2.vocab import markdown as md
from relu2.vocab.text import aligned
from relu2.vocab.schema import FAILED, format_bytes, format_seconds

REPICKED_WHY = ("the same generated code; autotuning picked another launch configuration on this box: "
                "not a slowdown of the same kernel, reported, never failing")
UNDECIDED_WHY = ("their work changed, and their rounds tell their move neither beyond the bar nor clear of the "
                 "smallest slowdown their band must tell; relu2 compare measures such cells in more rounds; "
                 "each is judged as it stands")
LAUNCH_WHY = ("host wall clock: identical code moved 0.39-1.91x between two freshly started boxes "
              "(docs/methodology.md), so launch is reported, not gated; --gate-launch RATIO gates it")
MISSING_WHY = "in the plan of the suites, absent from the results: the check fails as for a vanished cell"
CONTRADICTED_WHY = ("more than noise flags in one run (the model allows 1 failing run of unchanged code in 20); a "
                    "maintainer reads the figures, or labels again for a fresh box")
NOTE_LIMIT = 1000  # characters of one note as rendered: a folder's strings cannot make a report long
CPU_WHY = ("a CPU machine (machine.json: gpu none): on a shared 2-core CPU, two commits with the same "
           "kernels moved up to 3.6x (results/cpu-2core), so its timings are reported, not gated; --factor "
           "gates them")


@dataclass(frozen=True)
class Resolution:
    """The rule for one family, mode and band in one comparison, and the smallest slowdown it catches
    in 90% of the model's out-of-sample cases, at this comparison's cells' widths."""

    family: str
    mode: str
    band: str
    gated: bool
    ratio: float  # at zero width (NaN: not gated)
    floor_s: float
    fastest_s: float  # the smallest base median in the group
    smallest_detectable: float  # NaN: not known
    cells: int = 0
    learned_from: int = 0  # recorded no-change cases behind the rule


@dataclass
class GateReport:
    """What the gate found between two commits (on one machine, or one per side)."""

    base_machine: str
    head_machine: str
    base: str  # full hashes
    head: str
    compared: int = 0  # comparisons made (ok at both sides)
    regressions: list[Change] = field(default_factory=list)  # what fails: flagged (and confirmed, with --confirmed)
    new_failures: list[Change] = field(default_factory=list)
    vanished: list[Change] = field(default_factory=list)  # ok at base; skipped or missing at head
    allowed: list[Change] = field(default_factory=list)  # vanished, but --allow-missing names them
    failed_at_base: list[Change] = field(default_factory=list)  # failed at base, no figure at head either
    unjudged: list[Change] = field(default_factory=list)  # ok at head, failed or skipped at base: not a pass
    not_gated: list[Change] = field(default_factory=list)  # beyond the threshold in a mode not gated
    improvements: list[Change] = field(default_factory=list)
    repicked: list[Change] = field(default_factory=list)  # same code, another autotuned pick: reported
    undecided: list[Change] = field(default_factory=list)  # work changed, not settled by its rounds: judged as it stands
    flagged: list[Change] = field(default_factory=list)  # every cell beyond the noise model, before confirmation
    unconfirmed: list[Change] = field(default_factory=list)  # flagged, not flagged again when re-measured
    contradicted: bool = False  # the re-measurement cleared every one of CONTRADICTED_FROM or more flagged cells
    missing: list[Change] = field(default_factory=list)  # in the plan (--plan), absent from base or head
    planned: int | None = None  # the plan's cells (--plan); None: no plan given
    planned_compared: int = 0  # of them, compared (ok at both sides)
    cells: list[Change] = field(default_factory=list)  # every timed cell compared, as judged (JSON only)
    confirmation: str = ""  # the re-measurement file given with --confirmed
    resolution: list[Resolution] = field(default_factory=list)
    spread: list[Spread] = field(default_factory=list)
    base_date: str = ""
    head_date: str = ""
    cpu: bool = False  # both machines measured on the CPU and no model: timings reported, not gated
    paired: bool = False  # a compare folder: base and head side by side on one box
    overrides: dict[str, Any] = field(default_factory=dict)
    noise: dict[str, Any] = field(default_factory=dict)  # the model used: gpu, budget, gated cells, per-cell share
    offsets: dict[str, float] = field(default_factory=dict)  # "hot in L2" -> the references' head/base, taken out
    stack_moves: dict[str, float] = field(default_factory=dict)  # references moved beyond a box: left in
    notes_: list[str] = field(default_factory=list)

    @property
    def machine(self) -> str:
        return self.base_machine if self.base_machine == self.head_machine else f"{self.base_machine} -> {self.head_machine}"

    @property
    def nothing_compared(self) -> str:
        """Why no cell could be compared ("" when some were): a gate that compared nothing passed nothing."""
        if self.compared:
            return ""
        lost = len(self.new_failures) + len(self.vanished) + len(self.allowed)
        if lost:  # the base had figures; the head has none to set beside them
            return (f"head {self.head[:8]} on {self.head_machine} has no ok figure for any of the base's "
                    f"{lost} cells: no comparison is not a pass")
        return (f"base {self.base[:8]} on {self.base_machine} has no ok figure to compare with "
                "(its result file holds none): no comparison is not a pass")

    @property
    def exit_code(self) -> int:
        """1 when head regressed, newly fails or lost a cell somewhere (vanished, or missing from the plan),
        measured a cell the base has no figure for (unjudged), a re-measurement contradicts the first pass,
        or nothing was compared; else 0."""
        return 1 if (self.regressions or self.new_failures or self.vanished or self.unjudged or self.missing
                     or self.contradicted or self.nothing_compared) else 0

    @property
    def verdict(self) -> str:
        return "FAIL" if self.exit_code else "PASS"

    def summary(self) -> str:
        regress = _count(self.regressions, "confirmed regression" if self.confirmation else "regression")
        extra = f" ({len(self.unconfirmed)} unconfirmed)" if self.confirmation else ""
        if self.contradicted:
            extra += f" (the re-measurement clears all {len(self.flagged)} flagged cells: contradicted)"
        missing = f", {_count(self.missing, 'missing cell')}" if self.planned is not None else ""
        planned = (f" ({self.planned_compared} of {self.planned} planned cells)" if self.planned is not None else "")
        return (f"{regress}{extra}, {_count(self.new_failures, 'new failure')}, "
                f"{_count(self.vanished, 'vanished cell')}{missing}; {_count(self.improvements, 'improvement')}, "
                f"{len(self.not_gated)} not gated, {len(self.repicked)} repicked, {len(self.failed_at_base)} failed "
                f"at base; "
                f"{_count(self.unjudged, 'unjudged cell')}; {self.compared} cells compared{planned}, "
                f"{self.noise.get('gated', 0) if self.noise else 0} gated"
                + (f"; references moved beyond a box: {', '.join(self.stack_moves)}" if self.stack_moves else ""))

    def notes(self) -> list[str]:
        """What a reader must know before the tables."""
        notes = [self.nothing_compared] if self.nothing_compared else []
        if self.base == self.head:
            notes.append(f"base and head are one commit ({self.base[:8]}): an A/A between "
                         f"{self.base_machine} and {self.head_machine}")
        return notes + self.notes_

    def header(self) -> str:
        return (f"base {self.base[:8]} on {self.base_machine} ({self.base_date}) -> "
                f"head {self.head[:8]} on {self.head_machine} ({self.head_date})")

    def budget_line(self) -> str:
        n = self.noise
        if not n or not n.get("gated"):
            return "no cell is gated: timings are reported, not judged" if n else ""
        if "factor" in self.overrides or not n.get("model"):  # the factor is the rule: no model's budget applies
            return f"{n['gated']} cells gated by --factor {self.overrides.get('factor', '?')}"
        if n.get("per_cell") is None:  # a GPU whose model judges only the cells whose work changed (the H100)
            changed = (f"the {n['work_changed']} cells whose work changed share it ({n['per_changed_cell']:.2g} each)"
                       if n.get("per_changed_cell") else "no cell's work changed")
            others = n["gated"] - n.get("work_changed", 0)
            return (f"noise model {n['model']}: at most {n['budget']:.0%} of runs of a change fail on noise; {changed}; "
                    + (f"{others} other cells gated by --gate-launch" if others else "no other cell is gated"))
        return (f"noise model {n['model']}: at most {n['budget']:.0%} of runs of unchanged code fail; "
                f"{n['gated']} gated cells share it ({n['per_cell']:.2g} each)")

    def offsets_line(self) -> str:
        """How the box moved, as the references say: what every cell of a band is judged after."""
        if not self.offsets:
            return ""
        moves = ", ".join(f"{key} {ratio:.3f}x" for key, ratio in self.offsets.items())
        return f"references (eager, copy) moved head/base {moves}: each cell is judged after its band's move"

    def _regression_title(self) -> str:
        if self.confirmation:
            return "CONFIRMED REGRESSIONS (flagged, then flagged again on re-measurement, or not re-measured)"
        return ("REGRESSIONS (flagged beyond the noise model; not confirmed: re-measure them and pass "
                "--confirmed FILE)")

    def format(self) -> str:
        """Plain text: verdict first, then each finding, then the resolution."""
        lines = [f"relu2 gate: {self.verdict} (exit {self.exit_code}): {self.summary()}", md.plain(self.header())]
        lines += [f"relu2 gate: {md.plain(note, NOTE_LIMIT)}" for note in self.notes()]
        lines += [self.budget_line()] if self.budget_line() else []
        lines += [self.offsets_line()] if self.offsets_line() else []
        lines += _table(self._regression_title(), self.regressions)
        if self.contradicted:
            lines += ["", f"CONTRADICTED: the re-measurement clears all {len(self.flagged)} flagged cells: {CONTRADICTED_WHY}"]
        lines += _table("UNCONFIRMED (flagged at first, not again on re-measurement: not failing)", self.unconfirmed)
        lines += _table("NEW FAILURES (failed at head, ok at base unless said; see the asv log)", self.new_failures,
                        show_why=True)
        lines += _table("VANISHED (ok at base, no result at head: skipped, missing, renamed or benchmark gone)",
                        self.vanished)
        lines += _table(f"MISSING ({MISSING_WHY})", self.missing, limit=50, show_why=True)
        lines += _table("UNJUDGED (ok at head, no figure at base: failed or skipped there; not a pass)",
                        self.unjudged)
        lines += _table("ALLOWED TO VANISH OR GO UNJUDGED (--allow-missing)", self.allowed)
        lines += _table("FAILED AT BASE (no figure to compare with: not compared)", self.failed_at_base, limit=10)
        lines += _table(f"NOT GATED (moved more than 1.1x; {self._not_gated_why()})", self.not_gated, limit=10)
        lines += _table("IMPROVEMENTS (faster beyond the noise model)", self.improvements, limit=10)
        lines += _table(f"REPICKED ({REPICKED_WHY})", self.repicked, limit=10)
        lines += _table(f"UNDECIDED ({UNDECIDED_WHY})", self.undecided, limit=20)
        lines += ["", "RESOLUTION (per family, mode and band: the threshold for this run, and the smallest slowdown "
                  "caught in 90% of no-change cases of boxes the model did not learn from, at these cells' widths)"]
        lines += ["  " + line for line in _resolution_lines(self.resolution)]
        return "\n".join(lines)

    def markdown(self) -> str:
        """A pull-request comment: verdict first, then the flagged cells, then the resolution."""
        mark = "❌" if self.exit_code else "✅"
        # Every string the measured folder chose (machine names, box, GPU, software versions, cell
        # parameters, kernels) is escaped: prose through _prose, cells through _code.
        lines = [f"### {mark} relu2 gate: {self.verdict}", "", f"{md.prose(self.summary(), NOTE_LIMIT)}.", "",
                 md.prose(self.header(), 300).replace("->", "→")]
        lines += [f"\n**{md.prose(note, NOTE_LIMIT)}**" for note in self.notes()]
        if self.budget_line():
            lines += ["", self.budget_line() + "."]
        if self.offsets_line():
            lines += ["", self.offsets_line() + "."]
        if self.contradicted:
            lines += ["", f"**Contradicted: the re-measurement clears all {len(self.flagged)} flagged cells**: "
                      f"{CONTRADICTED_WHY}."]
        title = "Confirmed regressions" if self.confirmation else "Regressions (flagged, not confirmed)"
        for name, changes in ((title, self.regressions), ("Unconfirmed (not failing)", self.unconfirmed),
                              ("New failures", self.new_failures), ("Vanished cells", self.vanished),
                              ("Missing (in the plan, absent from the results: not a pass)", self.missing),
                              ("Unjudged (no figure at base: not a pass)", self.unjudged),
                              ("Failed at base (not compared)", self.failed_at_base)):
            if changes:
                lines += ["", f"#### {name}", "", "| ratio | judged | base | head | cell | kernel |",
                          "|---:|---:|---:|---:|---|---|"]
                lines += [f"| {_ratio(c.ratio)} | {_ratio(c.moved)} | {format_value(c.base, c.unit)} | "
                          f"{format_value(c.head, c.unit)} | {_cell_code(c)} | "
                          f"{md.code(c.kernel) if c.kernel else md.prose(c.why) if changes is self.missing else ''} |"
                          for c in changes[:50]]
                if len(changes) > 50:
                    lines += ["", f"… and {len(changes) - 50} more (--format json lists every one)."]
        if self.not_gated or self.improvements or self.repicked:
            lines += ["", "<details><summary>Not gated, improvements, repicked</summary>", "",
                      f"Not gated: {self._not_gated_why()}. Repicked: {REPICKED_WHY}.", "",
                      "| ratio | judged | base | head | cell |", "|---:|---:|---:|---:|---|"]
            lines += [f"| {_ratio(c.ratio)} | {_ratio(c.moved)} | {format_value(c.base, c.unit)} | "
                      f"{format_value(c.head, c.unit)} | {_cell_code(c)} |"
                      for c in self.not_gated[:20] + self.improvements[:20] + self.repicked[:20]]
            lines += ["", "</details>"]
        lines += ["", "#### Resolution", "", "| family | mode | band | cells | threshold | floor | caught 90% |",
                  "|---|---|---|---:|---:|---:|---:|"]
        for r in self.resolution:
            lines.append(f"| {r.family} | {r.mode} | {r.band} | {r.cells} | {_threshold(r.ratio)} | "
                         f"{format_seconds(r.floor_s) if r.gated else '-'} | {_detectable(r)} |")
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        """Machine-readable, stable keys (documented in docs/tracking.md): each list of cells under its
        field's name (``allowed`` as ``allowed_to_vanish``)."""
        lists = {JSON_KEYS.get(name, name): [c.as_json() for c in getattr(self, name)] for name in change_lists(self)}
        return {"verdict": self.verdict.lower(), "exit_code": self.exit_code,
                "base": {"commit": self.base, "machine": self.base_machine, "date": self.base_date},
                "head": {"commit": self.head, "machine": self.head_machine, "date": self.head_date},
                "compared": self.compared, **lists, "confirmation": self.confirmation or None,
                "contradicted": self.contradicted, "planned": self.planned,
                "resolution": [asdict(r) for r in self.resolution], "spread": [asdict(s) for s in self.spread],
                "cpu": self.cpu, "paired": self.paired, "notes": self.notes(), "overrides": self.overrides,
                "noise_model": self.noise, "reference_moves": self.offsets, "stack_moves": self.stack_moves}

    def _not_gated_why(self) -> str:
        whys = list(dict.fromkeys(c.why for c in self.not_gated if c.why))
        return "; ".join(whys) or LAUNCH_WHY

    def render(self, fmt: str) -> str:
        if fmt == "json":  # strict JSON: NaN is no JSON value, and clients other than Python reject it
            return json_text(self.as_json(), indent=2, sort_keys=True)
        return self.markdown() if fmt == "markdown" else self.format()


JSON_KEYS = {"allowed": "allowed_to_vanish"}  # a field whose JSON key says more than its name


def change_lists(report: GateReport) -> list[str]:
    """The names of a report's lists of cells (regressions, vanished, ..., cells), in field order."""
    return [f.name for f in fields(report) if f.type == "list[Change]"]


# ---------------------------------------------------------------------------------------------
# pure helpers


def _count(items: list, noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def _threshold(x: float) -> str:
    """A ratio as written: 1.05x, 1.1x, 1.045x."""
    return "-" if not math.isfinite(x) else f"{x:.3f}".rstrip("0").rstrip(".") + "x"


def _ratio(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2f}x"


def _detectable(r: Resolution) -> str:
    if not r.gated:
        return "not gated"
    return "not known" if math.isnan(r.smallest_detectable) else _threshold(r.smallest_detectable)


def format_value(value: float | None, unit: str) -> str:
    """A figure in a readable unit (relu2.vocab.schema's formatters); "failed"/"n/a" when there is none."""
    if value is None:
        return FAILED
    if math.isnan(value):
        return "n/a"
    if unit == "seconds":
        return format_seconds(value)
    if unit == "bytes":
        return format_bytes(value)
    return f"{value:.4g} {unit}".strip()


def _table(title: str, changes: list[Change], limit: int | None = None, show_why: bool = False) -> list[str]:
    if not changes:
        return []
    shown = changes[:limit] if limit else changes
    # ratio: the medians'; judged: what the rule read (paired: the rounds' median move; the box's move out)
    rows = [(_ratio(c.ratio), _ratio(c.moved), format_value(c.base, c.unit), format_value(c.head, c.unit),
             md.plain(c.label) + (f"  [kernel {md.plain(c.kernel)}]" if c.kernel and c.kernel != "same" else "")
             + (f"  (also {md.plain(', '.join(c.also))})" if c.also else "")
             + (f"  ({c.why})" if show_why and c.why else "")) for c in shown]
    out = ["", f"{title}: {len(changes)}"]
    out += aligned([("ratio", "judged", "base", "head", "cell"), *rows], right=lambda column: column < 4, indent="  ")
    if limit and len(changes) > limit:
        out.append(f"  ... and {len(changes) - limit} more (--format json lists every one)")
    return out


def _resolution_lines(resolution: Sequence[Resolution]) -> list[str]:
    rows = [("family", "mode", "band", "cells", "threshold", "floor", "caught 90%")]
    rows += [(r.family, r.mode, r.band, str(r.cells), _threshold(r.ratio) if r.gated else "-",
              format_seconds(r.floor_s) if r.gated else "-", _detectable(r)) for r in resolution]
    return aligned(rows)


def format_spread(rows: Sequence[Spread], markdown: bool = False) -> str:
    """The spread table: one line per implementation and mode."""
    header = ("impl", "mode", "cells", "median", "p10", "p90", "max")
    body = [(s.impl, s.mode, str(s.cells), f"{s.median:.3f}", f"{s.p10:.3f}", f"{s.p90:.3f}", f"{s.max:.3f}")
            for s in rows]
    if markdown:
        return "\n".join(["| " + " | ".join(header) + " |", "|---|---|---:|---:|---:|---:|---:|"] +
                         ["| " + " | ".join(r) + " |" for r in body])
    return "\n".join(aligned([header, *body], right=lambda column: column > 1))


def _cell_code(c: Change) -> str:
    """A table's cell column: the label, and the other suites listing it."""
    return md.code(c.label) + (f" (also {md.code(', '.join(c.also), 100)})" if c.also else "")
