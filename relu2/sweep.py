"""The grid engine behind ``relu2 sweep`` and the asv suites: check, then time, every cell of a grid.

A cell is one implementation on one input (dtype and shape).  For each cell the implementation is
first checked bitwise against the eager path on fresh inputs; only then is it timed.  A cell that
disagrees is recorded "failed" and never timed; one that cannot run here, or runs out of memory,
is recorded "skipped"; any other error fails that cell only and the sweep goes on.  The ``copy``
reference is timed for every (dtype, shape) first, so every figure gets the fraction of the copy
roofline measured in the same run and mode.

``run_resumable`` measures one input (dtype, shape) at a time and checkpoints the rows after each,
so an interrupted sweep loses at most the input it was on and a re-run picks up from there.
"""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Sequence

import torch
from tqdm import tqdm

from relu2.agreement import AgreementError, check_agreement
from relu2.implementations import Implementation, get
from relu2.inputs import random_input
from relu2.results import MODES, ROOFLINE_IMPL, Row, read_csv, write_csv
from relu2.timing import Budget, Timing, bytes_moved, dtype_name, dtype_of, peak_memory_bytes, time_fn

DEFAULT_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
DEFAULT_SIZES: tuple[int, ...] = tuple(4**k for k in range(5, 15))  # 2^10 .. 2^28, every factor 4
# A CPU sweep stops here by default: a full grid there would take long and says nothing about a GPU.
CPU_MAX_NUMEL = 2**22
ROW_WIDTH = 4096  # grid inputs are (numel // 4096, 4096) once they hold a row: the shape of an activation
MODEL_TOKENS: tuple[int, ...] = (1, 16, 128, 1024, 4096, 16384)
MODEL_HIDDEN: tuple[int, ...] = (3072, 12288)  # Nemotron-H-class MLP widths
MODEL_DTYPE = "bfloat16"

GroupKey = tuple[str, tuple[int, ...]]  # (dtype, shape): one input, measured in one go with its copy


@dataclass(frozen=True)
class Cell:
    """One implementation on one input: ``dtype`` by name ("bfloat16"), ``shape`` with ``numel`` elements."""

    impl: str
    dtype: str
    numel: int
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        object.__setattr__(self, "shape", tuple(int(n) for n in self.shape))
        product = 1
        for n in self.shape:
            product *= n
        if product != self.numel:
            raise ValueError(f"shape {self.shape} holds {product} elements, not numel={self.numel}")

    @property
    def shape_str(self) -> str:
        """The shape as results store it: "4096x4096"."""
        return format_shape(self.shape)

    @property
    def bytes(self) -> int:
        return bytes_moved(self.numel, self.dtype)

    def with_impl(self, impl: str) -> "Cell":
        return Cell(impl, self.dtype, self.numel, self.shape)

    def describe(self) -> str:
        return f"{self.impl} {self.dtype} {self.shape_str}"


def format_shape(shape: Sequence[int]) -> str:
    """A shape as results store it: (4096, 4096) -> "4096x4096", (1024,) -> "1024"."""
    return "x".join(str(n) for n in shape)


def default_sizes(device: str) -> tuple[int, ...]:
    """The sweep's default sizes: all of DEFAULT_SIZES on CUDA, up to CPU_MAX_NUMEL on the CPU."""
    return DEFAULT_SIZES if device == "cuda" else tuple(n for n in DEFAULT_SIZES if n <= CPU_MAX_NUMEL)


