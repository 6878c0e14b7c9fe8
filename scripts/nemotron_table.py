"""The Nemotron table of docs/findings.md, from a tidy CSV of asv results (relu2 export).

    relu2 export docs/aa/results --machine h200-a --out /tmp/h200-a.csv
    python scripts/nemotron_table.py /tmp/h200-a.csv 0b29c8e > table.md

For each Nemotron relu² width and token count: hot latency of the vLLM paths, as multiples of copy
(the memory floor) and of fused; ! marks a compiled path more than 10% slower than fused, !! one
slower than eager.
"""

from __future__ import annotations

import sys

from relu2.results import read_csv
from relu2.schema import NEMOTRON_TOKENS, NEMOTRON_WIDTHS

IMPLS = ("eager", "fused", "compile_dynamic", "compile_dim0")


def main(path: str, commit: str, mode: str = "hot") -> None:
    rows = [r for r in read_csv(path) if r.commit.startswith(commit) and r.mode == mode and r.status == "ok"
            and r.dtype == "bfloat16"]
    by = {(r.shape, r.impl): r.median_s for r in rows}
    print("| width | tokens | copy | eager | fused | compile_dynamic (vLLM) | compile_dim0 |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for width, model in NEMOTRON_WIDTHS.items():
        for tokens in NEMOTRON_TOKENS:
            shape = f"{tokens}x{width}"
            if (shape, "copy") not in by:
                continue
            copy, fused, eager = by[(shape, "copy")], by[(shape, "fused")], by[(shape, "eager")]
            cells = [f"{width}", f"{tokens}", _us(copy), f"{_us(eager)} ({eager / copy:.2f}x)",
                     f"{_us(fused)} ({fused / copy:.2f}x)"]
            for impl in IMPLS[2:]:
                t = by.get((shape, impl))
                mark = ("!!" if t > eager else "!" if t > 1.10 * fused else "") if t else ""
                cells.append(f"{_us(t)} ({t / copy:.2f}x copy, {t / fused:.2f}x fused){mark}" if t else "-")
            print("| " + " | ".join(cells) + " |")


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs" if seconds * 1e6 < 100 else f"{seconds * 1e6:.0f} µs"


if __name__ == "__main__":
    main(*sys.argv[1:])
