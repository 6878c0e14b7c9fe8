"""The regression gate: two commits' recorded figures in, one verdict out.

``asv compare`` always exits 0 and ``asv continuous`` exits 2 without a word when any benchmark
failed, so the gate is this small layer over the decoded measurements (``relu2.asv_results``):

* ``relu2.verdict``: the rule (one, for both kinds of comparison) and the sorting of cells;
* ``relu2.noise``: the thresholds, per implementation family, mode and band, per GPU model and kind;
* ``relu2.gate_report``: the text, markdown and JSON renderings.

Two kinds of comparison: ``gate`` (two commits in results folders: cross-box, medians of rounds)
and ``gate_compare`` (a compare folder, base and head measured side by side on one box: paired
rounds).  This module reads the inputs, refuses what means nothing (two GPU models, two benchmark
versions, a base whose cells mostly failed, a GPU with no model of its own, an incomplete compare:
each in one line, unless a flag says the user means it) and names what differs (torch, triton,
CUDA, driver).  Exit 0: no finding; 1: a regression, a new failure, a vanished or unjudged cell; 2:
unusable input.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Sequence

from relu2 import noise
from relu2.asv_results import Measurement, ResultsError, box_of, commit_dates, iso_date, load_measurements, \
    machine_info, machines, resolve_commit
from relu2.gate_report import CPU_WHY, LAUNCH_WHY, GateReport, Resolution, format_spread, format_value  # noqa: F401
from relu2.machine import is_cpu_machine
from relu2.noise import NoiseModel
from relu2.schema import OK
from relu2.asv_names import SUMMARY
from relu2.verdict import GATED_MODES, REPICK_BOUND, Change, Rule, VerdictInputError, check_versions, compare, confirm, \
    read_remeasurement, spread

UNKNOWN_GROUP_WHY = "no learned noise for this family, mode and band: reported, not gated"
REPORTED_BEYOND = 1.10  # a cell not gated is listed (never failing) when it moved more than this
FAILED_BASE_LIMIT = 0.5  # a base with more failed cells than this says nothing about head
STACK = ("torch", "triton", "cuda", "driver")  # machine.json keys whose change moves every figure


class GateInputError(ResultsError):
    """The gate cannot judge: no results, unknown or ambiguous commit, ambiguous machine, unreadable file."""


def pick_machine(results_dir: str | os.PathLike, machine: str | None) -> str:
    """``machine`` (its folder's name or the name its machine.json records) if it has results; the
    only machine when None; GateInputError otherwise."""
    try:
        known = machines(results_dir)
        if machine is not None:
            machine_info(results_dir, machine)  # finds it by folder or recorded name, or by neither
    except ResultsError as e:
        raise GateInputError(str(e)) from None
    if machine is not None:
        from relu2.asv_results import machine_folder

        folder = machine_folder(Path(results_dir), machine)
        if folder is None or not any(p.name not in ("machine.json",) for p in folder.glob("*.json")):
            raise GateInputError(f"no results for machine {machine!r} in {results_dir} "
                                 f"(machines: {', '.join(known) or 'none'})")
        return machine
    if not known:
        raise GateInputError(f"no asv results in {results_dir} (no <machine>/machine.json with results)")
    if len(known) > 1:
        raise GateInputError(f"several machines in {results_dir}: {', '.join(known)}; choose one with --machine "
                             "(or --base-machine and --head-machine)")
    return known[0]


def stack_differences(base: dict, head: dict) -> str:
    """The software stack that differs between two machine.json files ("" when none), named."""
    diff = [f"{k} {base.get(k) or '?'} -> {head.get(k) or '?'}" for k in STACK if base.get(k) != head.get(k)]
    return ("base and head ran different software: " + ", ".join(diff) + " (every figure may move with it; "
            "the references' move says how far)") if diff else ""


def pick_model(gpu: str, kind: str, path: str | os.PathLike | None, factor: float | None,
               cpu: bool) -> tuple[NoiseModel | None, str]:
    """The model that judges, and a note.  Never another GPU's: a GPU with no model of its own is
    refused, or gated by ``--factor`` only; a same-box comparison without a same-box model is judged
    with the cross-box one (wider) and says so; a CPU is gated only with a model or ``--factor``."""
    try:
        models = noise.load_models(path)
    except noise.NoiseModelError as e:
        raise GateInputError(str(e)) from None
    model = noise.model_for(models, gpu, kind)
    if model is not None:
        return model, ""
    if factor is not None:
        return None, f"no {kind} noise model for {gpu or 'this machine'}: every gated cell is judged by --factor " \
                     f"{factor:g} only"
    if cpu:
        return None, (CPU_WHY if kind == noise.CROSS_BOX else
                      f"no same-box noise model for this CPU ({gpu or 'none'}): timings reported, not gated; "
                      "--factor gates them")
    if kind == noise.SAME_BOX:
        wider = noise.model_for(models, gpu, noise.CROSS_BOX)
        if wider is not None:
            return wider, (f"no same-box noise model for {gpu}: judged with its cross-box model (wider: two boxes "
                           "move more than one); relu2 noise learn --same-box learns one from A/A compares")
    known = ", ".join(m.name for m in models) or "none"
    raise GateInputError(f"no noise model for {gpu or 'an unrecorded GPU'} ({kind}; the model file has: {known}): "
                         "learn one on that GPU (relu2 noise learn), or gate by --factor only")


def make_rule_for(model: NoiseModel | None, l2_bytes: int, *, factor: float | None, floor_s: float | None,
                  gate_launch: float | None, why_not: str = ""):
    """The rule of a cell in a comparison of ``gated`` gated cells, with the command line's overrides."""
    floor = (model.floor_s if model else noise.DEFAULT_FLOOR_S) if floor_s is None else floor_s
    launch_floor = 0.0 if floor_s is None else floor_s

    def rule_for(m: Measurement, gated: int) -> Rule:
        mode = m.cell.timing_mode
        if mode in GATED_MODES:
            if factor is not None:
                return Rule(True, factor, floor)
            if model is None:
                return Rule(False, REPORTED_BEYOND, floor, why_not)
            key = noise.group_of(m.cell, l2_bytes)
            ratio = model.ratio(key, gated)
            if ratio is None:
                return Rule(False, REPORTED_BEYOND, floor, UNKNOWN_GROUP_WHY)
            return Rule(True, ratio, floor, width=model.width(m, key))
        if mode == "launch" and gate_launch:
            return Rule(True, gate_launch, launch_floor, "gated by --gate-launch")
        return Rule(False, REPORTED_BEYOND, launch_floor, LAUNCH_WHY)

    return rule_for


def resolution(base: Sequence[Measurement], rule_for, gated: int, model: NoiseModel | None, l2_bytes: int,
               factor: float | None) -> list[Resolution]:
    """Per family, mode and band of this comparison's gated cells: the ratio at zero width, and the
    slowdown caught in 90% of the model's out-of-sample cases at these cells' widths (the gate's rule)."""
    groups: dict[tuple[str, str, str], list[tuple[Measurement, Rule]]] = {}
    for m in base:
        if m.status != OK or m.cell.timing_mode is None or m.cell.measure == SUMMARY:
            continue
        groups.setdefault(noise.group_of(m.cell, l2_bytes), []).append((m, rule_for(m, gated)))
    out = []
    for key in sorted(groups, key=noise._group_order):
        cells = groups[key]
        rule = cells[0][1]
        fit = model.fit_for(key) if model else None
        caught = math.nan
        if rule.gated and fit and fit.held_out:
            cases = fit.held_out if factor is None else [(c[0], c[1], c[2], math.log(factor)) for c in fit.held_out]
            widths = [max(r.width, m.width) for m, r in cells]
            caught = noise.resolution(cases, widths, rule.floor_s, noise.SLOWDOWNS)
        out.append(Resolution(*key, gated=rule.gated, ratio=rule.ratio if rule.gated else math.nan,
                              floor_s=rule.floor_s, fastest_s=min(float(m.value) for m, _ in cells),
                              smallest_detectable=caught, cells=len(cells),
                              learned_from=fit.cells if fit else 0))
    return out


@dataclass(frozen=True)
class Side:
    """One side of a comparison, read."""

    machine: str
    commit: str
    date: str
    info: dict
    measurements: list[Measurement]


def judge(base: Side, head: Side, *, paired: bool, kind: str, factor: float | None = None,
          floor_s: float | None = None, gate_launch: float | None = None, allow_missing: Sequence[str] = (),
          with_spread: bool = False, across_versions: bool = False, allow_failed_base: bool = False,
          confirmed: str | os.PathLike | None = None, noise_model: str | os.PathLike | None = None,
          notes: Sequence[str] = ()) -> GateReport:
    """The verdict on two read sides (both kinds of comparison): the checks, the rule, the report."""
    if factor is not None and not factor >= 1.0:
        raise GateInputError(f"factor must be >= 1, got {factor}")
    if gate_launch is not None and not gate_launch >= 1.0:
        raise GateInputError(f"--gate-launch must be >= 1, got {gate_launch}")
    if floor_s is not None and not floor_s >= 0:
        raise GateInputError(f"floor must be >= 0, got {floor_s}")
    gpu = str(head.info.get("gpu", ""))
    cpu = is_cpu_machine(base.info) and is_cpu_machine(head.info)
    model, model_note = pick_model(gpu, kind, noise_model, factor, cpu)
    l2 = noise.l2_of(head.info) or (model.l2_bytes if model else None) or noise.KNOWN_L2["H200"]
    if not across_versions:
        try:
            check_versions(base.measurements, head.measurements)
        except VerdictInputError as e:
            raise GateInputError(str(e)) from None
    rule_for = make_rule_for(model, l2, factor=factor, floor_s=floor_s, gate_launch=gate_launch,
                             why_not=model_note or CPU_WHY)
    band = partial(noise.band_of_cell, l2_bytes=l2)
    found = compare(base.measurements, head.measurements, rule_for, allow_missing, band, paired=paired,
                    bounds=model.bound_map() if model else None,
                    repick_bound=model.repick_bound if model else REPICK_BOUND)
    if found.base_cells and found.base_failures > FAILED_BASE_LIMIT * found.base_cells and not allow_failed_base:
        raise GateInputError(f"base {base.commit[:8]} on {base.machine}: {found.base_failures} of its "
                             f"{found.base_cells} cells failed, so it says nothing about head; gate against another "
                             "base, or --allow-failed-base to compare the cells that did not fail")
    regressions, unconfirmed, confirmation = found.regressions, [], ""
    if confirmed is not None:
        regressions, unconfirmed = _confirm(found.regressions, confirmed, base, head, rule_for, found.gated, paired)
        confirmation = str(confirmed)
    overrides = {k: v for k, v in (("factor", factor), ("floor_s", floor_s), ("gate_launch", gate_launch),
                                   ("allow_missing", tuple(allow_missing))) if v not in (None, ())}
    bounds = model.bound_map() if model else {}
    stack = [f"{mode} {b} {math.exp(v):.3f}x (a box moves at most {math.exp(bounds.get((mode, b), 0)):.3f}x)"
             for (mode, b), v in sorted(found.stack_moves.items())]
    return GateReport(
        base_machine=base.machine, head_machine=head.machine, base=base.commit, head=head.commit,
        compared=found.compared, regressions=regressions, flagged=found.regressions, unconfirmed=unconfirmed,
        confirmation=confirmation, new_failures=found.new_failures, vanished=found.vanished,
        allowed=found.allowed, unjudged=found.unjudged, failed_at_base=found.failed_at_base,
        not_gated=found.not_gated, improvements=found.improvements, repicked=found.repicked, cells=found.cells,
        base_date=base.date, head_date=head.date,
        resolution=resolution(base.measurements, rule_for, found.gated, model, l2, factor),
        spread=spread(base.measurements, head.measurements) if with_spread else [], cpu=cpu and model is None,
        paired=paired, overrides=overrides,
        noise={"model": model.name if model else None, "budget": noise.BUDGET,
               "gated": found.gated, "per_cell": model.per_cell(found.gated) if model and found.gated else None,
               "l2_bytes": l2},
        offsets={f"{mode} {b}": math.exp(v) for (mode, b), v in sorted(found.offsets.items())},
        stack_moves={f"{mode} {b}": math.exp(v) for (mode, b), v in sorted(found.stack_moves.items())},
        notes_=[n for n in (*notes, model_note if model_note != CPU_WHY else "",
                            stack_differences(base.info, head.info),
                            ("the references (eager, copy) moved beyond what a box moves: " + ", ".join(stack)
                             + ": not taken out, every cell is judged as measured") if stack else "") if n],
    )


def _read_side(results_dir: str | os.PathLike, machine: str, ref: str, box: str | None = None) -> Side:
    try:
        info = machine_info(results_dir, machine)
        full = resolve_commit(results_dir, ref, machine)
        ms = load_measurements(results_dir, machine, full, box=box or box_of(results_dir, machine))
        date = iso_date(commit_dates(results_dir, machine).get(full))[:10]
    except ResultsError as e:
        raise GateInputError(str(e)) from None
    return Side(machine, full, date, info, ms)


def gate(
    results_dir: str | os.PathLike, base: str, head: str, machine: str | None = None, factor: float | None = None,
    *, base_machine: str | None = None, head_machine: str | None = None, floor_s: float | None = None,
    gate_launch: float | None = None, allow_missing: Sequence[str] = (), with_spread: bool = False,
    across_gpus: bool = False, across_versions: bool = False, allow_failed_base: bool = False,
    confirmed: str | os.PathLike | None = None, noise_model: str | os.PathLike | None = None,
) -> GateReport:
    """Compare ``head`` against ``base`` (any git ref, hash or unique prefix) in a results folder,
    cross-box (the medians of rounds).  ``machine`` names the machine of both sides;
    ``base_machine``/``head_machine`` one side each.  ``factor`` and ``floor_s`` replace the learned
    ratio and floor; ``gate_launch`` gates launch at that ratio; ``allow_missing``: fnmatch patterns of
    cell labels allowed to vanish or to have no base figure; ``confirmed``: a re-measurement of the
    flagged cells.  Raises GateInputError (a ResultsError) when the input is unusable."""
    bm = pick_machine(results_dir, base_machine or machine)
    hm = pick_machine(results_dir, head_machine or machine)
    b, h = _read_side(results_dir, bm, base), _read_side(results_dir, hm, head)
    b_gpu, h_gpu = str(b.info.get("gpu", "")), str(h.info.get("gpu", ""))
    if b_gpu != h_gpu and not across_gpus:
        raise GateInputError(f"base was measured on {b_gpu or 'an unrecorded GPU'} ({bm}) and head on "
                             f"{h_gpu or 'an unrecorded GPU'} ({hm}): the noise model is per GPU model; "
                             "--across-gpus compares anyway")
    if b.commit == h.commit and bm == hm:
        raise GateInputError(f"base {base!r} and head {head!r} are one commit ({b.commit[:8]}) on one machine "
                             f"({bm}): nothing to compare; an A/A across two machines takes --base-machine and "
                             "--head-machine")
    return judge(b, h, paired=False, kind=noise.CROSS_BOX, factor=factor, floor_s=floor_s, gate_launch=gate_launch,
                 allow_missing=allow_missing, with_spread=with_spread, across_versions=across_versions,
                 allow_failed_base=allow_failed_base, confirmed=confirmed, noise_model=noise_model)


# --- the compare layout (relu2 compare) -----------------------------------------------------------


@dataclass(frozen=True)
class CompareFolder:
    """A compare folder's compare.json, checked (the layout: docs/tracking.md)."""

    path: Path
    box: str
    machine: str
    gpu: str
    base: str  # full hashes
    head: str
    rounds: int


def read_compare(folder: str | os.PathLike) -> CompareFolder:
    """DIR/compare.json, checked: format 1, complete, both shas, a box; GateInputError naming what is wrong."""
    path = Path(folder)
    meta = path / "compare.json"
    try:
        data = json.loads(meta.read_text())
        if data.get("format") != 1:
            raise ValueError(f"format {data.get('format')!r}, not 1")
        out = CompareFolder(path, str(data["box"]), str(data["machine"]), str(data.get("gpu", "")),
                            str(data["base"]["sha"]), str(data["head"]["sha"]), int(data.get("rounds", 0)))
        complete = data["complete"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise GateInputError(f"{meta}: not a relu2 compare folder ({type(e).__name__}: {e})") from None
    if complete is not True:
        raise GateInputError(f"{meta}: the compare did not finish (complete: {json.dumps(complete)}): its rounds "
                             "are not all there, so there is no verdict; measure it again")
    if not out.box:
        raise GateInputError(f"{meta}: no box recorded")
    for side in ("base", "head"):
        if not (path / side).is_dir():
            raise GateInputError(f"{path / side}: missing (a compare folder holds base/ and head/ results folders)")
    return out


def compare_sides(folder: CompareFolder) -> tuple[Side, Side]:
    """The two sides of a compare folder, each of its box."""
    sides = []
    for name, sha in (("base", folder.base), ("head", folder.head)):
        d = folder.path / name
        try:
            machine = pick_machine(d, folder.machine)
        except GateInputError as e:
            raise GateInputError(f"{d}: {e}") from None
        sides.append(_read_side(d, machine, sha, box=folder.box))
    return sides[0], sides[1]


def gate_compare(folder: str | os.PathLike, *, factor: float | None = None, floor_s: float | None = None,
                 gate_launch: float | None = None, allow_missing: Sequence[str] = (), with_spread: bool = False,
                 across_versions: bool = False, allow_failed_base: bool = False,
                 confirmed: str | os.PathLike | None = None,
                 noise_model: str | os.PathLike | None = None) -> GateReport:
    """The paired verdict on a compare folder (base and head measured side by side on one box);
    ``confirmed``: relu2 confirm's re-measurement of its flagged cells, as for ``gate``."""
    meta = read_compare(folder)
    b, h = compare_sides(meta)
    note = f"paired: base and head measured side by side on box {meta.box} ({meta.rounds} rounds each)"
    if b.commit == h.commit:
        note += "; base and head are one commit: an A/A"
    return judge(b, h, paired=True, kind=noise.SAME_BOX, factor=factor, floor_s=floor_s, gate_launch=gate_launch,
                 allow_missing=allow_missing, with_spread=with_spread, across_versions=across_versions,
                 allow_failed_base=allow_failed_base, confirmed=confirmed, noise_model=noise_model, notes=[note])


def _confirm(flagged: list[Change], path: str | os.PathLike, base: Side, head: Side, rule_for,
             gated: int, paired: bool = False) -> tuple[list[Change], list[Change]]:
    """(failing, unconfirmed) after a re-measurement, each flagged cell judged by the rule that flagged
    it; GateInputError when it is of other commits."""
    try:
        again = read_remeasurement(path)
    except VerdictInputError as e:
        raise GateInputError(str(e)) from None
    if (again.base, again.head) != (base.commit, head.commit):
        raise GateInputError(f"{path}: a re-measurement of {again.base[:8]} -> {again.head[:8]}, not of "
                             f"{base.commit[:8]} -> {head.commit[:8]}")
    by_key = {(m.benchmark, m.params): m for m in base.measurements}

    def rule_of(change: Change) -> Rule:
        m = by_key.get((change.benchmark, change.params))
        return rule_for(m, max(1, gated)) if m else Rule(True, change.threshold, 0.0)

    result = confirm(flagged, again, rule_of, paired)
    return result.confirmed + result.not_remeasured, result.unconfirmed


# --- learning and checking the model ----------------------------------------------------------------


def compare_runs(folder: str | os.PathLike) -> tuple[noise.Run, noise.Run]:
    """A compare folder's two sides as runs of its box (for the same-box model)."""
    meta = read_compare(folder)
    b, h = compare_sides(meta)
    return tuple(noise.Run(meta.box, s.machine, s.commit, str(s.info.get("gpu", "")), noise.l2_of(s.info),
                           tuple(s.measurements), str(folder)) for s in (b, h))  # type: ignore[return-value]


def cross_box_seen(results_dirs: Sequence[str], exclude_boxes: Sequence[str] = ()) -> tuple[list, list, dict]:
    """The pairs of boxes in ``results_dirs`` (of the GPU model most runs have) and the model's fixed
    arguments (gpu, l2, widths)."""
    runs = [r for d in results_dirs for r in noise.runs_in(d) if r.box not in exclude_boxes]
    gpus = [r.gpu for r in runs if noise.is_gpu(r.gpu)]
    if not gpus:
        raise GateInputError("no GPU runs to learn from (a CPU machine's cross-box timings are not gated)")
    gpu = max(set(gpus), key=gpus.count)
    mine = [r for r in runs if r.gpu == gpu]
    l2 = next((r.l2_bytes for r in mine if r.l2_bytes), None)
    if l2 is None:
        raise GateInputError(f"no L2 size known for {gpu!r}: record l2_bytes in machine.json")
    seen = [noise.seen_in(a, b, l2, paired=False) for a, b in noise.cross_box_pairs(mine)]
    if not seen:
        raise GateInputError(f"no two boxes of {gpu} in one results folder in {', '.join(results_dirs)}: "
                             "nothing moved between boxes to learn from")
    return seen, mine, {"gpu": gpu, "kind": noise.CROSS_BOX, "l2_bytes": l2, "book": noise.WidthBook(mine)}


def same_box_seen(compare_dirs: Sequence[str]) -> tuple[list, list, dict]:
    """The A/A pairs of compare folders (cells whose fingerprint is the same on both sides)."""
    pairs = [compare_runs(d) for d in compare_dirs]
    gpus = {a.gpu for a, _ in pairs}
    if len(gpus) != 1:
        raise GateInputError(f"compare folders of several GPU models ({', '.join(sorted(gpus))}): one model per GPU")
    gpu = gpus.pop()
    l2 = next((r.l2_bytes for p in pairs for r in p if r.l2_bytes), None)
    if l2 is None:
        raise GateInputError(f"no L2 size known for {gpu or 'this machine'}: record l2_bytes in machine.json")
    seen = [noise.seen_in(a, b, l2, paired=True) for a, b in pairs]
    runs = [r for p in pairs for r in p]
    return seen, runs, {"gpu": gpu, "kind": noise.SAME_BOX, "l2_bytes": l2,
                        "book": noise.WidthBook(runs, noise.paired_widths_of)}


def noise_learn(results_dirs: Sequence[str], out: str | os.PathLike, *, same_box: Sequence[str] = (),
                exclude_boxes: Sequence[str] = (), command: str = "") -> NoiseModel:
    """Learn one model (cross-box from results folders, or same-box from compare folders) and write it
    to ``out``: replacing the model of the same GPU and kind that ``out`` already holds, keeping the rest."""
    try:
        if same_box:
            seen, runs, fixed = same_box_seen(same_box)
        else:
            seen, runs, fixed = cross_box_seen(results_dirs, exclude_boxes)
        sources = [*results_dirs, *same_box, *(f"without {b}" for b in exclude_boxes)]
        model = noise.learn(seen, sources=sources, command=command, **fixed)
    except (ResultsError, noise.NoiseModelError) as e:
        raise GateInputError(str(e)) from None
    kept = []
    if Path(out).is_file():
        try:
            kept = [m for m in noise.load_models(out) if (m.gpu, m.kind) != (model.gpu, model.kind)]
        except noise.NoiseModelError as e:
            raise GateInputError(f"{e}: not overwritten") from None
    noise.save_models([*kept, model], out)
    return model


def boxes_in(results_dirs: Sequence[str]) -> list[str]:
    """Every recorded box (results folder and machine) in ``results_dirs``."""
    try:
        return [box_of(d, m) for d in results_dirs for m in machines(d)]
    except ResultsError as e:
        raise GateInputError(str(e)) from None


def resolve_boxes(results_dirs: Sequence[str], names: Sequence[str]) -> list[str]:
    """Boxes named ``FOLDER:MACHINE`` (or a machine name that exactly one box has); GateInputError for
    a name no box has, or one that several share."""
    known = boxes_in(results_dirs)
    out = []
    for name in names:
        if name in known:
            out.append(name)
            continue
        norm = [b for b in known if b == f"{os.path.normpath(name.rsplit(':', 1)[0])}:{name.rsplit(':', 1)[-1]}"]
        by_machine = [b for b in known if b.rsplit(":", 1)[-1] == name]
        found = norm or by_machine
        if len(found) != 1:
            what = "no box" if not found else f"{len(found)} boxes ({', '.join(found)})"
            raise GateInputError(f"{name!r} names {what}; boxes: {', '.join(known) or 'none'} "
                                 "(name one as FOLDER:MACHINE)")
        out.append(found[0])
    return out


def noise_check(results_dirs: Sequence[str], held_out: Sequence[str] = (),
                factors: Sequence[float] = (1.05, 1.07, 1.10, 1.20), *,
                same_box: Sequence[str] = ()) -> dict[str, Any]:
    """Leave-one-box-out, by the gate's own rule: learn without each box in turn (``held_out``, default
    every box in a cross-box pair; with ``same_box`` compare folders, every box that made one), judge
    every pair that includes it both ways, and count (a) the no-change comparisons that fail (any false
    flag) and (b) per family, mode and band, the share of cases caught when the head's cells are made
    ``factor`` slower; each for the pairs of today's methods (rounds) and for all."""
    if same_box:
        if results_dirs or held_out:
            raise GateInputError("a same-box check leaves each box of its compare folders out in turn: "
                                 "no RESULTS_DIR or --exclude-box beside --same-box")
        seen, runs, fixed = same_box_seen(same_box)
        named = []
    else:
        named = resolve_boxes(results_dirs, held_out) if held_out else []
        seen, runs, fixed = cross_box_seen(results_dirs)
    boxes = sorted({b for p in seen for b in p.boxes})
    if len(boxes) < 2:
        raise GateInputError(f"compares of {len(boxes)} box: leaving a box out needs at least two")
    chosen = named or boxes
    comparisons: dict[tuple[str, str], dict] = {}
    groups: dict[str, dict[tuple, dict]] = {"today": {}, "all": {}}
    for box in chosen:
        model, cases = noise.held_out(seen, box, **fixed)
        for group, moved, base_s, width, log_ratio, name, today in cases:
            rule = Rule(True, math.exp(log_ratio), model.floor_s, width=width)
            c = comparisons.setdefault((box, name), {"held_out": box, "comparison": name, "today": today,
                                                     "gated": 0, "false_flags": 0})
            c["gated"] += 1
            flagged = _flags(moved, base_s, rule, 1.0)
            c["false_flags"] += flagged
            for kind in ("today", "all") if today else ("all",):
                g = groups[kind].setdefault(group, {"cases": 0, "false": 0, **{f: 0 for f in factors}})
                g["cases"] += 1
                g["false"] += flagged
                for f in factors:
                    g[f] += _flags(moved, base_s, rule, f)
    return {"comparisons": list(comparisons.values()), "groups": groups, "boxes": chosen, "factors": list(factors)}


def _flags(moved: float, base_s: float, rule: Rule, factor: float) -> bool:
    from relu2.verdict import Figure, is_slower

    return is_slower(Figure(base_s), Figure(base_s * math.exp(moved) * factor), rule)


def format_check(check: dict[str, Any]) -> str:
    """``noise_check`` as text: the no-change comparisons, then per family, mode and band the false
    flags and the share of cases caught at each planted slowdown."""
    lines = []
    for kind, title in (("today", "pairs of today's methods (rounds)"), ("all", "all pairs (earlier methods too)")):
        comps = [c for c in check["comparisons"] if c["today"] or kind == "all"]
        failing = [c for c in comps if c["false_flags"]]
        lines += ["" if lines else None, f"{title}, each box left out in turn ({len(check['boxes'])} boxes): "
                  f"{len(failing)} of {len(comps)} no-change comparisons fail "
                  f"({sum(c['false_flags'] for c in comps)} false flags in {sum(c['gated'] for c in comps)} "
                  "gated cells)"]
        lines += [f"  fails: {c['comparison']} (learned without {c['held_out']}): {c['false_flags']} false flags"
                  for c in failing]
        factors = check["factors"]
        header = ("family", "mode", "band", "cases", "false", *(f"{f:g}x" for f in factors))
        rows = [header]
        for g in sorted(check["groups"][kind], key=noise._group_order):
            v = check["groups"][kind][g]
            rows.append((*g, str(v["cases"]), str(v["false"]), *(f"{v[f] / v['cases']:.0%}" for f in factors)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines += ["  caught: the share of cases flagged with the head's cell made that much slower"]
        lines += ["  " + "  ".join(r[i].ljust(widths[i]) for i in range(len(r))).rstrip() for r in rows]
    return "\n".join(line for line in lines if line is not None)
