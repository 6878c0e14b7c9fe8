"""asv suites: relu² implementations on a size grid, on model shapes and on vLLM's shapes.

How it is built (docs/tracking.md and docs/methodology.md say why):

* The module-level ``setup_cache`` measures every suite's cells once per commit (``relu2.sweep``:
  bitwise agreement first, then the timings), each implementation in a worker process of its own
  so a crash costs only that implementation's cells, and returns plain Python data keyed by cell.
  asv runs every parameter combination in its own process; those processes only read the cache,
  never import torch, and take a fraction of a second.
* Every cell is measured in rounds (``relu2.rounds``): ``RELU2_ROUNDS`` (default 3) passes over
  all cells, each with a fresh worker pool, so a figure's samples come from independent processes.
* ``track_<mode>``, one per timing mode of ``relu2.schema.MODES``, returns ``{"samples":
  [seconds per round...], "number": 1}`` so asv keeps the samples (median, IQR, CI); ``track_peak_memory``
  returns the GPU bytes allocated at the peak of one call, ``track_kernel`` the fingerprint of the
  kernel that ran (relu2.compiled).  Versions are pinned (see ``_track``).
* A cell the harness skipped (implementation unavailable here, e.g. triton without CUDA; out of
  memory; above the CPU size cap) raises NotImplementedError in ``setup``: asv records it as n/a
  (skipped), and the reason is printed to stderr.  A cell that failed (disagrees with the eager
  path bitwise, so it was never timed; its timing raised; its worker crashed) raises in the
  ``track_`` method: asv records it as failed, with the reason in its stderr.
* torch is imported only inside ``setup_cache``; at module level only ``relu2.schema`` and
  ``relu2.interface``, which need nothing but the standard library, from the instrument named by
  ``RELU2_INSTRUMENT`` (``relu2 asv run`` sets it; plain asv on a commit older than the interface
  cannot import them, which is why history is measured through ``relu2 asv run``).

Suites (shapes from relu2.schema): ``Grid`` (dtype x numel), ``ModelShapes`` (tokens x hidden,
bf16), ``VllmShapes`` (vLLM's own relu² benchmark grid: batch x seq x d as tokens x hidden, three
dtypes), ``Nemotron`` (Nemotron relu² widths at decode and prefill token counts, bf16) and
``WarmupOrder`` (the dynamic compiled paths warmed largest-first and one-token-first, side by side).

Device: CUDA when available, else the CPU.  On the CPU only inputs of at most
``relu2.schema.CPU_MAX_NUMEL`` elements are measured; larger cells are n/a there.

Environment variables:

* ``RELU2_BENCH_QUICK=1``: a tiny grid (eager and copy, float32, 2^10 and 2^12 elements, one
  shape per model suite) and a short timing budget, for tests and smoke runs.
* ``RELU2_BENCH_IMPLS=a,b,c``: the implementations to measure in every suite (default: each
  suite's own list, plus any registered through the ``relu2.implementations`` entry point group).
* ``RELU2_TIMEOUT=SECONDS``: an implementation silent this long on one input is killed and its
  remaining cells fail (default 300).
* ``RELU2_ROUNDS=N``: the rounds a cell is measured in (default 3; 1 to 20).  Fewer than 3 leave the
  gate only the ratio of medians to judge by (``relu2.verdict.MIN_ROUNDS``).
* ``RELU2_BENCH_SUITES=Grid,Nemotron``: measure only these suites (the others' cells are n/a); pair
  it with ``asv run --bench`` to time one suite quickly.

What a commit costs on the H200 is in docs/lab/provenance.md; the vLLM suites are cut to fit (bf16 only,
no peak memory: the Grid and ModelShapes suites keep that history).
"""

import itertools
import os
import sys

# The instrument: ``relu2 asv run`` copies the relu2 package it runs from into a folder of its own and
# names it here, so every commit is measured with one ruler and the commit's own installed relu2 is
# never imported; only its implementations (entry points of ``relu2.interface``) are.  The worker
# processes inherit sys.path.  Without it (plain asv, --python=same) the importable relu2 measures.
_INSTRUMENT = os.environ.get("RELU2_INSTRUMENT", "")
if _INSTRUMENT and sys.path[:1] != [_INSTRUMENT]:
    sys.path.insert(0, _INSTRUMENT)

