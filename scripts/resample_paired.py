"""How many rounds a paired compare needs on a box: resample the rounds of recorded A/A compares.

    python scripts/resample_paired.py docs/aa/compare-cpu-quiet --rounds 12 20 40 --factor 1.25 1.4

For each timed cell (implementation, mode, numel) the (base round, head round) pairs of every A/A
folder under FOLDER are pooled; a trial draws ROUNDS pairs with replacement and judges them by the
paired move the verdict judges (``relu2.runs.bisect.paired_move``), once as they are (identical code) and
once with the head rounds times STEP (a planted slowdown).  Printed: per rounds and factor, the share
of trials of identical cells beyond the factor, and of planted ones.

It assumes rounds are independent draws, which a real compare's are not quite (a box's slow minutes
fall on neighbouring rounds): read its shares as a lower bound on what one compare sees.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from relu2.runs.bisect import paired_move  # noqa: E402
from relu2.judge.gate import compare_sides  # noqa: E402
from relu2.records.compare_folder import read_compare  # noqa: E402

TIMED = ("hot", "cold")


def pooled_rounds(root: Path) -> dict[tuple[str, str, str], list[tuple[float, float]]]:
    """(impl, mode, numel) -> every (base round, head round) of the A/A folders under ``root``."""
    pool: dict[tuple[str, str, str], list[tuple[float, float]]] = defaultdict(list)
    for info in sorted(root.glob("*/compare.json")):
        base, head = compare_sides(read_compare(info.parent))
        heads = {m.cell: m for m in head.measurements}
        for m in base.measurements:
            other = heads.get(m.cell)
            if other is None or not m.samples or m.cell.measure not in TIMED:
                continue
            params = dict(m.cell.params)
            pool[(params["impl"], m.cell.measure, params["numel"])].extend(zip(m.samples, other.samples))
    return pool


def shares(pool: dict, rounds: int, factor: float, step: float, trials: int, seed: int) -> tuple[float, float]:
    """(identical cells beyond ``factor``, cells ``step`` slower beyond it) over ``trials`` draws a cell."""
    rng = random.Random(seed)
    same = slower = total = 0
    for pairs in pool.values():
        for _ in range(trials):
            drawn = [rng.choice(pairs) for _ in range(rounds)]
            base, head = [b for b, _ in drawn], [h for _, h in drawn]
            same += paired_move(base, head) > factor
            slower += paired_move(base, [h * step for h in head]) > factor
            total += 1
    return same / total, slower / total


def _at_least(kind: type, low: float):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if not value >= low:
            raise argparse.ArgumentTypeError(f"{text} is below {low:g}")
        return value
    return parse


def main() -> int:
    from relu2.vocab.schema import MIN_ROUNDS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="a folder of relu2 compare A/A folders (each with compare.json)")
    p.add_argument("--rounds", type=_at_least(int, MIN_ROUNDS), nargs="+", default=[12, 20, 40],
                   help=f"rounds a side to draw (each at least {MIN_ROUNDS})")
    p.add_argument("--factor", type=_at_least(float, 1.0), nargs="+", default=[1.25, 1.4],
                   help="the factors a move must exceed (each at least 1)")
    p.add_argument("--step", type=_at_least(float, 1.0), default=1.5, help="the planted slowdown (default 1.5)")
    p.add_argument("--trials", type=_at_least(int, 1), default=2000, help="draws per cell (default 2000)")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    pool = pooled_rounds(args.folder)
    if not pool:
        print(f"resample_paired: {args.folder}: no A/A compare folder with timed cells", file=sys.stderr)
        return 2
    folders = len(list(args.folder.glob("*/compare.json")))
    print(f"{folders} A/A compares, {len(pool)} timed cells, {args.trials} draws a cell, step {args.step:g}x")
    print("rounds  factor  identical beyond  planted beyond")
    for rounds in args.rounds:
        for factor in args.factor:
            same, slower = shares(pool, rounds, factor, args.step, args.trials, args.seed)
            print(f"{rounds:>6}  {factor:>6.2f}  {same:>16.2%}  {slower:>14.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
