"""Work counters: what each kernel of a cell did, counted by Nsight Compute (``ncu``).

Time moves between processes and boxes; the work a kernel does does not.  For one GPU model and one
software stack, the instructions a kernel executes, its global load and store instructions and its
launch (grid, block, registers) are the same to the last unit in every run: a cell whose counters
changed ran a different kernel, whatever its timings say, and one whose counters did not ran the
same one.  docs/methodology.md ("Work counters") says which counters were measured exact on the H200
and how; ``relu2.vocab.schema.COUNTERS`` marks them.

How a cell is counted.  One child process measures every cell asked for under ``ncu
--profile-from-start off``: each implementation is warmed up outside the profiled ranges (its
compile, its agreement check: what a timing is preceded by, ``relu2.measure.cell.prepare_and_check``),
then each launch of a cell runs in a profiled range of its own, opened by a marker kernel (torch's
``spin_kernel``, which no implementation launches): the kernels ncu lists between two markers are
that launch's.  Inputs are seeded, so every run counts the same values.

Without CUDA, or without ``ncu``, or where the driver refuses the counters, nothing is counted:
``unavailable()`` says why in one line, and everything else works as before.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping, Sequence

from relu2.host.files import atomic_write_text
from relu2.host.proc import ProcessFailed, run_child
from relu2.records.work import EXACT, METRICS, Counted, Work, parse_ncu_csv, split_launches
from relu2.vocab.schema import Cell

ENV_NCU = "RELU2_NCU"  # the ncu executable (default: ncu on PATH, then the CUDA toolkit's)


# --- where ncu is, and whether it can count here -----------------------------------------------------


def ncu_path() -> str | None:
    explicit = os.environ.get(ENV_NCU)
    if explicit:
        return explicit if shutil.which(explicit) else None
    found = shutil.which("ncu")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "ncu").exists():
            return str(Path(home) / "bin" / "ncu")
    return None


def unavailable(device: str) -> str:
    """Why counters cannot be measured here ("" when they can be tried)."""
    if device != "cuda":
        return f"not measured here: counters are read by Nsight Compute on CUDA, and this run is on {device}"
    if ncu_path() is None:
        return f"not measured here: no ncu (Nsight Compute) on PATH or in the CUDA toolkit (set ${ENV_NCU})"
    return ""


# --- measuring: the parent ------------------------------------------------------------------------------


def count(cells: Sequence[Cell], launches: int = 1, timeout_s: float = 1800.0, env: Mapping[str, str] | None = None,
          cwd: str | os.PathLike | None = None) -> Counted:
    """Count every cell's work in one child process under ncu (``env``, ``cwd``: a compare side's, whose
    implementations it counts); ProcessFailed (a RuntimeError) when ncu or its child delivered no
    counts that read: ncu refused or died, its CSV or the child's list did not read, or they disagree."""
    ncu = ncu_path()
    if ncu is None:
        raise ProcessFailed(unavailable("cuda"))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="relu2-counters-") as tmp:
        plan, done = Path(tmp) / "plan.json", Path(tmp) / "done.json"
        plan.write_text(json.dumps({"cells": [c.to_json() for c in cells], "launches": launches}))
        log = Path(tmp) / "ncu.csv"
        command = [ncu, "--profile-from-start", "off", "--clock-control", "none", "--target-processes", "application-only",
                   "--csv", "--page", "raw", "--print-units", "base", "--metrics", ",".join(METRICS),
                   "--log-file", str(log),
                   sys.executable, "-m", "relu2.measure.counters", str(plan), str(done)]
        ended = run_child(command, timeout_s=timeout_s, env=env, cwd=cwd)
        raw = log.read_text() if log.exists() else ""
        if '"ID",' not in raw:  # an ncu that prints its CSV to stdout despite --log-file
            raw = ended.stdout
        if not done.exists():  # the child lists each cell as it finishes it: here, none
            raise ProcessFailed(f"ncu {ended.why()}")
        try:
            ran = json.loads(done.read_text())["cells"]
            groups = split_launches(parse_ncu_csv(raw))
        except (ValueError, KeyError, TypeError) as e:  # NcuOutputError and a cut JSON are ValueErrors
            raise ProcessFailed(f"ncu's output did not read: {e}") from None
    if not ended.ok:  # the cells it finished keep their counts; the one it died in left launches behind
        finished = sum(entry["markers"] for entry in ran)
        if len(groups) < finished:  # ncu itself failed (refused the counters, died): its own words
            raise ProcessFailed(f"ncu {ended.why()}")
        groups = groups[:finished]
    counted = attribute(ran, groups, raw_csv=raw, seconds=time.perf_counter() - start)
    for cell in cells:
        if cell not in counted.works and cell not in counted.failed:
            counted.failed[cell] = (f"not counted: the counting process {ended.why()}" if not ended.ok else
                                    "not reached: a CUDA error in an earlier cell ended the counting process")
    return counted


