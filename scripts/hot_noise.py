"""Where the hot figure's noise between processes comes from (a lab probe, one process a run).

    python scripts/hot_noise.py OUT.jsonl          measure in this process, append one line per (impl, size, method)
    python scripts/hot_noise.py --report OUT.jsonl the spread between processes of each method

Hypothesis: triton's do_bench_cudagraph sizes its graph (n_repeat = rep / estimate) from five *eager*
launches timed by events, which for a kernel of a microsecond can be the host's launch cost, not the
GPU's: n_repeat may then differ between processes, and so does how much of the graph's fixed cost each call
carries.  Cold in the L2 (the project's own graph, calls from a GPU-side estimate, capped at 1000) is
about 3x quieter between processes than hot on the same cells (docs/aa A/As of 2026-12-02).

Methods, each repeated REPEATS times in this process, a new graph each time:
  dbc      do_bench_cudagraph(rep=2 ms, return_mode="all"), median of replays 2..10 (the project's hot)
  gpu_est  a graph of N calls, N from five calls timed behind a GPU sleep (host cost out), capped at 1000
  fixed    a graph of 1000 calls (8 beyond 2^22 elements)
  dbc_sleep  dbc, its warm-up call leaving the GPU asleep (its estimate then times the GPU)
  fresh_x  gpu_est, each repeat on a freshly allocated input (kept alive: a new address each time)
and est_n: the n_repeat do_bench_cudagraph would choose, estimated its way, each repeat.
"""

from __future__ import annotations

import json
import math
import os
import statistics as st
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = [2**10, 2**14, 2**18, 2**20, 2**22, 2**24, 2**28]
REPEATS = 5
REP_MS = 2.0
CAP = 1000


def measure(path: str) -> None:
    import torch
    import triton.testing

    from relu2_impls.fused import relu_squared

    def event_ms(work, before=None) -> float:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if before is not None:
            before()
        a.record()
        work()
        b.record()
        b.synchronize()
        return a.elapsed_time(b)

    def graph_per_call_ms(call, n: int) -> float:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(n):
                call()
        g.replay()
        torch.cuda.synchronize()
        ms = [event_ms(g.replay) / n for _ in range(10)]
        return st.median(ms[1:])

    def gpu_n(call) -> int:
        est = event_ms(lambda: [call() for _ in range(5)], before=lambda: torch.cuda._sleep(2_000_000)) / 5
        return max(1, min(CAP, math.ceil(REP_MS / est)))

    def dbc_n(call) -> int:
        est = event_ms(lambda: [call() for _ in range(5)]) / 5
        return max(1, int(REP_MS / est)) if est else 1000

    def sleepy(call):
        """``call``, its first run leaving the GPU asleep: do_bench_cudagraph's five estimate calls are
        then queued behind the sleep and timed as the GPU runs them."""
        first = [True]

        def run() -> None:
            call()
            if first[0]:
                first[0] = False
                torch.cuda._sleep(2_000_000)
        return run

    def one(name: str, numel: int, x, out) -> dict[str, list[float]]:
        on = (lambda t: (lambda: relu_squared(t))) if name == "fused" else (lambda t: (lambda: out.copy_(t)))
        call = on(x)
        call()
        torch.cuda.synchronize()
        got: dict[str, list[float]] = defaultdict(list)
        for _ in range(REPEATS):
            got["est_n"].append(dbc_n(call))
            got["dbc"].append(st.median(triton.testing.do_bench_cudagraph(call, rep=REP_MS, return_mode="all")[1:]))
            ms = triton.testing.do_bench_cudagraph(sleepy(call), rep=REP_MS, return_mode="all")
            got["dbc_sleep"].append(st.median(ms[1:]))
            n = gpu_n(call)
            got["gpu_n"].append(n)
            got["gpu_est"].append(graph_per_call_ms(call, n))
            got["fixed"].append(graph_per_call_ms(call, CAP if numel <= 2**22 else 8))
        fresh = [torch.randn_like(x) for _ in range(REPEATS)]  # all alive: each at its own address
        for y in fresh:
            c = on(y)
            c()
            got["fresh_x"].append(graph_per_call_ms(c, gpu_n(c)))
        return got

    rows = []
    with torch.cuda.stream(torch.cuda.Stream()):
        for numel in SIZES:
            x = torch.randn(numel // 4096 or 1, min(numel, 4096), device="cuda", dtype=torch.bfloat16)
            out = torch.empty_like(x)
            for name in ("fused", "copy"):
                for method, values in one(name, numel, x, out).items():
                    rows.append({"pid": os.getpid(), "impl": name, "numel": numel, "method": method, "values": values})
    with open(path, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"{len(rows)} rows from process {os.getpid()} -> {path}")


def report(path: str) -> None:
    rows = [json.loads(line) for line in open(path)]
    by = defaultdict(dict)  # (impl, numel, method) -> pid -> values
    for r in rows:
        by[(r["impl"], r["numel"], r["method"])][r["pid"]] = r["values"]
    print(f"{len({r['pid'] for r in rows})} processes; sd in % of log(per-call time): between processes "
          "(of each process's median) / within a process (mean of sds)")
    print(f"{'impl':6} {'numel':>8} " + " ".join(f"{m:>17}" for m in ("dbc", "dbc_sleep", "gpu_est", "fixed", "fresh_x")) +
          "   dbc n_repeat (min-max)  gpu N")
    for impl in ("fused", "copy"):
        for numel in SIZES:
            cells = []
            for m in ("dbc", "dbc_sleep", "gpu_est", "fixed", "fresh_x"):
                per = by.get((impl, numel, m), {})
                if len(per) < 2:
                    cells.append(f"{'-':>17}")
                    continue
                med = [math.log(st.median(v)) for v in per.values()]
                within = st.mean(st.pstdev([math.log(x) for x in v]) for v in per.values())
                cells.append(f"{100 * st.stdev(med):.2f}/{100 * within:.2f}% {1e3 * math.exp(st.mean(med)):.2f}us".rjust(17))
            ns = [n for v in by.get((impl, numel, "est_n"), {}).values() for n in v]
            gn = [n for v in by.get((impl, numel, "gpu_n"), {}).values() for n in v]
            print(f"{impl:6} {numel:>8} " + " ".join(cells) +
                  f"   {min(ns, default=0):>5}-{max(ns, default=0):<5}          {min(gn, default=0)}-{max(gn, default=0)}")


if __name__ == "__main__":
    if sys.argv[1] == "--report":
        report(sys.argv[2])
    else:
        measure(sys.argv[1])
