"""The regression gate: two commits' recorded figures in, one verdict out.

``asv compare`` always exits 0 and ``asv continuous`` exits 2 without a word when any benchmark
failed, so the gate is this small layer over the decoded measurements (``relu2.records.asv_results``):

* ``relu2.judge.rule``: the rule (one, for both kinds of comparison) and the sorting of cells;
* ``relu2.judge.noise``: the thresholds, per implementation family, mode and band, per GPU model and kind;
* ``relu2.judge.report``: the text, markdown and JSON renderings.

Two kinds of comparison: ``gate`` (two commits in results folders: cross-box, medians of rounds)
and ``gate_compare`` (a compare folder, base and head measured side by side on one box: paired
rounds).  This module reads the inputs, refuses what means nothing (two GPU models, two benchmark
versions, a base whose cells mostly failed, a GPU with no model of its own, an incomplete compare:
each in one line, unless a flag says the user means it) and names what differs (torch, triton,
CUDA, driver).  Exit 0: no finding; 1: a regression, a new failure, a vanished, missing or unjudged
cell, a re-measurement that contradicts the first pass; 2: unusable input.

A compare folder from CI was written where the head's code ran, so the judge checks what it can
against what it trusts (``gate_compare``): the GPU both sides and compare.json name, against each
other and ``expect_gpu`` (the runner's); the cells, against the plan of the trusted suites
(``plan``); the box, GPU and software fields, against strict character sets; the re-measurement's
machine, and whether it clears every flagged cell (``CONTRADICTED_FROM``).
"""

from __future__ import annotations

import fnmatch
import itertools
import math
import os
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable, Sequence

from relu2.host.machine import is_cpu_machine
from relu2.judge import noise
from relu2.judge.noise import NoiseModel
from relu2.judge.report import CPU_WHY, LAUNCH_WHY, GateReport, Resolution, change_lists
from relu2.judge.rule import (GATED_MODES, REPICK_BOUND, Change, Findings, Rule, check_versions, compare, confirm,
                              family_of, spread)
from relu2.records import compare_folder
from relu2.records.asv_names import SUMMARY, Cell
from relu2.records.asv_results import Measurement, pick_machine, read_commit
from relu2.records.compare_folder import RECORDED_NAME, CompareFolder, shown
from relu2.records.confirmed import read_remeasurement
from relu2.records.plan import Plan, read_plan
from relu2.vocab.errors import ResultsError
from relu2.vocab.schema import OK, band_named

UNKNOWN_GROUP_WHY = "no learned noise for this family, mode and band: reported, not gated"
REPORTED_BEYOND = 1.10  # a cell not gated is listed (never failing) when it moved more than this
FAILED_BASE_LIMIT = 0.5  # a base with more failed cells than this says nothing about head
STACK = ("torch", "triton", "cuda", "driver")  # machine.json keys whose change moves every figure


def stack_differences(base: dict, head: dict) -> str:
    """The software stack that differs between two machine.json files ("" when none), named."""
    diff = [f"{k} {base.get(k) or '?'} -> {head.get(k) or '?'}" for k in STACK if base.get(k) != head.get(k)]
    return ("base and head ran different software: " + ", ".join(diff) + " (every figure may move with it; "
            "the references' move says how far)") if diff else ""


