"""How much a cell's figure moves from one process to the next in A/A compares, and how much of that
a process's cells share: where the noise the verdict must tell apart from a slowdown lives.

    python scripts/aa_spread.py docs/aa/compare-h200-2026-12-02 [--impl fused,triton,copy,eager] [--dtype bfloat16]

Reads every A/A compare folder under ROOT (DIR/compare.json whose base and head are one commit).  In
each, a cell has one figure a round a side (the median of that process's replays); its deviations are
the logs of those figures less their mean.  Per implementation, mode and band (relu2.judge.noise.group_of's
band, the GPU's L2 from the folder's machine.json):

* **cell sd**: the cell's deviations' sd, pooled over cells and compares (root of the mean variance);
* **shared**: the variance of the mean deviation of the band's cells in one process (one worker
  measures them all), as a share of the cell variance.  1/n (n cells) when each cell's noise is its
  own; 1 when the process moves all its cells together, and a reference measured in that process would
  take it out.

Then per size (``--dtype``), each implementation's cell sd hot and cold; and per mode and band, the
listed implementations together: the median |deviation| (the typical figure) and the tail, figures
more than ``OUTLIER`` from the median of their cell's other rounds (one process's figure of one cell
off on its own, which a pooled sd mixes in with the rest).
"""

from __future__ import annotations

import argparse
import math
import statistics as st
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from relu2.judge.gate import compare_sides  # noqa: E402
from relu2.judge.noise import band_of_cell  # noqa: E402
from relu2.judge.rule import GATED_MODES  # noqa: E402
from relu2.records.compare_folder import read_compare  # noqa: E402
from relu2.vocab.errors import ResultsError  # noqa: E402
from relu2.vocab.schema import BAND_NAMES, OK, l2_of  # noqa: E402

OUTLIER = 1.1  # a figure this far from the median of its cell's other rounds is the tail

Key = tuple[tuple, str]  # the cell's identity (relu2.records.asv_names.Cell.identity), its band


def deviations(folder: Path) -> dict[Key, list[float]]:
    """Per cell, the deviations of its rounds (base's then head's) from their mean log."""
    meta = read_compare(folder)
    sides = compare_sides(meta)
    l2 = l2_of(sides[0].info) or 0
    logs: dict[Key, list[float]] = defaultdict(list)
    for side in sides:
        for m in side.measurements:
            if m.status != OK or not m.rounds or m.cell.measure not in GATED_MODES:
                continue
            logs[(m.cell.identity, band_of_cell(m.cell, l2))] += map(math.log, m.samples)
    rounds = 2 * meta.rounds
    return {k: [x - st.mean(v) for x in v] for k, v in logs.items() if len(v) == rounds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--impl", default="fused,triton,copy,eager")
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args(argv)
    impls = args.impl.split(",")
    folders = []
    for path in sorted(args.root.glob("*/compare.json")):
        try:
            meta = read_compare(path.parent)
        except ResultsError as e:
            print(f"aa_spread: left out: {e}", file=sys.stderr)
            continue
        if meta.base == meta.head:
            folders.append(path.parent)
    if not folders:
        ap.error(f"{args.root}: no A/A compare folders (DIR/compare.json with base == head)")
    cell_var: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    shared: dict[tuple[str, str, str], list[tuple[float, float, int]]] = defaultdict(list)
    by_size: dict[tuple[str, str, str, int], list[float]] = defaultdict(list)
    # Per (mode, band), every listed implementation: each figure's deviation, and its log off its cell's other rounds.
    typical: dict[tuple[str, str], list[float]] = defaultdict(list)
    tails: dict[tuple[str, str], list[float]] = defaultdict(list)
    for folder in folders:
        groups: dict[tuple[str, str, str], list[list[float]]] = defaultdict(list)
        for ((mode, impl, dtype, shape, extras), band), d in deviations(folder).items():
            if impl not in impls:
                continue
            groups[(impl, mode, band)].append(d)
            typical[(mode, band)] += [abs(x) for x in d]
            tails[(mode, band)] += [abs(x - st.median(d[:i] + d[i + 1:])) for i, x in enumerate(d)]
            numel = math.prod(int(n) for n in shape.split("x")) if shape and not extras else 0
            if numel:
                by_size[(impl, mode, dtype, numel)].append(st.pvariance(d))
        for key, ds in groups.items():
            v = st.mean(st.pvariance(d) for d in ds)
            cell_var[key].append(v)
            per_process = [st.mean(col) for col in zip(*ds)]
            shared[key].append((st.pvariance(per_process), v, len(ds)))
    print(f"{len(folders)} A/A compares under {args.root}")
    print(f"{'impl':8} {'mode':5} {'band':12} {'cell sd':>8} {'shared':>7} {'1/n':>6}")
    for impl in impls:
        for mode in GATED_MODES:
            for band in BAND_NAMES:
                key = (impl, mode, band)
                if key not in cell_var:
                    continue
                v = st.mean(cell_var[key])
                share = st.mean(s for s, _, _ in shared[key]) / v if v else math.nan
                n = shared[key][0][2]
                print(f"{impl:8} {mode:5} {band:12} {100 * math.sqrt(v):7.2f}% {share:7.2f} {1 / n:6.2f}")
    print(f"\ncell sd by size, {args.dtype} (2^k elements; the cells that name their size alone)")
    for impl in impls:
        for mode in GATED_MODES:
            sizes = sorted(n for i, m, d, n in by_size if (i, m, d) == (impl, mode, args.dtype))
            row = " ".join(f"{int(math.log2(n))}:{100 * math.sqrt(st.mean(by_size[(impl, mode, args.dtype, n)])):.2f}"
                           for n in sizes)
            print(f"{impl:8} {mode:5} {row}")
    print(f"\nthe typical figure and the tail, {', '.join(impls)} together (outlying: more than {OUTLIER}x "
          "from the median of its cell's other rounds)")
    print(f"{'mode':5} {'band':12} {'figures':>8} {'median |dev|':>13} {'outlying':>9} {'largest':>8}")
    for mode in GATED_MODES:
        for band in BAND_NAMES:
            offs = tails.get((mode, band))
            if not offs:
                continue
            out = sum(x > math.log(OUTLIER) for x in offs)
            print(f"{mode:5} {band:12} {len(offs):8} {100 * st.median(typical[(mode, band)]):12.2f}% {out:9} "
                  f"{math.exp(max(offs)):7.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
