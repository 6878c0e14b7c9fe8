"""The paired verdict out of sample, on a folder of compare folders from several boxes (as
scripts/h200.sh's compare= steps write them): each box left out in turn, its folders judged by

* the shipped model (learned from no box here: out of sample by construction), and
* the same-box model learned from every other box's folders (relu2 noise learn --same-box),

each A/A both ways round (as relu2 noise check --same-box counts them),

and, for a compare whose head is another commit (a planted branch), per mode and band of the
implementation it changed, how many cells moved and how many each model flagged.

    python scripts/paired_out_of_sample.py docs/aa/compare-h200-2026-12-02 [--impl fused]

The figures are what docs/lab/results.md quotes ("The paired verdict on the H200")."""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path

from relu2.judge import noise
from relu2.records.asv_names import decode
from relu2.judge.gate import compare_sides, gate_compare
from relu2.records.compare_folder import read_compare
from relu2.judge.learn import noise_learn
from relu2.judge.rule import GATED_MODES


def folders_of(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.glob("*/compare.json"))


def bands_of(report, impl: str, l2: int) -> dict[tuple[str, str], list[tuple[float, bool]]]:
    """(mode, band) -> (move, flagged) of each of ``impl``'s timed cells."""
    flagged = {c.label for c in report.regressions}
    out: dict[tuple[str, str], list[tuple[float, bool]]] = defaultdict(list)
    for c in report.cells:
        cell = decode(c.benchmark, c.params, c.unit)
        if cell.impl == impl and cell.measure in GATED_MODES:
            out[(cell.measure, noise.band_of_cell(cell, l2))].append((c.moved, c.label in flagged))
    return out


def reversed_copy(folder: Path, dest: Path) -> Path:
    """An A/A compare folder with its sides swapped (one commit, so compare.json stands as it is)."""
    shutil.copytree(folder, dest)
    (dest / "base").rename(dest / "side")
    (dest / "head").rename(dest / "base")
    (dest / "side").rename(dest / "head")
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path, help="a folder of compare folders")
    ap.add_argument("--impl", default="fused", help="the implementation a planted branch changes (default fused)")
    args = ap.parse_args(argv)
    folders = folders_of(args.root)
    if not folders:
        ap.error(f"{args.root}: no compare folders (DIR/*/compare.json)")
    metas = {f: read_compare(f) for f in folders}
    boxes = sorted({m.box for m in metas.values()})
    if len(boxes) < 2:
        ap.error(f"{args.root}: compares of {len(boxes)} box; leaving one out needs two")
    verdicts, planted = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for box in boxes:
            model = Path(tmp) / f"without-{box}.json"
            noise_learn([], model, same_box=[str(f) for f, m in metas.items() if m.box != box])
            for f in (f for f, m in metas.items() if m.box == box):
                meta = metas[f]
                l2 = noise.l2_of(compare_sides(meta)[1].info)
                if l2 is None:
                    ap.error(f"{f}: its machine.json records no l2_bytes")
                shipped, held = gate_compare(f), gate_compare(f, noise_model=model)
                verdicts.append((f.name, meta.base == meta.head, shipped, held))
                if meta.base == meta.head:  # an A/A read the other way round is a no-change comparison too
                    back = reversed_copy(f, Path(tmp) / "reversed" / f.name)
                    verdicts.append((f"{f.name}, reversed", True, gate_compare(back),
                                     gate_compare(back, noise_model=model)))
                if meta.base != meta.head:
                    planted.append((f.name, bands_of(shipped, args.impl, l2), bands_of(held, args.impl, l2)))
    print("compare                                       kind  shipped model           same-box, box left out")
    for name, aa, s, h in verdicts:
        say = lambda r: f"{'FAIL' if r.exit_code else 'PASS'} ({len(r.regressions)} flagged)"  # noqa: E731
        print(f"{name:<45} {'A/A' if aa else 'A/B':<5} {say(s):<23} {say(h)}")
    aas = [(s, h) for _, aa, s, h in verdicts if aa]
    print(f"no-change comparisons failing: shipped {sum(bool(s.exit_code) for s, _ in aas)} of {len(aas)}, "
          f"same-box (box left out) {sum(bool(h.exit_code) for _, h in aas)} of {len(aas)}")
    for name, s, h in planted:
        print(f"\n{name}: {args.impl}'s cells, flagged by the shipped model / the same-box model (box left out)")
        print("  mode  band      cells  median move  shipped  same-box")
        for key in sorted(s, key=lambda k: (k[0], noise.BAND_NAMES.index(k[1]))):
            moves = [m for m, _ in s[key]]
            print(f"  {key[0]:<5} {key[1]:<9} {len(moves):>5}  {statistics.median(moves):>10.3f}x  "
                  f"{sum(f for _, f in s[key]):>7}  {sum(f for _, f in h[key]):>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