# The vocabulary comes from the instrument (relu2.schema and relu2.interface import neither torch nor
# the rest of relu2).
from relu2.asv_run import ENV_LOG  # noqa: E402
from relu2.interface import ENTRY_POINT_GROUP, ENV_MEASURED, INTERFACE_VERSION, declares_interface, entry_points  # noqa: E402
from relu2.schema import (  # noqa: E402
    CELL_FIGURES,
    CPU_MAX_NUMEL,
    DEFAULT_SIZES,
    DTYPES,
    KERNEL_ASV_VERSION,
    MODEL_DTYPE,
    MODEL_HIDDEN,
    MODEL_TOKENS,
    MODES,
    NEMOTRON_DTYPE,
    NEMOTRON_TOKENS,
    NEMOTRON_WIDTHS,
    VLLM_HIDDEN,
    VLLM_DTYPE,
    VLLM_TOKENS,
    WARMUP_WIDTHS,
    Cell,
    activation_shape,
    env_flag,
    grid_shape,
    kernel_id,
)


# What each suite measures: pinned, since its history is measured with exactly these (names of
# the instrument's references and of this repository's implementations, found through interface 1).
# The Grid and ModelShapes suites keep the implementations their committed history has.
SUITE_IMPLS: tuple = ("eager", "compile", "compile_dynamic", "fused", "triton", "copy")
# The relu² paths vLLM can run (each path NemotronH takes: maybe_compile, the model-level backend,
# the routed experts' in-place eager, vLLM's CUDA kernel), the fused kernel, and the roofline.
VLLM_IMPLS: tuple = ("eager", "compile_dynamic", "compile_dim0", "compile_model", "eager_inplace", "fused", "vllm_cuda",
                     "copy")
# vLLM's own benchmark grid compares its kernel with the native path and its compiled forms.
VLLM_SHAPES_IMPLS: tuple = ("eager", "compile_dynamic", "compile_dim0", "fused", "vllm_cuda", "copy")
# The dynamic compiled paths warmed largest-first and one-token-first, side by side.
WARMUP_IMPLS: tuple = ("compile_dynamic", "compile_dynamic_1tok", "compile_dim0", "compile_dim0_1tok", "copy")
# Any other implementation (a new one, a plugin's) joins every suite.
LISTED: frozenset = frozenset(SUITE_IMPLS + VLLM_IMPLS + VLLM_SHAPES_IMPLS + WARMUP_IMPLS)


def _quick() -> bool:
    return env_flag("RELU2_BENCH_QUICK")  # ValueError for a value that is neither on nor off


def _impls(default: tuple) -> list:
    """``RELU2_BENCH_IMPLS``, else (quick: eager and copy) the suite's own list plus entry points."""
    chosen = os.environ.get("RELU2_BENCH_IMPLS", "").strip()
    if chosen:
        return [name.strip() for name in chosen.split(",") if name.strip()]
    if _quick():
        return ["eager", "copy"]
    extra = sorted({ep.name for ep in entry_points()} - LISTED)
    return list(default) + extra


def _pick(full, quick) -> list:
    return list(quick if _quick() else full)


def setup_cache():
    """Measure every cell of every suite in rounds (a worker process per implementation a round); plain data.

    ``{"device": str, "cells": {(impl, dtype, shape): entry}}`` where an entry is ``{"status",
    "reason", "peak_bytes", "kernel", "modes": {mode: {"status", "reason", "samples"}}}`` (samples: one
    median a round).  Cells not measured here (above the CPU cap) are absent.
    """
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    unmeasurable = _predates_interface()
    if unmeasurable:
        _report(unmeasurable)
        return {"device": device, "cells": {}, "skipped": unmeasurable}
    try:
        return _measure_all(device)
    except BaseException as e:
        _report(f"the suites' setup raised {type(e).__name__}: {e}")
        raise


def _report(reason: str) -> None:
    """Why this commit has no figures: to stderr, and to ``relu2 asv run`` (which prints it without -v)."""
    print(f"relu2: {reason}", file=sys.stderr)
    log = os.environ.get(ENV_LOG)
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{os.environ.get('ASV_COMMIT', '')}\t{' '.join(reason.split())}\n")


