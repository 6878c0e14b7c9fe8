"""The grid engine behind ``relu2 sweep`` and the asv suites: check, then time, every cell of a grid.

A cell is one implementation on one input (dtype and shape).  For each cell the implementation is
first checked bitwise against the eager path on fresh inputs; only then is it timed.  A cell that
disagrees is recorded "failed" and never timed; one that cannot run here, or runs out of memory,
is recorded "skipped"; any other error fails that cell only and the sweep goes on.  The ``copy``
reference is timed for every (dtype, shape) first, so every figure gets the fraction of the copy
roofline measured in the same run and mode.

Cells are measured by a ``Measurer``: ``relu2 sweep`` and the asv suites use a worker process per
implementation (``sweep.measurer``, ``relu2.measure.isolation``), so a kernel that crashes or hangs costs only
its own cells; called without one, these functions measure in this process.

``run_resumable`` measures one input (dtype, shape) at a time and checkpoints the rows after each,
so an interrupted sweep loses at most the input it was on and a re-run picks up from there.
"""

from __future__ import annotations

import os
import socket
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Protocol, Sequence

from tqdm import tqdm

from relu2.host import busy
from relu2.host.machine import default_device, device_memory_bytes
from relu2.measure.isolation import DEFAULT_TIMEOUT_S, Ready, WorkerPool
from relu2.records.rows import Row, flag_outliers, make_row, read_csv, write_csv
from relu2.vocab.errors import UsageError
from relu2.vocab.schema import MODE_NAMES, ROOFLINE, Cell, check_modes, format_bytes, itemsize

if TYPE_CHECKING:
    from relu2.measure.outcome import CellResult
    from relu2.measure.timing import Budget

GroupKey = tuple[str, tuple[int, ...]]  # (dtype, shape): one input, measured in one go with its copy


class Measurer(Protocol):
    """What measures a cell: a worker per implementation (``relu2.measure.isolation.WorkerPool``) or this process."""

    def measure(self, cell: Cell, modes: Sequence[str], device: str, budget: "Budget | None") -> "CellResult": ...

    def ready(self, name: str) -> "Ready | None": ...


class InProcess:
    """Every cell measured in this process: no isolation (a crashing kernel ends the run); for debugging."""

    def measure(self, cell: Cell, modes: Sequence[str], device: str, budget: "Budget | None") -> "CellResult":
        from relu2.measure.cell import measure_cell

        return measure_cell(cell, modes, device, budget)

    def ready(self, name: str) -> "Ready | None":
        from relu2.measure.registry import get

        impl = get(name)
        return Ready(impl.available, impl.broken, impl.reason, impl.devices)


@contextmanager
def measurer(cells: Iterable[Cell], device: str, isolate: bool = True, timeout_s: float | None = None,
             progress: bool = False, cache_root: str | Path | None = None) -> Iterator[Measurer]:
    """A worker per implementation of ``cells`` (and the roofline), started and ready; or this process.
    ``cache_root``: where the workers keep their compiler caches (``relu2.measure.isolation.WorkerPool``)."""
    if not isolate:
        yield InProcess()
        return

    names = list(dict.fromkeys([ROOFLINE] + [c.impl for c in cells]))
    if progress:
        print(f"relu2 sweep: starting {len(names)} worker processes, one per implementation "
              f"({', '.join(names)})", file=sys.stderr)
    with WorkerPool(names, device, timeout_s or DEFAULT_TIMEOUT_S, cache_root=cache_root) as pool:
        yield pool


