"""asv suites: relu² implementations on a size grid and on model activation shapes.

How it is built (docs/tracking.md and docs/methodology.md say why):

* The module-level ``setup_cache`` measures the whole grid once per commit (``relu2.sweep.run_sweep``:
  bitwise agreement first, then the timings), each implementation in a worker process of its own so
  a crash costs only that implementation's cells, and returns plain Python data.  asv runs every parameter combination in its own process; those
  processes only read the cache, never import torch, and take a fraction of a second.
* ``track_<mode>``, one per timing mode of ``relu2.schema.MODES``, returns ``{"samples":
  [seconds...], "number": 1}`` so asv keeps the samples (median, IQR, CI); ``track_peak_memory``
  returns the GPU bytes allocated at the peak of one call, ``track_kernel`` the fingerprint of the
  kernel that ran (relu2.compiled).  Versions are pinned (see ``_track``).
* A cell the harness skipped (implementation unavailable here, e.g. triton without CUDA; out of
  memory; above the CPU size cap) raises NotImplementedError in ``setup``: asv records it as n/a
  (skipped), and the reason is printed to stderr.  A cell that failed (disagrees with the eager
  path bitwise, so it was never timed, or its timing raised) raises in the ``track_`` method: asv
  records it as failed, with the reason in its stderr.
* torch is imported only inside ``setup_cache``; at module level only ``relu2.schema``, which needs
  nothing but the standard library: a module that fails to import at one commit loses the commit.

Device: CUDA when available, else the CPU.  On the CPU only inputs of at most
``relu2.schema.CPU_MAX_NUMEL`` elements are measured (torch.compile's first compiles dominate a
CPU run); larger cells are n/a there.

Environment variables:

* ``RELU2_BENCH_QUICK=1``: a tiny grid (eager and copy, float32, 2^10 and 2^12 elements, one
  model shape) and a short timing budget, for tests and smoke runs.
* ``RELU2_BENCH_IMPLS=a,b,c``: the implementations to measure (default: the built-ins plus any
  registered through the ``relu2.implementations`` entry point group).
* ``RELU2_TIMEOUT=SECONDS``: an implementation silent this long on one input is killed and its
  remaining cells fail (default 300; each implementation runs in a worker process of its own).
"""

import os
import sys
from importlib import metadata

# The vocabulary comes from the package (relu2.schema imports neither torch nor the rest of relu2).
from relu2.schema import (
    BUILTIN_IMPLS,
    CPU_MAX_NUMEL,
    SUITE_IMPLS,
    DEFAULT_SIZES,
    DTYPES,
    KERNEL_ASV_VERSION,
    MODEL_DTYPE,
    MODEL_HIDDEN,
    MODEL_TOKENS,
    MODES,
    PEAK_MEMORY_ASV_VERSION,
    grid_cells,
    kernel_id,
    model_cells,
)

QUICK_IMPLS = ("eager", "copy")
QUICK_DTYPES = ("float32",)
QUICK_NUMELS = (2**10, 2**12)
QUICK_TOKENS = (1,)
QUICK_HIDDEN = (3072,)
ENTRY_POINT_GROUP = "relu2.implementations"


def _quick() -> bool:
    return os.environ.get("RELU2_BENCH_QUICK", "").strip().lower() in ("1", "true", "yes")


def _impls() -> tuple:
    chosen = os.environ.get("RELU2_BENCH_IMPLS", "").strip()
    if chosen:
        return tuple(name.strip() for name in chosen.split(",") if name.strip())
    if _quick():
        return QUICK_IMPLS
    extra = sorted({ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)} - set(BUILTIN_IMPLS))
    return SUITE_IMPLS + tuple(extra)


IMPLS = _impls()
GRID_DTYPES = QUICK_DTYPES if _quick() else DTYPES
GRID_NUMELS = QUICK_NUMELS if _quick() else DEFAULT_SIZES
TOKENS = QUICK_TOKENS if _quick() else MODEL_TOKENS
HIDDEN = QUICK_HIDDEN if _quick() else MODEL_HIDDEN


def setup_cache():
    """Measure every cell of both suites once (a worker process per implementation) and return plain data.

    ``{"device": str, "grid": {(impl, dtype, numel): entry}, "model": {(impl, tokens, hidden): entry}}``
    where an entry is ``{"status", "reason", "peak_bytes", "modes": {mode: {"status", "reason",
    "samples"}}}``.  Cells not measured here (above the CPU cap) are absent.
    """
    import torch

    from relu2 import sweep
    from relu2.isolation import timeout_from_env
    from relu2.timing import DEFAULT_BUDGET, QUICK_BUDGET

    device = "cuda" if torch.cuda.is_available() else "cpu"

    def measurable(numel):
        return device == "cuda" or numel <= CPU_MAX_NUMEL

    grid = [c for c in grid_cells(IMPLS, GRID_DTYPES, GRID_NUMELS) if measurable(c.numel)]
    model = [c for c in model_cells(IMPLS, TOKENS, HIDDEN, (MODEL_DTYPE,)) if measurable(c.numel)]
    budget = QUICK_BUDGET if _quick() else DEFAULT_BUDGET
    # A kernel that crashes or hangs costs its own cells only; RELU2_TIMEOUT bounds a hang.
    with sweep.measurer(grid + model, device, timeout_s=timeout_from_env()) as measurer:
        results = sweep.run_sweep(grid + model, device=device, budget=budget, measurer=measurer).results
    measured = {r.cell: r for r in results}
    return {
        "device": device,
        "grid": {(c.impl, c.dtype, c.numel): _entry(measured[c]) for c in grid},
        "model": {(c.impl, c.shape[0], c.shape[1]): _entry(measured[c]) for c in model},
    }


# The whole grid per commit: compiles, JIT builds and ~300 cells take minutes on a GPU.
setup_cache.timeout = 3600


def _entry(result) -> dict:
    """A CellResult as plain data, so the benchmark processes can unpickle it without torch."""
    return {
        "status": result.status,
        "reason": result.reason,
        "peak_bytes": result.peak_bytes,
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
    """A ``track_<mode>`` method per timing mode (generated below) and ``track_peak_memory``, over one
    cache table; subclasses say which table and key."""

    unit = "seconds"
    table = ""

    def _key(self, *params) -> tuple:
        return params

    def _lookup(self, cache, params) -> dict:
        entry = cache[self.table].get(self._key(*params))
        if entry is None:
            raise _skip(f"not measured on {cache['device']}: inputs above {CPU_MAX_NUMEL} elements "
                        f"are measured on CUDA only")
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

    def track_peak_memory(self, cache, *params):
        entry = self._lookup(cache, params)
        if entry["status"] == "failed":
            raise RuntimeError(f"relu2: failed: {entry['reason']}")
        if entry["peak_bytes"] is None:
            raise _skip_one(f"GPU memory is measured on CUDA only (device here: {cache['device']})")
        return entry["peak_bytes"]

    track_peak_memory.unit = "bytes"
    track_peak_memory.version = PEAK_MEMORY_ASV_VERSION
    track_peak_memory.less_is_better = True

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

    params = [list(IMPLS), list(GRID_DTYPES), list(GRID_NUMELS)]
    param_names = ["impl", "dtype", "numel"]
    table = "grid"


class ModelShapes(_Suite):
    """Every implementation on (tokens, hidden) bf16 activations, the shapes a model sees."""

    params = [list(IMPLS), list(TOKENS), list(HIDDEN)]
    param_names = ["impl", "tokens", "hidden"]
    table = "model"
