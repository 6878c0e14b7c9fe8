"""Where the hot figure's noise between processes comes from (a lab probe, one process a run).

    python scripts/hot_noise.py OUT.jsonl           measure in this process, append a line per (impl, size, method)
    python scripts/hot_noise.py --report OUT.jsonl  the spread of each method, per GPU (OUT.jsonl.gz too)

Hypothesis: triton's do_bench_cudagraph sizes its graph (n_repeat = rep / estimate) from five *eager*
launches timed by events, which for a kernel of a microsecond can be the host's launch cost, not the
GPU's: the graph's length may then differ between processes, and with it how much of the graph's
fixed cost each call carries.  Cold in the L2 (the project's own graph, calls from a GPU-side
estimate, capped at 1000) is 1.8-3.7x quieter between processes than hot on the same cells
(scripts/aa_spread.py on the H200 A/As of 2026-12-02).

Methods, each repeated REPEATS times in this process, a new graph each time, on fused and on the
project's copy kernel (relu2.measure.registry.copy_bytes), bf16:
  dbc        do_bench_cudagraph(rep=2 ms, return_mode="all"), median of replays 2..10: the project's hot
             figure of one round (relu2.measure.timing.ROUND_BUDGET)
  dbc_sleep  the same, its warm-up call leaving the GPU asleep (its estimate then times the GPU)
  gpu_est    a graph of N calls, N from five calls timed behind a GPU sleep, capped at 1000
  fixed      a graph of 1000 calls (8 beyond 2^22 elements)
  fresh_x    gpu_est, each repeat on a freshly allocated input (all kept alive: a new address each)
and the graph lengths dbc and dbc_sleep chose (calls made while capturing).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import statistics as st
import sys
import uuid
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from relu2.measure.timing import ESTIMATE_SLEEP_CYCLES as SLEEP_CYCLES  # noqa: E402  (hot method 3's own)

SIZES = [2**10, 2**14, 2**18, 2**20, 2**22, 2**24, 2**28]
REPEATS = 5
REP_MS = 2.0
CAP = 1000
METHODS = ("dbc", "dbc_sleep", "gpu_est", "fixed", "fresh_x")
LENGTHS = ("dbc_n", "dbc_sleep_n", "gpu_n")


def graph_per_call_ms(call, n: int) -> float:
    """Per call, a CUDA graph of ``n`` calls: the median of replays 2..10."""
    import torch

    from relu2.measure.timing import _event_ms as event_ms
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            call()
    g.replay()
    torch.cuda.synchronize()
    return st.median([event_ms(g.replay) / n for _ in range(10)][1:])


def gpu_n(call) -> int:
    """Hot method 3's graph length: REP_MS over five calls timed behind a GPU sleep, capped at CAP."""
    import torch

    from relu2.measure.timing import _event_ms as event_ms
    est = event_ms(lambda: [call() for _ in range(5)], before=lambda: torch.cuda._sleep(SLEEP_CYCLES)) / 5
    return max(1, min(CAP, math.ceil(REP_MS / est))) if est > 0 else CAP