def pick_model(gpu: str, kind: str, path: str | os.PathLike | None, factor: float | None,
               cpu: bool) -> tuple[NoiseModel | None, str, NoiseModel | None]:
    """The model that judges, a note, and the model that judges the cells whose exact work changed.
    Never another GPU's: a GPU with no model of its own is refused, or gated by ``--factor`` only; a
    same-box comparison without a same-box model for every cell is judged with the cross-box one
    (wider) and says so, or, where the GPU has none (the H100), gates only the cells whose work
    changed (None judges the others: reported); a CPU is gated only with a model or ``--factor``."""
    models = noise.load_models(path)
    changed = noise.model_for(models, gpu, kind)
    if factor is not None or changed is None or not changed.changed_work_only:
        model, note = _pick_model(models, gpu, kind, factor, cpu)
        return model, note, model
    read = f"its same-box model (learned at {changed.rounds} rounds a side, read at theirs)"
    if noise.model_for(models, gpu, noise.CROSS_BOX) is None:
        # A changed cell's bar needs only what one box moves; the others need a model that held out of sample
        return None, (f"the cells whose work did not change are reported, not gated: no model of {gpu} judges "
                      f"them (its same-box model failed more A/As out of sample than the budget allows); "
                      f"the cells whose exact work changed are judged with {read}"), changed
    model, _ = _pick_model(models, gpu, kind, factor, cpu)
    return model, (f"the cells whose work did not change are judged with its cross-box model (wider: the same-box "
                   f"model of {gpu} failed more A/As out of sample than the budget allows); the cells whose exact "
                   f"work changed with {read}"), changed


def _pick_model(models: Sequence[NoiseModel], gpu: str, kind: str, factor: float | None,
                cpu: bool) -> tuple[NoiseModel | None, str]:
    model = noise.model_for(models, gpu, kind)
    if model is not None and not model.changed_work_only:
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
    raise ResultsError(f"no noise model for {gpu or 'an unrecorded GPU'} ({kind}; the model file has: {known}): "
                         "learn one on that GPU (relu2 noise learn), or gate by --factor only")


def make_rule_for(model: NoiseModel | None, l2_bytes: int, *, factor: float | None, floor_s: float | None,
                  gate_launch: float | None, why_not: str = "", changed: NoiseModel | None = None):
    """The rule of a cell in a comparison of ``gated`` gated cells, with the command line's overrides;
    a cell whose exact work changed (``changed_work``) is judged by ``changed`` (default ``model``)."""
    floor = (model.floor_s if model else noise.DEFAULT_FLOOR_S) if floor_s is None else floor_s
    launch_floor = 0.0 if floor_s is None else floor_s

    def rule_for(m: Measurement, gated: int, changed_work: bool = False) -> Rule:
        mode = m.cell.timing_mode
        if mode in GATED_MODES:
            if factor is not None:
                return Rule(True, factor, floor)
            key = noise.group_of(m.cell, l2_bytes)
            if changed_work and changed is not None and changed.fit_for(key) is not None:
                # No floor unless asked: the counters say the work changed, so even a small kernel's
                # move is the change's (the floor keeps noise on the fastest cells from failing a run)
                return changed_rule(changed, m, gated, l2_bytes, launch_floor)
            if model is None and changed_work and changed is not None:  # a family its changed-work model never saw
                return Rule(False, REPORTED_BEYOND, floor, UNKNOWN_GROUP_WHY)
            if model is None:
                return Rule(False, REPORTED_BEYOND, floor, why_not)
            ratio = model.ratio(key, gated)
            if ratio is None:
                return Rule(False, REPORTED_BEYOND, floor, UNKNOWN_GROUP_WHY)
            return Rule(True, ratio, floor, width=model.width(m, key))
        if mode == "launch" and gate_launch:
            return Rule(True, gate_launch, launch_floor, "gated by --gate-launch")
        return Rule(False, REPORTED_BEYOND, launch_floor, LAUNCH_WHY)

    return rule_for


# A cell whose work changed is settled as passing only where a slowdown that matters would have read
# higher in at least this share of comparisons: the resolution's own detection rate (the model's tail
# starts at its 90th percentile of |move|, so the bar it gives here is a little wider than asked).
SETTLED_MISS = 1 - noise.DETECTION