@dataclass
class Sweep:
    """The results of ``run_sweep``, in the order the cells were given, and the copy references."""

    device: str
    modes: tuple[str, ...]
    results: list["CellResult"]
    references: dict[GroupKey, "CellResult"]  # (dtype, shape) -> the copy cell

    def rows(self, machine: str = "", commit: str = "", date: str | None = None) -> list[Row]:
        """One tidy Row per cell and mode."""
        date = date or now_iso()
        rows = []
        for result in self.results:
            cell = result.cell
            reference = self.references.get(cell.input_key)
            for mode in self.modes:
                outcome = result.outcomes[mode]
                timing = outcome.timing
                rows.append(make_row(
                    machine=machine, commit=commit, date=date, impl=cell.impl, dtype=cell.dtype,
                    numel=cell.numel, shape=cell.shape_str, mode=mode, status=outcome.status, reason=outcome.reason,
                    median_s=outcome.median_s,
                    q25_s=timing.q25_s if timing else float("nan"),
                    q75_s=timing.q75_s if timing else float("nan"),
                    copy_median_s=reference.median(mode) if reference else float("nan"),
                    peak_bytes=float(result.peak_bytes) if result.peak_bytes is not None else float("nan"),
                    kernel=result.kernel,
                ))
        return rows


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def run_cells(
    cells: Sequence[Cell],
    modes: Sequence[str] | None = None,
    device: str | None = None,
    machine: str = "",
    commit: str = "",
    progress: bool = False,
    *,
    budget: "Budget | None" = None,
    date: str | None = None,
    measurer: Measurer | None = None,
) -> list[Row]:
    """Check and time every cell (see ``run_sweep``) and return the tidy rows, one per cell and mode."""
    return run_sweep(cells, modes, device, progress, budget=budget, measurer=measurer).rows(machine, commit, date)


def run_sweep(
    cells: Sequence[Cell],
    modes: Sequence[str] | None = None,
    device: str | None = None,
    progress: bool = False,
    *,
    budget: "Budget | None" = None,
    measurer: Measurer | None = None,
) -> Sweep:
    """Check and time every distinct cell on ``device`` (default: cuda if available, else cpu).

    Cells are measured input by input; for each input the ``copy`` reference goes first.  Never
    raises for a cell: failures and skips are recorded with their reason.
    """
    modes = check_modes(MODE_NAMES if modes is None else modes)
    device = device or default_device()
    measurer = measurer or InProcess()
    cells = list(dict.fromkeys(cells))  # distinct, in order
    groups = group_cells(cells)

    measured: dict[Cell, CellResult] = {}
    references: dict[GroupKey, CellResult] = {}
    with tqdm(total=sum(len(with_reference(g)) for g in groups.values()), desc="relu2 sweep", unit="cell",
              file=sys.stderr, disable=not progress) as bar:
        for key, group in groups.items():
            ordered = with_reference(group)
            for cell in ordered:
                bar.set_postfix_str(cell.describe(), refresh=False)
                measured[cell] = measurer.measure(cell, modes, device, budget)
                bar.update()
            references[key] = measured[ordered[0]]
    return Sweep(device=device, modes=modes, results=[measured[c] for c in cells], references=references)


LOCK = ".relu2.lock"  # held by the sweep writing a folder


@contextmanager
def locked(out: Path, what: str) -> Iterator[None]:
    """Hold an exclusive lock on the folder ``out`` (creating it) for the block; no lock file outlives it.

    A second sweep into the same folder would interleave its checkpoint with this one's and spoil
    both sets of figures by contention: it gets a UsageError naming who holds the lock.
    """
    import fcntl

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create {out}: {e.strerror or e}") from None
    path = out / LOCK
    while True:
        f = open(path, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise UsageError(f"{out} is in use by {holder}; wait for it to finish or choose another --out") from None
        # The holder before us removes the file as it leaves: a lock taken on a removed file locks
        # nothing, so take it again on the file that is there now.
        try:
            if os.fstat(f.fileno()).st_ino == os.stat(path).st_ino:
                break
        except FileNotFoundError:
            pass
        f.close()
    try:
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()} ({what}) since {now_iso()}\n")
        f.flush()
        yield
    finally:
        path.unlink(missing_ok=True)  # removed while still held, so no one takes a lock on a dying file
        f.close()


def registered_names() -> list[str]:
    """The implementations a sweep can be asked for (built-ins, registrations, entry points), unresolved."""
    from relu2.measure.registry import names

    return names()


def default_names() -> list[str]:
    """The implementations a sweep that names none measures: all but the declared variants, unresolved."""
    from relu2.measure.registry import in_default_sweep

    return [name for name in registered_names() if in_default_sweep(name)]


# Tensors of a cell alive at once while it is checked: the input, its clone, the reference output,
# the implementation's output, plus a few masks of a byte an element.
_LIVE_COPIES = 4
_MASK_BYTES = 3


