"""The paired verdict out of sample, on a folder of compare folders from several boxes (as
scripts/h200.sh's compare= steps write them): each box left out in turn, its folders judged by

* the shipped model (learned from no box here: out of sample by construction), and
* the same-box model learned from every other box's folders (relu2 noise learn --same-box),

and, for a compare whose head is another commit (a planted branch), per mode and band of the
implementation it changed, how many cells moved and how many each model flagged.

    python scripts/paired_out_of_sample.py docs/aa/compare-h200-2026-12-02 [--impl fused]

The figures are what docs/results.md quotes ("The paired verdict on the H200")."""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path

from relu2 import noise
from relu2.asv_names import decode
from relu2.gate import compare_sides, gate_compare, noise_learn, read_compare
from relu2.verdict import GATED_MODES


def folders_of(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.glob("*/compare.json"))


def bands_of(report, impl: str, l2: int) -> dict[tuple[str, str], tuple[list[float], int]]:
    """(mode, band) -> (the moves of ``impl``'s timed cells, how many of them were flagged)."""
    flagged = {c.label for c in report.regressions}
    out: dict[tuple[str, str], tuple[list[float], int]] = defaultdict(lambda: ([], 0))
    for c in report.cells:
        cell = decode(c.benchmark, c.params, c.unit)
        if cell.impl != impl or cell.measure not in GATED_MODES:
            continue
        key = (cell.measure, noise.band_of_cell(cell, l2))
        moves, n = out[key]
        out[key] = ([*moves, c.moved], n + (c.label in flagged))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path, help="a folder of compare folders")
    ap.add_argument("--impl", default="fused", help="the implementation a planted branch changes (default fused)")
    args = ap.parse_args(argv)
    folders = folders_of(args.root)
    if not folders:
        ap.error(f"{args.root}: no compare folders (DIR/*/compare.json)")
    boxes = sorted({read_compare(f).box for f in folders})
    if len(boxes) < 2:
        ap.error(f"{args.root}: compares of {len(boxes)} box; leaving one out needs two")
    verdicts, planted = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for box in boxes:
            mine = [f for f in folders if read_compare(f).box == box]
            model = Path(tmp) / f"without-{box}.json"
            noise_learn([], model, same_box=[str(f) for f in folders if f not in mine])
            for f in mine:
                meta = read_compare(f)
                l2 = noise.l2_of(compare_sides(meta)[1].info) or noise.KNOWN_L2["H200"]
                shipped, held = gate_compare(f), gate_compare(f, noise_model=model)
                verdicts.append((f.name, meta.base == meta.head, shipped, held))
                if meta.base != meta.head:
                    planted.append((f.name, bands_of(shipped, args.impl, l2), bands_of(held, args.impl, l2)))
    print("compare                                       kind  shipped model           same-box, box left out")
    for name, aa, s, h in verdicts:
        say = lambda r: f"{'FAIL' if r.exit_code else 'PASS'} ({len(r.regressions)} flagged)"  # noqa: E731
        print(f"{name:<45} {'A/A' if aa else 'A/B':<5} {say(s):<23} {say(h)}")
    for name, s, h in planted:
        print(f"\n{name}: {args.impl}'s cells, flagged by the shipped model / the same-box model (box left out)")
        print("  mode  band      cells  median move  shipped  same-box")
        for key in sorted(s, key=lambda k: (k[0], noise.BAND_NAMES.index(k[1]))):
            moves, n_s = s[key]
            print(f"  {key[0]:<5} {key[1]:<9} {len(moves):>5}  {statistics.median(moves):>10.3f}x  {n_s:>7}  {h[key][1]:>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
