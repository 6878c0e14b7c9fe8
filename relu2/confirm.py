"""``relu2 confirm``: measure flagged cells again, base and head, in fresh interleaved processes.

A gate that fails on one measurement of each side fails every so often on noise: a box's clocks, a
first replay, an L2 that happened to be warm.  Before a pull request is failed, the cells the gate
flagged are measured again on the same box: for each of ``rounds`` rounds, a fresh process measures
them with the base commit's implementations, another with the head's (the order alternating, so
neither side always runs first on a warm or a cold box).  Each round's median is one sample of the
between-process spread the noise model is about; ``relu2 gate --confirmed FILE`` fails only on the
cells that are slower again.

How a side is built: a git worktree of the commit, its package installed (no dependencies, no
network) into a folder of its own, so its implementations are found through interface 1 as asv
would find them; the instrument is this one, copied once (``relu2.asv_run.instrument``) and put
first on ``sys.path`` of every process, so both sides are measured with the same ruler.

Output (``--out``, JSON): relu2.verdict's ``Remeasurement`` contract, ``{"base": sha, "head": sha,
"machine": str, "device": str, "rounds": int, "cells": [{"benchmark", "params", "base_rounds": [seconds per
round], "head_rounds": [...], "impl", "dtype", "shape", "mode", "base_status", "head_status"}]}``;
``benchmark`` and ``params`` are the gate report's (empty for a cell named with ``--cell``).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from relu2.schema import MODE_NAMES, OK, Cell, format_shape, parse_shape
# relu2 gate --confirmed needs this many rounds a side to tell a step from the spread between them.
from relu2.verdict import MIN_ROUNDS as DEFAULT_ROUNDS



@dataclass(frozen=True)
class Target:
    """One figure to confirm: a cell in one timing mode (and, from a gate report, the benchmark and
    parameters it was flagged under)."""

    cell: Cell
    mode: str
    benchmark: str = ""
    params: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        return f"{self.cell.describe()} {self.mode}"


@dataclass
class Confirmed:
    """The rounds of one target: each side's median per round (seconds); a round that failed is absent."""

    impl: str
    dtype: str
    shape: str
    mode: str
    benchmark: str = ""
    params: dict[str, str] = field(default_factory=dict)
    base_rounds: list[float] = field(default_factory=list)
    head_rounds: list[float] = field(default_factory=list)
    base_status: str = OK
    head_status: str = OK

    @property
    def ratio(self) -> float:
        """head / base of the medians over rounds (NaN when a side has none)."""
        if not self.base_rounds or not self.head_rounds:
            return float("nan")
        return statistics.median(self.head_rounds) / statistics.median(self.base_rounds)


def parse_target(text: str) -> Target:
    """``IMPL:DTYPE:SHAPE:MODE`` ("fused:bfloat16:4096x4096:hot") -> a Target; ValueError otherwise."""
    parts = text.split(":")
    if len(parts) != 4:
        raise ValueError(f"not a cell: {text!r} (use IMPL:DTYPE:SHAPE:MODE, e.g. fused:bfloat16:4096x4096:hot)")
    impl, dtype, shape_text, mode = parts
    if mode not in MODE_NAMES:
        raise ValueError(f"not a timing mode: {mode!r} in {text!r} (modes: {', '.join(MODE_NAMES)})")
    shape = parse_shape(shape_text)
    import math

    return Target(Cell(impl, dtype, math.prod(shape), shape), mode)


def targets_from_gate(report: dict) -> list[Target]:
    """The flagged cells of ``relu2 gate --format json``'s report: its regressions, one target per
    measurement (a cell listed by several suites once)."""
    from relu2.asv_names import suite_dtype
    from relu2.schema import geometry

    out: dict[tuple, Target] = {}
    for change in report.get("regressions", []):
        mode, params = _cell_mode(change), change["params"]
        if mode is None:
            continue
        numel, shape = geometry(params)
        dtype = params.get("dtype") or suite_dtype(change["benchmark"].rsplit(".", 1)[0])
        cell = Cell(params["impl"], dtype, numel, parse_shape(shape))
        out.setdefault((cell, mode), Target(cell, mode, change["benchmark"], tuple(sorted(params.items()))))
    return list(out.values())


