"""Does a tiny hot figure depend on where its tensors sit?  (a lab probe, one process a run)

    python scripts/hot_levels.py OUT.jsonl           measure in this process, append a line per figure
    python scripts/hot_levels.py --report OUT.jsonl  the levels, and the address bits that tell them apart
    python scripts/hot_levels.py --first OUT.jsonl B probe|instrument
                                                     a fresh process's first figures after B throwaway graphs
    python scripts/hot_levels.py --instrument OUT.jsonl
                                                     the instrument's hot figure on fresh inputs, method 3 and 4
    python scripts/hot_levels.py --rounds DIR...     the cells of compare folders whose rounds sit on two levels

Why: in the paired compares on the H200 (docs/aa/compare-h200-2026-12-06), hot figures at 2^10
elements take one of two levels per process, about 7.5% apart, each tight to 0.3%: fused bf16 1.06 or
1.14 us, copy 0.83 or 0.90 us; fp32 sat at the upper one.  The hot-noise probe
(docs/aa/hot-noise-h200-2026-12-06, method ``fresh_x``) saw the same step in one process: the first
fresh input read 1.06-1.08 us, every later one 1.13-1.17 us.  So the level follows the input's (or the
output's) address, which the caching allocator hands out differently from one process to the next.

Here every figure is hot method 3's graph of one input as the instrument writes it out
(``relu2.measure.timing.graph_replay_samples``: its length from five calls timed behind a GPU sleep,
capped at 1000; the median of replays 2..10, ``graph_ms``), of fused (``relu_squared(x, out=)``) and of the copy kernel
(``bitwise_or(.., out=)``), bf16 and fp32 at 2^10 elements, with both tensors placed by hand in one
large allocation:

  x      the input at OFFSETS from the allocation's start, the output fixed at OUT_AT
  out    the output at OFFSETS, the input fixed at OUT_AT
  fresh  the input and output from the caching allocator (torch.randn, the op's own output), as a
         benchmark gets them: REPEATS of them, all kept alive
  start  that fixed placement (bf16) first thing in the process, START_FIGURES times, then three times
         after each of IDLE_GAPS of idling (with the SM clock, where pynvml is there to read it)
  ref    one fixed placement, measured again before every REF_EVERY-th placement: the control that
         tells a level set by time in the process from one set by the address
  rotK   a candidate cure: the graph's calls cycle over K such pairs (K in ROTATIONS), fresh ones for
         each of ROTATION_REPEATS figures; if the level is the address's, its step shrinks with K
"""

from __future__ import annotations

import gzip
import json
import math
import os
import statistics as st
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NUMEL = 2**10
DTYPES = ("bfloat16", "float32")
# Every 512 bytes (the caching allocator's granule) over 64 KiB, then powers of two up to 16 MiB.
OFFSETS = tuple(range(0, 64 << 10, 512)) + tuple(1 << b for b in range(16, 25))
OUT_AT = 24 << 20
POOL_BYTES = 32 << 20
REPEATS = 16
ROTATIONS = (1, 4, 16, 64)
ROTATION_REPEATS = 8
REF_AT, REF_EVERY = 20 << 20, 16
START_FIGURES, IDLE_GAPS = 12, (0.05, 0.25, 1.0, 3.0)  # s the GPU idles before three more of them
FIRST_FIGURES = 4
FRESH_INPUTS, INSTRUMENT_SIZES = 12, (2**10, 2**14, 2**18)
LEVEL_GAP = 0.03  # two figures more than 3% apart are on different levels (each level is tight to ~0.3%)