def attribute(ran: Sequence[dict], groups: Sequence[Work], raw_csv: str = "", seconds: float = 0.0) -> Counted:
    """Give each cell the profiled launches the child made for it, in order: ``ran`` is the child's
    list, one entry a cell with the markers it launched and, where it failed, why.  A failed cell's
    groups (a launch cut short) are dropped, so the cells after it keep their own."""
    expected = sum(entry["markers"] for entry in ran)
    if len(groups) != expected:
        raise ProcessFailed(f"ncu listed {len(groups)} profiled launches, the child made {expected}")
    counted = Counted(raw_csv=raw_csv, seconds=seconds)
    it = iter(groups)
    for entry in ran:
        cell = Cell.from_json(entry["cell"])
        works = [next(it) for _ in range(entry["markers"])]
        if entry.get("reason") is not None:
            counted.failed[cell] = entry["reason"]
        else:
            counted.works[cell] = works
    return counted


def figures(cells: Sequence[Cell], device: str) -> tuple[dict[Cell, dict[str, float]], str]:
    """The exact counters of every cell (``schema.CELL_FIGURES``: a call's totals), counted in one
    ncu process, and why some or all were not ("" when every one was): no CUDA, no ncu, ncu refused,
    a cell that failed under it."""
    why = unavailable(device)
    if not why:
        try:
            counted = count(cells)
        except RuntimeError as e:
            why = f"not counted: {e}"
        else:
            found = {cell: {name: w.total(name) for name in EXACT} for cell, w in
                     ((c, counted.work(c)) for c in counted.works) if w is not None}
            if not counted.failed:
                return found, ""
            first = next(iter(counted.failed.values())).splitlines()[0]
            return found, f"work counters: {len(counted.failed)} of {len(cells)} cells not counted (first: {first})"
    return {}, f"work counters: {why}"


# --- measuring: the child, under ncu --------------------------------------------------------------------

SEED = 20261203


def _child(plan_path: str, done_path: str) -> int:
    plan = json.loads(Path(plan_path).read_text())
    ran: list[dict] = []  # every cell finished, in order: the markers it launched, and why it failed
    atomic_write_text(done_path, json.dumps({"cells": ran}))
    for data in plan["cells"]:
        entry = {"cell": data, "markers": 0, "reason": None}
        go_on = _count_cell(Cell.from_json(data), int(plan["launches"]), entry)
        ran.append(entry)
        atomic_write_text(done_path, json.dumps({"cells": ran}))  # a child that dies later keeps these
        if not go_on:
            break
    return 0


def _count_cell(cell: Cell, launches: int, entry: dict) -> bool:
    """Launch ``cell`` ``launches`` times, each in a profiled range opened by a marker; its markers and
    any failure go into ``entry``.  False when the process cannot go on (a sticky CUDA error)."""
    import torch

    from relu2.measure.agreement import AgreementError
    from relu2.measure.cell import free_memory, prepare_and_check
    from relu2.measure.inputs import dtype_of, random_input
    from relu2.measure.outcome import describe
    from relu2.measure.registry import get

    try:
        impl = get(cell.impl)
        why = impl.reason if impl.broken else impl.why_not("cuda")
        if why:
            entry["reason"] = why
            return True
        prepare_and_check(impl, cell, "cuda")  # the warm-up a timing gets: compiles, agreement
        generator = torch.Generator(device="cuda").manual_seed(SEED)
        x = random_input(cell.numel, dtype_of(cell.dtype), "cuda", generator=generator).view(cell.shape)
        impl.fn(x.clone() if impl.writes_input else x)  # this very input met once, untimed
        for _ in range(launches):
            arg = x.clone() if impl.writes_input else x
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            try:  # a launch that raises must not leave the range open over the next cell's warm-up
                torch.cuda._sleep(1)
                entry["markers"] += 1
                impl.fn(arg)
                torch.cuda.synchronize()
            finally:
                torch.cuda.profiler.stop()
    except AgreementError as e:
        entry["reason"] = str(e)
    except Exception as e:  # noqa: BLE001  one cell's failure is recorded, the others are counted
        entry["reason"] = describe(e)
    x = arg = None  # noqa: F841  a failed launch's tensors must not sit through the next cell's warm-up
    try:
        free_memory("cuda", collect=False)
    except Exception as e:  # noqa: BLE001  a sticky CUDA error: the cells after this one cannot run
        entry["reason"] = entry["reason"] or describe(e)
        return False
    return True


def format_table(counted: Counted) -> str:
    """One line a cell: the launches' kernels and the exact counters of its first launch."""
    lines = [f"{'cell':<40}{'kernels':>8}{'instructions':>16}{'global ld':>12}{'global st':>12}{'DRAM read':>14}"
             f"  {'same each launch'}"]
    for cell, works in counted.works.items():
        w = works[0]
        same = all(x.same_as(w) for x in works[1:])
        lines.append(f"{cell.describe():<40}{len(w.kernels):>8}{w.total('instructions'):>16,.0f}"
                     f"{w.total('global_loads'):>12,.0f}{w.total('global_stores'):>12,.0f}"
                     f"{w.total('dram_read_bytes'):>14,.0f}  {'yes' if same else 'NO'}")
    for cell, reason in counted.failed.items():
        lines.append(f"{cell.describe():<40} not counted: {reason.splitlines()[0] if reason else ''}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(_child(*sys.argv[1:3]))
