"""What more rounds do for a cell whose work changed, on recorded A/A compares of one GPU (each box left out).

    python scripts/changed_rounds.py docs/aa/compare-h200-2026-12-02 [MORE FOLDERS] [--share 60] [--learn-also FOLDER]

The A/A compares one box made, one after another, are read as one compare of 3, 6, 9 ... rounds (the
first k of them concatenated: real rounds of fresh processes on one box, as relu2 compare adds them).
Each fixed-kernel cell of box X is judged as a cell whose work changed (``relu2.judge.gate.changed_rule``)
by the same-box model learned without box X, at 1/SHARE of the budget (a fused Grid change: 60 gated
cells), measured again while ``relu2.judge.rule.settled`` says it is not settled, as relu2 compare does.
Printed per mode and band: how many such judgments FAIL on identical code (both directions: the
price of the lower bar when work changed but time did not), and how many FAIL with the head's rounds
planted slower by the band's ``matters`` (the smallest slowdown it must tell), with the mean rounds used.
The first three columns are each cell at 3 rounds alone, then sequentially at up to all of the box's.
``--learn-also FOLDER``: the compare folders in FOLDER (planted ones too: their cells of unchanged work
are A/A pairs, as ``relu2 noise learn --same-box`` reads them) teach every held-out model as well; only
the A/As are replayed.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from relu2.judge import noise  # noqa: E402
from relu2.judge.gate import changed_rule, compare_sides  # noqa: E402
from relu2.judge.learn import rounds_of, same_box_seen  # noqa: E402
from relu2.judge.rule import Figure, family_of, is_slower, move, reference_moves, settled  # noqa: E402
from relu2.records.compare_folder import read_compare  # noqa: E402
from relu2.vocab.errors import ResultsError  # noqa: E402
from relu2.vocab.schema import band_named, quantile  # noqa: E402


def concatenated(sides: list, k: int) -> list[tuple]:
    """(base, head) measurements of the first ``k`` compares, each cell's rounds one after another."""
    by_cell = [({x.cell: x for x in b.measurements}, {x.cell: x for x in h.measurements}) for b, h in sides[:k]]
    out = []
    for cell in by_cell[0][0]:
        got = [(b.get(cell), h.get(cell)) for b, h in by_cell]
        if any(b is None or h is None or not b.samples or len(b.samples) != len(h.samples) for b, h in got):
            continue
        bs = tuple(s for b, _ in got for s in b.samples)
        hs = tuple(s for _, h in got for s in h.samples)
        out.append((replace(got[0][0], samples=bs, value=quantile(bs, 0.5)),
                    replace(got[0][1], samples=hs, value=quantile(hs, 0.5))))
    return out


def judged(stages: list[dict], cell, model, share: int, l2: int, planted: float, reverse: bool) -> tuple[bool, bool, int]:
    """One cell judged as changed work, its head planted ``planted`` slower (``reverse``: base and head
    swapped): (FAIL at 3 rounds, FAIL once settled or at the last stage the box has, rounds used)."""
    for i, stage in enumerate(stages):
        b, h, offset = stage[cell]
        fb, fh = Figure.of(b), Figure.of(h)
        if reverse:
            fb, fh, offset = fh, fb, -offset
        fh = fh.scaled(planted)
        rule = changed_rule(model, b, share, l2, 0.0)  # as relu2 gate judges them: no floor
        slower = is_slower(fb, fh, rule, True, offset)
        first = slower if i == 0 else first
        if settled(fb, fh, rule, True, offset) or i == len(stages) - 1 or cell not in stages[i + 1]:
            return first, slower, len(fb.samples)
    raise AssertionError("no stage")


def spread_table(by_box: dict, l2: int) -> None:
    """How far identical code's paired move reaches at 3, 6 and 12 rounds: per family, mode and band, the
    90th and 99th percentile and the largest |move| (the references' move taken out) of the first 1, 2
    and 4 compares of each box concatenated (each box's cells once per round count, where it has them)."""
    band = lambda cell: noise.band_of_cell(cell, l2)  # noqa: E731
    moves: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for sides in by_box.values():
        for k in (1, 2, 4):
            if len(sides) < k:
                continue
            pairs = concatenated(sides, k)
            offsets = reference_moves(pairs, band, paired=True)
            for b, h in pairs:
                if b.cell.measure in ("hot", "cold"):
                    moved = move(Figure.of(b), Figure.of(h), True) - offsets.get((b.cell.measure, band(b.cell)), 0.0)
                    moves[noise.group_of(b.cell, l2)][3 * k].append(abs(moved))
    print("identical code's |paired move|, q90 / q99 / max (cells), a box's first 1, 2, 4 A/As as one compare")
    print(f"{'family, mode, band':<34}" + "".join(f"{f'{n} rounds':>28}" for n in (3, 6, 12)))
    for key in sorted(moves, key=lambda g: (g[0], g[1], noise.BAND_NAMES.index(g[2]))):
        cols = []
        for n in (3, 6, 12):
            v = moves[key][n]
            cols.append(f"{100 * quantile(v, .9):.2f}% {100 * quantile(v, .99):.2f}% {100 * max(v):.2f}% ({len(v)})"
                        if v else "-")
        print(f"{', '.join(key):<34}" + "".join(f"{c:>28}" for c in cols))