def _measure_all(device: str) -> dict:
    import time

    from relu2 import rounds, sweep
    from relu2.isolation import timeout_from_env

    n_rounds = rounds.rounds_from_env()
    plan = measuring_plan(device)
    import relu2

    print(f"relu2: measured by the instrument at {os.path.dirname(relu2.__file__)}, {n_rounds} rounds", file=sys.stderr)
    start = time.perf_counter()
    # Each round a fresh worker pool; a kernel that crashes or hangs costs its own cells only (in the
    # round it did), and RELU2_TIMEOUT bounds a hang.
    done = rounds.measure(plan, device, n_rounds, budget=budget(), timeout_s=timeout_from_env())
    work, why_not = _counted(list(done.cells), device)
    measured = {_key(cell): _entry(result, work.get(cell, {})) for cell, result in done.cells.items()}
    cost = (f"relu2: {os.environ.get('ASV_COMMIT', '')[:8]}: measured {len(measured)} cells on {device} in "
            f"{time.perf_counter() - start:.0f} s, {n_rounds} rounds of "
            f"{', '.join(f'{s:.0f}' for s in done.rounds_s)} s, workers starting "
            f"{', '.join(f'{s:.0f}' for s in done.workers_s)} s and leaving "
            f"{', '.join(f'{s:.0f}' for s in done.closing_s)} s\n{sweep.cost_table(done.results)}")
    print(cost, file=sys.stderr)
    log = os.environ.get(ENV_LOG)
    if log:  # asv shows a setup's output only when it fails: relu2 asv run prints this after the run
        with open(log + ".cost", "a", encoding="utf-8") as f:
            f.write(cost + "\n")
    return {"device": device, "cells": measured, "why_not": why_not}


def _counted(cells: list, device: str) -> tuple:
    """Each cell's figures measured once a commit, not a round (relu2.measure.figures: the work
    counters, which are exact), and why some are not (an instrument from before them measures none)."""
    try:
        from relu2.measure import figures
    except ImportError:
        return {}, "this instrument measures no figures beside the timings and peak memory"
    return figures.measure(cells, device, say=lambda line: print(f"relu2: {line}", file=sys.stderr))


def measuring_plan(device: str) -> list:
    """The cells to measure, suite by suite (named groups), each cell once (suites share cells), the
    suites with history first; on the CPU only those up to CPU_MAX_NUMEL.  ``relu2 compare`` measures
    the same plan, a round a process."""
    plan, seen = [], set()
    for suite in _selected():
        cells = [c for c in suite.cells() if c not in seen and (device == "cuda" or c.numel <= CPU_MAX_NUMEL)]
        seen.update(cells)
        plan.append((suite.__name__, cells))
    return plan


def budget():
    """A round's timing budget: the short one for the quick grid."""
    from relu2.timing import QUICK_BUDGET, ROUND_BUDGET

    return QUICK_BUDGET if _quick() else ROUND_BUDGET


def _predates_interface() -> str:
    """Why this commit cannot be measured by this instrument ("" when it can): under ``relu2 asv run``
    the package under test (``$RELU2_MEASURED``) must declare implementations through interface 1."""
    measured = os.environ.get(ENV_MEASURED, "")
    if not measured or declares_interface(measured):
        return ""
    commit = os.environ.get("ASV_COMMIT", "")[:8] or "this commit"
    return (f"{measured} at {commit} predates the implementations interface {INTERFACE_VERSION}: it declares no "
            f"entry points in the group {ENTRY_POINT_GROUP}, so this instrument cannot find what to measure")


def _selected() -> list:
    """The suites to measure: ``RELU2_BENCH_SUITES`` (comma-separated class names), else all."""
    chosen = {s.strip() for s in os.environ.get("RELU2_BENCH_SUITES", "").split(",") if s.strip()}
    unknown = chosen - {suite.__name__ for suite in SUITES}
    if unknown:
        raise ValueError(f"RELU2_BENCH_SUITES names no suite {sorted(unknown)}; suites: "
                         f"{', '.join(s.__name__ for s in SUITES)}")
    return [suite for suite in SUITES if not chosen or suite.__name__ in chosen]


# The whole grid per commit: compiles, JIT builds and ~1000 cells take minutes on a GPU.
setup_cache.timeout = 3600


def _key(cell: Cell) -> tuple:
    return (cell.impl, cell.dtype, cell.shape)


def _entry(result, work: dict | None = None) -> dict:
    """A CellResult as plain data, so the benchmark processes can unpickle it without torch; ``figures``
    by column (peak memory, and the work counters ``work`` holds)."""
    return {
        "status": result.status,
        "reason": result.reason,
        "figures": {"peak_bytes": result.peak_bytes, **(work or {})},
        "kernel": result.kernel,
        "modes": {
            mode: {
                "status": outcome.status,
                "reason": outcome.reason,
                "samples": list(outcome.timing.samples_s) if outcome.timing else [],
            }
            for mode, outcome in result.outcomes.items()
        },
    }


