"""Which work counters are exact: every cell's counters across runs of `relu2 counters` (A/A), and
what planted kernel changes do to them.

    python scripts/counters_aa.py docs/aa/counters-h200-2026-12-03
    python scripts/counters_aa.py docs/aa/counters-h200-2026-12-03 docs/aa/counters-h100-2026-12-05

Each FOLDER holds one folder a box (box-a, box-b, ...), each holding the runs `relu2 counters` wrote
(aa-N: the same commit, every implementation; anything else: a planted change, compared with the
box's aa-1); several FOLDERs are read as one set of boxes (their box names must differ).
A counter is exact in a cell when every launch of every A/A run, on every box, reads
the same value for every kernel.  A compiled path whose autotuning picked another configuration in
one run ran another kernel (its launch differs): those cells are counted apart, since there the
counters are right to differ.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from relu2.records.work import COUNTERS, Counted, Work, describe_change, read_report  # noqa: E402
from relu2.vocab.schema import Cell, itemsize  # noqa: E402


def spread(values: list[float]) -> float:
    top = max(values)
    return (top - min(values)) / top if top else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", type=Path, nargs="+", metavar="FOLDER")
    args = parser.parse_args(argv)
    missing = [str(f) for f in args.folders if not f.is_dir()]
    if missing:
        print(f"counters_aa: no such folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    boxes = sorted(p for folder in args.folders for p in folder.iterdir() if p.is_dir())
    names = [box.name for box in boxes]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        print(f"counters_aa: box names repeat across folders: {', '.join(repeated)}", file=sys.stderr)
        return 2
    aa: dict[str, Counted] = {}
    planted: dict[str, tuple[Counted, Counted]] = {}
    for box in boxes:
        runs = sorted(p for p in box.iterdir() if (p / "counters.json.gz").exists() or (p / "counters.json").exists())
        first = next((r for r in runs if r.name == "aa-1"), None)
        for run in runs:
            if run.name.startswith("aa-"):
                aa[f"{box.name}/{run.name}"] = read_report(run)
            elif first is not None and run.name != "smoke":
                planted[f"{box.name}/{run.name}"] = (read_report(first), read_report(run))
    if len(aa) < 2:
        print(f"{' '.join(map(str, args.folders))}: fewer than two A/A runs", file=sys.stderr)
        return 2

    seen: dict[Cell, list[Work]] = defaultdict(list)
    for counted in aa.values():
        for cell, works in counted.works.items():
            seen[cell] += works
    repicked = {cell for cell, works in seen.items() if len({w.launches for w in works}) > 1}
    steady = {cell: works for cell, works in seen.items() if cell not in repicked}
    launches = sum(len(w) for w in seen.values())
    print(f"{len(aa)} A/A runs on {len(boxes)} boxes ({', '.join(aa)}): {len(seen)} cells, {launches} launches")
    print(f"{len(repicked)} cells ran another kernel in some run (autotuning picked another launch): "
          + ", ".join(sorted({c.impl for c in repicked})))
    print(f"\n{'counter':<18}{'exact':>7}  in cells of one launch ({len(steady)}); largest spread of a call's total")
    for counter in COUNTERS:
        same = sum(len({tuple(k.counts[counter.name] for k in w.kernels) for w in works}) == 1
                   for works in steady.values())
        worst = max(spread([w.total(counter.name) for w in works]) for works in steady.values())
        print(f"{counter.name:<18}{same:>4}/{len(steady)}  {100 * worst:.4g}%")

    print("\nDRAM bytes read, largest spread by input size (bytes)")
    by_size: dict[int, float] = defaultdict(float)
    for cell, works in steady.items():
        size = cell.numel * itemsize(cell.dtype)
        by_size[size] = max(by_size[size], spread([w.total("dram_read_bytes") for w in works]))
    for size, worst in sorted(by_size.items()):
        print(f"{size:>12}  {100 * worst:.3f}%")

    for label, (base, head) in planted.items():
        changed = {cell: describe_change(base.works[cell][0], works[0])
                   for cell, works in head.works.items() if cell in base.works}
        moved = {c: text for c, text in changed.items() if text}
        print(f"\n{label}: work changed in {len(moved)} of {len(changed)} cells")
        for cell, text in moved.items():
            if cell.dtype == "bfloat16" and cell.impl != "copy":
                print(f"  {cell.describe():<32} {text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
