"""How much slower a planted kernel truly is, timed apart from relu2 compare, and what a compare caught.

    python scripts/truth.py TRUTH_DIR... [--report COMPARE_DIR/report.json ...] [--gpu H200]

TRUTH_DIR holds the sweeps ``scripts/h200.sh truth=PATCH`` makes on one box: ``main-I/sweep.csv`` and
``planted-I/sweep.csv`` for I = 1..N, fused built from csrc/ and from csrc/ with the patch applied
(``RELU2_CSRC_DIR``), one process each, alternating (main, planted, main, ...).  A pair is planted-I /
main-I of one folder (each a sweep's median): the two sides of a ratio always share a box.  A cell's true
ratio is the median over the pairs of every TRUTH_DIR given (several boxes' truths of one plant pooled:
one pair alone is loose in the L2); its spread is the smallest and largest.

With ``--report``: each compare's fused cells whose true ratio reaches their band's ``matters`` (the
smallest slowdown the verdict must tell: 1.05x in the L2, 1.03x beyond), and how many of them FAILed;
and every FAIL of another implementation (the plant changes only fused).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from relu2.judge.rule import GATED_MODES  # noqa: E402
from relu2.records.asv_names import timed_cell  # noqa: E402
from relu2.records.rows import read_csv  # noqa: E402
from relu2.vocab.schema import BAND_NAMES, band_named, band_of, bytes_moved, l2_of, quantile  # noqa: E402

Key = tuple[str, int, str]  # dtype, numel, mode


def pairs_of(folder: Path) -> list[tuple[dict[Key, float], dict[Key, float]]]:
    """A truth folder's pairs of sweeps, main-I with planted-I (the two processes run back to back; an I
    with one side only is no pair): each process's fused medians by (dtype, numel, mode)."""
    got: dict[int, dict[str, dict[Key, float]]] = defaultdict(dict)
    for d in folder.iterdir():
        if (m := re.fullmatch(r"(main|planted)-(\d+)", d.name)) and (d / "sweep.csv").exists():
            got[int(m[2])][m[1]] = {(r.dtype, r.numel, r.mode): r.median_s for r in read_csv(d / "sweep.csv")
                                    if r.impl == "fused" and r.status == "ok" and r.mode in GATED_MODES}
    return [(got[i]["main"], got[i]["planted"]) for i in sorted(got) if len(got[i]) == 2]


def instruments_of(folder: Path) -> list[str]:
    """The commits whose instrument measured a truth folder's sweeps (the sweep's ``commit`` column),
    one a sweep: pooling pairs of two instruments (another hot method) mixes their figures."""
    return [r.commit[:7] for d in sorted(folder.iterdir()) if (d / "sweep.csv").exists()
            for r in read_csv(d / "sweep.csv")[:1]]


def true_ratios(pairs: list[tuple[dict[Key, float], dict[Key, float]]]) -> dict[Key, tuple[float, float, float]]:
    """(median, smallest, largest) over ``pairs`` (``pairs_of``) of planted / main, per cell both sides
    have in every pair; {} without a pair."""
    if not pairs:
        return {}
    keys = set.intersection(*(set(m) & set(p) for m, p in pairs))
    out = {}
    for k in keys:
        r = [p[k] / m[k] for m, p in pairs]
        out[k] = (quantile(r, 0.5), min(r), max(r))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("truth", type=Path, nargs="+", help="truth folders of one plant (one a box), pooled")
    parser.add_argument("--report", type=Path, nargs="+", action="extend", default=[],
                        help="compares' report.json, each scored against the pooled truth")
    parser.add_argument("--gpu", default="H200", help="whose L2 sets the bands (default H200)")
    args = parser.parse_args(argv)
    l2 = l2_of({"gpu": args.gpu})
    if l2 is None:
        parser.error(f"no known L2 for {args.gpu}")
    folders = list(dict.fromkeys(f.resolve() for f in args.truth))  # a folder named twice is pooled once
    pairs = []
    for folder in folders:
        if not folder.is_dir():
            parser.error(f"{folder}: no such folder")
        found = pairs_of(folder)
        if not true_ratios(found):
            parser.error(f"{folder}: no pair of main-I/sweep.csv and planted-I/sweep.csv with fused figures")
        pairs += found
    truth = true_ratios(pairs)
    if not truth:
        parser.error("the truth folders share no fused cell")
    every = set().union(*(set(m) | set(p) for m, p in pairs))
    try:
        reports = [(path, json.loads(path.read_text())) for path in args.report]
    except (OSError, ValueError) as e:
        parser.error(f"a --report is not readable JSON: {e}")
    band = lambda k: band_of(bytes_moved(k[1], k[0]), l2).name  # noqa: E731
    print(f"fused, planted / main: median over {len(pairs)} pairs of sweeps of {len(folders)} "
          f"folder{'s' * (len(folders) > 1)} (smallest-largest)"
          + (f"; {len(every - set(truth))} cells left out, not in every pair" if every - set(truth) else ""))
    made = {os.path.relpath(folder): sorted(set(instruments_of(folder))) for folder in folders}
    print("measured by " + "; ".join(f"{name}: {', '.join(commits)}" for name, commits in made.items())
          + ("  (more than one instrument: pooled only if they time alike, docs/tracking.md)"
             if len({c for commits in made.values() for c in commits}) > 1 else ""))
    print(f"{'mode':<6}{'dtype':<10}{'numel':>11}  {'band':<9}{'true ratio':>28}")
    for k in sorted(truth, key=lambda k: (k[2], k[0], k[1])):
        med, lo, hi = truth[k]
        print(f"{k[2]:<6}{k[0]:<10}{k[1]:>11}  {band(k):<9}{med:>12.4f}  ({lo:.4f}-{hi:.4f})")
    for path, report in reports:
        cells = (timed_cell(c["benchmark"], c["params"], c.get("unit")) for c in report["regressions"])
        failed = {(cell.impl, cell.dtype, cell.numel, mode) for cell, mode in filter(None, cells)}
        print(f"\n{path}: exit {report['exit_code']}, verdict {report['verdict']}")
        tally: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
        for k, (med, _, _) in truth.items():
            if med >= band_named(band(k)).matters:
                row = tally[(k[2], band(k))]
                row[0] += 1
                row[1] += ("fused", *k) in failed
        print(f"{'mode':<6}{'band':<10}{'truly >= matters':>18}{'FAIL':>6}")
        for (mode, b), (n, caught) in sorted(tally.items(), key=lambda t: (t[0][0], BAND_NAMES.index(t[0][1]))):
            print(f"{mode:<6}{b:<10}{n:>18}{caught:>6}")
        total = sum(n for n, _ in tally.values())
        caught = sum(c for _, c in tally.values())
        print(f"all   {'':<10}{total:>18}{caught:>6}  ({caught / total:.0%})" if total else "no cell truly moved that far")
        missed = sorted(k for k, (med, _, _) in truth.items()
                        if med >= band_named(band(k)).matters and ("fused", *k) not in failed)
        print(f"missed: {len(missed)}" + "".join(f"\n  {k[2]} {k[0]} {k[1]} ({band(k)}): truly {truth[k][0]:.4f}"
                                                 for k in missed))
        others = sorted(f for f in failed if f[0] != "fused")
        print(f"FAIL of other implementations: {len(others)}" + "".join(f"\n  {f}" for f in others))
    return 0


if __name__ == "__main__":
    sys.exit(main())
