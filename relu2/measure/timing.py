"""How an implementation is timed: three figures (hot, cold, launch), all in seconds, kept as samples.

* ``hot``: the kernel's own time with its input warm in L2.  On CUDA this is
  ``triton.testing.do_bench_cudagraph`` (CUDA-graph replay of many back-to-back calls, so launch
  overhead is hidden); without triton, the same method written out here.  The calls take their input
  by turns from up to HOT_INPUTS L2-resident copies of it, so a tiny tensor's figure is not that of
  one address.
* ``cold``: the same with inputs that are not cache-resident.  On CUDA the L2 is flushed before each
  sample (outside the timed region) and every call inside the sample's graph reads its own input
  copy and writes its own output, so no call finds its data in L2.  From ROTATION_FACTOR x the L2
  per call up, one call's bytes evict the last's by themselves: calls repeat on one input, no flush.  On the CPU the calls rotate
  over copies of the input whose total exceeds 4x the last-level cache.
* ``launch``: wall-clock per call of back-to-back eager calls, then one synchronize: what eager mode
  pays, launch overhead included.

On the CPU every call is synchronous, so ``hot`` and ``launch`` use the same procedure (a
wall-clock batch of calls on one input); they are kept as two figures so a CPU sweep has the same
shape as a GPU one.

Budget: one figure takes ``samples`` samples of about ``sample_ms`` each, plus a warm-up and (on
CUDA) a graph capture, so a whole grid stays at a few minutes per commit.  Measured in rounds
(``relu2.measure.rounds``), each round takes ``ROUND_BUDGET`` and the figure is the median of the rounds'.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from relu2.vocab.schema import MODE_NAMES, bytes_moved, default_sizes, grid_shape
from relu2.vocab.schema import mode as _mode
from relu2.vocab.schema import quantile

if TYPE_CHECKING:
    import torch

# torch is imported by the functions that time: a round's coordinating process reads the budgets
# and never touches a tensor, and importing torch would cost it a second and more a round.
Fn = Callable[["torch.Tensor"], "torch.Tensor"]

# cold: the buffers a sample touches between two uses of one input exceed this many times the
# last-level cache, so nothing of the input survives in it.
ROTATION_FACTOR = 4
# cold on CUDA: bytes written before each sample to evict the L2, as a multiple of its size.
FLUSH_FACTOR = 2
CPU_CACHE_FALLBACK_BYTES = 32 << 20
MAX_CPU_SETS = 4096
_CPU_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")


@dataclass(frozen=True)
class Budget:
    """How long one figure may take: ``samples`` samples of about ``sample_ms`` milliseconds each.

    ``max_calls`` caps the calls per sample (it bounds CUDA-graph size and capture time for tiny
    tensors, where a call takes a microsecond).  On CUDA the ``hot`` figure comes from triton's
    ``do_bench_cudagraph``, which always takes 10 samples (the first one is dropped, see
    ``_cuda_hot``) of a graph it sizes itself (``sample_ms`` over its estimate of a call: about 900
    calls of a 1 µs kernel at 2 ms, uncapped); ``samples`` and ``max_calls`` apply to the other figures.
    """

    samples: int = 10
    sample_ms: float = 5.0
    max_calls: int = 1000

    def __post_init__(self) -> None:
        if self.samples < 1 or self.sample_ms <= 0 or self.max_calls < 1:
            raise ValueError(f"a budget needs samples >= 1, sample_ms > 0 and max_calls >= 1, got {self}")


DEFAULT_BUDGET = Budget()
# One round of a figure measured in rounds (relu2.measure.rounds: the asv suites, relu2 confirm): replays in one
# process agree within about 1.5% while two processes or boxes differ by several, so a round needs few
# and short samples; the rounds pay for themselves out of the samples they no longer take.
ROUND_BUDGET = Budget(samples=5, sample_ms=2.0)
# For tests and smoke runs: a figure in a few milliseconds, numbers only roughly right.
QUICK_BUDGET = Budget(samples=3, sample_ms=0.5, max_calls=64)


@dataclass(frozen=True)
class Timing:
    """The samples of one figure, in seconds per call; summaries are the median and quartiles."""

    mode: str
    samples_s: tuple[float, ...]

    def __post_init__(self) -> None:
        _mode(self.mode)  # ValueError for an unknown mode
        if not self.samples_s:
            raise ValueError("a Timing needs at least one sample")

    @property
    def median_s(self) -> float:
        return quantile(self.samples_s, 0.5)

    @property
    def q25_s(self) -> float:
        return quantile(self.samples_s, 0.25)

    @property
    def q75_s(self) -> float:
        return quantile(self.samples_s, 0.75)


# --- caches ----------------------------------------------------------------------------------


def _parse_cache_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def cpu_cache_bytes(cache_dir: Path = _CPU_CACHE_DIR) -> int:
    """Size of the CPU's largest (last-level) cache from sysfs; 32 MiB when it cannot be read."""
    sizes = []
    for size_file in cache_dir.glob("index*/size"):
        try:
            sizes.append(_parse_cache_size(size_file.read_text()))
        except (OSError, ValueError):
            continue
    return max(sizes, default=CPU_CACHE_FALLBACK_BYTES)


