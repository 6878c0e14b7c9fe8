"""An asv benchmark name and its parameters <-> the cell it measured: encoded and decoded here only.

The suites (``benchmarks/bench_relu2.py``) are named ``bench_relu2.<Suite>.track_<measure>``:

* ``Grid`` takes ``(impl, dtype, numel)``; the token suites (``ModelShapes``, ``VllmShapes``,
  ``Nemotron``, ``WarmupOrder``) take ``(impl, tokens, hidden)`` and time one dtype each, which asv
  never records (no dtype parameter): it is decoded from the suite's dtype in ``relu2.vocab.schema``
  (``SUITE_DTYPES``), so a bfloat16 suite and a float16 one can never be read as one another;
* ``<measure>`` is a timing mode (``hot``), ``kernel`` (the fingerprint), a cell figure (``peak_memory``,
  a work counter: ``schema.CELL_FIGURES``), or, in
  ``Implementations`` (no parameters), an implementation's name: its ``summary`` figure.

Torch-free: every reader (gate, noise, confirm, export, publish, plots) imports it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from relu2.vocab.schema import CELL_FIGURE_METHODS, MODEL_DTYPE, MODE_NAMES, NEMOTRON_DTYPE, VLLM_DTYPE, bytes_moved, geometry
from relu2.vocab.schema import Cell as SchemaCell  # what a measuring process is asked for; Cell here is a result's
from relu2.vocab.schema import parse_shape

MODULE = "bench_relu2"
# The dtype each token suite times (its class attribute ``dtype`` is the same constant; a test checks).
SUITE_DTYPES: Mapping[str, str] = {"ModelShapes": MODEL_DTYPE, "VllmShapes": VLLM_DTYPE,
                                   "Nemotron": NEMOTRON_DTYPE, "WarmupOrder": NEMOTRON_DTYPE}
# A suite this instrument does not define (a user's) and that names no dtype: read as bfloat16.
DEFAULT_DTYPE = "bfloat16"
SIZE_PARAMS = ("numel", "tokens", "hidden")
KERNEL = "kernel"
SUMMARY = "summary"
SUMMARY_SUITE = "Implementations"


@dataclass(frozen=True)
class Cell:
    """A benchmark result decoded once: what it measured, and how to name it."""

    suite: str  # "bench_relu2.Grid"
    measure: str  # a mode ("hot"), "kernel", "peak_memory", "summary", or the method's own name
    params: tuple[tuple[str, str], ...]  # asv's, unquoted, in benchmarks.json order
    impl: str
    dtype: str
    shape: str  # "4096x4096"; "" when the benchmark names no size

    @property
    def extras(self) -> tuple[tuple[str, str], ...]:
        """Parameters beyond implementation, dtype and size."""
        return tuple((k, v) for k, v in self.params if k not in ("impl", "dtype", *SIZE_PARAMS))

    @property
    def identity(self) -> tuple:
        """What makes two cells one measurement, whichever suite lists it."""
        return (self.measure, self.impl, self.dtype, self.shape, self.extras)

    @property
    def input(self) -> tuple:
        """What the implementation ran on (the kernel fingerprint of the same input is its own)."""
        return (self.impl, self.dtype, self.shape, self.extras)

    @property
    def numel(self) -> int:
        return math.prod(int(n) for n in self.shape.split("x")) if self.shape else 0

    @property
    def bytes(self) -> int:
        try:
            return bytes_moved(self.numel, self.dtype)
        except ValueError:
            return 0

    @property
    def timing_mode(self) -> str | None:
        """The mode whose noise judges this cell (a summary is judged as hot); None for non-timings."""
        if self.measure in MODE_NAMES:
            return self.measure
        return "hot" if self.measure == SUMMARY else None

    @property
    def benchmark(self) -> str:
        """The asv name it was recorded under."""
        return benchmark_name(self.suite.rsplit(".", 1)[-1], self.impl if self.measure == SUMMARY else self.measure)

    def label(self) -> str:
        """``Grid.track_hot(impl=fused, dtype=bfloat16, numel=16777216)``."""
        short = ".".join(self.benchmark.split(".")[-2:])
        return f"{short}({', '.join(f'{k}={v}' for k, v in self.params)})"


def suite_dtype(suite: str) -> str:
    """The dtype a suite without a dtype parameter times (``suite``: "bench_relu2.Nemotron" or "Nemotron")."""
    return SUITE_DTYPES.get(suite.rsplit(".", 1)[-1], DEFAULT_DTYPE)


def benchmark_name(suite: str, measure: str) -> str:
    """``("Grid", "hot")`` -> ``bench_relu2.Grid.track_hot`` (a summary: ``("Implementations", impl)``)."""
    return f"{MODULE}.{suite}.track_{measure}"


def encode(suite: str, measure: str, impl: str, *, dtype: str | None = None, numel: int | None = None,
           tokens: int | None = None, hidden: int | None = None) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The asv benchmark name and parameters of a cell, as ``decode`` reads them back: Grid by
    ``dtype`` and ``numel``, a token suite by ``tokens`` and ``hidden`` (its dtype is the suite's:
    ValueError for another one)."""
    if suite == SUMMARY_SUITE:
        return benchmark_name(suite, impl), ()
    if suite in SUITE_DTYPES:
        if dtype not in (None, SUITE_DTYPES[suite]):
            raise ValueError(f"{suite} times {SUITE_DTYPES[suite]} only, not {dtype}")
        if tokens is None or hidden is None:
            raise ValueError(f"{suite} cells are named by tokens and hidden")
        return benchmark_name(suite, measure), (("impl", impl), ("tokens", str(tokens)), ("hidden", str(hidden)))
    if dtype is None or numel is None:
        raise ValueError(f"{suite} cells are named by dtype and numel")
    return benchmark_name(suite, measure), (("impl", impl), ("dtype", dtype), ("numel", str(numel)))


