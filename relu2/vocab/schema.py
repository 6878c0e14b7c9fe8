"""The project's vocabulary, defined once: timing modes, result columns and metrics, the grid, and how
implementations are shown.  Everything else derives from here.

Torch-free on purpose: ``relu2 --help``, the asv suites' module import and the readers of results
use this without paying for torch (a test imports it with torch made unimportable).

* **Modes** (``MODES``): what a figure times.  The timers live in ``relu2.measure.timing``, attached by name;
  the asv ``track_<mode>`` benchmarks are generated from this list.
* **Columns** (``COLUMNS``): the tidy row of ``relu2 sweep``, ``relu2 export``, the plots and the
  gate.  A derived metric is one ``Column`` with a ``derive`` function: the sweep and the asv reader
  both build rows through ``relu2.records.rows.make_row``, which calls it.
* **Grid**: dtypes, sizes, shapes, model shapes and the CPU cap, with ``grid_shape``/``format_shape``.
* **Implementations**: the built-ins' order, the baseline and roofline names, colours and markers.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

# --- timing modes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mode:
    """One timing mode: a figure of every cell, in seconds per call.

    ``method`` is the version of how the instrument times this mode (``relu2.measure.timing``): it is bumped
    when a change of the timer changes what its figures mean, and the asv ``track_<name>`` version
    follows it, so a new method starts a new series on the dashboard and the gate refuses to compare
    across it, instead of showing a step that no kernel made (docs/tracking.md lists the methods).
    ``first_asv_version`` is the version method 1's results carry (asv's hash of the first source).
    """

    name: str
    label: str  # legend text
    linestyle: str  # matplotlib line style in every plot
    doc: str  # one line: how it is timed and what it answers
    first_asv_version: str
    method: int = 1
    # True when the figure is the kernel's own time (no host overhead), so no kernel can beat a copy
    # of the same bytes by much; False when host-side call overhead is part of it.
    kernel_time: bool = True
    # The first method whose samples are per-round medians (one independent worker process each)
    # rather than replays in one process (None: none is), so the gate tests the spread between rounds.
    rounds_from_method: int | None = None
    # The first method whose between-run noise the gate's model learns from (relu2.judge.noise): an earlier
    # method joins when it differs from today's only in how many processes and samples make a figure,
    # not in what is timed, or was measured noisier than today's on the same cells (a model learned
    # from it errs wide, never narrow).  None: this method only.
    noise_from_method: int | None = None

    @property
    def asv_version(self) -> str:
        """The version of the asv ``track_<name>`` benchmarks: asv keys history by it."""
        return self.version_of(self.method)

    def version_of(self, method: int) -> str:
        """The asv version figures of ``method`` are recorded under."""
        return self.first_asv_version if method == 1 else f"{self.name}-method-{method}"

    @property
    def versions_before(self) -> tuple[str, ...]:
        """The asv versions of this mode's earlier methods (kept in committed results, never compared)."""
        return tuple(self.version_of(m) for m in range(1, self.method))

    def method_of(self, asv_version: str | None) -> int | None:
        """Which method a recorded asv version is (None: not one of this mode's)."""
        if asv_version == self.first_asv_version:
            return 1
        prefix = f"{self.name}-method-"
        if asv_version and asv_version.startswith(prefix) and asv_version[len(prefix):].isdigit():
            return int(asv_version[len(prefix):])
        return None

    @property
    def noise_versions(self) -> tuple[str, ...]:
        """The asv versions whose figures the noise model may learn this mode's noise from."""
        first = self.method if self.noise_from_method is None else self.noise_from_method
        return tuple(self.version_of(m) for m in range(first, self.method + 1))

    def samples_are_rounds(self, asv_version: str | None) -> bool:
        """True when figures recorded under ``asv_version`` carry one sample per independent round."""
        method = self.method_of(asv_version)
        return self.rounds_from_method is not None and method is not None and method >= self.rounds_from_method


