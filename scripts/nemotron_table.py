"""The Nemotron table of docs/lab/findings.md, from a tidy CSV of asv results (relu2 export).

    relu2 export docs/findings/results --out /tmp/findings.csv
    python scripts/nemotron_table.py /tmp/findings.csv 44b68df h200 h200-b > table.md

For each Nemotron relu² width and token count: the hot median of every path NemotronH can take in
vLLM, with the memory floor (copy) and this project's fused kernel beside them, as "box 1 / box 2"
(two freshly started H200s measuring the same commit); the last columns name the paths vLLM can run
there that are within TIE of the fastest on box 1, and whether box 2's fastest is among them.
"""

from __future__ import annotations

import sys

from relu2.records.rows import read_csv
from relu2.vocab.schema import NEMOTRON_TOKENS, NEMOTRON_WIDTHS, activation_shape, format_shape

# What vLLM can run for relu² (docs/lab/findings.md says where each one runs), and the references.
VLLM_PATHS = ("vllm_cuda", "compile_dynamic", "compile_model", "compile_dim0", "eager", "eager_inplace")
COLUMNS = ("copy", "fused", *VLLM_PATHS)
TIE = 1.03  # paths within 3% of the fastest are equally fast here (the gate's resolution beyond the L2)


def main(path: str, commit: str, box: str, other: str, mode: str = "hot") -> None:
    rows = [r for r in read_csv(path) if r.commit.startswith(commit) and r.mode == mode and r.status == "ok"]
    by = {(r.machine, r.shape, r.impl): r.median_s for r in rows}
    print("| width | tokens | " + " | ".join(COLUMNS) + " | fastest vLLM paths (within 3%) | box 2's fastest among them |")
    print("|---:|---:|" + "---:|" * len(COLUMNS) + "---|---|")
    for width in NEMOTRON_WIDTHS:
        for tokens in NEMOTRON_TOKENS:
            shape = format_shape(activation_shape(tokens, width))
            if (box, shape, "copy") not in by:
                continue
            cells = [str(width), str(tokens)]
            for impl in COLUMNS:
                a, b = by.get((box, shape, impl)), by.get((other, shape, impl))
                cells.append(f"{_us(a)} / {_us(b)}" if a and b else _us(a) if a else "-")
            best = _fastest(by, box, shape)
            best_other = _fastest(by, other, shape)[:1]
            cells += [", ".join(best) or "-", "yes" if set(best_other) <= set(best) else f"no ({best_other[0]})"]
            print("| " + " | ".join(cells) + " |")


def _fastest(by: dict, machine: str, shape: str) -> list[str]:
    """The vLLM paths within TIE of the fastest on ``machine``, fastest first."""
    candidates = {impl: by[(machine, shape, impl)] for impl in VLLM_PATHS if (machine, shape, impl) in by}
    if not candidates:
        return []
    best = min(candidates.values())
    return sorted((i for i, t in candidates.items() if t <= TIE * best), key=candidates.get)


def _us(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e6:.1f}" if seconds * 1e6 < 100 else f"{seconds * 1e6:.0f}"


if __name__ == "__main__":
    main(*sys.argv[1:])