def measure(path: str) -> None:
    import torch

    from relu2_impls.fused import relu_squared  # relu2::relu_squared, out= form (builds on first use)

    run = {"run": uuid.uuid4().hex[:8], "pid": os.getpid(), "gpu": torch.cuda.get_device_name(),
           "torch": torch.__version__}
    ints = {2: torch.int16, 4: torch.int32}

    def kernels(x: torch.Tensor, out: torch.Tensor) -> dict[str, object]:
        xi, oi = x.view(ints[x.element_size()]), out.view(ints[x.element_size()])
        return {"fused": lambda: relu_squared(x, out=out), "copy": lambda: torch.bitwise_or(xi, 0, out=oi)}

    start = time.monotonic()

    def figure(call) -> dict:
        """The figure (ms a call), the graph's length, and when in the process it was taken (s)."""
        ms, n = graph_ms(call)
        return {"ms": ms, "n": n, "t": round(time.monotonic() - start, 3)}

    def sm_mhz() -> int | None:
        try:
            return torch.cuda.clock_rate()  # via pynvml, which a box may lack
        except Exception:  # noqa: BLE001 - any failure only means no clock in the record
            return None

    rows, written = [], 0
    with torch.cuda.stream(torch.cuda.Stream()):
        pool = torch.empty(POOL_BYTES, dtype=torch.uint8, device="cuda")
        # First thing in the process, the fixed placement over and over, then again after the GPU idled
        # for a while: on the H100 the first figures of a process read 15% low.
        x, out = (pool[o:o + 2 * NUMEL].view(torch.bfloat16) for o in (REF_AT, OUT_AT))
        x.copy_(torch.randn(NUMEL, device="cuda", dtype=torch.bfloat16))
        for gap in (0.0,) * START_FIGURES + tuple(g for g in IDLE_GAPS for _ in range(3)):
            time.sleep(gap)
            for impl, call in kernels(x, out).items():
                rows.append({**run, "impl": impl, "dtype": "bfloat16", "numel": NUMEL, "exp": "start", "gap": gap,
                             "x": REF_AT, "out": OUT_AT, **figure(call), "sm_mhz": sm_mhz()})
        for name in DTYPES:
            dtype = getattr(torch, name)
            nbytes = NUMEL * dtype.itemsize

            def at(offset: int) -> torch.Tensor:
                return pool[offset:offset + nbytes].view(dtype)

            src = torch.randn(NUMEL, device="cuda", dtype=dtype)

            def take(exp: str, x: torch.Tensor, out: torch.Tensor, pooled: bool = True) -> None:
                """Both kernels' figures for one placement (offsets into the pool where ``pooled``)."""
                if pooled:
                    x.copy_(src)
                base = pool.data_ptr() if pooled else 0
                for impl, call in kernels(x, out).items():
                    rows.append({**run, "impl": impl, "dtype": name, "numel": NUMEL, "exp": exp,
                                 "x": x.data_ptr() - base, "out": out.data_ptr() - base, **figure(call)})

            placed = [("x", at(o), at(OUT_AT)) for o in OFFSETS] + [("out", at(OUT_AT), at(o)) for o in OFFSETS]
            for i, (exp, x, out) in enumerate(placed):
                if i % REF_EVERY == 0:  # the fixed placement again: a level that follows time shows here
                    take("ref", at(REF_AT), at(OUT_AT))
                take(exp, x, out)
            for x in [torch.randn(NUMEL, device="cuda", dtype=dtype) for _ in range(REPEATS)]:
                take("fresh", x, torch.empty_like(x), pooled=False)
            kept = []  # every rotation's pairs stay alive: the next repeat's are at new addresses
            for k in ROTATIONS:
                for _ in range(ROTATION_REPEATS):
                    pairs = [(x, torch.empty_like(x)) for x in
                             (torch.randn(NUMEL, device="cuda", dtype=dtype) for _ in range(k))]
                    kept += pairs
                    for impl in ("fused", "copy"):
                        calls = [kernels(x, out)[impl] for x, out in pairs]
                        turn = [0]

                        def cycle() -> None:
                            calls[turn[0]]()
                            turn[0] = (turn[0] + 1) % len(calls)

                        rows.append({**run, "impl": impl, "dtype": name, "numel": NUMEL, "exp": f"rot{k}",
                                     "x": pairs[0][0].data_ptr(), "out": pairs[0][1].data_ptr(), **figure(cycle)})
            take("ref", at(REF_AT), at(OUT_AT))
            with open(path, "a") as f:  # each dtype as it ends: a crash keeps what was measured
                f.write("".join(json.dumps(r) + "\n" for r in rows))
            written += len(rows)
            rows = []
    print(f"run {run['run']} (process {run['pid']}, {run['gpu']}): {written} figures -> {path}")