def changed_rule(model: NoiseModel, m: Measurement, gated: int, l2_bytes: int, floor_s: float) -> Rule:
    """The rule of a cell whose exact work changed, one of ``gated`` such cells: ``model``'s bar at that
    share, read at the cell's rounds (``NoiseModel.scale``), and what settles it (``relu2.judge.rule.settled``):
    the ratio unchanged code exceeds one time in ten, against the smallest slowdown its band must tell."""
    key = noise.group_of(m.cell, l2_bytes)
    fit = model.fit_for(key)
    if fit is None:  # a family the model never saw (make_rule_for judges it by the other model)
        return Rule(False, REPORTED_BEYOND, floor_s, UNKNOWN_GROUP_WHY)
    s = model.scale(len(m.samples) if m.rounds else model.rounds)
    scaled = lambda ratio: max(noise.MIN_RATIO, ratio ** s)  # noqa: E731  (no bar below 1%, as learned)
    return Rule(True, scaled(fit.tail.ratio(model.per_cell(gated))), floor_s, width=s * model.width(m, key),
                usual=scaled(fit.tail.ratio(SETTLED_MISS)), matters=band_named(key[2]).matters)


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


def changed_resolution(base: Sequence[Measurement], changed: Sequence[Change], rule_for, share: int,
                       model: NoiseModel | None, l2_bytes: int) -> list[Resolution]:
    """Per family, mode and band of the cells whose work changed: their bar, and the smallest slowdown
    their own rules (``changed_rule``: at their share and their rounds) catch in 90% of ``model``'s
    out-of-sample same-box cases, each case's move read at the cell's rounds (``NoiseModel.scale``)."""
    if model is None or not changed:
        return []
    keys = {(c.benchmark, c.params) for c in changed}
    groups: dict[tuple[str, str, str], list[tuple[Measurement, Rule]]] = {}
    for m in base:
        if (m.benchmark, m.params) in keys and m.status == OK and m.cell.timing_mode in GATED_MODES:
            groups.setdefault(noise.group_of(m.cell, l2_bytes), []).append((m, rule_for(m, share, True)))
    out = []
    for key in sorted(groups, key=noise._group_order):
        cells, fit = groups[key], model.fit_for(key)
        rounds = sorted({len(m.samples) for m, _ in cells})
        caught = math.nan
        if fit and all(r.matters for _, r in cells):  # judged by this model
            judged = [(case[0] * model.scale(len(m.samples)), case[1], r)
                      for case, (m, r) in zip(fit.held_out, itertools.cycle(cells))]
            caught = noise.smallest_caught(judged, noise.SLOWDOWNS)
        rule = cells[0][1]
        span = f"{rounds[0]}" if len(rounds) == 1 else f"{rounds[0]}-{rounds[-1]}"
        out.append(Resolution(f"{key[0]}, work changed ({span} rounds)",
                              key[1], key[2], gated=rule.gated, ratio=rule.ratio if rule.gated else math.nan,
                              floor_s=rule.floor_s, fastest_s=min(float(m.value) for m, _ in cells),
                              smallest_detectable=caught, cells=len(cells), learned_from=fit.cells if fit else 0))
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
          notes: Sequence[str] = (), plan: "Plan | None" = None, confirm_machine: str | None = None,
          confirm_instrument: str = "", work: Callable[[Cell], str | None] = lambda cell: None) -> GateReport:
    """The verdict on two read sides (both kinds of comparison): the checks, the rule, the report.
    ``plan``: every cell of it must be at both sides (else ``missing``); ``confirm_machine`` and
    ``confirm_instrument`` (when not empty): the machine and instrument the re-measurement must name;
    ``work``: how a cell's work changed, where it was counted beside the sides (``relu2.judge.rule.compare``)."""
    for name, value, least in (("factor", factor, 1), ("--gate-launch", gate_launch, 1), ("floor", floor_s, 0)):
        if value is not None and not value >= least:
            raise ResultsError(f"{name} must be >= {least}, got {value}")
    gpu, b_gpu = str(head.info.get("gpu", "")), str(base.info.get("gpu", ""))
    cpu = is_cpu_machine(base.info) and is_cpu_machine(head.info)
    model, model_note, changed_model = pick_model(gpu, kind, noise_model, factor, cpu)
    learned = model or changed_model  # what knows this GPU: its bands, how far its boxes move, its repicks
    if learned is not None and noise.is_gpu(gpu):  # the bands are the model's GPU's: a folder does not move them
        for side in (s for s in (base, head) if str(s.info.get("gpu", "")) == gpu):  # --across-gpus: head's alone
            recorded = noise.l2_of(side.info)
            if recorded is not None and recorded != learned.l2_bytes:
                raise ResultsError(f"{side.machine} ({side.commit[:8]}) records an L2 of {recorded} bytes; the model "
                                     f"of {gpu} was learned with {learned.l2_bytes}: not that GPU, or not its record")
    l2 = noise.l2_of(head.info) or (learned.l2_bytes if learned else None) or noise.KNOWN_L2["H200"]
    if not across_versions:
        check_versions(base.measurements, head.measurements)
    rule_for = make_rule_for(model, l2, factor=factor, floor_s=floor_s, gate_launch=gate_launch,
                             why_not=model_note or CPU_WHY, changed=changed_model)
    band = partial(noise.band_of_cell, l2_bytes=l2)
    found = compare(base.measurements, head.measurements, rule_for, allow_missing, band, paired=paired,
                    bounds=learned.bound_map() if learned else None,
                    repick_bound=learned.repick_bound if learned else REPICK_BOUND, work=work,
                    count_work=b_gpu == gpu and not stack_differences(base.info, head.info))
    if found.base_cells and found.base_failures > FAILED_BASE_LIMIT * found.base_cells and not allow_failed_base:
        raise ResultsError(f"base {base.commit[:8]} on {base.machine}: {found.base_failures} of its "
                             f"{found.base_cells} cells failed, so it says nothing about head; gate against another "
                             "base, or --allow-failed-base to compare the cells that did not fail")
    regressions, unconfirmed, confirmation, contradicted = found.regressions, [], "", False
    if confirmed is not None:
        regressions, unconfirmed, contradicted = _confirm(found.regressions, confirmed, base, head, rule_for,
                                                          (found.gated, found.work_changed), paired, confirm_machine,
                                                          confirm_instrument)
        confirmation = str(confirmed)
    missing, planned, planned_compared, plan_notes = [], None, 0, []
    if plan is not None:
        missing, allowed, planned_compared, plan_notes = missing_cells(plan, base, head, allow_missing)
        found.allowed.extend(allowed)
        planned = len(plan.cells)
    overrides = {k: v for k, v in (("factor", factor), ("floor_s", floor_s), ("gate_launch", gate_launch),
                                   ("allow_missing", tuple(allow_missing))) if v not in (None, ())}
    bounds = learned.bound_map() if learned else {}
    stack = [f"{mode} {b} {math.exp(v):.3f}x (a box moves at most {math.exp(bounds.get((mode, b), 0)):.3f}x)"
             for (mode, b), v in sorted(found.stack_moves.items())]
    return with_work(GateReport(
        base_machine=base.machine, head_machine=head.machine, base=base.commit, head=head.commit,
        compared=found.compared, regressions=regressions, flagged=found.regressions, unconfirmed=unconfirmed,
        confirmation=confirmation, contradicted=contradicted, missing=missing, planned=planned,
        planned_compared=planned_compared, new_failures=found.new_failures, vanished=found.vanished,
        allowed=found.allowed, unjudged=found.unjudged, failed_at_base=found.failed_at_base,
        not_gated=found.not_gated, improvements=found.improvements, repicked=found.repicked,
        undecided=found.undecided, cells=found.cells,
        base_date=base.date, head_date=head.date,
        resolution=resolution(base.measurements, rule_for, found.gated, model, l2, factor)
        + (changed_resolution(base.measurements, [c for c in found.cells if c.work], rule_for, found.work_changed,
                              changed_model, l2) if paired and factor is None else []),
        spread=spread(base.measurements, head.measurements) if with_spread else [], cpu=cpu and model is None,
        paired=paired, overrides=overrides,
        noise={"model": learned.name if learned else None, "budget": noise.BUDGET,
               "gated": found.gated, "per_cell": model.per_cell(found.gated) if model and found.gated else None,
               "work_changed": found.work_changed,
               "per_changed_cell": (changed_model.per_cell(found.work_changed)
                                    if changed_model and found.work_changed else None),
               "l2_bytes": l2},
        offsets={f"{mode} {b}": math.exp(v) for (mode, b), v in sorted(found.offsets.items())},
        stack_moves={f"{mode} {b}": math.exp(v) for (mode, b), v in sorted(found.stack_moves.items())},
        notes_=[n for n in (*notes, *plan_notes, model_note if model_note != CPU_WHY else "", _work_note(found, changed_model),
                            stack_differences(base.info, head.info),
                            ("the references (eager, copy) moved beyond what a box moves: " + ", ".join(stack)
                             + ": not taken out, every cell is judged as measured") if stack else "") if n],
    ))


