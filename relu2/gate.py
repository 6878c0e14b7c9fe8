"""The regression gate: compare two commits' recorded asv results and say whether head got worse.

``asv compare`` always exits 0 and ``asv continuous`` exits 2 without a word when any benchmark
failed, so the gate is this small layer over asv's results API, in three parts:

* ``relu2.noise``: how far identical code moves (bands by bytes against the L2, thresholds learned
  from recorded runs and sized to a budget for the whole run, the resolution by simulation);
* ``relu2.verdict``: which cells match, which moved, vanished or failed, and confirmation;
* ``relu2.gate_report``: the text, markdown and JSON renderings.

This module reads the inputs, refuses the comparisons that mean nothing (two GPU models, two
benchmark versions, a base whose cells mostly failed: each unless a flag says the user means it)
and wires the three together.  Exit 0: no finding; 1: a regression, a new failure or a vanished
cell; 2: unusable input.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Sequence

from relu2 import noise
from relu2.asv_results import ResultsError, commit_dates, iso_date, load_records, machine_info, machines, \
    resolve_commit
from relu2.gate_report import CPU_WHY, LAUNCH_WHY, GateReport, format_spread, format_value  # noqa: F401 (API)
from relu2.noise import NoiseModel, Resolution, Rule
from relu2.machine import is_cpu_machine
from relu2.schema import OK
from relu2.verdict import GATED_MODES, SUMMARY, TIMING_MODES, Cell, Change, VerdictInputError, check_versions, \
    compare, confirm, decode, entries, fingerprints, kernel_of, read_remeasurement, spread

UNKNOWN_MODE_WHY = "no learned noise for this mode and band: reported, not gated"
FAILED_BASE_LIMIT = 0.5  # a base with more failed cells than this says nothing about head


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


def model_for(gpu: str, path: str | os.PathLike | None = None) -> tuple[NoiseModel, str]:
    """The learned model, and a note when it was learned on another GPU model than ``gpu``."""
    try:
        model = noise.load_model(path or noise.DEFAULT_MODEL_PATH)
    except noise.NoiseModelError as e:
        raise GateInputError(str(e)) from None
    note = "" if gpu == model.gpu else (f"the noise model was learned on {model.gpu}, not on this machine's "
                                        f"{gpu or 'unrecorded GPU'}: learn one there (relu2 noise learn)")
    return model, note


def make_rule_for(model: NoiseModel, l2_bytes: int, *, factor: float | None, floor_s: float | None,
                  gate_launch: float | None, cpu: bool):
    """The rule of a cell in a comparison of ``gated`` gated cells, with the command line's overrides."""
    floor = model.floor_s if floor_s is None else floor_s

    def rule_for(cell: Cell, gated: int, kernel: str | None = None) -> Rule:
        mode = cell.timing_mode
        if cpu and factor is None:
            return Rule(False, 1.10, floor, CPU_WHY)
        if mode in GATED_MODES:
            band = noise.band_of_cell(cell, l2_bytes)
            learned = model.threshold(mode, band, gated)
            if factor is not None:
                return Rule(True, factor, floor)
            if not learned:
                return Rule(False, 1.10, floor, UNKNOWN_MODE_WHY)
            return Rule(True, learned, floor, width=model.width(noise.width_key(cell, kernel), mode, band))
        if mode == "launch" and gate_launch:
            return Rule(True, gate_launch, 0.0 if floor_s is None else floor_s, "gated by --gate-launch")
        return Rule(False, factor or 1.10, 0.0 if floor_s is None else floor_s, LAUNCH_WHY)

    return rule_for


def resolution(base_cells: Sequence[Cell], base_values: Sequence[float], rule_for, gated: int, model: NoiseModel,
               l2_bytes: int) -> list[Resolution]:
    """Per mode and band: this run's rule, its fastest base figure, and the slowdown caught 90% of the time."""
    fastest: dict[tuple[str, str], float] = {}
    count: dict[tuple[str, str], int] = {}
    for cell, value in zip(base_cells, base_values):
        if cell.timing_mode is None or cell.measure == SUMMARY:
            continue
        key = (cell.measure, noise.band_of_cell(cell, l2_bytes))
        fastest[key] = min(fastest.get(key, math.inf), value)
        count[key] = count.get(key, 0) + 1
    out = []
    for mode in TIMING_MODES:
        for band in noise.BANDS:
            probe = Cell("", mode, (), "", "bfloat16", _shape_in(band, l2_bytes))
            # Each recorded case is judged at its own width (noise.detects), not the band's typical one.
            rule = replace(rule_for(probe, gated), width=0.0)
            fit = model.fit_for(mode, band.name)
            caught = noise.resolution(fit.sample, rule) if rule.gated and fit else math.nan
            out.append(Resolution(mode, band.name, rule.gated, rule.ratio, rule.floor_s,
                                  fastest.get((mode, band.name), math.nan), caught, model.per_cell(gated),
                                  count.get((mode, band.name), 0), fit.cells if fit else 0))
    return out