def l2_bytes(device: str | torch.device = "cuda") -> int:
    """The last-level cache in bytes: the GPU's L2 for a CUDA device, the CPU's LLC otherwise."""
    import torch
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).L2_cache_size)
    return cpu_cache_bytes()


# --- the three figures ------------------------------------------------------------------------


def time_fn(fn: Fn, x: torch.Tensor, mode: str, budget: Budget | None = None) -> Timing:
    """Time ``fn(x)`` in ``mode`` ("hot", "cold" or "launch") on ``x``'s device.

    ``fn`` must already work on ``x`` (check it first: the warm-up here is not a correctness
    check) and, on CUDA, be capturable in a CUDA graph for ``hot`` and ``cold``.
    """
    import torch
    _mode(mode)  # ValueError for an unknown mode
    budget = budget or DEFAULT_BUDGET
    device = "cuda" if x.device.type == "cuda" else "cpu"
    if device == "cuda":
        # The timers work on side streams: make sure whatever produced x has finished.
        torch.cuda.synchronize(x.device)
    return Timing(mode, tuple(TIMERS[device][mode](fn, x, budget)))


def time_all(fn: Fn, x: torch.Tensor, modes: Sequence[str] = MODE_NAMES, budget: Budget | None = None) -> dict[str, Timing]:
    """``time_fn`` in each of ``modes``."""
    return {mode: time_fn(fn, x, mode, budget) for mode in modes}


def _calls_per_sample(estimate_s: float, budget: Budget, limit: int | None = None) -> int:
    """Calls that make one sample last about ``budget.sample_ms``, within ``[1, max_calls]`` and ``limit``."""
    calls = math.ceil(budget.sample_ms / 1e3 / max(estimate_s, 1e-9))
    cap = budget.max_calls if limit is None else min(budget.max_calls, limit)
    return max(1, min(calls, cap))


def _wallclock_samples(run: Callable[[int], None], sync: Callable[[], None], budget: Budget) -> list[float]:
    """Seconds per call of ``run(n)`` (n back-to-back calls, then ``sync``), one sample per batch."""
    run(1)  # warm-up: first-call costs (allocator, lazy init) stay out of the samples
    sync()
    start = time.perf_counter()
    run(1)
    sync()
    calls = _calls_per_sample(time.perf_counter() - start, budget)
    samples = []
    for _ in range(budget.samples):
        sync()
        start = time.perf_counter()
        run(calls)
        sync()
        samples.append((time.perf_counter() - start) / calls)
    return samples


def _repeat(fn: Fn, x: torch.Tensor) -> Callable[[int], None]:
    def run(n: int) -> None:
        for _ in range(n):
            fn(x)

    return run


def _rotation(fn: Fn, x: torch.Tensor, n_sets: int) -> Callable[[int], None]:
    """``run(n)``: n calls cycling over ``n_sets`` input copies, each keeping its output until its next turn.

    Keeping the outputs alive for a whole cycle means every call also writes to memory that was
    last touched a cycle ago, not to the buffer the previous call just freed.
    """
    import torch
    inputs = [x] + [x.clone() for _ in range(n_sets - 1)]
    outputs: list[torch.Tensor | None] = [None] * n_sets
    turn = 0

    def run(n: int) -> None:
        nonlocal turn
        for _ in range(n):
            outputs[turn] = fn(inputs[turn])
            turn = (turn + 1) % n_sets

    return run


def _set_bytes(x: torch.Tensor) -> int:
    """Bytes one call on ``x`` reads and writes (its input and its output)."""
    from relu2.measure.inputs import dtype_name
    return bytes_moved(x.numel(), dtype_name(x.dtype))


def _warmed_copies(fn: Fn, x: torch.Tensor, n: int) -> list[torch.Tensor]:
    """``x`` and ``n - 1`` copies of it, ``fn`` called once on each before any graph captures them: a
    torch.compile'd fn may recompile for a new input (seen on the H200 for compile_dynamic), and a
    recompile inside capture aborts it and leaves the CUDA RNG in capture mode, failing every later
    cell of the run."""
    inputs = [x] + [x.clone() for _ in range(n - 1)]
    for xi in inputs:
        fn(xi)
    return inputs