def not_cells_in_gate(report: dict) -> list[str]:
    """The flagged figures of a gate report that are not one cell in one timing mode (an
    ``Implementations`` summary, a mean over Grid cells): confirm cannot re-measure them, and the gate
    still fails on them (no evidence is not a pass)."""
    return list(dict.fromkeys(change["benchmark"].split(".", 1)[-1] for change in report.get("regressions", [])
                              if _cell_mode(change) is None))


def _cell_mode(change: dict) -> str | None:
    """The timing mode of a flagged change of a gate report that is one cell (None: it is not one)."""
    from relu2.asv_names import measure_of

    mode = measure_of(change["benchmark"], change.get("unit"))
    return mode if mode in MODE_NAMES and "impl" in change["params"] else None


# --- the sides ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """One commit, ready to measure: its installed package's folder."""

    name: str  # "base" or "head"
    commit: str
    site: Path


@contextlib.contextmanager
def sides(repo: Path, base: str, head: str, scratch: Path) -> Iterator[tuple[Side, Side]]:
    """A worktree of each commit with its package installed into a folder of its own; removed after."""
    trees: list[Path] = []
    try:
        built = []
        for name, commit in (("base", base), ("head", head)):
            tree = scratch / f"tree-{name}"
            _git(repo, "worktree", "add", "--detach", "-q", str(tree), commit)
            trees.append(tree)
            built.append(Side(name, commit, _install(tree, scratch / f"site-{name}", f"{name} ({commit[:8]})")))
        yield built[0], built[1]
    finally:
        for tree in trees:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)], capture_output=True)


def _install(tree: Path, site: Path, what: str) -> Path:
    """``tree``'s package (no dependencies, no network) into ``site``: its code and its entry points."""
    from relu2.machine import UsageError

    run = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                          "--no-build-isolation", "--target", str(site), str(tree)], capture_output=True, text=True)
    if run.returncode != 0:
        raise UsageError(f"{what} does not install: {(run.stderr.strip().splitlines() or ['?'])[-1]}")
    return site


def _git(repo: Path, *args: str) -> str:
    run = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if run.returncode != 0:
        from relu2.machine import UsageError

        raise UsageError(f"git {' '.join(args[:2])}: {run.stderr.strip().splitlines()[-1] if run.stderr.strip() else run.returncode}")
    return run.stdout.strip()


# --- one round of one side: a fresh process ---------------------------------------------------------


def measure_round(side: Side, instrument: Path, targets: Sequence[Target], device: str, measured: str,
                  timeout_s: float) -> dict[tuple, tuple[str, float]]:
    """Measure ``targets`` with ``side``'s implementations in a fresh process: (impl, dtype, shape, mode)
    -> (status, median seconds)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(instrument), str(side.site)]), RELU2_MEASURED=measured)
    request = json.dumps({"device": device, "cells": [[t.cell.impl, t.cell.dtype, list(t.cell.shape), t.mode]
                                                      for t in targets]})
    # cwd: `python -m` puts it first on sys.path, and a checkout there would shadow both the instrument
    # and the side's implementations; the side's folder holds neither at its top.
    def failed(reason: str) -> dict[tuple, tuple[str, float]]:
        return {(t.cell.impl, t.cell.dtype, t.cell.shape_str, t.mode): (reason, float("nan")) for t in targets}

    try:
        run = subprocess.run([sys.executable, "-m", "relu2.confirm", "--worker"], input=request, env=env,
                             capture_output=True, text=True, timeout=timeout_s, cwd=side.site.parent)
    except subprocess.TimeoutExpired:
        return failed(f"the round's process gave no answer in {timeout_s:g} s")
    if run.returncode != 0:
        return failed(f"the round's process failed: {(run.stderr.strip().splitlines() or [f'exit {run.returncode}'])[-1]}")
    try:
        answer = json.loads(run.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return failed("the round's process printed no answer")
    return {tuple(k.split("|")): (v[0], v[1]) for k, v in answer.items()}


def _worker() -> int:
    """The round's process: read the request on stdin, measure (each implementation isolated), print JSON."""
    import math

    from relu2 import sweep
    from relu2.timing import ROUND_BUDGET

    request = json.loads(sys.stdin.read())
    device = request["device"]
    wanted = [(impl, dtype, tuple(shape), mode) for impl, dtype, shape, mode in request["cells"]]
    cells = list(dict.fromkeys(Cell(i, d, math.prod(s), s) for i, d, s, _ in wanted))
    modes = sorted({m for *_, m in wanted}, key=MODE_NAMES.index)
    with sweep.measurer(cells, device) as measurer:  # a round, as the suites measure one
        done = sweep.run_sweep(cells, modes, device, budget=ROUND_BUDGET, measurer=measurer)
    by_cell = {r.cell: r for r in done.results}
    out = {}
    for impl, dtype, shape, mode in wanted:
        result = by_cell[Cell(impl, dtype, math.prod(shape), shape)]
        outcome = result.outcomes[mode]
        out["|".join((impl, dtype, format_shape(shape), mode))] = (outcome.status, outcome.median_s)
    print(json.dumps(out))
    return 0