def first(path: str, burn: int, how: str) -> None:
    """The first figures of a fresh process, after ``burn`` throwaway CUDA graphs (another kernel on
    other tensors): by this probe's graph (``how`` "probe") or by the instrument's hot timer
    (``time_fn(.., "hot", ROUND_BUDGET)``, "instrument"), fused and copy by turns."""
    import torch

    from relu2.measure.timing import ROUND_BUDGET, time_fn
    from relu2_impls.fused import relu_squared

    run = {"run": uuid.uuid4().hex[:8], "pid": os.getpid(), "gpu": torch.cuda.get_device_name(),
           "torch": torch.__version__, "exp": f"first-{how}", "burn": burn}
    x = torch.randn(NUMEL, device="cuda", dtype=torch.bfloat16)
    out, a, b = torch.empty_like(x), torch.zeros(1 << 16, device="cuda"), torch.empty(1 << 16, device="cuda")
    relu_squared(x, out=out)
    with torch.cuda.stream(torch.cuda.Stream()):
        for _ in range(burn):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(100):
                    torch.add(a, 1, out=b)
            g.replay()
            torch.cuda.synchronize()
            del g
        xi, oi = x.view(torch.int16), out.view(torch.int16)
        kernels = {"fused": lambda: relu_squared(x, out=out), "copy": lambda: torch.bitwise_or(xi, 0, out=oi)}
        rows = []
        for k in range(FIRST_FIGURES):
            for impl, call in kernels.items():
                if how == "probe":
                    ms = graph_ms(call)[0]
                else:
                    fn = (lambda t: relu_squared(t)) if impl == "fused" else (lambda t: torch.bitwise_or(t.view(torch.int16), 0))
                    ms = 1e3 * time_fn(fn, x, "hot", ROUND_BUDGET).median_s
                rows.append({**run, "impl": impl, "dtype": "bfloat16", "numel": NUMEL, "k": k, "ms": ms})
    with open(path, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    print(f"run {run['run']} ({how}, {burn} graphs before): " + " ".join(f"{r['impl'][0]}{1e3 * r['ms']:.3f}" for r in rows))


def graph_ms(call) -> tuple[float, int]:
    """Per call (ms) of a CUDA graph of ``call`` sized behind a GPU sleep, the median of replays 2..10
    (the instrument's written-out hot method 3), and the calls the graph held."""
    from relu2.measure.timing import Budget, graph_replay_samples
    samples, calls = graph_replay_samples(call, Budget(samples=10, sample_ms=2.0, max_calls=1000))
    return 1e3 * st.median(samples[1:]), calls


def instrument(path: str) -> None:
    """The instrument's own hot figure (``time_fn(.., "hot", ROUND_BUDGET)``) of fused on FRESH_INPUTS
    inputs allocated one after another (all kept alive: each at its own address), with its graph on
    one input (HOT_INPUTS 1, method 3) and cycling over copies (the instrument's HOT_INPUTS, method 4),
    at sizes in the L2; a method whose figure follows the address spreads over the inputs."""
    import torch

    from relu2.measure import timing
    from relu2_impls.fused import relu_squared

    run = {"run": uuid.uuid4().hex[:8], "pid": os.getpid(), "gpu": torch.cuda.get_device_name(),
           "torch": torch.__version__}
    rows, inputs = [], timing.HOT_INPUTS
    for numel in INSTRUMENT_SIZES:
        for name in DTYPES:
            xs = [torch.randn(numel, device="cuda", dtype=getattr(torch, name)) for _ in range(FRESH_INPUTS)]
            relu_squared(xs[0])
            for count in (1, inputs):
                timing.HOT_INPUTS = count
                for i, x in enumerate(xs):
                    ms = 1e3 * timing.time_fn(relu_squared, x, "hot", timing.ROUND_BUDGET).median_s
                    rows.append({**run, "impl": "fused", "dtype": name, "numel": numel, "exp": f"instr-k{count}",
                                 "i": i, "x": x.data_ptr(), "ms": ms})
            timing.HOT_INPUTS = inputs
    with open(path, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    print(f"run {run['run']} (process {run['pid']}, {run['gpu']}): {len(rows)} figures -> {path}")


def levels(values: list[float]) -> list[float]:
    """The lower edge of each level among ``values``: a new level where a sorted value is more than
    LEVEL_GAP above the one before it."""
    s = sorted(values)
    return [s[0]] + [b for a, b in zip(s, s[1:]) if b / a - 1 > LEVEL_GAP]


def report(path: str) -> None:
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        rows = [json.loads(line) for line in f]
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["gpu"], r["impl"], r["dtype"], r["exp"] + (f" 2^{r['numel'].bit_length() - 1}" if r["exp"].startswith("instr") else ""))].append(r)
    print(f"{len({r['run'] for r in rows})} processes.  Per placement: the levels (us, and how many figures "
          f"each), then the address bits whose 0 and 1 split the figures most (mean 1 / mean 0 - 1, %)")
    for (gpu, impl, dtype, exp), got in sorted(groups.items()):
        ms = [r["ms"] for r in got]
        edges = levels(ms)
        counts = [sum(1 for v in ms if lo <= v < hi) for lo, hi in zip(edges, edges[1:] + [math.inf])]
        lv = ", ".join(f"{1e3 * lo:.3f}+ x{n}" for lo, n in zip(edges, counts))
        print(f"{gpu} {impl:5} {dtype:8} {exp:5} {len(ms):3} figures; levels {lv}")
        if exp.startswith("rot"):
            print(f"    sd between figures {100 * st.pstdev(math.log(v) for v in ms):.2f}%")
            continue
        if exp.startswith("instr"):
            by_run: dict[str, list[float]] = defaultdict(list)
            for r in got:
                by_run[r["run"]].append(r["ms"])
            print(f"    over {FRESH_INPUTS} fresh inputs, per process: " + "; ".join(
                f"sd {100 * st.pstdev(math.log(v) for v in ms):.2f}%, span {100 * (max(ms) / min(ms) - 1):.1f}%, "
                f"median {1e3 * st.median(ms):.3f}" for ms in by_run.values()))
            continue
        if exp.startswith("first"):
            by_burn: dict[int, list[str]] = defaultdict(list)
            for r in got:
                by_burn[r["burn"]].append(f"{1e3 * r['ms']:.3f}")
            for burn, figs in sorted(by_burn.items()):
                print(f"    after {burn} graphs, each process's figures in order: {' '.join(figs)}")
            continue
        if exp in ("ref", "start"):
            print("    in time order (s: us): " + ", ".join(
                f"{r.get('t', float('nan')):.{0 if exp == 'ref' else 2}f}: {1e3 * r['ms']:.3f}"
                + (f" @{r['sm_mhz']}" if r.get("sm_mhz") else "")
                for r in sorted(got, key=lambda r: (r["run"], r.get("t", 0)))))
            continue
        if exp == "fresh":
            for r in got:
                print(f"    x {r['x']:#x} out {r['out']:#x} {1e3 * r['ms']:.3f}")
            continue
        varied = "x" if exp == "x" else "out"
        splits = []
        for bit in range(7, 25):
            one = [r["ms"] for r in got if r[varied] >> bit & 1]
            zero = [r["ms"] for r in got if not r[varied] >> bit & 1]
            if one and zero:
                splits.append((st.mean(one) / st.mean(zero) - 1, bit, len(one), len(zero)))
        top = sorted(splits, key=lambda s: -abs(s[0]))[:4]
        print("    " + "; ".join(f"bit {b} ({n1}/{n0}): {100 * d:+.1f}%" for d, b, n1, n0 in top))
        print(f"    by offset ({varied}, H above the lowest level): {_level_marks(tuple(ms), edges[0])}")
        spread, r = address_effect(got, varied)
        print(f"    figures span {100 * spread:.1f}% over the placements; offset by offset, the processes' "
              f"figures correlate r = {'n/a' if r is None else f'{r:.2f}'} (near 1: the address sets the figure)")


