"""A/A of relu2 compare on the CPU quick grid: `relu2 compare REF REF` N times, and how many pass.

    python scripts/aa_compare.py [--runs 20] [--out .asv/aa-compare] [--ref HEAD] [--judge-only]

Measuring: a fresh clone of this checkout at REF (OUT/clone), then for each run i
`relu2 compare REF REF --suites Grid --measure-only --out OUT/aa-NN` from that clone, with
RELU2_BENCH_QUICK=1 (eager and copy, float32, 2^10 and 2^12 elements).  A folder already complete
is kept (the script resumes).  Judging: each folder with relu2.runs.compare.judge of THIS checkout (what
`relu2 compare` runs after measuring), from run --first on; the count is printed last:
"A/A: P of N passed".  Runs before --first are left to learn the same-box model from
(relu2 noise learn --same-box), so the count is out of sample.

Slow: a compare is about a minute on an idle 2-core box.  Run it nice'd in the background.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
QUICK = {"RELU2_BENCH_QUICK": "1"}


def measure(out: Path, ref: str, runs: int, rounds: int) -> None:
    clone = out / "clone"
    sha = subprocess.run(["git", "-C", str(HERE), "rev-parse", ref], check=True, capture_output=True,
                         text=True).stdout.strip()
    if not clone.is_dir():
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(HERE), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "fetch", "-q", str(HERE), sha], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", "--detach", sha], check=True)
    print(f"measuring with a clone at {sha[:8]}", flush=True)
    for i in range(1, runs + 1):
        folder = out / f"aa-{i:02d}"
        if _complete(folder):
            continue
        if folder.exists():
            subprocess.run(["rm", "-rf", str(folder)], check=True)
        cmd = [sys.executable, "-m", "relu2", "compare", "HEAD", "HEAD", "--suites", "Grid", "--rounds", str(rounds),
               "--device", "cpu", "--measure-only", "--out", str(folder)]
        run = subprocess.run(cmd, cwd=clone, env=dict(os.environ, **QUICK), capture_output=True, text=True)
        print(f"aa-{i:02d}: measured, exit {run.returncode}, {time.strftime('%H:%M:%S', time.gmtime())} UTC" + (f": {run.stderr.strip().splitlines()[-1]}"
                                                               if run.returncode else ""), flush=True)


def _complete(folder: Path) -> bool:
    try:
        return bool(json.loads((folder / "compare.json").read_text()).get("complete"))
    except (OSError, ValueError):
        return False


def judge(out: Path, first: int, noise_model: str | None) -> tuple[int, int]:
    sys.path.insert(0, str(HERE))
    from relu2.runs import compare

    passed = judged = 0
    for folder in sorted(out.glob("aa-*")):
        if int(folder.name.split("-")[1]) < first or not _complete(folder):
            continue
        report, code = compare.judge(folder, "json", noise_model=noise_model)
        data = json.loads(report)
        judged += 1
        passed += code == 0
        flagged = ", ".join(c["label"] for c in data.get("regressions", [])) or "-"
        print(f"{folder.name}: exit {code}  flagged: {flagged}", flush=True)
    return passed, judged


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=20, help="compares to measure (default 20)")
    p.add_argument("--rounds", type=int, default=3, help="rounds a side (default 3, relu2 compare's)")
    p.add_argument("--out", default=str(HERE / ".asv" / "aa-compare"), help="where the folders go")
    p.add_argument("--ref", default="HEAD", help="the commit compared with itself (default HEAD)")
    p.add_argument("--first", type=int, default=1, help="judge runs from this one on (the earlier ones learn)")
    p.add_argument("--judge-only", action="store_true", help="judge the folders already measured")
    p.add_argument("--noise-model", default=None, help="the same-box model to judge with")
    args = p.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not args.judge_only:
        measure(out, args.ref, args.runs, args.rounds)
    passed, judged = judge(out, args.first, args.noise_model)
    print(f"A/A: {passed} of {judged} passed (relu2 compare HEAD HEAD, CPU quick grid, Grid suite)")
    return 0 if judged else 1


if __name__ == "__main__":
    sys.exit(main())