def check_fits(cells: Iterable[Cell], device: str) -> None:
    """UsageError naming the first input too large for ``device``'s memory, before anything runs."""
    largest = max(cells, key=lambda c: c.numel * itemsize(c.dtype), default=None)
    if largest is None:
        return
    need = largest.numel * (_LIVE_COPIES * itemsize(largest.dtype) + _MASK_BYTES)
    have = device_memory_bytes(device)
    if need > have:
        raise UsageError(f"{largest.dtype} {largest.shape_str} ({largest.numel} elements) needs about "
                         f"{format_bytes(need)} to check and time; the {device} has {format_bytes(have)}")


def with_reference(group: Sequence[Cell]) -> list[Cell]:
    """The cells of one input with the roofline's cell first (added when the group lacks it)."""
    ordered = sorted(group, key=lambda c: c.impl != ROOFLINE)
    if ordered[0].impl != ROOFLINE:
        ordered.insert(0, ordered[0].with_impl(ROOFLINE))
    return ordered


def group_cells(cells: Iterable[Cell]) -> dict[GroupKey, list[Cell]]:
    """Cells by input (dtype, shape), groups in order of first appearance, cells in order within each."""
    groups: dict[GroupKey, list[Cell]] = {}
    for cell in cells:
        groups.setdefault(cell.input_key, []).append(cell)
    return groups


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
    budget: "Budget | None" = None,
    date: str | None = None,
    measurer: Measurer | None = None,
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
    modes = check_modes(modes)
    device = device or default_device()
    date = date or now_iso()
    checkpoint = Path(checkpoint)
    cells = list(dict.fromkeys(cells))  # distinct, in order
    groups = group_cells(cells)

    done = _resume_from(checkpoint, groups, modes, machine, commit)
    if done:
        print(f"resuming: {len(done)} of {len(groups)} groups already measured in {checkpoint}", file=sys.stderr)
    rows: dict[GroupKey, list[Row]] = dict(done)
    watch = busy.Watch(gpu=device == "cuda")
    with tqdm(total=len(cells), desc="relu2 sweep", unit="cell", file=sys.stderr, disable=not progress) as bar:
        bar.update(sum(len(groups[key]) for key in done))
        for key, group in groups.items():
            if key in done:
                continue
            watch.check()
            bar.set_postfix_str(f"{key[0]} {'x'.join(map(str, key[1]))}", refresh=False)
            sweep = run_sweep(group, modes, device, progress=False, budget=budget, measurer=measurer)
            rows[key] = sweep.rows(machine, commit, date)
            write_csv(_in_cell_order(cells, rows), checkpoint)  # atomic: a kill here keeps the last one
            bar.update(len(group))
    # Judged once every size is in: a checkpoint's flags saw only the inputs measured by then.
    return flag_outliers(_in_cell_order(cells, rows))


def _resume_from(
    checkpoint: Path, groups: dict[GroupKey, list[Cell]], modes: tuple[str, ...], machine: str, commit: str,
) -> dict[GroupKey, list[Row]]:
    """The rows of each group that ``checkpoint`` holds in full, in cell order; {} when none can be reused."""
    if not checkpoint.exists():
        return {}
    try:
        saved = read_csv(checkpoint, complete_lines_only=True)
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


def cost_table(results: Iterable["CellResult"]) -> str:
    """Where a measurement's time went: seconds by implementation and phase (``CellResult.seconds``),
    with totals; each distinct cell once."""
    by_impl: dict[str, dict[str, float]] = {}
    seen: set[Cell] = set()
    for result in results:
        if result.cell in seen:
            continue
        seen.add(result.cell)
        row = by_impl.setdefault(result.cell.impl, {})
        for phase, s in result.seconds.items():
            row[phase] = row.get(phase, 0.0) + s
    phases = sorted({p for row in by_impl.values() for p in row})
    lines = ["relu2: seconds by implementation and phase", "  " + "impl".ljust(22) +
             "".join(p.rjust(12) for p in [*phases, "total"])]
    totals = {p: 0.0 for p in phases}
    for impl, row in sorted(by_impl.items()):
        lines.append("  " + impl.ljust(22) + "".join(f"{row.get(p, 0.0):12.1f}" for p in phases) +
                     f"{sum(row.values()):12.1f}")
        for p in phases:
            totals[p] += row.get(p, 0.0)
    lines.append("  " + "all".ljust(22) + "".join(f"{totals[p]:12.1f}" for p in phases) +
                 f"{sum(totals.values()):12.1f}")
    return "\n".join(lines)