def address_effect(got: list[dict], varied: str) -> tuple[float, float | None]:
    """How far the figures of one placement series spread (max / min - 1), and, where more than one
    process measured it, the mean correlation between two processes' figures taken offset by offset:
    a figure that is a function of the address repeats its pattern in every process."""
    ms = [r["ms"] for r in got]
    by_run: dict[str, dict[int, float]] = defaultdict(dict)
    for r in got:
        by_run[r["run"]][r[varied]] = r["ms"]
    runs = list(by_run.values())
    pairs = [(a, b) for i, a in enumerate(runs) for b in runs[i + 1:]]
    rs = []
    for a, b in pairs:
        common = sorted(set(a) & set(b))
        if len(common) > 2:
            rs.append(st.correlation([a[o] for o in common], [b[o] for o in common]))
    return max(ms) / min(ms) - 1, (st.mean(rs) if rs else None)


def _level_marks(samples: tuple[float, ...], low: float) -> str:
    return "".join("H" if v / low - 1 > LEVEL_GAP else "." for v in samples)


def rounds(folders: list[str]) -> None:
    """Per compare folder, its gated cells whose rounds (a side's, one process each) sit on more than one
    level: each side's rounds in order (H: above the lowest level), and, where both sides have the
    same two levels, head/base level by level (like with like: what the paired median mixes)."""
    from relu2.judge.gate import compare_sides
    from relu2.judge.rule import GATED_MODES
    from relu2.records.compare_folder import read_compare
    from relu2.vocab.schema import OK

    tally: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    for folder in folders:
        meta = read_compare(folder)
        sides = [{m.cell.identity: m for m in side.measurements
                  if m.status == OK and m.rounds and m.cell.measure in GATED_MODES} for side in compare_sides(meta)]
        print(f"{folder} (box {meta.box[:8]}, {meta.rounds} rounds a side, {meta.added_rounds} added)")
        for key in sorted(set(sides[0]) & set(sides[1]), key=str):
            base, head = sides[0][key], sides[1][key]
            p = dict(base.params)
            group = (base.cell.impl, base.cell.measure, p.get("dtype", ""), p.get("numel", ""))
            both = [levels(list(m.samples)) for m in (base, head)]
            tally[group][0] += 1
            if max(len(b) for b in both) < 2:
                continue
            tally[group][1] += 1
            marks = " | ".join(_level_marks(m.samples, lv[0]) for m, lv in zip((base, head), both))
            line = f"  {' '.join(group):36} {marks}"
            if len(both[0]) == len(both[1]) == 2:
                per = [[st.median([v for v in m.samples if (v / lv[0] - 1 > LEVEL_GAP) == upper]) for upper in (False, True)]
                       for m, lv in zip((base, head), both)]
                line += "   like with like: " + ", ".join(f"{h / b:.3f}x" for b, h in zip(*per))
            print(line)
    print("cells on two levels, per implementation, mode, dtype and size (of the cells compared):")
    for group, (n, split) in sorted(tally.items(), key=lambda kv: str(kv[0])):
        if split:
            print(f"  {' '.join(group):36} {split} of {n}")


