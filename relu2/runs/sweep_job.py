"""One ``relu2 sweep`` into one folder: the plan of cells, the lock, the measurer, Ctrl-C, the CSV and plots.

``relu2.measure.sweep`` is the grid engine (check then time each cell, checkpointed input by input); this
module is the job around it that the command line asks for.  Input is refused (UsageError) before
anything is written: an implementation named that cannot run here, a bad ``$RELU2_TIMEOUT``, an
input too large for the device.  A finished, failed or interrupted job leaves no lock file.

Exit codes as the command line's: 0 every figure ok, 1 a figure failed, 130 interrupted (every
process of the sweep ended, ``relu2.host.lifecycle``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from relu2.host import busy as quiet
from relu2.host import git, lifecycle
from relu2.host.files import is_cut_short
from relu2.measure import figures, sweep
from relu2.records.rows import write_csv
from relu2.show.table import format_table
from relu2.vocab import schema
from relu2.vocab.errors import UsageError
from relu2.vocab.schema import Cell

if TYPE_CHECKING:
    from relu2.measure.sweep import Measurer

# The checkout's folders whose code a sweep runs (the instrument, the implementations, the kernel
# sources): a row's commit names their state (relu2.host.git.state), so an edited kernel is never filed
# under its commit, and a sweep resumed after an edit starts over instead of merging two kernels' rows.
MEASURED_PATHS = ("relu2", "relu2_impls", "csrc")
# relu2_impls.fused builds its kernel from this folder when it is set (the lab's planted kernels); its
# name is that module's (ENV_CSRC_DIR there: the implementations import nothing of the instrument).
ENV_CSRC_DIR = "RELU2_CSRC_DIR"


def measured_state(root: Path | None = None) -> str:
    """The commit a sweep records: the state of the checkout this package runs from (``root``): HEAD's
    hash, ``+dirty-<digest>`` where MEASURED_PATHS differ from it, and ``+csrc-<digest>`` of the kernel
    sources $RELU2_CSRC_DIR names instead of the checkout's."""
    state = git.state(root or Path(__file__).resolve().parents[2], MEASURED_PATHS)
    src = os.environ.get(ENV_CSRC_DIR, "").strip()
    if src:
        names = [str(p.relative_to(src)) for p in Path(src).rglob("*") if p.is_file()]
        state += f"+csrc-{git.files_digest(Path(src), names)}"
    return state


@dataclass(frozen=True)
class Plan:
    """What a sweep measures and how: every field comes from the command line."""

    device: str
    cells: tuple[Cell, ...]
    modes: tuple[str, ...]
    named: tuple[str, ...]  # implementations asked for by name: absent here is unusable input
    out: Path
    machine: str
    samples: int
    sample_ms: float
    timeout_s: float
    isolate: bool = True
    progress: bool = True
    require_idle: bool = False  # refuse to measure on a machine that is not quiet (relu2.host.busy)


def implementations(asked: Sequence[str] | None, known: Sequence[str], default: Sequence[str] | None = None
                    ) -> list[str]:
    """The implementations to sweep (``default``, else every ``known`` one, when none are asked for),
    roofline last; UsageError naming an unknown one."""
    names = list(asked or (known if default is None else default))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"unknown implementation(s): {', '.join(unknown)}; known: {', '.join(known)}")
    if schema.ROOFLINE not in names:
        names.append(schema.ROOFLINE)  # the roofline every figure is compared with
    return names


def plan_cells(names: Sequence[str], dtypes: Sequence[str], sizes: Sequence[int], *, grid: bool = True,
               model_shapes: bool = False, vllm_shapes: bool = False, nemotron: bool = False) -> list[Cell]:
    """The grid (unless ``grid`` is False) plus the model-shape sets asked for; UsageError when empty."""
    cells = schema.grid_cells(names, dtypes, sizes) if grid else []
    if model_shapes:
        cells += schema.model_cells(names)
    if vllm_shapes:  # vLLM's own benchmark grid, in the dtypes asked for
        cells += schema.model_cells(names, schema.VLLM_TOKENS, schema.VLLM_HIDDEN, dtypes)
    if nemotron:
        cells += schema.model_cells(names, schema.NEMOTRON_TOKENS, schema.NEMOTRON_WIDTHS, (schema.NEMOTRON_DTYPE,))
    if not cells:
        raise UsageError("no cells: --no-grid needs --model-shapes, --vllm-shapes or --nemotron")
    return cells