def grid_shape(numel: int) -> tuple[int, ...]:
    """(numel // 4096, 4096) when numel is a whole number of 4096-wide rows, else (numel,)."""
    if numel >= ROW_WIDTH and numel % ROW_WIDTH == 0:
        return (numel // ROW_WIDTH, ROW_WIDTH)
    return (numel,)


def default_cells(
    impls: Iterable[str],
    dtypes: Iterable[str | torch.dtype] = DEFAULT_DTYPES,
    sizes: Iterable[int] = DEFAULT_SIZES,
) -> list[Cell]:
    """Every implementation x dtype x size, shaped by ``grid_shape``; grouped by input."""
    impls = list(impls)
    return [Cell(impl, dtype_name(dtype), numel, grid_shape(numel))
            for dtype in dtypes for numel in sizes for impl in impls]


def model_cells(
    impls: Iterable[str],
    tokens: Iterable[int] = MODEL_TOKENS,
    hidden: Iterable[int] = MODEL_HIDDEN,
    dtype: str | torch.dtype = MODEL_DTYPE,
) -> list[Cell]:
    """The activation shapes a model sees: (tokens, hidden) in bf16 for each implementation."""
    impls = list(impls)
    return [Cell(impl, dtype_name(dtype), t * h, (t, h)) for h in hidden for t in tokens for impl in impls]


@dataclass(frozen=True)
class Outcome:
    """One figure of a cell: its Timing when status is "ok", else the reason it has none."""

    status: str
    reason: str = ""
    timing: Timing | None = None


@dataclass
class CellResult:
    """Everything measured for one cell.

    ``status`` is the cell's own: "ok" once it passed the agreement check (or needs none, like
    ``copy``), "failed" when it disagreed or the check raised, "skipped" when it cannot run here.
    ``outcomes`` has one Outcome per mode; a mode can fail on its own (say, the implementation
    cannot be captured in a CUDA graph) while the others are timed.  ``peak_bytes`` is the GPU
    memory one call allocates at its peak (None off CUDA or when not measured).
    """

    cell: Cell
    status: str
    reason: str = ""
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    peak_bytes: int | None = None

    def median(self, mode: str) -> float:
        """The mode's median in seconds, NaN when it was not timed."""
        outcome = self.outcomes.get(mode)
        return outcome.timing.median_s if outcome and outcome.timing else float("nan")


@dataclass
class Sweep:
    """The results of ``run_sweep``, in the order the cells were given, and the copy references."""

    device: str
    modes: tuple[str, ...]
    results: list[CellResult]
    references: dict[tuple[str, tuple[int, ...]], CellResult]  # (dtype, shape) -> the copy cell

    def roofline_fraction(self, result: CellResult, mode: str) -> float:
        """Copy median over this median, same input and mode: 1.0 is as fast as a device copy."""
        reference = self.references.get((result.cell.dtype, result.cell.shape))
        copy_s = reference.median(mode) if reference else float("nan")
        return copy_s / result.median(mode)

    def rows(self, machine: str = "", commit: str = "", date: str | None = None) -> list[Row]:
        """One tidy Row per cell and mode."""
        date = date or datetime.now(timezone.utc).isoformat(timespec="seconds")
        rows = []
        for result in self.results:
            cell = result.cell
            for mode in self.modes:
                outcome = result.outcomes[mode]
                median = result.median(mode)
                timing = outcome.timing
                rows.append(Row(
                    machine=machine, commit=commit, date=date, impl=cell.impl, dtype=cell.dtype,
                    numel=cell.numel, shape=cell.shape_str, mode=mode,
                    median_s=median,
                    q25_s=timing.q25_s if timing else float("nan"),
                    q75_s=timing.q75_s if timing else float("nan"),
                    bytes=cell.bytes,
                    gbps=cell.bytes / median / 1e9 if timing else float("nan"),
                    roofline_fraction=self.roofline_fraction(result, mode) if timing else float("nan"),
                    status=outcome.status, reason=outcome.reason,
                ))
        return rows

    def peak_memory(self) -> dict[Cell, int]:
        """GPU bytes at the peak of one call, for the cells where it was measured."""
        return {r.cell: r.peak_bytes for r in self.results if r.peak_bytes is not None}


def default_device() -> str:
    """"cuda" when a GPU is visible, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def run_cells(
    cells: Sequence[Cell],
    modes: Sequence[str] = MODES,
    device: str | None = None,
    machine: str = "",
    commit: str = "",
    progress: bool = False,
    *,
    budget: Budget | None = None,
    date: str | None = None,
) -> list[Row]:
    """Check and time every cell (see ``run_sweep``) and return the tidy rows, one per cell and mode."""
    return run_sweep(cells, modes, device, progress, budget=budget).rows(machine, commit, date)


def run_sweep(
    cells: Sequence[Cell],
    modes: Sequence[str] = MODES,
    device: str | None = None,
    progress: bool = False,
    *,
    budget: Budget | None = None,
) -> Sweep:
    """Check and time every distinct cell on ``device`` (default: cuda if available, else cpu).

    Cells are measured input by input; for each input the ``copy`` reference goes first.  Never
    raises for a cell: failures and skips are recorded with their reason.
    """
    modes = _check_modes(modes)
    device = device or default_device()
    cells = list(dict.fromkeys(cells))  # distinct, in order
    groups = group_cells(cells)

    measured: dict[Cell, CellResult] = {}
    references: dict[GroupKey, CellResult] = {}
    with tqdm(total=len(cells) + sum(1 for g in groups.values() if all(c.impl != ROOFLINE_IMPL for c in g)),
              desc="relu2 sweep", unit="cell", file=sys.stderr, disable=not progress) as bar:
        for key, group in groups.items():
            ordered = sorted(group, key=lambda c: c.impl != ROOFLINE_IMPL)  # copy first
            if ordered[0].impl != ROOFLINE_IMPL:
                ordered.insert(0, ordered[0].with_impl(ROOFLINE_IMPL))
            for cell in ordered:
                bar.set_postfix_str(cell.describe(), refresh=False)
                measured[cell] = measure_cell(cell, modes, device, budget)
                bar.update()
            references[key] = measured[ordered[0]]
            _free_memory(device)
    return Sweep(device=device, modes=modes, results=[measured[c] for c in cells], references=references)


def group_cells(cells: Iterable[Cell]) -> dict[GroupKey, list[Cell]]:
    """Cells by input (dtype, shape), groups in order of first appearance, cells in order within each."""
    groups: dict[GroupKey, list[Cell]] = {}
    for cell in cells:
        groups.setdefault((cell.dtype, cell.shape), []).append(cell)
    return groups


def _check_modes(modes: Sequence[str]) -> tuple[str, ...]:
    modes = tuple(modes)
    unknown = set(modes) - set(MODES)
    if unknown:
        raise ValueError(f"unknown timing modes {sorted(unknown)}; known: {', '.join(MODES)}")
    return modes


# --- resumable sweeps ----------------------------------------------------------------------------

RowKey = tuple[str, str, int, str, str]  # impl, dtype, numel, shape, mode: one figure


def run_resumable(
    cells: Sequence[Cell],
    modes: Sequence[str],
    device: str | None,
    machine: str,
    commit: str,
    checkpoint: str | Path,
    progress: bool = False,
    *,
    budget: Budget | None = None,
    date: str | None = None,
) -> list[Row]:
    """``run_cells``, one input at a time, checkpointing the rows so far to ``checkpoint`` after each.

    Each (dtype, shape) group is measured by ``run_sweep`` on its own (``copy`` first, so its
    roofline fractions come from one run) and ``checkpoint`` is then rewritten atomically with
    every row so far.  When ``checkpoint`` already holds rows of this machine, commit and modes,
    the groups whose figures it holds in full are taken from it instead of being measured again;
    a checkpoint from another machine, commit or set of modes, or one that cannot be read, is
    ignored with a warning and overwritten.  Rows come back in the order of ``cells``, one per
    cell and mode, as from ``run_cells``.  The caller removes ``checkpoint`` once it has the rows.
    """
    modes = _check_modes(modes)
    device = device or default_device()
    date = date or datetime.now(timezone.utc).isoformat(timespec="seconds")
    checkpoint = Path(checkpoint)
    cells = list(dict.fromkeys(cells))  # distinct, in order
    groups = group_cells(cells)

    done = _resume_from(checkpoint, groups, modes, machine, commit)
    if done:
        print(f"resuming: {len(done)} of {len(groups)} groups already measured in {checkpoint}", file=sys.stderr)
    rows: dict[GroupKey, list[Row]] = dict(done)
    with tqdm(total=len(cells), desc="relu2 sweep", unit="cell", file=sys.stderr, disable=not progress) as bar:
        bar.update(sum(len(groups[key]) for key in done))
        for key, group in groups.items():
            if key in done:
                continue
            bar.set_postfix_str(f"{key[0]} {'x'.join(map(str, key[1]))}", refresh=False)
            sweep = run_sweep(group, modes, device, progress=False, budget=budget)
            rows[key] = sweep.rows(machine, commit, date)
            write_csv(_in_cell_order(cells, rows), checkpoint)  # atomic: a kill here keeps the last one
            bar.update(len(group))
    return _in_cell_order(cells, rows)


def _resume_from(
    checkpoint: Path, groups: dict[GroupKey, list[Cell]], modes: tuple[str, ...], machine: str, commit: str,
) -> dict[GroupKey, list[Row]]:
    """The rows of each group that ``checkpoint`` holds in full, in cell order; {} when none can be reused."""
    if not checkpoint.exists():
        return {}
    try:
        saved = read_csv(checkpoint)
    except (OSError, ValueError) as e:
        # The checkpoint is only a cache of figures this command can measure again, so an
        # unreadable one costs time, never data: warn and start over rather than make the user
        # delete it by hand before the sweep can run at all.
        print(f"warning: ignoring unreadable checkpoint {checkpoint} and starting over: {e}", file=sys.stderr)
        return {}
    origin = {(r.machine, r.commit) for r in saved}
    if origin and origin != {(machine, commit)}:
        found = ", ".join(f"machine {m!r} commit {c[:12]!r}" for m, c in sorted(origin))
        print(f"warning: ignoring checkpoint {checkpoint} from {found} (this run: machine {machine!r} "
              f"commit {commit[:12]!r}); starting over", file=sys.stderr)
        return {}
    saved_modes = {r.mode for r in saved}
    if saved_modes and saved_modes != set(modes):
        print(f"warning: ignoring checkpoint {checkpoint} timed in modes {','.join(sorted(saved_modes))} "
              f"(this run: {','.join(modes)}); starting over", file=sys.stderr)
        return {}

    by_key: dict[RowKey, Row] = {_row_key(r): r for r in saved}
    done: dict[GroupKey, list[Row]] = {}
    for key, group in groups.items():
        wanted = [_cell_key(cell, mode) for cell in group for mode in modes]
        if all(k in by_key for k in wanted):
            done[key] = [by_key[k] for k in wanted]
    return done


def _in_cell_order(cells: Sequence[Cell], rows: dict[GroupKey, list[Row]]) -> list[Row]:
    """The rows of the measured groups, ordered as ``cells`` (then by mode, as ``Sweep.rows``)."""
    ordered = []
    for cell in cells:
        ordered += [r for r in rows.get((cell.dtype, cell.shape), ()) if r.impl == cell.impl]
    return ordered


def _row_key(row: Row) -> RowKey:
    return (row.impl, row.dtype, row.numel, row.shape, row.mode)


def _cell_key(cell: Cell, mode: str) -> RowKey:
    return (cell.impl, cell.dtype, cell.numel, cell.shape_str, mode)


def measure_cell(cell: Cell, modes: Sequence[str], device: str, budget: Budget | None = None) -> CellResult:
    """Agreement first on fresh inputs, then each mode's timing; every failure becomes a recorded status."""
    try:
        impl = get(cell.impl)
    except KeyError as e:
        return _all_modes(cell, modes, "skipped", str(e.args[0]))
    if not impl.supports(device):
        return _all_modes(cell, modes, "skipped", impl.why_not(device))
    try:
        if impl.is_relu2:
            _check(impl, cell, device)  # a torch.compile'd implementation compiles here, untimed
        x = _input(cell, device)
    except AgreementError as e:
        return _all_modes(cell, modes, "failed", str(e))
    except torch.OutOfMemoryError as e:
        _free_memory(device)
        return _all_modes(cell, modes, "skipped", f"out of memory: {_first_line(e)}")
    except Exception as e:
        _free_memory(device)
        return _all_modes(cell, modes, "failed", f"agreement check raised {_describe(e)}")

    result = CellResult(cell, "ok")
    for mode in modes:
        result.outcomes[mode] = _time_mode(impl, x, mode, budget, device)
    try:
        result.peak_bytes = peak_memory_bytes(impl.fn, x)
    except Exception:  # only a side figure for asv; the timings stand without it
        result.peak_bytes = None
    del x
    _free_memory(device, collect=False)
    return result


def _check(impl: Implementation, cell: Cell, device: str) -> None:
    x = _input(cell, device)
    check_agreement(impl, x)


def _input(cell: Cell, device: str) -> torch.Tensor:
    return random_input(cell.numel, dtype_of(cell.dtype), device).view(cell.shape)


def _time_mode(impl: Implementation, x: torch.Tensor, mode: str, budget: Budget | None, device: str) -> Outcome:
    try:
        return Outcome("ok", timing=time_fn(impl.fn, x, mode, budget))
    except torch.OutOfMemoryError as e:
        _free_memory(device)
        return Outcome("skipped", f"out of memory while timing {mode}: {_first_line(e)}")
    except Exception as e:
        _free_memory(device)
        return Outcome("failed", f"timing {mode} raised {_describe(e)}")


def _all_modes(cell: Cell, modes: Sequence[str], status: str, reason: str) -> CellResult:
    return CellResult(cell, status, reason, {mode: Outcome(status, reason) for mode in modes})


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {_first_line(e)}"


def _free_memory(device: str, collect: bool = True) -> None:
    """Return cached GPU memory between cells, so one cell's buffers never crowd out the next."""
    if collect:
        gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