def compare_folders(folders: list[Path]) -> list[str]:
    """The compare folders (DIR/compare.json) in ``folders``, each once."""
    return list(dict.fromkeys(str(d) for f in folders for d in sorted(f.iterdir()) if (d / "compare.json").exists()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, nargs="+", help="folders of compare folders (every A/A in them is read)")
    parser.add_argument("--share", type=int, default=60, help="cells whose work changed (default 60: fused's Grid)")
    parser.add_argument("--plant", type=float, default=None, metavar="RATIO",
                        help="the head planted RATIO slower (default: each band's matters)")
    parser.add_argument("--learn-also", type=Path, action="append", default=[], metavar="FOLDER",
                        help="a folder of compare folders whose cells of unchanged work also teach each model")
    args = parser.parse_args(argv)
    for folder in [*args.folder, *args.learn_also]:
        if not folder.is_dir():
            parser.error(f"{folder}: no such folder")
    if args.plant is not None and not args.plant > 0:
        parser.error(f"--plant {args.plant}: a ratio must be positive")
    aa = [d for d in compare_folders(args.folder) if (lambda m: m.base == m.head)(read_compare(d))]
    if not aa:
        parser.error(f"no A/A compare folder (base = head) in {', '.join(map(str, args.folder))}")
    also = [d for d in compare_folders(args.learn_also) if d not in aa]  # an A/A teaches once
    if args.learn_also and not also:
        parser.error(f"--learn-also: no compare folder not already read in {', '.join(map(str, args.learn_also))}")
    try:
        learned_at = rounds_of([*aa, *also])  # one round count, as relu2 noise learn asks
        seen, _, fixed = same_box_seen([*aa, *also])
    except ResultsError as e:  # A/As of several GPUs, say
        parser.error(str(e))
    l2 = fixed["l2_bytes"]
    by_box: dict[str, list] = defaultdict(list)
    for d in aa:
        by_box[read_compare(d).box].append(compare_sides(read_compare(d)))
    tally: dict[tuple, Counter] = defaultdict(Counter)
    band = lambda cell: noise.band_of_cell(cell, l2)  # noqa: E731
    for box, sides in sorted(by_box.items()):
        model = replace(noise.held_out(seen, box, **fixed)[0], rounds=learned_at)
        stages = []
        for k in range(1, len(sides) + 1):
            pairs = concatenated(sides, k)
            offsets = reference_moves(pairs, band, paired=True)
            stages.append({b.cell: (b, h, offsets.get((b.cell.measure, band(b.cell)), 0.0)) for b, h in pairs})
        for cell in stages[0]:
            if family_of(cell.impl) != "fixed kernels" or cell.measure not in ("hot", "cold"):
                continue
            key = noise.group_of(cell, l2)
            if model.fit_for(key) is None:
                continue
            row = tally[(cell.measure, key[2])]
            row["cells"] += 1
            for reverse in (False, True):  # identical code, both directions
                first, last, _ = judged(stages, cell, model, args.share, l2, 1.0, reverse)
                row["aa fail 3"] += first
                row["aa fail"] += last
            planted = band_named(key[2]).matters if args.plant is None else args.plant
            first, last, rounds = judged(stages, cell, model, args.share, l2, planted, False)
            row["planted 3"] += first
            row["planted"] += last
            row["rounds"] += rounds
    spread_table(by_box, l2)
    print(f"\n{len(aa)} A/A compares on {len(by_box)} boxes ({', '.join(f'{b[:8]}: {len(s)}' for b, s in by_box.items())}); "
          f"fixed kernels judged as changed work at 1/{args.share} of the budget, each box left out"
          + (f"; {len(also)} more compares taught each model" if also else ""))
    print(f"{'mode':<6}{'band':<10}{'cells':>6}{'A/A FAIL, 3 rounds':>20}{'planted caught':>16}"
          f"{'A/A FAIL, more':>16}{'planted caught':>16}{'mean rounds':>13}")
    for (mode, band_name), row in sorted(tally.items()):
        n = row["cells"]
        aa3, aa, p3, p = (f"{row['aa fail 3']} of {2 * n}", f"{row['aa fail']} of {2 * n}",
                          f"{row['planted 3']} ({row['planted 3'] / n:.0%})", f"{row['planted']} ({row['planted'] / n:.0%})")
        print(f"{mode:<6}{band_name:<10}{n:>6}{aa3:>20}{p3:>16}{aa:>16}{p:>16}{row['rounds'] / n:>13.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