def run(plan: Plan) -> int:
    """Measure ``plan`` into ``plan.out``: CSV, table and plots; 0, or 1 (a figure failed).  Interrupted,
    it ends the sweep's processes, says what it kept and raises ``relu2.host.lifecycle.Interrupted`` (130)."""
    from relu2.measure.timing import Budget

    sweep.check_fits(plan.cells, plan.device)  # UsageError before anything runs
    budget = Budget(samples=plan.samples, sample_ms=plan.sample_ms)
    quiet.before_measuring("relu2 sweep", plan.require_idle, gpu=plan.device == "cuda")  # UsageError: nothing written
    # Rows are checkpointed input by input, so Ctrl-C (or a kill) loses at most the input being
    # measured, and the same command run again measures only what is missing.
    partial = plan.out / PARTIAL

    def saved() -> str:
        kept = f"the inputs measured so far are kept in {partial}" if partial.exists() else "nothing was measured yet"
        return f"{kept}; run the same command again (same --out, machine and code: an edit to relu2/, relu2_impls/ or csrc/ starts over) to resume from there"

    with lifecycle.guard("relu2 sweep", saved):
        with sweep.measurer(plan.cells, plan.device, isolate=plan.isolate, timeout_s=plan.timeout_s,
                            progress=plan.progress) as measurer:
            refuse_absent(measurer, plan.named, plan.device)  # before the folder or its lock exists
            with sweep.locked(plan.out, "relu2 sweep"):
                print(f"relu2 sweep: {len(plan.cells)} cells x {len(plan.modes)} modes on {plan.device}; "
                      f"writing {plan.out}/", file=sys.stderr)
                rows = sweep.run_resumable(plan.cells, plan.modes, plan.device, plan.machine, measured_state(),
                                           partial, progress=plan.progress, budget=budget, measurer=measurer)
                return finish(with_work(rows, plan.device), plan.out, partial)


def refuse_absent(measurer: "Measurer", named: Sequence[str], device: str) -> None:
    """UsageError when an implementation asked for by name cannot run here (a broken one runs and fails)."""
    ready = {n: measurer.ready(n) for n in named}
    absent = {n: r.why_not(device) for n, r in ready.items() if r is not None and not r.broken and r.why_not(device)}
    if absent:
        raise UsageError("cannot run here: " + "; ".join(f"{n}: {why.splitlines()[0]}" for n, why in absent.items()))


def with_work(rows: list, device: str) -> list:
    """The rows with each cell's figures measured once for the run, after the timings
    (relu2.measure.figures: the work counters, in one ncu process); where they cannot be, said once, and NaN."""
    cells = {(r.impl, r.dtype, r.numel, r.shape): Cell(r.impl, r.dtype, r.numel, schema.parse_shape(r.shape))
             for r in rows if r.status == schema.OK}
    work, _ = figures.measure(sorted(set(cells.values()), key=lambda c: c.name("hot")), device,
                              say=lambda line: print(f"relu2 sweep: {line}", file=sys.stderr))
    return [replace(r, **work[cells[key]]) if (key := (r.impl, r.dtype, r.numel, r.shape)) in cells
            and cells[key] in work else r for r in rows]


PARTIAL = "sweep.partial.csv"  # the checkpoint: its presence says a sweep stopped here


def resumable(folder: Path) -> bool:
    """Whether ``folder`` is one a stopped sweep left, which the same command resumes: its checkpoint
    (or only its lock: stopped before the first), with nothing beside it but what a sweep writes (the
    CSV and plots written before the checkpoint is dropped; a temporary file a kill cut short)."""
    names = [p.name for p in folder.iterdir()]
    begun = PARTIAL in names or all(n == sweep.LOCK or is_cut_short(n) for n in names)
    return begun and all(n in (PARTIAL, "sweep.csv", sweep.LOCK) or n.endswith((".png", ".svg")) or is_cut_short(n)
                         for n in names)


def finish(rows: list, out: Path, partial: Path) -> int:
    """Write the CSV, print the table, draw the plots (saying which were not drawn and why), then drop
    the checkpoint; 1 when a figure failed."""
    from relu2.show import plot

    write_csv(rows, out / "sweep.csv")
    print(format_table(rows))
    drawn = plot.plot_all(rows, out, repo=git.toplevel(out))
    # Removed only now: were the table or the plots interrupted, a re-run still resumes at once.
    partial.unlink(missing_ok=True)
    print(f"\nwrote {out / 'sweep.csv'} and {len(drawn)} plot files in {out}/")
    plot.say_missing(drawn, "relu2 sweep")
    failed = [r for r in rows if r.status == schema.FAILED]
    if failed:
        print(f"{len(failed)} figures FAILED (not timed): see the table above", file=sys.stderr)
    return 1 if failed else 0