def split(benchmark: str) -> tuple[str, str, str]:
    """``bench_relu2.Grid.track_hot(...)`` -> (``bench_relu2.Grid``, ``track_hot``, ``hot``): the suite,
    the method, and the method's name less asv's prefix (a dashboard's series name keeps its params)."""
    name = benchmark.split("(", 1)[0]
    suite, method = name.rsplit(".", 1) if "." in name else ("", name)
    return suite, method, method.removeprefix("track_").removeprefix("time_")


def measure_of(benchmark: str, unit: str | None = None) -> str:
    """What a benchmark measures from its name (and unit, when known): a mode, ``kernel``,
    a cell figure (``peak_memory``, ``instructions``...), ``summary`` (an Implementations figure), or the
    method's own name."""
    suite, method, name = split(benchmark)
    if name in MODE_NAMES and unit in (None, "seconds"):
        return name
    if name == KERNEL or name in CELL_FIGURE_METHODS:
        return name
    if suite.rsplit(".", 1)[-1] == SUMMARY_SUITE and unit in (None, "seconds"):
        return SUMMARY
    return method


def timed_cell(benchmark: str, params: Mapping[str, str], unit: str | None = None) -> "tuple[SchemaCell, str] | None":
    """The cell (``relu2.vocab.schema.Cell``: what a measuring process is asked for) and timing mode of a
    result that is one cell in one timing mode; None for any other figure (a summary, a counter)."""
    mode = measure_of(benchmark, unit)
    if mode not in MODE_NAMES or "impl" not in params:
        return None
    numel, shape = geometry(params)
    dtype = params.get("dtype") or suite_dtype(benchmark.split("(", 1)[0].rsplit(".", 1)[0])
    return SchemaCell(params["impl"], dtype, numel, parse_shape(shape)), mode


def unit_of(benchmark: str) -> str:
    """The unit a benchmark's name implies (for one benchmarks.json no longer lists): "" when unknown."""
    measure = measure_of(benchmark)
    if measure in CELL_FIGURE_METHODS:
        return CELL_FIGURE_METHODS[measure].unit
    return "seconds" if measure in MODE_NAMES or measure == SUMMARY else ""


@functools.cache  # pure, and asked again for the same cell by every reader of a record
def decode(benchmark: str, params: tuple[tuple[str, str], ...], unit: str) -> Cell:
    """``bench_relu2.Grid.track_hot`` at (impl, dtype, numel), unit seconds -> Cell(suite, "hot", ...)."""
    suite, method, name = split(benchmark)
    named = dict(params)
    params = tuple(params)
    if unit == "seconds" and name in MODE_NAMES:
        measure = name
    elif unit == "seconds" and not named:
        measure, named = SUMMARY, {"impl": name}
    elif name == KERNEL or name in CELL_FIGURE_METHODS:
        measure = name
    else:
        measure = method
    try:
        shape = geometry(named)[1]
    except (ValueError, TypeError):
        shape = ""
    return Cell(suite, measure, params, named.get("impl", ""), named.get("dtype") or suite_dtype(suite), shape)
