"""Processes: the process table (one reader of /proc), the environment a child inherits, and the one
way of running a child process to its end, with how it died said in words.

Torch-free: the busy rule, the run's lifecycle and every command that starts a child read this.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

# --- the process table ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    """One process as the process table shows it: ``ticks`` its user + system CPU so far (clock ticks;
    0 where only ``ps`` answers)."""

    pid: int
    ppid: int
    name: str
    zombie: bool
    ticks: int = 0


def parse_stat(text: str) -> Proc | None:
    """A ``/proc/PID/stat`` line as a Proc (the name may hold spaces and parentheses); None if malformed."""
    head, _, tail = text.rpartition(")")
    pid, _, name = head.partition(" (")
    fields = tail.split()
    if not pid.strip().isdigit() or len(fields) < 2 or not fields[1].lstrip("-").isdigit():
        return None
    ticks = int(fields[11]) + int(fields[12]) if len(fields) > 12 and fields[11].isdigit() and fields[12].isdigit() else 0
    return Proc(int(pid), int(fields[1]), name, fields[0] in ("Z", "X"), ticks)


def has_proc() -> bool:
    return Path("/proc/self/stat").exists()


def process_table() -> dict[int, Proc]:
    """Every process visible here: /proc on Linux, ``ps`` elsewhere."""
    table: dict[int, Proc] = {}
    if has_proc():
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    parsed = parse_stat((entry / "stat").read_text(errors="replace"))
                except OSError:
                    continue
                if parsed:
                    table[parsed.pid] = parsed
        return table
    out = subprocess.run(["ps", "-A", "-o", "pid=,ppid=,stat=,comm="], capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) == 4 and parts[0].isdigit() and parts[1].isdigit():
            table[int(parts[0])] = Proc(int(parts[0]), int(parts[1]), parts[3], parts[2].startswith("Z"))
    return table


def descendants(root: int, table: Mapping[int, Proc]) -> set[int]:
    """The pids below ``root`` in ``table``'s tree (not ``root`` itself)."""
    children: dict[int, list[int]] = {}
    for p in table.values():
        children.setdefault(p.ppid, []).append(p.pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


# --- a child's environment --------------------------------------------------------------------------


@contextlib.contextmanager
def environ(values: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set for the block and restored after: a command run in-process
    (tests, a library caller) leaves no variable of its run behind for the next one to inherit."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --- running a child to its end --------------------------------------------------------------------------


def death_reason(exitcode: int | None) -> str:
    """How a process ended, in words: "was killed by SIGSEGV (Segmentation fault)", "exited with status 3"."""
    if exitcode is None:
        return "stopped answering"
    if exitcode < 0:
        try:
            sig = signal.Signals(-exitcode)
            return f"was killed by {sig.name} ({signal.strsignal(sig) or sig.name})"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with status {exitcode}"


class ProcessFailed(RuntimeError):
    """A child process the work needed ended without doing it (out of memory, a crash, a timeout): work
    not done, not bad input.  The command says so in one line, with what was saved, and exits 1."""


@dataclass(frozen=True)
class Ended:
    """How a child ended: its exit status (None: stopped for its time limit), its output's last line."""

    code: int | None
    tail: str
    stdout: str = ""
    log: str = ""  # the file its output went to ("": kept, not logged)

    @property
    def ok(self) -> bool:
        return self.code == 0

    def why(self) -> str:
        """"no answer in 600 s", "was killed by SIGSEGV (...): <its last line>", "exited with status 1: ..."."""
        if self.code is None:
            return self.tail
        return death_reason(self.code) + (f": {self.tail}" if self.tail else "")


def run_child(argv: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None,
              cwd: str | os.PathLike | None = None, log: str | os.PathLike | None = None) -> Ended:
    """Run ``argv`` to its end or ``timeout_s`` (then it is killed, with every process below it: ncu's
    target, a round's workers, which would otherwise go on beside what is measured next): never
    raises for how it ended.  Its output goes to ``log`` (stdout and stderr together) when given, else
    is kept; ``tail`` is its last non-empty line (a process that dies says why last)."""
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(log, "w", encoding="utf-8")) if log is not None else subprocess.PIPE
        child = stack.enter_context(subprocess.Popen(list(argv), stdout=out, text=True, env=env, cwd=cwd,
                                                     stderr=subprocess.STDOUT if log is not None else subprocess.PIPE))
        try:
            stdout, stderr = child.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            kill_tree(child.pid)
            child.wait()  # not communicate(): a process below it that lived on would hold the pipes open
            partial = e.stderr or e.output or b""
            lines = [ln for ln in (partial.decode(errors="replace") if isinstance(partial, bytes) else partial).splitlines()
                     if ln.strip()]
            return Ended(None, f"no answer in {timeout_s:g} s" + (f" (last: {lines[-1]})" if lines else ""))
        except BaseException:  # Ctrl-C: as subprocess.run, the child goes (the run's guard ends the rest)
            child.kill()
            raise
    if log is not None:
        text, stdout = Path(log).read_text(encoding="utf-8", errors="replace"), ""
    else:  # why it failed is on stderr; what it answers, on stdout
        text = stderr if child.returncode and stderr.strip() else stdout
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return Ended(child.returncode, lines[-1] if lines else "", stdout, os.fspath(log) if log is not None else "")


def signal_all(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def kill_tree(root: int) -> None:
    """SIGKILL to ``root`` and every process below it (read before any dies: an orphan leaves the tree)."""
    signal_all([root, *descendants(root, process_table())], signal.SIGKILL)