# Methods (docs/tracking.md lists them): hot 2, cold 3 and launch 2 are the first measured in rounds,
# each figure the median of ``MIN_ROUNDS`` independent worker processes' medians.  Hot 3 sizes its graph
# from the GPU's time, not the host's: 2.7-8.6x quieter between processes in the L2, the same beyond 4x.
# Hot 4 cycles its graph's calls over up to 16 L2-resident copies of the input: a tiny tensor's figure
# no longer follows the one address its input got.
# The noise model also learns from the single-process figures before them (the A/A runs of earlier
# boxes), except cold's method 1, whose L2 flush split the largest figures in two.
MODES: tuple[Mode, ...] = (
    Mode("hot", "hot (kernel time, L2 warm)", "-",
         "CUDA-graph replay of back-to-back calls on L2-resident inputs: the kernel's own time, data warm in L2",
         first_asv_version="deca6e1fca4ee5060d32c98cbd9049144d6e7511a586083fda885c42990970eb",
         method=4, rounds_from_method=2, noise_from_method=1),
    Mode("cold", "cold (kernel time, L2 cold)", "--",
         "the same with the L2 flushed and every call on its own input: what a model sees after a GEMM",
         first_asv_version="ad1ee5675c5da51859e7df98b59112d700f16843039c013c3b83aefce1522fad",
         method=3, rounds_from_method=3, noise_from_method=2),
    Mode("launch", "launch (eager calls, wall clock)", ":",
         "wall clock of back-to-back eager calls then one synchronize: what eager mode pays per call",
         first_asv_version="4b93e7c8c61f45612e066afd68d4a83db7e001697987be919440431568060aa2", kernel_time=False,
         method=2, rounds_from_method=2),
)
MODE_NAMES: tuple[str, ...] = tuple(m.name for m in MODES)
# The asv benchmark of GPU memory at the peak of one call (unit bytes), beside the timing modes.
PEAK_MEMORY_ASV_VERSION = "dbbc686f99c0f776082c700f17c4f8d79c4366d17ec6086ff06dfff1331420eb"


def mode(name: str) -> Mode:
    """The Mode called ``name``; ValueError naming the known ones."""
    for m in MODES:
        if m.name == name:
            return m
    raise ValueError(f"unknown timing mode {name!r}; known: {', '.join(MODE_NAMES)}")


def check_modes(names: Iterable[str]) -> tuple[str, ...]:
    """``names`` as a tuple when every one is a mode; ValueError naming the unknown ones."""
    names = tuple(names)
    unknown = [n for n in names if n not in MODE_NAMES]
    if unknown:
        raise ValueError(f"unknown timing modes {unknown}; known: {', '.join(MODE_NAMES)}")
    return names


