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

from relu2.host.proc import run_child
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
    implementations it counts); RuntimeError when ncu itself fails."""
    ncu = ncu_path()
    if ncu is None:
        raise RuntimeError(unavailable("cuda"))
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
        if not ended.ok or not done.exists():
            raise RuntimeError(f"ncu {ended.why()}")
        ran = json.loads(done.read_text())
    return attribute(ran["cells"], split_launches(parse_ncu_csv(raw)), raw_csv=raw,
                     seconds=time.perf_counter() - start)


def attribute(ran: Sequence[dict], groups: Sequence[Work], raw_csv: str = "", seconds: float = 0.0) -> Counted:
    """Give each cell the profiled launches the child made for it, in order: ``ran`` is the child's
    list, one entry a cell with the markers it launched and, where it failed, why.  A failed cell's
    groups (a launch cut short) are dropped, so the cells after it keep their own."""
    expected = sum(entry["markers"] for entry in ran)
    if len(groups) != expected:
        raise RuntimeError(f"ncu listed {len(groups)} profiled launches, the child made {expected}")
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
    ncu process, and why none were ("" when they were): no CUDA, no ncu, ncu refused."""
    why = unavailable(device)
    if not why:
        try:
            counted = count(cells)
        except RuntimeError as e:
            why = f"not counted: {e}"
        else:
            return ({cell: {name: w.total(name) for name in EXACT} for cell, w in
                     ((c, counted.work(c)) for c in counted.works) if w is not None}, "")
    return {}, f"work counters: {why}"


# --- measuring: the child, under ncu --------------------------------------------------------------------

SEED = 20261203


def _child(plan_path: str, done_path: str) -> int:
    import torch

    from relu2.measure.agreement import AgreementError
    from relu2.measure.cell import free_memory, prepare_and_check
    from relu2.measure.outcome import describe
    from relu2.measure.inputs import dtype_of, random_input
    from relu2.measure.registry import get

    plan = json.loads(Path(plan_path).read_text())
    launches = int(plan["launches"])
    ran: list[dict] = []  # every cell in order: the markers it launched, and why it failed
    for data in plan["cells"]:
        cell = Cell.from_json(data)
        entry = {"cell": data, "markers": 0, "reason": None}
        ran.append(entry)
        try:
            impl = get(cell.impl)
            why = impl.reason if impl.broken else impl.why_not("cuda")
            if why:
                entry["reason"] = why
                continue
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
            del x
        except AgreementError as e:
            entry["reason"] = str(e)
        except Exception as e:  # noqa: BLE001  one cell's failure is recorded, the others are counted
            entry["reason"] = describe(e)
        free_memory("cuda", collect=False)
    Path(done_path).write_text(json.dumps({"cells": ran}))
    return 0


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
