"""How much one process's speed differs from the next on this machine: the same two cells timed in N
fresh processes, one after another.

    python scripts/process_speed.py [--processes 12] [--numel 1024] [--device cpu]

Each process times ``copy`` then ``eager`` (relu2.measure.timing.time_fn, hot, relu2.measure.timing.ROUND_BUDGET: one
round's budget) on one input of NUMEL float32 elements and prints both medians; the last line gives
each cell's spread over the processes (max/min) and the spread of copy/eager within a process.  A
machine whose processes run at different speeds shows a large first figure and a small second one:
then every process's figure carries its process's speed, and a compare needs rounds (processes) to
average it out.  docs/lab/results.md quotes a run of it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

ONE = """
import sys, torch
from relu2.measure.registry import copy_bytes
from relu2.measure.timing import ROUND_BUDGET, time_fn
x = torch.randn(int(sys.argv[1]), device=sys.argv[2])
eager = lambda t: torch.square(torch.nn.functional.relu(t))
print(time_fn(copy_bytes, x, "hot", ROUND_BUDGET).median_s, time_fn(eager, x, "hot", ROUND_BUDGET).median_s)
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--processes", type=int, default=12, help="fresh processes, one after another (default 12)")
    p.add_argument("--numel", type=int, default=1024, help="elements of the float32 input (default 1024)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="default cpu")
    args = p.parse_args()
    if args.processes < 2 or args.numel < 1:
        p.error("--processes needs at least 2 and --numel at least 1")
    copies, eagers = [], []
    for i in range(1, args.processes + 1):
        run = subprocess.run([sys.executable, "-c", ONE, str(args.numel), args.device], capture_output=True, text=True)
        if run.returncode != 0:
            print(f"process {i}: exit {run.returncode}: {(run.stderr.strip().splitlines() or ['?'])[-1]}",
                  file=sys.stderr)
            return 1
        copy_s, eager_s = map(float, run.stdout.split())
        copies.append(copy_s)
        eagers.append(eager_s)
        print(f"process {i:2d}: copy {copy_s * 1e6:7.2f} µs  eager {eager_s * 1e6:7.2f} µs  "
              f"copy/eager {copy_s / eager_s:.2f}", flush=True)
    within = [c / e for c, e in zip(copies, eagers)]
    print(f"over {args.processes} processes: copy max/min {max(copies) / min(copies):.2f}x, eager max/min "
          f"{max(eagers) / min(eagers):.2f}x; within a process copy/eager {min(within):.2f}-{max(within):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