# --- the whole confirmation -------------------------------------------------------------------------


def confirm(repo: Path, base: str, head: str, targets: Sequence[Target], rounds: int = DEFAULT_ROUNDS,
            device: str | None = None, measured: str = "relu2-bench", timeout_s: float = 600.0,
            progress: bool = True, machine: str = "") -> dict:
    """Measure ``targets`` ``rounds`` times on each side, interleaved; the report as plain data."""
    from relu2.asv_run import instrument
    from relu2.machine import default_device

    device = device or default_device()
    base_sha, head_sha = _git(repo, "rev-parse", base), _git(repo, "rev-parse", head)
    results = {(t.cell.impl, t.cell.dtype, t.cell.shape_str, t.mode):
               Confirmed(t.cell.impl, t.cell.dtype, t.cell.shape_str, t.mode, t.benchmark, dict(t.params))
               for t in targets}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="relu2-confirm-") as scratch, instrument() as copy, \
            sides(repo, base_sha, head_sha, Path(scratch)) as (b, h):
        for r in range(rounds):
            for side in ((b, h) if r % 2 == 0 else (h, b)):  # alternate who goes first
                got = measure_round(side, copy, targets, device, measured, timeout_s)
                for key, entry in results.items():
                    status, median = got.get(key, ("not measured", float("nan")))
                    if status == OK:
                        getattr(entry, f"{side.name}_rounds").append(median)
                    else:  # the reason stays; the other rounds' figures still count
                        setattr(entry, f"{side.name}_status", status)
                if progress:
                    print(f"relu2 confirm: round {r + 1}/{rounds} {side.name} ({side.commit[:8]}) done at "
                          f"{time.perf_counter() - started:.0f} s", file=sys.stderr)
    import socket

    return {"base": base_sha, "head": head_sha, "machine": machine or socket.gethostname(), "device": device,
            "rounds": rounds, "cells": [asdict(c) for c in results.values()]}


def format_confirmation(report: dict) -> str:
    """One line per target: the medians over rounds and their ratio."""
    from relu2.schema import format_seconds

    lines = [f"base {report['base'][:8]}  head {report['head'][:8]}  {report['rounds']} rounds on {report['device']}"]
    for c in report["cells"]:
        entry = Confirmed(**c)
        b = format_seconds(statistics.median(entry.base_rounds)) if entry.base_rounds else entry.base_status
        h = format_seconds(statistics.median(entry.head_rounds)) if entry.head_rounds else entry.head_status
        lines.append(f"  {entry.ratio:6.3f}x  {b:>10} -> {h:>10}  {entry.impl} {entry.dtype} {entry.shape} {entry.mode}")
    return "\n".join(lines)


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    sys.exit(_worker())