def _no_sync() -> None:
    pass


def _cpu_hot(fn: Fn, x: torch.Tensor, budget: Budget) -> list[float]:
    return _wallclock_samples(_repeat(fn, x), _no_sync, budget)


def _cpu_launch(fn: Fn, x: torch.Tensor, budget: Budget) -> list[float]:
    # CPU calls are synchronous: back-to-back calls on one input, as in hot.
    return _wallclock_samples(_repeat(fn, x), _no_sync, budget)


def cpu_rotation_sets(set_bytes: int, cache_bytes: int, free_bytes: int) -> int:
    """Input copies the CPU's cold figure rotates over: enough to exceed ROTATION_FACTOR x the cache,
    but at most MAX_CPU_SETS (tiny inputs would need millions of tensors) and within a quarter of
    the free memory.  Below cache / MAX_CPU_SETS per set the figure is therefore partly cache-warm."""
    wanted = math.ceil(ROTATION_FACTOR * cache_bytes / max(1, set_bytes))
    affordable = max(1, free_bytes // 4 // max(1, set_bytes))
    return max(1, min(wanted, MAX_CPU_SETS, affordable))


def _available_host_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (OSError, ValueError):
        return 1 << 30


def _cpu_cold(fn: Fn, x: torch.Tensor, budget: Budget) -> list[float]:
    set_bytes = _set_bytes(x)
    n_sets = cpu_rotation_sets(set_bytes, cpu_cache_bytes(), _available_host_bytes())
    return _wallclock_samples(_rotation(fn, x, n_sets), _no_sync, budget)


def _event_ms(work: Callable[[], object], before: Callable[[], object] | None = None) -> float:
    """GPU milliseconds between events recorded around ``work`` on the current stream.

    ``before`` runs first, untimed; when it is long GPU work (a flush), the host has queued
    ``work`` before the GPU reaches it, so the host's launch cost stays out of the figure.
    """
    import torch
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    if before is not None:
        before()
    start.record()
    work()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


# GPU clock cycles the GPU is left asleep for before a graph's length is estimated (about 1 ms at an
# H200's clock): longer than the host takes to queue the five calls of the estimate, so they are timed
# as the GPU runs them, back to back, and not as the host launches them.
ESTIMATE_SLEEP_CYCLES = 2_000_000


# A hot graph whose calls last less than this share of the sample time asked for was sized from an
# estimate the GPU did not make (the host stalled past the sleep, and the five calls were timed with the
# GPU idle between them): its few calls each carry a large share of the graph's fixed cost, so it is
# measured again, up to HOT_TRIES times in all.  A sound graph lasts about half the sample time or more.
SHORT_GRAPH = 0.25
HOT_TRIES = 3
HOT_NOTE = "relu2: hot: "  # what such a retry says on stderr; relu2 compare passes these lines on


# hot: the graph's calls take their input by turns from this many copies of it (hot method 4), fewer
# where the copies and their outputs would fill more than 1/HOT_L2_SHARE of the L2.  A tiny tensor's hot
# time follows its input's address, which the process's allocations decide; cycling over copies at other
# addresses times their average, which no one allocation moves (docs/lab/results.md, "Hot method 4").
HOT_INPUTS = 16
HOT_L2_SHARE = 4


def hot_input_count(set_bytes: int, l2: int) -> int:
    """How many copies of its input a hot graph cycles over: HOT_INPUTS, fewer where they (each
    ``set_bytes`` with its output) would fill more than 1/HOT_L2_SHARE of an L2 of ``l2`` bytes, and at
    least one (from there up the figure is method 3's: one input, whose many lines average themselves)."""
    return max(1, min(HOT_INPUTS, l2 // HOT_L2_SHARE // max(1, set_bytes)))


def _by_turns(fn: Fn, inputs: Sequence[torch.Tensor]) -> Callable[[], None]:
    """A call of ``fn`` on the next of ``inputs``: captured n times in a graph, the graph cycles over them."""
    turn = 0

    def call() -> None:
        nonlocal turn
        fn(inputs[turn])
        turn = (turn + 1) % len(inputs)

    return call


def _cuda_hot(fn: Fn, x: torch.Tensor, budget: Budget) -> list[float]:
    count = hot_input_count(_set_bytes(x), l2_bytes(x.device))
    call = _by_turns(fn, _warmed_copies(fn, x, count))
    tries = []
    for _ in range(HOT_TRIES):
        samples, calls, capped = _hot_graph(call, budget)
        if capped or not _short_graph(samples, calls, budget):
            return samples
        tries.append((calls, samples))
        # Said, so a probe or a log shows whether (and where) the check fires.
        print(f"{HOT_NOTE}a graph of {calls} calls lasted {calls * quantile(samples, 0.5) * 1e3:.3f} ms of the "
              f"{budget.sample_ms:g} ms asked (try {len(tries)} of {HOT_TRIES}): its estimate stalled", file=sys.stderr)
    return max(tries, key=lambda t: t[0])[1]  # every estimate stalled: the longest graph is the least wrong


def _hot_graph(step: Callable[[], None], budget: Budget) -> tuple[list[float], int, bool]:
    """One hot figure of ``step`` (a call), the calls its graph held, and whether ``budget.max_calls``
    held it: by triton's ``do_bench_cudagraph`` (uncapped), or, without a triton that returns every
    replay, by the same method written out (capped)."""
    try:
        from triton.testing import do_bench_cudagraph
    except ImportError:
        return _written_out(step, budget)
    try:
        return (*_triton_graph_samples(do_bench_cudagraph, step, budget), False)
    except AssertionError:  # a triton older than return_mode="all"
        return _written_out(step, budget)


def _written_out(step: Callable[[], None], budget: Budget) -> tuple[list[float], int, bool]:
    samples, calls = graph_replay_samples(step, budget)
    return samples, calls, calls >= budget.max_calls  # short by the cap, not by a stalled estimate


def _short_graph(samples: Sequence[float], calls: int, budget: Budget) -> bool:
    """Whether a graph of ``calls`` calls, each taking the samples' median, lasted less than
    ``SHORT_GRAPH`` of the sample time: its length came from a stalled estimate.  ``calls`` 0 (a
    triton that captured no graph this wrapper saw) is never short."""
    return 0 < calls * quantile(samples, 0.5) < SHORT_GRAPH * budget.sample_ms / 1e3


def _triton_graph_samples(do_bench_cudagraph: Callable, step: Callable[[], None],
                          budget: Budget) -> tuple[list[float], int]:
    """One figure by ``do_bench_cudagraph``: seconds per call of its replays (the first left out) and
    the number of calls its graph held (counted as they were captured)."""
    import torch
    first = True
    captured = 0

    def call() -> None:
        # do_bench_cudagraph (triton 3) sizes its graph from five eager calls right after its warm-up
        # call (this first one).  Timed as the host launches them they read tens of microseconds for a
        # kernel of one, so its graph held another few dozen calls in every process, each carrying
        # another share of the graph's fixed cost; queued behind a sleep, the graph gets the same length
        # everywhere (hot method 3: docs/tracking.md, docs/lab/results.md "Where hot noise in the L2
        # lives").  Older tritons timed a one-call graph there, for which the sleep is moot.
        nonlocal first, captured
        step()
        if first:
            first = False
            torch.cuda._sleep(ESTIMATE_SLEEP_CYCLES)
        elif torch.cuda.is_current_stream_capturing():
            captured += 1

    ms = do_bench_cudagraph(call, rep=budget.sample_ms, return_mode="all")
    samples = [m / 1e3 for m in ms]
    # The first replay also uploads the graph and is often the slowest: not the kernel's time.
    return (samples[1:] if len(samples) > 2 else samples), captured


def graph_replay_samples(call: Callable[[], None], budget: Budget) -> tuple[list[float], int]:
    """``do_bench_cudagraph``'s method: replay a graph of n back-to-back calls; seconds per call and n,
    n from five calls timed behind a sleep of the GPU (as ``_cuda_hot`` has triton estimate it)."""
    import torch
    with torch.cuda.stream(torch.cuda.Stream()):  # capture may not run on the default stream
        call()
        estimate_s = _event_ms(lambda: [call() for _ in range(5)],
                               before=lambda: torch.cuda._sleep(ESTIMATE_SLEEP_CYCLES)) / 5 / 1e3
        calls = _calls_per_sample(estimate_s, budget)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                call()
        graph.replay()  # uploads the graph; not a sample
        samples = [_event_ms(graph.replay) / calls / 1e3 for _ in range(budget.samples)]
    del graph
    return samples, calls


def _cuda_cold(fn: Fn, x: torch.Tensor, budget: Budget) -> list[float]:
    import torch
    device = x.device
    l2 = l2_bytes(device)
    set_bytes = max(1, _set_bytes(x))
    if set_bytes >= ROTATION_FACTOR * l2:
        return _cuda_cold_large(fn, x, budget)
    free, _ = torch.cuda.mem_get_info(device)
    # Memory stays bounded: one sample's input copies and outputs hold at most 4x L2 and never
    # more than half of what is free.
    room = min(ROTATION_FACTOR * l2, free // 2)
    flush = torch.empty(FLUSH_FACTOR * l2, dtype=torch.int8, device=device)
    with torch.cuda.stream(torch.cuda.Stream(device)):
        fn(x)
        estimate_s = min(_event_ms(lambda: fn(x), before=flush.zero_) for _ in range(3)) / 1e3
        calls = _calls_per_sample(estimate_s, budget, limit=max(1, room // set_bytes))
        # Each call of a sample reads its own input copy and writes its own output (all kept
        # alive by the graph), so after the flush no call finds its data in L2.
        inputs = _warmed_copies(fn, x, calls)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = [fn(xi) for xi in inputs]
        samples = []
        for i in range(budget.samples + 1):
            ms = _event_ms(graph.replay, before=flush.zero_)
            if i:  # the first replay uploads the graph; not a sample
                samples.append(ms / calls / 1e3)
    del graph, outputs, inputs, flush
    return samples


def _cuda_cold_large(fn: Fn, x: torch.Tensor, budget: Budget) -> list[float]:
    """cold when one call's bytes are at least ROTATION_FACTOR x the L2: no call can find the previous
    one's data there, so calls repeat on one input, without a flush and without copies.

    A flush before such a sample gained nothing and cost stability: its dirty lines drained to
    memory during the timed call, and with one call a sample the samples split into two modes.
    """
    import torch
    with torch.cuda.stream(torch.cuda.Stream(x.device)):
        fn(x)
        estimate_s = min(_event_ms(lambda: fn(x)) for _ in range(3)) / 1e3
        calls = _calls_per_sample(estimate_s, budget)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn(x)  # the output is dropped: the graph's pool reuses one buffer, memory stays bounded
        samples = []
        for i in range(budget.samples + 1):
            ms = _event_ms(graph.replay)
            if i:  # the first replay uploads the graph; not a sample
                samples.append(ms / calls / 1e3)
    del graph
    return samples


def _cuda_launch(fn: Fn, x: torch.Tensor, budget: Budget) -> list[float]:
    import torch
    def sync() -> None:
        torch.cuda.synchronize(x.device)

    return _wallclock_samples(_repeat(fn, x), sync, budget)


# The timers of each mode (relu2.vocab.schema.MODES) by device kind; a test keeps the two in step.
TIMERS: dict[str, dict[str, Callable[[Fn, torch.Tensor, Budget], list[float]]]] = {
    "cuda": {"hot": _cuda_hot, "cold": _cuda_cold, "launch": _cuda_launch},
    "cpu": {"hot": _cpu_hot, "cold": _cpu_cold, "launch": _cpu_launch},
}


# --- other measurements ---------------------------------------------------------------------


def peak_memory_bytes(fn: Fn, x: torch.Tensor) -> int | None:
    """GPU bytes allocated at the peak of one call of ``fn(x)`` above what was allocated before; None off CUDA."""
    import torch
    if x.device.type != "cuda":
        return None
    torch.cuda.synchronize(x.device)
    baseline = torch.cuda.memory_allocated(x.device)
    torch.cuda.reset_peak_memory_stats(x.device)
    out = fn(x)
    torch.cuda.synchronize(x.device)
    peak = torch.cuda.max_memory_allocated(x.device) - baseline
    del out
    return int(peak)


def copy_bandwidth(device: str | torch.device = "cuda", numel: int | None = None, dtype: str = "bfloat16",
                   budget: Budget | None = None) -> float:
    """GB/s (bytes read plus written) of the roofline itself: the ``copy`` implementation, ``hot``, on a
    ``numel``-element input shaped as the grid shapes it.

    The default is the grid's largest size on this device (``relu2.vocab.schema.default_sizes``), where
    every figure's roofline_fraction is measured against exactly this copy; far above the L2, so it is
    the DRAM figure.
    """
    import torch
    from relu2.measure.inputs import dtype_of, random_input
    from relu2.measure.registry import copy_bytes

    kind = torch.device(device).type
    numel = numel or max(default_sizes("cuda" if kind == "cuda" else "cpu"))
    x = random_input(numel, dtype_of(dtype), device).view(grid_shape(numel))
    timing = time_fn(copy_bytes, x, "hot", budget)
    return bytes_moved(numel, dtype) / timing.median_s / 1e9
