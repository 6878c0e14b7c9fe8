"""Learning the noise model and checking it out of sample: ``relu2 noise learn`` and ``relu2 noise check``.

A model is learned from runs of unchanged code (A/A): cross-box from results folders (every pair of
boxes of one commit), same-box from compare folders (base and head of one commit measured side by
side); ``noise_check`` learns without each box in turn and judges the pairs that include it.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from relu2.judge import noise
from relu2.judge.gate import compare_sides
from relu2.records.compare_folder import read_compare
from relu2.judge.noise import NoiseModel
from relu2.judge.rule import Figure, Rule, is_slower
from relu2.records.asv_results import box_of, machines
from relu2.vocab.errors import ResultsError
from relu2.vocab.text import aligned


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
        raise ResultsError("no GPU runs to learn from (a CPU machine's cross-box timings are not gated)")
    gpu = max(sorted(set(gpus)), key=gpus.count)  # a tie goes to the first by name, the same every run
    mine = [r for r in runs if r.gpu == gpu]
    l2 = next((r.l2_bytes for r in mine if r.l2_bytes), None)
    if l2 is None:
        raise ResultsError(f"no L2 size known for {gpu!r}: record l2_bytes in machine.json")
    seen = [noise.seen_in(a, b, l2, paired=False) for a, b in noise.cross_box_pairs(mine)]
    if not seen:
        raise ResultsError(f"no two boxes of {gpu} in one results folder in {', '.join(results_dirs)}: "
                             "nothing moved between boxes to learn from")
    return seen, mine, {"gpu": gpu, "kind": noise.CROSS_BOX, "l2_bytes": l2, "book": noise.WidthBook(mine)}


def same_box_seen(compare_dirs: Sequence[str]) -> tuple[list, list, dict]:
    """The A/A pairs of compare folders (cells whose fingerprint is the same on both sides)."""
    pairs = [compare_runs(d) for d in compare_dirs]
    gpus = {a.gpu for a, _ in pairs}
    if len(gpus) != 1:
        raise ResultsError(f"compare folders of several GPU models ({', '.join(sorted(gpus))}): one model per GPU")
    gpu = gpus.pop()
    l2 = next((r.l2_bytes for p in pairs for r in p if r.l2_bytes), None)
    if l2 is None:
        raise ResultsError(f"no L2 size known for {gpu or 'this machine'}: record l2_bytes in machine.json")
    seen = [noise.seen_in(a, b, l2, paired=True) for a, b in pairs]
    runs = [r for p in pairs for r in p]
    return seen, runs, {"gpu": gpu, "kind": noise.SAME_BOX, "l2_bytes": l2,
                        "book": noise.WidthBook(runs, noise.paired_widths_of)}


def rounds_of(compare_dirs: Sequence[str]) -> int:
    """The rounds a side of every one of ``compare_dirs`` had; ResultsError when they differ (a
    same-box model's bars are those of one round count: ``NoiseModel.rounds``)."""
    counts = {read_compare(d).rounds for d in compare_dirs}
    if len(counts) != 1:
        raise ResultsError(f"compare folders of {', '.join(map(str, sorted(counts)))} rounds a side: a same-box "
                           "model is learned from compares of one round count")
    return counts.pop()


def noise_learn(results_dirs: Sequence[str], out: str | os.PathLike, *, same_box: Sequence[str] = (),
                exclude_boxes: Sequence[str] = (), command: str = "", changed_work_only: bool = False) -> NoiseModel:
    """Learn one model (cross-box from results folders, or same-box from compare folders) and write it
    to ``out``: replacing the model of the same GPU and kind that ``out`` already holds, keeping the rest.
    ``changed_work_only``: a same-box model that judges only the cells whose exact work changed."""
    if changed_work_only and not same_box:
        raise ResultsError("--changed-work-only is for a same-box model (--same-box COMPARE_DIR...)")
    if same_box:
        rounds = rounds_of(same_box)  # before the learning: one round count, or nothing is learned
        seen, runs, fixed = same_box_seen(same_box)
    else:
        seen, runs, fixed = cross_box_seen(results_dirs, exclude_boxes)
    sources = [*results_dirs, *same_box, *(f"without {b}" for b in exclude_boxes)]
    model = noise.learn(seen, sources=sources, command=command, **fixed)
    if same_box:
        model = replace(model, rounds=rounds, changed_work_only=changed_work_only)
    kept = []
    if Path(out).is_file():
        try:
            kept = [m for m in noise.load_models(out) if (m.gpu, m.kind) != (model.gpu, model.kind)]
        except noise.NoiseModelError as e:
            raise ResultsError(f"{e}: not overwritten") from None
    noise.save_models([*kept, model], out)
    return model


def boxes_in(results_dirs: Sequence[str]) -> list[str]:
    """Every recorded box (results folder and machine) in ``results_dirs``."""
    return [box_of(d, m) for d in results_dirs for m in machines(d)]


def resolve_boxes(results_dirs: Sequence[str], names: Sequence[str]) -> list[str]:
    """Boxes named ``FOLDER:MACHINE`` (or a machine name that exactly one box has); ResultsError for
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
            raise ResultsError(f"{name!r} names {what}; boxes: {', '.join(known) or 'none'} "
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
            raise ResultsError("a same-box check leaves each box of its compare folders out in turn: "
                                 "no RESULTS_DIR or --exclude-box beside --same-box")
        seen, runs, fixed = same_box_seen(same_box)
        named = []
    else:
        named = resolve_boxes(results_dirs, held_out) if held_out else []
        seen, runs, fixed = cross_box_seen(results_dirs)
    boxes = sorted({b for p in seen for b in p.boxes})
    if len(boxes) < 2:
        raise ResultsError(f"compares of {len(boxes)} box: leaving a box out needs at least two")
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
        lines += ["  caught: the share of cases flagged with the head's cell made that much slower"]
        lines += aligned(rows, indent="  ")
    return "\n".join(line for line in lines if line is not None)