def _skip(reason: str):
    """asv records a benchmark whose setup raises NotImplementedError as skipped (n/a)."""
    print(f"relu2: skipped: {reason}", file=sys.stderr)
    return NotImplementedError(reason)


def _skip_one(reason: str):
    """For a single track_ method: asv_runner's SkipNotImplemented marks just that result n/a."""
    print(f"relu2: skipped: {reason}", file=sys.stderr)
    from asv_runner.benchmarks.mark import SkipNotImplemented

    return SkipNotImplemented(reason)


class _Suite:
    """A ``track_<mode>`` method per timing mode (generated below), ``track_peak_memory`` and
    ``track_kernel`` over the cached cells; a subclass says which parameters name which cell."""

    unit = "seconds"
    params: list = []
    param_names: list = []

    @staticmethod
    def cell(*params) -> Cell:
        raise NotImplementedError

    @classmethod
    def cells(cls) -> list:
        return [cls.cell(*combo) for combo in itertools.product(*cls.params)]

    def _lookup(self, cache, params) -> dict:
        if cache.get("skipped"):
            raise _skip(cache["skipped"])
        entry = cache["cells"].get(_key(self.cell(*params)))
        if entry is None:
            raise _skip(f"not measured on {cache['device']}: inputs above {CPU_MAX_NUMEL} elements are measured "
                        "on CUDA only, and RELU2_BENCH_SUITES may leave this suite out")
        return entry

    def setup(self, cache, *params):
        entry = self._lookup(cache, params)
        if entry["status"] == "skipped":
            raise _skip(entry["reason"])

    def _samples(self, cache, params, mode) -> dict:
        figure = self._lookup(cache, params)["modes"][mode]
        if figure["status"] == "failed":
            raise RuntimeError(f"relu2: {mode} failed: {figure['reason']}")
        if figure["status"] == "skipped":
            raise _skip_one(figure["reason"])
        return {"samples": figure["samples"], "number": 1}

    def track_kernel(self, cache, *params):
        """What ran: the fingerprint of the generated or built kernel as a number (a step = new code)."""
        entry = self._lookup(cache, params)
        if entry["status"] == "failed":
            raise RuntimeError(f"relu2: failed: {entry['reason']}")
        if not entry.get("kernel"):
            raise _skip_one("no generated or built kernel to fingerprint (eager and copy run torch's own)")
        return kernel_id(entry["kernel"])

    track_kernel.unit = "kernel id"
    track_kernel.version = KERNEL_ASV_VERSION


def _figure(figure):
    """``track_<method>`` of a cell figure (relu2.vocab.schema.CELL_FIGURES: peak memory, the work
    counters): its value for the cell, n/a (saying why) where it was not measured."""

    def track(self, cache, *params):
        entry = self._lookup(cache, params)
        if entry["status"] == "failed":
            raise RuntimeError(f"relu2: failed: {entry['reason']}")
        value = entry.get("figures", {}).get(figure.column)
        if value is None:
            why = (f"GPU memory is measured on CUDA only (device here: {cache['device']})"
                   if figure.column == "peak_bytes" else cache.get("why_not") or f"no {figure.column} measured")
            raise _skip_one(why)
        return value

    track.unit = figure.unit
    track.version = figure.asv_version
    track.less_is_better = True
    track.__name__ = figure.benchmark
    return track


for _figure_ in CELL_FIGURES:
    setattr(_Suite, _figure_.benchmark, _figure(_figure_))


def _track(mode: str, version: str):
    """``track_<mode>``: the mode's samples of the cell.

    asv keys each benchmark's history by its version, by default a hash of its source (and of setup
    and setup_cache): an edit to this file would drop the committed results from the dashboard.  So
    the version is pinned in relu2.schema.MODES, and bumped there only when a mode's figures stop
    being comparable with their history.  ``less_is_better`` tells the dashboard which way is worse.
    """

    def track(self, cache, *params):
        return self._samples(cache, params, mode)

    track.__name__ = track.__qualname__ = f"track_{mode}"
    track.version = version
    track.less_is_better = True
    return track


for _mode in MODES:
    setattr(_Suite, f"track_{_mode.name}", _track(_mode.name, _mode.asv_version))


