"""Whether the machine is quiet before a measurement starts: no other process on the GPU, no CPU load.

Figures taken beside other work are that work's figures too: another process's kernels share the
GPU's SMs and memory bandwidth, and another process's CPU use delays launches (every figure on a CPU
box).  Before measuring, ``check`` looks at both:

* the GPU: the compute processes ``nvidia-smi --query-compute-apps`` lists that are not this run's
  (in a container nvidia-smi may not see other containers' processes: silence proves little);
* the CPU: each other process's CPU time over a short window, from ``/proc/PID/stat`` (Linux).

The commands say so in one line, ``relu2 asv run`` records it in the machine's metadata of that run
(asv's machine.json: ``quiet`` "yes", "no" or "unknown", and ``busy``, what was busy), and
``--require-idle`` refuses to start (exit 2, nothing written) on a machine that is not quiet.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from relu2.host.proc import descendants, has_proc, process_table
from relu2.vocab.errors import UsageError

QUIET_CORES = 0.5  # other processes together using this much of one core over the window move the figures
LISTED_CORES = 0.05  # a process using less than this is not named
WINDOW_S = 1.0
NVIDIA_SMI = ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"]
_SHOWN = 3  # the busiest processes named in the line


@dataclass(frozen=True)
class GpuApp:
    """A compute process on a GPU, as nvidia-smi lists it."""

    pid: int
    name: str
    used_mib: float | None  # None: "[N/A]" (some drivers, some containers)

    def describe(self) -> str:
        memory = "" if self.used_mib is None else f", {self.used_mib:.0f} MiB"
        return f"pid {self.pid} {Path(self.name).name}{memory}"


@dataclass(frozen=True)
class Busy:
    """A process using the CPU over the window."""

    pid: int
    name: str
    cores: float  # CPU seconds per second of the window

    def describe(self) -> str:
        return f"pid {self.pid} {self.name} {self.cores:.0%} of a core"


@dataclass
class Quiet:
    """What ``check`` saw: other GPU compute processes, other processes' CPU use."""

    gpu: list[GpuApp] | None = None  # None: not looked at (no nvidia-smi, or not asked)
    cpu: list[Busy] | None = None  # None: no /proc here
    cpu_cores: float = 0.0  # every other process's CPU use, together
    window_s: float = WINDOW_S
    own: set[int] = field(default_factory=set)

    @property
    def quiet(self) -> bool | None:
        """True quiet, False not, None when neither the GPU nor the CPU could be looked at."""
        if self.gpu is None and self.cpu is None:
            return None
        return not self.gpu and self.cpu_cores < QUIET_CORES

    def busy(self) -> str:
        """What was busy, in one phrase ("" when nothing)."""
        parts = []
        if self.gpu:
            parts.append(f"{len(self.gpu)} other process{'es' if len(self.gpu) > 1 else ''} on the GPU ("
                         + "; ".join(a.describe() for a in self.gpu[:_SHOWN]) + ")")
        if self.cpu is not None and self.cpu_cores >= QUIET_CORES:
            top = sorted(self.cpu, key=lambda b: -b.cores)[:_SHOWN]
            parts.append(f"other processes used {self.cpu_cores:.1f} cores of the CPU over {self.window_s:g} s ("
                         + "; ".join(b.describe() for b in top) + ")")
        return "; ".join(parts)

    def machine_keys(self) -> dict[str, str]:
        """The keys recorded in asv's machine.json for the run (strings, as asv's are)."""
        state = {True: "yes", False: "no", None: "unknown"}[self.quiet]
        return {"quiet": state, "busy": self.busy()[:200] or "none"}


def parse_compute_apps(text: str) -> list[GpuApp]:
    """nvidia-smi's ``--query-compute-apps=pid,process_name,used_memory --format=csv,noheader`` output
    (with or without ``,nounits``) as GpuApps; lines that are not one are left out."""
    apps = []
    for line in text.splitlines():
        pid, _, rest = line.partition(",")
        name, _, memory = rest.rpartition(",")
        if not pid.strip().isdigit() or not name.strip():
            continue
        number = memory.strip().removesuffix("MiB").strip()
        try:
            used = float(number)
        except ValueError:
            used = None
        apps.append(GpuApp(int(pid), name.strip(), used))
    return apps