def _shape_in(band: noise.Band, l2_bytes: int) -> str:
    """A bfloat16 shape whose bytes moved fall in ``band`` (to ask the rule of that band)."""
    numel = max(1, int(band.lo * l2_bytes / 4) + 1)
    return str(numel)


def gate(
    results_dir: str | os.PathLike, base: str, head: str, machine: str | None = None, factor: float | None = None,
    *, base_machine: str | None = None, head_machine: str | None = None, floor_s: float | None = None,
    gate_launch: float | None = None, allow_missing: Sequence[str] = (), with_spread: bool = False,
    across_gpus: bool = False, across_versions: bool = False, allow_failed_base: bool = False,
    confirmed: str | os.PathLike | None = None, noise_model: str | os.PathLike | None = None,
) -> GateReport:
    """Compare ``head`` against ``base`` (any git ref, hash or unique prefix) in a results folder.

    ``machine`` names the machine of both sides; ``base_machine``/``head_machine`` one side each.
    ``factor`` and ``floor_s`` override the learned ratio and floor for every gated cell;
    ``gate_launch`` gates launch at that ratio; ``allow_missing`` holds fnmatch patterns of cell labels
    allowed to vanish; ``confirmed`` is a re-measurement of the flagged cells (``relu2.verdict.Remeasurement``).
    Raises GateInputError (a ResultsError) when the input is unusable or the comparison means nothing.
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
        b_info, h_info = machine_info(results_dir, bm), machine_info(results_dir, hm)
    except ResultsError as e:
        raise GateInputError(str(e)) from None
    b_gpu, h_gpu = str(b_info.get("gpu", "")), str(h_info.get("gpu", ""))
    if b_gpu != h_gpu and not across_gpus:
        raise GateInputError(f"base was measured on {b_gpu or 'an unrecorded GPU'} ({bm}) and head on "
                             f"{h_gpu or 'an unrecorded GPU'} ({hm}): the noise model is per GPU model; "
                             "--across-gpus compares anyway")
    cpu = is_cpu_machine(b_info) and is_cpu_machine(h_info)
    model, model_note = model_for(h_gpu, noise_model)
    l2 = noise.l2_of(h_info) or model.l2_bytes
    try:
        base_full = resolve_commit(results_dir, base, bm)
        head_full = resolve_commit(results_dir, head, hm)
        base_records = load_records(results_dir, bm, base_full)
        head_records = load_records(results_dir, hm, head_full)
        base_dates, head_dates = commit_dates(results_dir, bm), commit_dates(results_dir, hm)
    except ResultsError as e:
        raise GateInputError(str(e)) from None
    if base_full == head_full and bm == hm:
        raise GateInputError(f"base {base!r} and head {head!r} are one commit ({base_full[:8]}) on one machine "
                             f"({bm}): nothing to compare; an A/A across two machines takes --base-machine and "
                             "--head-machine")
    if not across_versions:
        try:
            check_versions(base_records, head_records)
        except VerdictInputError as e:
            raise GateInputError(str(e)) from None
    rule_for = make_rule_for(model, l2, factor=factor, floor_s=floor_s, gate_launch=gate_launch, cpu=cpu)
    found = compare(base_records, head_records, rule_for, allow_missing, band_of=partial(noise.band_of_cell, l2_bytes=l2))
    if (found.base_cells and len(found.failed_at_base) > FAILED_BASE_LIMIT * found.base_cells
            and not allow_failed_base):
        raise GateInputError(f"base {base_full[:8]} on {bm}: {len(found.failed_at_base)} of its {found.base_cells} "
                             "cells failed, so it says nothing about head; gate against another base, or "
                             "--allow-failed-base to compare the cells that did not fail")
    regressions, unconfirmed, confirmation = found.regressions, [], ""
    if confirmed is not None:
        regressions, unconfirmed = _confirm(found.regressions, confirmed, base_full, head_full, rule_for, found.gated,
                                            base_records)
        confirmation = str(confirmed)
    ok_base = [r for r in base_records if r.status == OK]
    cells = [decode(r) for r in ok_base]
    overrides = {k: v for k, v in (("factor", factor), ("floor_s", floor_s), ("gate_launch", gate_launch),
                                   ("allow_missing", tuple(allow_missing))) if v not in (None, ())}
    return GateReport(
        base_machine=bm, head_machine=hm, base=base_full, head=head_full, compared=found.compared,
        regressions=regressions, flagged=found.regressions, unconfirmed=unconfirmed, confirmation=confirmation,
        new_failures=found.new_failures, vanished=found.vanished, allowed=found.allowed,
        failed_at_base=found.failed_at_base, not_gated=found.not_gated, improvements=found.improvements,
        repicked=found.repicked,
        base_date=iso_date(base_dates.get(base_full))[:10], head_date=iso_date(head_dates.get(head_full))[:10],
        resolution=resolution(cells, [float(r.value) for r in ok_base], rule_for, found.gated, model, l2),
        spread=spread(base_records, head_records) if with_spread else [], cpu=cpu, overrides=overrides,
        noise={"model": model.gpu, "budget": model.budget, "gated": found.gated,
               "per_cell": model.per_cell(found.gated), "l2_bytes": l2},
        offsets={f"{mode} {band}": math.exp(v) for (mode, band), v in sorted(found.offsets.items())},
        notes_=[n for n in (model_note,) if n and not cpu],
    )


def _confirm(flagged: list[Change], path: str | os.PathLike, base: str, head: str, rule_for, gated: int,
             base_records) -> tuple[list[Change], list[Change]]:
    """(failing, unconfirmed) after a re-measurement, each flagged cell judged by the rule that flagged
    it (``gated``: the comparison's gated cells); GateInputError when it is of other commits."""
    try:
        again = read_remeasurement(path)
    except VerdictInputError as e:
        raise GateInputError(str(e)) from None
    if (again.base, again.head) != (base, head):
        raise GateInputError(f"{path}: a re-measurement of {again.base[:8]} -> {again.head[:8]}, not of "
                             f"{base[:8]} -> {head[:8]}")
    by_key = {(r.benchmark, r.params): decode(r) for r in base_records}
    gated = max(1, gated)

    kernels = fingerprints(entries(base_records))

    def rule_of(change: Change) -> Rule:
        cell = by_key.get((change.benchmark, change.params))
        return rule_for(cell, gated, kernel_of(cell, kernels)) if cell else Rule(True, change.threshold, 0.0)

    result = confirm(flagged, again, rule_of)
    return result.confirmed + result.not_remeasured, result.unconfirmed


def noise_learn(results_dirs: Sequence[str], out: str | os.PathLike, exclude_machines: Sequence[str] = (),
                command: str = "") -> NoiseModel:
    """Learn the model from every no-change pair of runs in ``results_dirs`` and write it to ``out``."""
    runs = []
    try:
        for d in results_dirs:
            runs += noise.runs_in(d, exclude_machines)
        model = noise.learn_from(runs, sources=[*results_dirs, *(f"without {m}" for m in exclude_machines)],
                                 command=command)
    except (ResultsError, noise.NoiseModelError) as e:
        raise GateInputError(str(e)) from None
    noise.save_model(model, out)
    return model


def floor_text(path: str | os.PathLike | None = None) -> str:
    """The floor the default model uses, for --help (never a literal that can drift from the code)."""
    try:
        return f"{noise.load_model(path or noise.DEFAULT_MODEL_PATH).floor_s * 1e6:g} µs"
    except noise.NoiseModelError:
        return f"{noise.DEFAULT_FLOOR_S * 1e6:g} µs"



def noise_check(results_dirs: Sequence[str], held_out: str) -> list[dict]:
    """Leave-one-box-out: learn without ``held_out``'s runs, then gate every no-change pair that
    includes it (both directions) and count false flags (flags on cells whose kernel did not change)."""
    from relu2.verdict import kernel_unchanged

    every = [r for d in results_dirs for r in noise.runs_in(d)]
    model = noise.learn_from([r for r in every if r.machine != held_out])
    out = []
    # Checked: the pairs measured by today's methods (what the gate will judge) that include the box.
    for a, b in noise.no_change_pairs([r for r in every if _of_todays_methods(r)]):
        try:
            check_versions(a.records, b.records)
        except VerdictInputError:  # two methods: the gate refuses the pair, so no verdict to check
            continue
        for base, head in ((a, b), (b, a)):
            l2 = base.l2_bytes or model.l2_bytes
            rule_for = make_rule_for(model, l2, factor=None, floor_s=None, gate_launch=None, cpu=False)
            found = compare(base.records, head.records, rule_for, band_of=partial(noise.band_of_cell, l2_bytes=l2))
            kb, kh = fingerprints(entries(base.records)), fingerprints(entries(head.records))
            table = {(c.benchmark, c.params): c for c in found.regressions}
            false = [c for c in table.values()
                     if kernel_unchanged(decode(_record_of(base.records, c)), kb, kh)]
            out.append({"base": base.name, "head": head.name, "held_out": held_out in (a.machine, b.machine),
                        "gated": found.gated, "false_flags": len(false), "flags": len(found.regressions)})
    return out


def _of_todays_methods(run: noise.Run) -> bool:
    """Whether a run holds gated figures recorded by today's method of their mode."""
    from relu2.schema import mode as mode_named

    measures = ((decode(r).measure, r.version) for r in run.records)
    return any(m in GATED_MODES and v == mode_named(m).asv_version for m, v in measures)


def _record_of(records, change: Change):
    return next(r for r in records if r.benchmark == change.benchmark and r.params == change.params)