def measure(path: str) -> None:
    import torch
    import triton
    import triton.testing

    from relu2.measure.registry import copy_bytes
    from relu2_impls.fused import relu_squared

    run = {"run": uuid.uuid4().hex[:8], "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__}

    def dbc(call, sleep: bool) -> tuple[float, int]:
        """do_bench_cudagraph's figure of ``call`` as the project reads it, and the calls its graph holds."""
        state = {"first": True, "captured": 0}

        def counted() -> None:
            call()
            if torch.cuda.is_current_stream_capturing():
                state["captured"] += 1
            elif sleep and state["first"]:
                torch.cuda._sleep(SLEEP_CYCLES)  # the estimate's five calls queue behind it
            state["first"] = False

        ms = triton.testing.do_bench_cudagraph(counted, rep=REP_MS, return_mode="all")
        return st.median(ms[1:]), state["captured"]

    def one(on, x) -> dict[str, list[float]]:
        call = on(x)
        call()
        torch.cuda.synchronize()
        got: dict[str, list[float]] = defaultdict(list)
        for _ in range(REPEATS):
            for name, sleep in (("dbc", False), ("dbc_sleep", True)):
                figure, n = dbc(call, sleep)
                got[name].append(figure)
                got[f"{name}_n"].append(n)
            n = gpu_n(call)
            got["gpu_n"].append(n)
            got["gpu_est"].append(graph_per_call_ms(call, n))
            got["fixed"].append(graph_per_call_ms(call, CAP if x.numel() <= 2**22 else 8))
        fresh = [torch.randn_like(x) for _ in range(REPEATS)]  # all alive: each at its own address
        for y in fresh:
            c = on(y)
            c()
            got["fresh_x"].append(graph_per_call_ms(c, gpu_n(c)))
        return got

    impls = {"fused": lambda t: (lambda: relu_squared(t)), "copy": lambda t: (lambda: copy_bytes(t))}
    with torch.cuda.stream(torch.cuda.Stream()):
        for numel in SIZES:
            x = torch.randn(max(1, numel // 4096), min(numel, 4096), device="cuda", dtype=torch.bfloat16)
            for impl, on in impls.items():
                rows = [{**run, "pid": os.getpid(), "impl": impl, "numel": numel, "method": m, "values": v}
                        for m, v in one(on, x).items()]
                with open(path, "a") as f:  # each cell as it ends: a crash keeps what was measured
                    f.write("".join(json.dumps(r) + "\n" for r in rows))
            del x
    print(f"run {run['run']} (process {os.getpid()}, {run['gpu']}) -> {path}")


def report(path: str) -> None:
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:  # committed data is gzipped
        rows = [json.loads(line) for line in f]
    by: dict[tuple, dict[str, list[float]]] = defaultdict(dict)  # (gpu, impl, numel, method) -> run -> values
    for r in rows:
        by[(r["gpu"], r["impl"], r["numel"], r["method"])][r["run"]] = r["values"]
    for gpu in sorted({r["gpu"] for r in rows}):
        runs = len({r["run"] for r in rows if r["gpu"] == gpu})
        print(f"\n{gpu}: {runs} processes.  Per method, sd of log(per-call time) in %: ONE = between processes of "
              "each one's first figure (an A/A round's), MED = between processes of each one's median of "
              f"{REPEATS}, IN = within a process (n-1); then the mean in us")
        print(f"{'impl':6} {'numel':>10} " + " ".join(f"{m + ' ONE/MED/IN us':>24}" for m in METHODS) +
              "  graph lengths dbc | dbc_sleep | gpu")
        for impl in ("fused", "copy"):
            for numel in SIZES:
                cells = []
                for m in METHODS:
                    per = by.get((gpu, impl, numel, m), {})
                    if len(per) < 2:
                        cells.append(f"{'-':>24}")
                        continue
                    logs = [[math.log(x) for x in v] for v in per.values()]
                    first = st.stdev(v[0] for v in logs)
                    med = st.stdev(st.median(v) for v in logs)
                    within = math.sqrt(st.mean(st.variance(v) for v in logs))
                    mean_us = 1e3 * math.exp(st.mean(x for v in logs for x in v))
                    cells.append(f"{100 * first:.2f}/{100 * med:.2f}/{100 * within:.2f} {mean_us:.2f}".rjust(24))
                lengths = []
                for m in LENGTHS:
                    ns = [n for v in by.get((gpu, impl, numel, m), {}).values() for n in v]
                    lengths.append(f"{min(ns)}-{max(ns)}" if ns else "-")
                print(f"{impl:6} {numel:>10} " + " ".join(cells) + "  " + " | ".join(lengths))


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--report":
        if not Path(argv[1]).is_file():
            print(f"hot_noise: no such file: {argv[1]}", file=sys.stderr)
            return 2
        report(argv[1])
    elif len(argv) == 1 and not argv[0].startswith("-"):
        measure(argv[0])
    else:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