def gpu_apps() -> list[GpuApp] | None:
    """The compute processes on this machine's GPUs; None without nvidia-smi (or when it fails)."""
    try:
        out = subprocess.run(NVIDIA_SMI, capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_compute_apps(out)


def cpu_times() -> dict[int, tuple[str, int]] | None:
    """pid -> (name, user + system clock ticks so far) of every process; None without /proc."""
    if not has_proc():
        return None
    return {p.pid: (p.name, p.ticks) for p in process_table().values()}


def busy_between(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]], seconds: float,
                 hz: float, own: Iterable[int] = ()) -> list[Busy]:
    """Each process's CPU use between two ``cpu_times`` samples ``seconds`` apart, ours (``own``) left
    out, in cores; those below ``LISTED_CORES`` left out."""
    mine = set(own)
    found = []
    for pid, (name, ticks) in after.items():
        if pid in mine or pid not in before or before[pid][0] != name:
            continue  # started in the window (or its pid reused): its share of the window is unknown
        cores = (ticks - before[pid][1]) / hz / seconds
        if cores >= LISTED_CORES:
            found.append(Busy(pid, name, cores))
    return sorted(found, key=lambda b: -b.cores)


def check(gpu: bool = True, window_s: float = WINDOW_S, own: Iterable[int] = ()) -> Quiet:
    """Look at the machine before measuring: GPU compute processes (when ``gpu``) and other
    processes' CPU use over ``window_s``; this process and ``own`` are ours (it runs before the
    run starts anything that could be busy)."""
    mine = {os.getpid(), *own}
    before = cpu_times()
    started = time.monotonic()
    apps = gpu_apps() if gpu else None
    time.sleep(max(0.0, window_s - (time.monotonic() - started)))
    after = cpu_times()
    elapsed = time.monotonic() - started
    result = Quiet(window_s=window_s, own=mine)
    if apps is not None:
        result.gpu = [a for a in apps if a.pid not in mine]
    if before is not None and after is not None:
        result.cpu = busy_between(before, after, elapsed, os.sysconf("SC_CLK_TCK"), mine)
        result.cpu_cores = sum(b.cores for b in result.cpu)
    return result


def before_measuring(command: str, require_idle: bool, gpu: bool = True) -> Quiet:
    """``check``, said in one line on stderr when the machine is not quiet; UsageError (exit 2, before
    anything is written) under ``--require-idle``."""
    seen = check(gpu=gpu)
    if seen.quiet is False:
        if require_idle:
            raise UsageError(f"the machine is not quiet ({seen.busy()}): --require-idle refuses to measure")
        print(f"{command}: warning: the machine is not quiet: {seen.busy()}; the figures may move", file=sys.stderr)
    elif seen.quiet is None and require_idle:
        raise UsageError("cannot tell whether the machine is quiet here (no nvidia-smi, no /proc): "
                         "--require-idle refuses to measure")
    return seen


class Watch:
    """The same rule while a run measures: between two calls of ``check`` (at most one a minute), other
    processes' CPU use over that stretch and other processes on the GPU; a line on stderr when they
    would move the figures.  The run's own processes (this one and all below it) are not others."""

    INTERVAL_S = 60.0

    def __init__(self, gpu: bool) -> None:
        self.gpu = gpu
        self.last: tuple[float, dict[int, tuple[str, int]] | None] | None = None

    def check(self) -> None:
        now = time.monotonic()
        if self.last is not None and now - self.last[0] < self.INTERVAL_S:
            return
        table = process_table() if has_proc() else {}
        mine = {os.getpid(), *descendants(os.getpid(), table)}
        sample = {p.pid: (p.name, p.ticks) for p in table.values()} if table else None
        seen = Quiet(own=mine)
        if self.gpu:
            apps = gpu_apps()
            seen.gpu = None if apps is None else [a for a in apps if a.pid not in mine]
        if self.last is not None and self.last[1] is not None and sample is not None:
            seen.window_s = now - self.last[0]
            seen.cpu = busy_between(self.last[1], sample, seen.window_s, os.sysconf("SC_CLK_TCK"), mine)
            seen.cpu_cores = sum(b.cores for b in seen.cpu)
        self.last = (now, sample)
        if seen.quiet is False:
            print(f"\nwarning: the machine is not quiet while it measures: {seen.busy()}; the figures may move",
                  file=sys.stderr)