class Grid(_Suite):
    """Every implementation x dtype x size: inputs of numel elements shaped (numel // 4096, 4096)."""

    params = [_impls(SUITE_IMPLS), _pick(DTYPES, ["float32"]), _pick(DEFAULT_SIZES, [2**10, 2**12])]
    param_names = ["impl", "dtype", "numel"]

    @staticmethod
    def cell(impl, dtype, numel) -> Cell:
        return Cell(impl, dtype, numel, grid_shape(numel))


class _TokensByHidden(_Suite):
    """(tokens, hidden) activations in one dtype."""

    dtype = MODEL_DTYPE
    param_names = ["impl", "tokens", "hidden"]

    @classmethod
    def cell(cls, impl, tokens, hidden) -> Cell:
        shape = activation_shape(tokens, hidden)
        return Cell(impl, cls.dtype, shape[0] * shape[1], shape)


class ModelShapes(_TokensByHidden):
    """Every implementation on (tokens, hidden) bf16 activations, the shapes a model sees."""

    params = [_impls(SUITE_IMPLS), _pick(MODEL_TOKENS, [1]), _pick(MODEL_HIDDEN, [3072])]


class _WithoutMemory(_TokensByHidden):
    """The vLLM suites: no ``track_peak_memory`` (a process per cell costs; Grid and ModelShapes have it)."""

    track_peak_memory = None


class VllmShapes(_WithoutMemory):
    """vLLM's own relu² benchmark grid (x = randn(batch * seq, d)) for the paths vLLM can run, in bf16
    (vLLM's default dtype; fp16 and fp32 with ``relu2 sweep --vllm-shapes``)."""

    dtype = VLLM_DTYPE
    params = [_impls(VLLM_SHAPES_IMPLS), _pick(VLLM_TOKENS, [16]), _pick(VLLM_HIDDEN, [3072])]


class Nemotron(_WithoutMemory):
    """Nemotron relu² widths at decode and prefill token counts, bf16, every path NemotronH takes in
    vLLM; at the routed experts' width (1856) a cell of T tokens is (6 T, 1856)."""

    dtype = NEMOTRON_DTYPE
    params = [_impls(VLLM_IMPLS), _pick(NEMOTRON_TOKENS, [8]), _pick(NEMOTRON_WIDTHS, [3712])]


class WarmupOrder(_WithoutMemory):
    """The dynamic compiled paths warmed at the most tokens first (as vLLM's profiling run) and at one
    token first, side by side."""

    dtype = NEMOTRON_DTYPE
    params = [_impls(WARMUP_IMPLS), _pick(NEMOTRON_TOKENS, [8]), _pick(WARMUP_WIDTHS, [3712])]


SUITES = (Grid, ModelShapes, VllmShapes, Nemotron, WarmupOrder)

# The overview a dashboard shows first has one tile per benchmark, averaged over its parameters:
# one benchmark per implementation puts "which implementation got slower" on that page.
SUMMARY_FROM_NUMEL = 2**20  # below, launch and L2 effects, not the implementation, set the figure


class Implementations:
    """One figure per implementation: the geometric mean of its hot medians over the Grid cells of
    2^20 elements and more (every dtype).  A step in one of them says that implementation got slower
    somewhere at the sizes where its kernel, not the launch, sets the time."""

    unit = "seconds"


def _summary(impl: str):
    def track(self, cache):
        import math
        import statistics

        if cache.get("skipped"):
            raise _skip_one(cache["skipped"])
        medians = []
        for cell in Grid.cells():
            if cell.impl != impl or cell.numel < SUMMARY_FROM_NUMEL or _key(cell) not in cache["cells"]:
                continue
            hot = cache["cells"][_key(cell)]["modes"]["hot"]
            if hot["status"] == "failed":  # a mean without it would move with no change in speed
                raise RuntimeError(f"relu2: {impl} {cell.describe()} hot failed: {hot['reason']}")
            if hot["samples"]:
                medians.append(statistics.median(hot["samples"]))
        if not medians:
            raise _skip_one(f"no hot figure of {impl} at {SUMMARY_FROM_NUMEL} elements or more here")
        return math.exp(sum(math.log(m) for m in medians) / len(medians))

    track.__name__ = track.__qualname__ = f"track_{impl}"
    track.version = "1"
    track.less_is_better = True
    return track


for _impl in Grid.params[0]:
    setattr(Implementations, f"track_{_impl}", _summary(_impl))