def _work_note(found: Findings, model: NoiseModel | None) -> str:
    """What the changed work did to the bar, in one line ("" when no gated cell's work changed)."""
    if not found.work_changed:
        return ""
    share = (f": each judged at 1/{found.work_changed} of the budget" if model else "")
    share += f", not 1/{found.gated}" if model and found.gated > found.work_changed else ""
    return (f"{found.work_changed} of the {found.gated} gated cells did other work (their exact work "
            f"differs){share} (unchanged code on one software stack changes no counter, so no A/A meets "
            "this bar)")


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
    flagged cells.  Raises ResultsError (a ResultsError) when the input is unusable."""
    bm = pick_machine(results_dir, base_machine or machine)
    hm = pick_machine(results_dir, head_machine or machine)
    b, h = (Side(m, *read_commit(results_dir, m, ref)) for m, ref in ((bm, base), (hm, head)))
    b_gpu, h_gpu = str(b.info.get("gpu", "")), str(h.info.get("gpu", ""))
    if b_gpu != h_gpu and not across_gpus:
        raise ResultsError(f"base was measured on {b_gpu or 'an unrecorded GPU'} ({bm}) and head on "
                             f"{h_gpu or 'an unrecorded GPU'} ({hm}): the noise model is per GPU model; "
                             "--across-gpus compares anyway")
    if b.commit == h.commit and bm == hm:
        raise ResultsError(f"base {base!r} and head {head!r} are one commit ({b.commit[:8]}) on one machine "
                             f"({bm}): nothing to compare; an A/A across two machines takes --base-machine and "
                             "--head-machine")
    return judge(b, h, paired=False, kind=noise.CROSS_BOX, factor=factor, floor_s=floor_s, gate_launch=gate_launch,
                 allow_missing=allow_missing, with_spread=with_spread, across_versions=across_versions,
                 allow_failed_base=allow_failed_base, confirmed=confirmed, noise_model=noise_model)


# --- the compare layout (relu2 compare) -----------------------------------------------------------


def compare_sides(folder: CompareFolder) -> tuple[Side, Side]:
    """The two sides of a compare folder, each of its box."""
    sides = []
    for name, sha in (("base", folder.base), ("head", folder.head)):
        d = folder.path / name
        try:
            machine = pick_machine(d, folder.machine)
        except ResultsError as e:
            raise ResultsError(f"{d}: {e}") from None
        sides.append(Side(machine, *read_commit(d, machine, sha, folder.box)))
    return sides[0], sides[1]


def check_gpu(meta: CompareFolder, base: Side, head: Side, expect_gpu: str | None = None) -> str:
    """The GPU of a compare folder: the one its two machine.json files and compare.json all name (one
    box measured both sides), and ``expect_gpu`` when given (the runner's: never "none" or "");
    ResultsError otherwise.  The names are checked against RECORDED_NAME, with the software's."""
    for side, name in ((base, "base"), (head, "head")):
        for key in ("gpu", *STACK):
            value = side.info.get(key)
            if value is not None and not RECORDED_NAME.fullmatch(str(value)):
                raise ResultsError(f"{meta.path / name}: machine.json {key} {shown(value)} is no name (letters, "
                                     "digits, spaces and . _ : + ( ) / - only, at most 100): not read")
    named = {"base machine.json": str(base.info.get("gpu", "")), "head machine.json": str(head.info.get("gpu", "")),
             "compare.json": meta.gpu}
    if len(set(named.values())) != 1:
        raise ResultsError(f"{meta.path}: the GPU is recorded as " + ", ".join(f"{v or 'nothing'!r} ({k})"
                             for k, v in named.items()) + ": one box measured both sides, so these agree; not judged")
    gpu = meta.gpu
    if expect_gpu is not None:
        if not noise.is_gpu(expect_gpu):
            raise ResultsError(f"--expect-gpu {expect_gpu!r}: a GPU's name as torch reports it (\"NVIDIA H200\"), "
                                 "never none or empty")
        if gpu != expect_gpu:
            raise ResultsError(f"{meta.path}: measured on {gpu or 'no GPU'!r}, not on the {expect_gpu!r} this "
                                 "runner stands for (--expect-gpu): not judged")
    return gpu


def gate_compare(folder: str | os.PathLike, *, factor: float | None = None, floor_s: float | None = None,
                 gate_launch: float | None = None, allow_missing: Sequence[str] = (), with_spread: bool = False,
                 across_versions: bool = False, allow_failed_base: bool = False,
                 confirmed: str | os.PathLike | None = None,
                 noise_model: str | os.PathLike | None = None, expect_gpu: str | None = None,
                 plan: str | os.PathLike | None = None) -> GateReport:
    """The paired verdict on a compare folder (base and head measured side by side on one box);
    ``confirmed``: relu2 confirm's re-measurement of its flagged cells, as for ``gate`` (it must name
    the compare's machine).  Refused unless both sides and compare.json name one GPU, that GPU is
    ``expect_gpu`` (given), and, with ``plan`` (a folder holding the trusted bench_relu2.py), the
    compare measured the whole plan: then a planned cell absent from either side fails (missing)."""
    return judge_compare(compare_folder.read_compare(folder), factor=factor, floor_s=floor_s,
                         gate_launch=gate_launch, allow_missing=allow_missing, with_spread=with_spread,
                         across_versions=across_versions, allow_failed_base=allow_failed_base, confirmed=confirmed,
                         noise_model=noise_model, expect_gpu=expect_gpu, plan=plan)


def judge_compare(meta: CompareFolder, *, factor: float | None = None, floor_s: float | None = None,
                  gate_launch: float | None = None, allow_missing: Sequence[str] = (), with_spread: bool = False,
                  across_versions: bool = False, allow_failed_base: bool = False,
                  confirmed: str | os.PathLike | None = None, noise_model: str | os.PathLike | None = None,
                  expect_gpu: str | None = None, plan: str | os.PathLike | None = None) -> GateReport:
    """``gate_compare`` of a compare folder's record, read (relu2 compare judges its own folder this way
    before it is complete, to choose the cells it measures again)."""
    b, h = compare_sides(meta)
    check_gpu(meta, b, h, expect_gpu)
    planned = None
    if plan is not None:
        planned = read_plan(plan)
        planned.check_compare(meta)
    note = f"paired: base and head measured side by side on box {meta.box} ({meta.rounds} rounds each"
    note += (f"; the cells whose work changed and were not settled, up to {meta.rounds + meta.added_rounds})"
             if meta.added_rounds else ")")
    if b.commit == h.commit:
        note += "; base and head are one commit: an A/A"
    work = compare_folder.read_work(meta.path)
    return judge(b, h, paired=True, kind=noise.SAME_BOX, factor=factor, floor_s=floor_s, gate_launch=gate_launch,
                 allow_missing=allow_missing, with_spread=with_spread, across_versions=across_versions,
                 allow_failed_base=allow_failed_base, confirmed=confirmed, noise_model=noise_model,
                 notes=[note, work.note()], plan=planned, confirm_machine=meta.machine,
                 confirm_instrument=meta.instrument,
                 work=lambda cell: work.change_at(cell.impl, cell.dtype, cell.shape))


def with_work(report: GateReport) -> GateReport:
    """Every listed cell whose work was counted gets its exact change beside its kernel's
    ("3f2a -> 77c0: instructions +6.0%, dram_read_bytes +3.1%", or ": the same work")."""
    def said(c: Change) -> Change:
        if c.work is None or (not c.work and c.kernel in ("", "same")):
            return c  # not counted, or nothing changed that needs saying
        text = c.work or "the same work"
        return replace(c, kernel=f"{c.kernel}: {text}" if c.kernel else text)

    return replace(report, **{name: [said(c) for c in getattr(report, name)] for name in change_lists(report)})


# --- the plan: which cells a compare holds (the trusted suites') -------------------------------------


def missing_cells(plan: Plan, base: Side, head: Side, allow_missing: Sequence[str] = ()
                  ) -> tuple[list[Change], list[Change], int, list[str]]:
    """(missing, allowed to be missing, planned cells compared, notes): a planned cell with no row at a
    side, unless the base has it ok (then the head lost it: vanished, as ``compare`` reports)."""
    at_base = {m.cell.identity: m.status for m in base.measurements}
    at_head = {m.cell.identity: m.status for m in head.measurements}
    missing, allowed, compared, no_figure = [], [], 0, {}
    for cell, unit in plan.cells:
        key = cell.identity
        b, h = at_base.get(key), at_head.get(key)
        if b is not None and h is not None:
            compared += b == OK and h == OK
            if b != OK:
                no_figure[cell.impl] = no_figure.get(cell.impl, 0) + 1
            continue
        if b == OK:
            continue  # vanished at head: compare reports it
        why = "absent at base and head" if b is None and h is None else "absent at base" if b is None else \
            "absent at head"
        change = Change(label=cell.label(), benchmark=cell.benchmark, params=cell.params, unit=unit,
                        base=math.nan, head=math.nan, family=family_of(cell.impl), why=why)
        (allowed if any(fnmatch.fnmatchcase(change.label, p) for p in allow_missing) else missing).append(change)
    notes = []
    if no_figure:
        notes.append(f"{sum(no_figure.values())} of the {len(plan.cells)} planned cells have no figure at base "
                     "(skipped or failed there), so they are not compared: "
                     + ", ".join(f"{impl} {n}" for impl, n in sorted(no_figure.items(), key=lambda x: -x[1])[:12]))
    return missing, allowed, compared, notes


def _confirm(flagged: list[Change], path: str | os.PathLike, base: Side, head: Side, rule_for,
             shares: tuple[int, int], paired: bool = False, machine: str | None = None, instrument: str = ""
             ) -> tuple[list[Change], list[Change], bool]:
    """(failing, unconfirmed, contradicted) after a re-measurement, each flagged cell judged by the rule
    that flagged it (``shares``: the gated cells, and those whose work changed); ResultsError when it
    is of other commits, or (``machine``, ``instrument`` given) another machine or instrument."""
    again = read_remeasurement(path)
    if (again.base, again.head) != (base.commit, head.commit):
        raise ResultsError(f"{path}: a re-measurement of {again.base[:8]} -> {again.head[:8]}, not of "
                             f"{base.commit[:8]} -> {head.commit[:8]}")
    if machine is not None and again.machine != machine:
        raise ResultsError(f"{path}: a re-measurement on machine {shown(again.machine)}, not on {shown(machine)}, "
                             "where the compare measured: not read")
    if instrument and again.instrument != instrument:
        raise ResultsError(f"{path}: a re-measurement by instrument {shown(again.instrument or 'unnamed')}, not by "
                             f"{shown(instrument)}, which measured the compare: not read")
    by_key = {(m.benchmark, m.params): m for m in base.measurements}

    def rule_of(change: Change) -> Rule:
        m = by_key.get((change.benchmark, change.params))
        share = shares[1] if change.work else shares[0]  # the share of the budget it was flagged at
        return rule_for(m, max(1, share), bool(change.work)) if m else Rule(True, change.threshold, 0.0)

    result = confirm(flagged, again, rule_of, paired)
    return result.confirmed + result.not_remeasured, result.unconfirmed, result.contradicted