def quantile(samples: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``samples`` by linear interpolation between order statistics (numpy's default)."""
    if not samples:
        raise ValueError("quantile of no samples")
    ordered = sorted(samples)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def env_flag(name: str) -> bool:
    """An on/off environment variable: unset, "", 0, false or no is off; 1, true or yes is on; anything
    else is a ValueError naming it (a typo never silently means the other thing)."""
    value = os.environ.get(name, "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise ValueError(f"{name}={os.environ[name]!r}: expected 1, true or yes (on), or 0, false, no or empty (off)")


# --- the fate of a figure -------------------------------------------------------------------------

OK = "ok"  # measured: agreement checked, then timed
FAILED = "failed"  # not timed: it disagreed, crashed, hung or raised (the reason says which)
SKIPPED = "skipped"  # not timed: it cannot run here (no CUDA, out of memory)
STATUSES: tuple[str, ...] = (OK, FAILED, SKIPPED)


# --- the gate's vocabulary (relu2.judge.noise, relu2.judge.rule; here so that --help reads it without them) -----

# Rounds: independent processes a figure is the median of.  MIN_ROUNDS is also every measurement's
# default (asv runs, compares): fewer say nothing about the spread between them; a re-measurement of
# flagged cells (relu2 confirm) takes twice as many; no run takes more than MAX_ROUNDS a side (twice
# that for a re-measurement or a bisect step).
MIN_ROUNDS = 3
CONFIRM_ROUNDS = 2 * MIN_ROUNDS
MAX_ROUNDS = 20
# A cell whose exact work changed is measured again, ADDED_ROUNDS more rounds at a time, until its
# verdict is settled (relu2.judge.rule.settled) or it has CHANGED_MAX_ROUNDS a side: Pinpoint's
# "unknown: measure more", for the few cells a change touched (docs/methodology.md, "Work counters").
ADDED_ROUNDS = MIN_ROUNDS
CHANGED_MAX_ROUNDS = 4 * MIN_ROUNDS
BUDGET = 0.05  # at most 1 run of unchanged code in 20 may fail: fewer and nobody trusts a FAIL
DEFAULT_FLOOR_S = 0.25e-6  # not learned: a slowdown of less than this is nothing anyone can act on
# L2 per GPU model (bytes), for machine.json files that predate ``l2_bytes``.  H200: 60 MiB, torch's
# ``L2_cache_size`` on the lent H200.  H100 SXM and PCIe: 50 MiB (NVIDIA's H100 whitepaper).
KNOWN_L2: Mapping[str, int] = {"H200": 60 * 2**20, "H100": 50 * 2**20}


@dataclass(frozen=True)
class Band:
    """Cells whose bytes moved lie in [lo, hi) times the L2: in the L2 a kernel is timed from it (and
    moves most between boxes), at 1-4x it is partly cached, beyond 4x it streams from DRAM.
    ``matters``: the smallest slowdown a cell whose work changed must be told apart from none (more
    rounds until it is): a memory-bound kernel beyond the L2 is near its roofline, where 3% is real."""

    name: str
    lo: float
    hi: float
    matters: float


BANDS: tuple[Band, ...] = (Band("in L2", 0.0, 1.0, 1.05), Band("1-4x L2", 1.0, 4.0, 1.03),
                           Band("> 4x L2", 4.0, math.inf, 1.03))
BAND_NAMES: tuple[str, ...] = tuple(b.name for b in BANDS)
LARGEST_BAND = BANDS[-1]


def band_named(name: str) -> Band:
    return next(b for b in BANDS if b.name == name)


def band_of(bytes_moved: float, l2_bytes: int) -> Band:
    x = bytes_moved / l2_bytes
    return next(b for b in BANDS if b.lo <= x < b.hi)


def l2_of(machine: Mapping[str, Any]) -> int | None:
    """A machine's L2 in bytes: machine.json's ``l2_bytes``, else ``KNOWN_L2`` by GPU name, else None."""
    recorded = machine.get("l2_bytes")
    if recorded not in (None, "", "none"):
        try:
            return int(recorded)
        except (TypeError, ValueError):
            pass
    gpu = str(machine.get("gpu", ""))
    return next((size for name, size in KNOWN_L2.items() if name in gpu), None)


# --- the grid -------------------------------------------------------------------------------------

DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
# float64 is accepted by every kernel but is no part of the grid.
ITEMSIZE: Mapping[str, int] = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}
DEFAULT_SIZES: tuple[int, ...] = tuple(4**k for k in range(5, 15))  # 2^10 .. 2^28, every factor 4
# A CPU run stops here: a full grid there would take long and says nothing about a GPU.
CPU_MAX_NUMEL = 2**22
ROW_WIDTH = 4096  # grid inputs are (numel // 4096, 4096) once they hold a row: an activation's shape
MODEL_TOKENS: tuple[int, ...] = (1, 16, 128, 1024, 4096, 16384)
MODEL_HIDDEN: tuple[int, ...] = (3072, 12288)  # Nemotron-H-class MLP widths
MODEL_DTYPE = "bfloat16"


# vLLM's shapes.  Its own relu² benchmark (benchmarks/kernels/benchmark_relu_squared.py, vLLM PR
# #39058) times x = randn(batch * seq, d): these are its batch, seq and d, as tokens = batch * seq.
VLLM_BATCH: tuple[int, ...] = (1, 16, 128)
VLLM_SEQ: tuple[int, ...] = (1, 16, 64, 1024)
VLLM_HIDDEN: tuple[int, ...] = (3072, 9728, 12288)
VLLM_TOKENS: tuple[int, ...] = tuple(sorted({b * s for b in VLLM_BATCH for s in VLLM_SEQ}))
VLLM_DTYPE = "bfloat16"  # the benchmark's default
# relu² widths of NVIDIA's Nemotron models (the MLP intermediate size; the experts' for MoE).
NEMOTRON_WIDTHS: Mapping[int, str] = {
    1856: "Nemotron-3-Nano routed experts (top-6 of 128: 6 rows a token)",
    3712: "Nemotron-3-Nano shared expert",
    5376: "Nemotron-3-Super shared expert",
    12288: "Nemotron-H 4B",
    15680: "Nemotron Nano-v2 9B",
    20480: "Nemotron Nano-v2 12B",
    21504: "Nemotron-H 8B",
    30720: "Nemotron-H 47B",
    32768: "Nemotron-H 56B",
}
# Decode CUDA graphs cover 1-512 tokens; prefill runs up to 8192-16384.
NEMOTRON_TOKENS: tuple[int, ...] = (1, 8, 64, 512, 2048, 8192, 16384)
NEMOTRON_DTYPE = "bfloat16"
# A routed expert's relu² runs on [tokens x top_k, width] (vllm/model_executor/models/nemotron_h.py):
# at these widths a cell of T tokens is (T * top_k, width).  No other suite has these widths.
ROUTED_TOP_K: Mapping[int, int] = {1856: 6}
# Widths measured with both warm-up orders side by side (the widest Nemotron-H one, and the one where
# marking only dim 0 dynamic was seen slower than eager).
WARMUP_WIDTHS: tuple[int, ...] = (12288, 3712)


def itemsize(dtype: str) -> int:
    """Bytes per element of a dtype named as results store it ("bfloat16")."""
    try:
        return ITEMSIZE[dtype]
    except KeyError:
        raise ValueError(f"not a floating-point dtype relu2 measures: {dtype!r} "
                         f"(known: {', '.join(ITEMSIZE)})") from None


def bytes_moved(numel: int, dtype: str) -> int:
    """Bytes relu² must move: every element read once and written once."""
    return 2 * numel * itemsize(dtype)


def grid_shape(numel: int) -> tuple[int, ...]:
    """(numel // 4096, 4096) when numel is a whole number of 4096-wide rows, else (numel,)."""
    if numel >= ROW_WIDTH and numel % ROW_WIDTH == 0:
        return (numel // ROW_WIDTH, ROW_WIDTH)
    return (numel,)


def format_shape(shape: Sequence[int]) -> str:
    """A shape as results store it: (4096, 4096) -> "4096x4096", (1024,) -> "1024"."""
    return "x".join(str(n) for n in shape)


def parse_shape(text: str) -> tuple[int, ...]:
    """ "4096x4096" -> (4096, 4096); ValueError for anything but positive integers joined by x."""
    try:
        shape = tuple(int(part) for part in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"not a shape: {text!r} (use e.g. 4096, 16384x12288)") from None
    if not shape or any(n < 1 for n in shape):
        raise ValueError(f"not a shape: {text!r} (every dimension must be >= 1)")
    return shape


def default_sizes(device: str) -> tuple[int, ...]:
    """The sweep's default sizes: all of DEFAULT_SIZES on CUDA, up to CPU_MAX_NUMEL on the CPU."""
    return DEFAULT_SIZES if device == "cuda" else tuple(n for n in DEFAULT_SIZES if n <= CPU_MAX_NUMEL)


def activation_shape(tokens: int, hidden: int) -> tuple[int, int]:
    """The relu² input of ``tokens`` tokens at width ``hidden``: (tokens, hidden), or (tokens x top_k,
    hidden) at a routed expert's width (``ROUTED_TOP_K``)."""
    return (tokens * ROUTED_TOP_K.get(hidden, 1), hidden)


def geometry(params: Mapping[str, Any]) -> tuple[int, str]:
    """``(numel, shape)`` of a suite's cell from its parameters (``numel``, or ``tokens`` and
    ``hidden``); ValueError when they name no size."""
    if "numel" in params:
        numel = int(params["numel"])
        return numel, format_shape(grid_shape(numel))
    if "tokens" in params and "hidden" in params:
        shape = activation_shape(int(params["tokens"]), int(params["hidden"]))
        return math.prod(shape), format_shape(shape)
    raise ValueError(f"no size parameter (numel, or tokens and hidden) in {sorted(params)}")


def is_grid_shape(numel: int, shape: str) -> bool:
    """True for the size grid's cells, whose shape follows from numel alone."""
    return shape == format_shape(grid_shape(numel))


@dataclass(frozen=True)
class Cell:
    """One implementation on one input: ``dtype`` by name ("bfloat16"), ``shape`` holding ``numel`` elements."""

    impl: str
    dtype: str
    numel: int
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        itemsize(self.dtype)  # ValueError for a dtype relu2 does not measure
        object.__setattr__(self, "shape", tuple(int(n) for n in self.shape))
        if math.prod(self.shape) != self.numel:
            raise ValueError(f"shape {self.shape} holds {math.prod(self.shape)} elements, not numel={self.numel}")

    @property
    def shape_str(self) -> str:
        """The shape as results store it: "4096x4096"."""
        return format_shape(self.shape)

    @property
    def bytes(self) -> int:
        return bytes_moved(self.numel, self.dtype)

    @property
    def input_key(self) -> tuple[str, tuple[int, ...]]:
        """(dtype, shape): the input this cell shares with the other implementations' cells."""
        return (self.dtype, self.shape)

    def with_impl(self, impl: str) -> "Cell":
        return Cell(impl, self.dtype, self.numel, self.shape)

    def describe(self) -> str:
        """"fused bfloat16 4096x4096": how tables and messages show a cell."""
        return f"{self.impl} {self.dtype} {self.shape_str}"

    def name(self, mode: str) -> str:
        """"fused:bfloat16:4096x4096:hot": one figure of the cell, as --cell takes it (``parse``)."""
        return f"{self.impl}:{self.dtype}:{self.shape_str}:{mode}"

    @classmethod
    def parse(cls, text: str) -> tuple["Cell", str]:
        """``name``'s text back: (cell, mode); ValueError saying what is wrong."""
        parts = text.split(":")
        if len(parts) != 4:
            raise ValueError(f"not a cell: {text!r} (use IMPL:DTYPE:SHAPE:MODE, e.g. fused:bfloat16:4096x4096:hot)")
        impl, dtype, shape_text, mode_name = parts
        if dtype not in DTYPES:
            raise ValueError(f"not a dtype: {dtype!r} in {text!r} (dtypes: {', '.join(DTYPES)})")
        if mode_name not in MODE_NAMES:
            raise ValueError(f"not a timing mode: {mode_name!r} in {text!r} (modes: {', '.join(MODE_NAMES)})")
        shape = parse_shape(shape_text)
        return cls(impl, dtype, math.prod(shape), shape), mode_name

    @property
    def key(self) -> tuple[str, str, tuple[int, ...]]:
        """(impl, dtype, shape): the cell as a key of plain data (dicts, pickles, JSON lists)."""
        return (self.impl, self.dtype, self.shape)

    def to_json(self) -> dict[str, Any]:
        return {"impl": self.impl, "dtype": self.dtype, "numel": self.numel, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Cell":
        shape = tuple(int(n) for n in data["shape"])
        return cls(str(data["impl"]), str(data["dtype"]), math.prod(shape), shape)


def grid_cells(impls: Iterable[str], dtypes: Iterable[str] = DTYPES, sizes: Iterable[int] = DEFAULT_SIZES) -> list[Cell]:
    """Every implementation x dtype x size, shaped by ``grid_shape``, grouped by input."""
    impls = list(impls)
    return [Cell(impl, dtype, numel, grid_shape(numel)) for dtype in dtypes for numel in sizes for impl in impls]


def model_cells(impls: Iterable[str], tokens: Iterable[int] = MODEL_TOKENS, hidden: Iterable[int] = MODEL_HIDDEN,
                dtypes: Iterable[str] = (MODEL_DTYPE,)) -> list[Cell]:
    """The activation shapes a model sees (``activation_shape``) for each implementation, grouped by input."""
    impls = list(impls)
    return [Cell(impl, dtype, math.prod(shape), shape) for dtype in dtypes for h in hidden for t in tokens
            for shape in [activation_shape(t, h)] for impl in impls]


# --- implementations ------------------------------------------------------------------------------

BASELINE = "eager"  # speed-ups are over this one; it is also the definition of correct
ROOFLINE = "copy"  # every figure's roofline_fraction is measured against this one


@dataclass(frozen=True)
class Style:
    """How an implementation is drawn: a colour (Okabe-Ito, legible in greyscale) and a marker."""

    colour: str
    marker: str


# The instrument's references (relu2.measure.registry.REFERENCES), drawn alike in every plot.  An
# implementation under test is the measured package's (interface 1), and the instrument knows it only
# by name: its style is derived from the name (``impl_style``).
REFERENCE_STYLES: Mapping[str, Style] = {
    BASELINE: Style("#D55E00", "o"),
    "compile": Style("#56B4E9", "s"),
    ROOFLINE: Style("#666666", "."),
}
REFERENCES: tuple[str, ...] = tuple(REFERENCE_STYLES)
# The styles implementations under test are given: colours legible in greyscale and unlike the
# references', and markers no reference uses; slot i is colour i % 10 with marker (i + i // 10) % 10,
# so 100 names can be told apart and neighbouring slots differ in colour.
IMPL_COLOURS = ("#009E73", "#0072B2", "#CC79A7", "#E69F00", "#000000", "#A6761D", "#882255", "#44AA99",
                "#332288", "#999933")
IMPL_MARKERS = ("^", "D", "v", "P", "x", "+", "X", "p", "h", "*")
_SLOTS = len(IMPL_COLOURS) * len(IMPL_MARKERS)


def _slot_style(slot: int) -> Style:
    n = len(IMPL_COLOURS)
    return Style(IMPL_COLOURS[slot % n], IMPL_MARKERS[(slot + slot // n) % len(IMPL_MARKERS)])


def impl_style(name: str, among: Iterable[str] = ()) -> Style:
    """How ``name`` is drawn: a reference's own style; any other name the slot a stable hash of it picks,
    moved to the next free slot when another implementation of ``among`` (the names drawn beside it),
    taken in sorted order, holds that slot: the same name keeps its style from plot to plot, and no
    two implementations of one plot look alike."""
    if name in REFERENCE_STYLES:
        return REFERENCE_STYLES[name]
    taken: dict[str, int] = {}
    for other in sorted(set(among) - set(REFERENCE_STYLES) | {name}):
        slot = int.from_bytes(hashlib.sha256(other.encode()).digest()[:4], "big") % _SLOTS
        while slot in taken.values():
            slot = (slot + 1) % _SLOTS
        taken[other] = slot
    return _slot_style(taken[name])


def impl_order(names: Iterable[str]) -> list[str]:
    """The references in their order, then the others alphabetically."""
    names = set(names)
    return [n for n in REFERENCES if n in names] + sorted(names - set(REFERENCES))


def dtype_order(names: Iterable[str]) -> list[str]:
    """The grid's dtypes in their usual order, then any others alphabetically."""
    names = set(names)
    return [d for d in DTYPES if d in names] + sorted(names - set(DTYPES))


# --- result columns and metrics -------------------------------------------------------------------

_REQUIRED = object()


def _nan_if_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


@dataclass(frozen=True)
class Column:
    """One column of the tidy result row.

    ``kind`` parses its CSV text (int, float or str).  A metric has a ``unit``; a derived metric
    has ``derive``, a function of the row's values so far (earlier columns, plus ``copy_median_s``:
    the roofline's median of the same input and mode), called by ``relu2.records.rows.make_row`` for
    sweeps and asv results alike.  ``default`` fills the column when an older CSV lacks it
    (required columns have none).  ``header`` and ``format`` put it in the sweep's table.
    """

    name: str
    kind: type
    doc: str
    unit: str = ""
    derive: Callable[[Mapping[str, Any]], Any] | None = None
    default: Any = _REQUIRED
    header: str = ""
    format: Callable[[Any], str] = str

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


def format_seconds(s: float) -> str:
    """Seconds in the unit that reads best: ns, µs, ms or s."""
    if _nan_if_missing(s):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def format_bytes(n: float) -> str:
    """Bytes as B, KiB, MiB, GiB or TiB, three significant digits."""
    if _nan_if_missing(n):
        return "-"
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def _gbps(v: Mapping[str, Any]) -> float:
    median = v["median_s"]
    return v["bytes"] / median / 1e9 if median > 0 else float("nan")


def _roofline_fraction(v: Mapping[str, Any]) -> float:
    copy_s, median = v.get("copy_median_s"), v["median_s"]
    return copy_s / median if not _nan_if_missing(copy_s) and median > 0 else float("nan")


# A kernel time faster than a copy of the same bytes, in the same run and mode, is not believable:
# the margin leaves room for sample noise between two figures of near-equal kernels.  Below
# ABOVE_ROOFLINE_MIN_BYTES per call both figures are mostly per-call overhead (on the CPU every mode
# includes the dispatch), and a launch figure can beat copy's honestly: neither is flagged.
ABOVE_ROOFLINE = 1.10
ABOVE_ROOFLINE_MIN_BYTES = 1 << 20


def _flags(v: Mapping[str, Any]) -> str:
    """Why a figure is implausible ("" when it is not): faster than copy, or spread wider than itself."""
    flags = []
    known = v["mode"] in MODE_NAMES
    if (known and mode(v["mode"]).kernel_time and v["bytes"] >= ABOVE_ROOFLINE_MIN_BYTES
            and v["roofline_fraction"] > ABOVE_ROOFLINE):  # NaN compares False
        flags.append("above-roofline")
    if v["q75_s"] - v["q25_s"] > v["median_s"]:
        flags.append("wide-iqr")
    return ";".join(flags)


# A figure is judged against its neighbours too: relu² is memory-bound, so a size takes no longer
# than the next larger one, nor longer than the next smaller one scaled up by the bytes.  A median
# OUTLIER_FACTOR times both (one, at the ends of the sizes) is a disturbed measurement, not the
# kernel (a CPU sweep once gave 10 ms between neighbours of 25 µs; its rerun 30 µs).  This needs the
# rows of a whole sweep or commit, so it is not a ``derive`` of one row: ``relu2.records.rows.flag_outliers``
# adds it to a set of rows.
OUTLIER = "outlier"
OUTLIER_FACTOR = 10.0

FLAG_DOCS: Mapping[str, str] = {
    "above-roofline": f"a kernel time more than {ABOVE_ROOFLINE:.2f}x as fast as a copy of the same bytes "
                      f"in the same run (checked from {ABOVE_ROOFLINE_MIN_BYTES >> 20} MiB moved)",
    "wide-iqr": "interquartile range wider than the median: the samples disagree",
    OUTLIER: f"a median at least {OUTLIER_FACTOR:.0f}x the same implementation's, dtype's and mode's at the "
             "next larger size and at the next smaller size scaled by the bytes, in the same run: "
             "implausible for a memory-bound op",
}

# --- work counters and the figures of a cell beside its timings ----------------------------------------


@dataclass(frozen=True)
class Counter:
    """One figure ncu reads for every kernel.  ``exact``: identical in every A/A measured (processes,
    launches and boxes), so any difference is a different kernel; the others are kept for the record
    and never judged."""

    name: str
    metric: str
    unit: str
    exact: bool
    doc: str


COUNTERS: tuple[Counter, ...] = (
    Counter("instructions", "smsp__inst_executed.sum", "", True, "warp instructions executed"),
    Counter("global_loads", "smsp__sass_inst_executed_op_global_ld.sum", "", True,
            "global load instructions executed (warp level)"),
    Counter("global_stores", "smsp__sass_inst_executed_op_global_st.sum", "", True,
            "global store instructions executed (warp level)"),
    Counter("load_bytes", "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum", "B", True,
            "bytes global loads asked the L1 for"),
    Counter("store_bytes", "l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum", "B", True,
            "bytes global stores handed to the L1"),
    Counter("dram_read_bytes", "dram__bytes_read.sum", "B", False, "bytes read from DRAM (caches flushed first)"),
    Counter("dram_write_bytes", "dram__bytes_write.sum", "B", False, "bytes written to DRAM"),
    Counter("l2_sectors", "lts__t_sectors.sum", "", False, "L2 sectors accessed"),
    Counter("duration_ns", "gpu__time_duration.sum", "ns", False, "the profiled launch's duration (clocks not fixed)"),
)
COUNTER_NAMES: tuple[str, ...] = tuple(c.name for c in COUNTERS)
EXACT: tuple[str, ...] = tuple(c.name for c in COUNTERS if c.exact)


@dataclass(frozen=True)
class CellFigure:
    """A figure of a cell beside its timings, measured once per cell (not per mode): a column of every
    row of the cell, and an asv benchmark ``track_<method>`` of each suite that lists it (its version
    pinned here, as the modes' are).  Adding one is a line here and its measuring (``relu2.measure``):
    the suites, the readers, the rows and export follow from this list."""

    column: str  # the row's column
    method: str  # the asv benchmark: track_<method>
    unit: str  # asv's unit
    doc: str
    asv_version: str
    header: str = ""  # the sweep table's header ("": not in the table)
    format: Callable[[Any], str] = str

    @property
    def benchmark(self) -> str:
        return f"track_{self.method}"


def _count(x: Any) -> str:
    return "-" if _nan_if_missing(x) else f"{x:,.0f}"


CELL_FIGURES: tuple[CellFigure, ...] = (
    CellFigure("peak_bytes", "peak_memory", "bytes", "GPU memory allocated at the peak of one call (NaN off CUDA)",
               PEAK_MEMORY_ASV_VERSION, header="peak mem", format=format_bytes),
    *(CellFigure(c.name, c.name, "count", f"work counter, exact: {c.doc} in one call (NaN where not counted)", "1",
                 header="instructions" if c.name == "instructions" else "", format=_count)
      for c in COUNTERS if c.exact),
)
CELL_FIGURE_METHODS: Mapping[str, CellFigure] = {f.method: f for f in CELL_FIGURES}


COLUMNS: tuple[Column, ...] = (
    Column("machine", str, "the machine it was measured on"),
    Column("commit", str, "the git commit measured (full hash; +dirty-<digest> where its relu2/, relu2_impls/ or csrc/ were edited)"),
    Column("date", str, "ISO 8601: the commit's date (asv) or the sweep's start"),
    Column("impl", str, "the implementation"),
    Column("dtype", str, "float32, float16 or bfloat16"),
    Column("numel", int, "elements of the input"),
    Column("shape", str, 'the input\'s shape, "4096x4096"'),
    Column("mode", str, "the timing mode: " + ", ".join(MODE_NAMES)),
    Column("median_s", float, "median of the samples", unit="s", header="median", format=format_seconds),
    Column("q25_s", float, "first quartile of the samples", unit="s"),
    Column("q75_s", float, "third quartile of the samples", unit="s"),
    Column("bytes", int, "bytes relu² must move: 2 x numel x itemsize", unit="B",
           derive=lambda v: bytes_moved(v["numel"], v["dtype"])),
    Column("gbps", float, "bytes / median", unit="GB/s", derive=_gbps, header="GB/s",
           format=lambda x: "-" if _nan_if_missing(x) else f"{x:.1f}"),
    Column("roofline_fraction", float, "copy's median / this median, same input and mode (1.0: as fast as a copy)",
           derive=_roofline_fraction, header="% copy",
           format=lambda x: "-" if _nan_if_missing(x) else f"{100 * x:.0f}%"),
    Column("status", str, ", ".join(STATUSES[:-1]) + " or " + STATUSES[-1]),
    Column("reason", str, "why a figure is failed or skipped", default=""),
    *(Column(f.column, float, f.doc, unit="B" if f.unit == "bytes" else f.unit, default=float("nan"), header=f.header,
             format=f.format) for f in CELL_FIGURES[:1]),
    Column("flags", str, "implausible figures: " + "; ".join(f"{k}: {d}" for k, d in FLAG_DOCS.items()),
           derive=_flags, default="", header="flags"),
    Column("kernel", str, "fingerprint of what ran: a hash of the generated (compiled paths) or built kernel "
                              "(its sources less comments and layout)",
           default=""),
    # The work counters come last: a CSV of an older relu2 without them reads with NaN.
    *(Column(f.column, float, f.doc, unit=f.unit, default=float("nan"), header=f.header, format=f.format)
      for f in CELL_FIGURES[1:]),
)
COLUMN_NAMES: tuple[str, ...] = tuple(c.name for c in COLUMNS)

# asv stores numbers only: a kernel fingerprint travels as the integer of its first 12 hex digits
# (48 bits, exact in a float64), in the ``track_kernel`` benchmark beside the timing modes.
KERNEL_ID_DIGITS = 12
# A compiled path's fingerprint is its generated code's hash (the first KERNEL_CODE_DIGITS digits) then
# the hash of the launch configurations autotuning picked (the next ones): two runs whose fingerprints
# share the code digits ran the same code, maybe with another pick (relu2.measure.compiled).  Version 2: this
# layout (version 1 hashed code and picks together, or code alone).
KERNEL_CODE_DIGITS = 6
# Version 3: the pick's digits hash the launch configuration that runs, not how many candidates it was
# picked from (a round that reads the pick from the autotuning cache has only the one: relu2.measure.rounds).
# Version 4: a built or hand-written kernel's fingerprint leaves its sources' comments and layout out
# (relu2_impls.fused.code_key), so a comment is no other kernel.
KERNEL_ASV_VERSION = "4"
KERNEL_ASV_VERSIONS_BEFORE: tuple[str, ...] = ("1", "2", "3")  # kept in committed results, not compared with 4


def kernel_id(fingerprint: str) -> int:
    """A fingerprint ("3f2a9c...") as the number asv stores."""
    return int(fingerprint[:KERNEL_ID_DIGITS], 16)


def kernel_hex(number: float) -> str:
    """The number asv stored back to the fingerprint's first 12 hex digits."""
    return f"{int(number):0{KERNEL_ID_DIGITS}x}"


def only_repicked(a: str, b: str) -> bool:
    """Two different fingerprints of the same generated code: only the autotuned pick differs."""
    return a != b and a[:KERNEL_CODE_DIGITS] == b[:KERNEL_CODE_DIGITS]


def with_picks(fingerprints: Iterable[str]) -> str | None:
    """One fingerprint for the same generated code run with several picks (one a round): the code's
    digits, then a hash of the picks seen; None when the code itself differs.  Two measurements that
    saw the same picks get the same fingerprint, and a different set reads as ``only_repicked``."""
    found = sorted(set(fingerprints))
    if len(found) <= 1:
        return found[0] if found else ""
    n = KERNEL_CODE_DIGITS
    code = {(f[:n], f[2 * n:]) for f in found}
    if len(code) != 1 or any(len(f) <= 2 * n for f in found):
        return None
    picks = hashlib.sha256(",".join(f[n:2 * n] for f in found).encode()).hexdigest()[:n]
    head, rest = code.pop()
    return head + picks + rest


def derive(values: dict[str, Any]) -> dict[str, Any]:
    """Fill every derived column of an ok figure in ``values`` (in place, in column order) and return it."""
    for column in COLUMNS:
        if column.derive is not None:
            values[column.name] = column.derive(values)
    return values