def _appending(path: str) -> int:
    """2, said in one line, where the records could not be appended to ``path`` (checked before a minute
    of measuring, not after it); 0 where they can."""
    target = Path(path)
    if target.is_dir() or not target.parent.is_dir():
        print(f"hot_levels: cannot append records to {path}: "
              f"{'a folder' if target.is_dir() else 'no folder ' + str(target.parent)}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "--rounds":
        missing = [d for d in argv[1:] if not (Path(d) / "compare.json").is_file()]
        if missing:
            print(f"hot_levels: not a compare folder: {missing[0]}", file=sys.stderr)
            return 2
        rounds(argv[1:])
    elif len(argv) == 2 and argv[0] == "--report":
        if not Path(argv[1]).is_file():
            print(f"hot_levels: no such file: {argv[1]}", file=sys.stderr)
            return 2
        report(argv[1])
    elif len(argv) == 4 and argv[0] == "--first" and argv[2].isdigit() and argv[3] in ("probe", "instrument"):
        return _appending(argv[1]) or first(argv[1], int(argv[2]), argv[3]) or 0
    elif len(argv) == 2 and argv[0] == "--instrument":
        return _appending(argv[1]) or instrument(argv[1]) or 0
    elif len(argv) == 1 and not argv[0].startswith("-"):
        return _appending(argv[0]) or measure(argv[0]) or 0
    else:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
