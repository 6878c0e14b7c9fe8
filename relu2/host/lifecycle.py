"""Everything a run started ends with it: Ctrl-C, SIGTERM or the death of the run's own process.

A long command (``relu2 asv run``, ``sweep``, ``confirm``, ``compare``, ``bisect``) wraps its work in
``guard``.  Its processes are not all one process group: asv starts each build, ``setup_cache`` and
its forkserver in a process group of its own (``asv.util.check_output``), so Ctrl-C never reaches them,
and a ``setup_cache`` whose parent died kept its workers measuring beside the next run (issue 30).
So a run marks what it starts, and ends by that mark:

* **Marked.**  ``guard`` puts ``RELU2_RUN_<token>`` in the environment; every process started after it
  (asv's, pip's, the workers, a compiler) inherits it, whatever its group or session.  The run's
  processes are those that carry it (``/proc/PID/environ``), plus this process's descendants; this
  process is also a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``), so an orphan stays in its tree.
* **First SIGINT or SIGTERM.**  Every process of the run gets SIGTERM at once (a worker leaves through
  Python's exit; asv's processes die), and ``KeyboardInterrupt`` unwinds this process, which closes
  pools, removes worktrees and temporary folders.  Leaving the block, what is still alive after
  ``GRACE_S`` gets SIGKILL; then one line says what was stopped and what was saved, and the command
  exits 130 (``relu2.cli``).
* **A second one** while that happens: SIGKILL to every process of the run, the line, exit 130 at once.
  A fork of this process (a multiprocessing pool's, as asv.util makes) inherits the handler but not
  the run: Ctrl-C to the group, then the run's SIGTERM, only end it.
* **This process killed** (SIGKILL, a lost job): a keeper process started by ``guard``, in a session of
  its own, waits for this one's end and then ends every process that carries the mark.  Each worker
  also follows its parent (``follow_parent``: ``PR_SET_PDEATHSIG``, or a check of the parent's pid where
  there is no prctl).

The timing path is untouched: no thread, timer or poll runs in a measuring process on Linux, and the
keeper blocks on a pipe until the run's process ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from relu2.host.proc import Proc, ProcessFailed, descendants, parse_stat, process_table, signal_all

MARK_PREFIX = "RELU2_RUN_"  # + a token per run; its value is the pid of the run's process
GRACE_S = 3.0  # SIGTERM, then this long to leave through Python's exit, then SIGKILL
EXIT_INTERRUPTED = 130

_DONE = b"done"  # what the run writes to its keeper as it ends by itself
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_POLL_S = 0.05


# --- prctl ----------------------------------------------------------------------------------------


def _prctl(option: int, value: int) -> bool:
    """Linux prctl(2) through ctypes; False where there is none or it failed."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper(on: bool = True) -> bool:
    """Make this process the reaper of its orphaned descendants (Linux), or no longer; whether it did."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, int(on))


def follow_parent(parent: int, signum: int = signal.SIGTERM) -> None:
    """This process gets ``signum`` when ``parent`` (the process that started it) dies.

    Linux: ``PR_SET_PDEATHSIG``, then a check that the parent did not die before it was set.
    Elsewhere: a daemon thread that checks the parent's pid once a second."""
    if _prctl(_PR_SET_PDEATHSIG, signum):
        if os.getppid() != parent:
            os.kill(os.getpid(), signum)
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signum)

    threading.Thread(target=watch, name="relu2-follow-parent", daemon=True).start()


# --- the processes of a run -----------------------------------------------------------------------


def carrying(variable: str, pids: Iterable[int]) -> set[int]:
    """The pids among ``pids`` whose environment (as they were started) holds ``variable`` (Linux)."""
    key = b"\0" + variable.encode() + b"="
    found = set()
    for pid in pids:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if key in b"\0" + environ:
            found.add(pid)
    return found


def run_processes(mark: str, root: int, spare: Iterable[int] = ()) -> dict[int, Proc]:
    """The live processes of a run: those carrying ``mark`` and the descendants of ``root``; never
    ``root`` itself, zombies (already ended) or ``spare``."""
    table = process_table()
    pids = (carrying(mark, table) | descendants(root, table)) - {root, *spare}
    return {pid: table[pid] for pid in pids if pid in table and not table[pid].zombie}


def _alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        text = ""
    if text:
        parsed = parse_stat(text)
        return parsed is not None and not parsed.zombie
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def end(pids: Iterable[int], grace_s: float = GRACE_S) -> int:
    """SIGTERM to ``pids``, SIGKILL to those still alive ``grace_s`` later; how many were alive."""
    pids = [p for p in pids if _alive(p)]
    signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    signal_all([p for p in pids if _alive(p)], signal.SIGKILL)
    return len(pids)


def reap() -> None:
    """Collect every child of this process that has ended (orphans reparented here, as a subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


# --- the guard ------------------------------------------------------------------------------------


class Signalled(KeyboardInterrupt):
    """Raised by the guard's handler at the first SIGINT or SIGTERM.  Not a plain ``KeyboardInterrupt``:
    CPython marks one that leaves string-``exec``'d code (a dataclass or namedtuple being made, say) as
    unhandled even once caught, and ``python -m`` then dies of SIGINT instead of exiting 130.  It only
    checks for the exact type, so a subclass is never marked."""


@contextlib.contextmanager
def interrupts() -> Iterator[None]:
    """Ctrl-C in the block raises ``Signalled`` where Python's own handler would raise a plain
    ``KeyboardInterrupt``, so a command exits 130 outside a guarded run too (an unguarded command, or a
    guarded one before its guard starts).  Only where SIGINT has Python's handler, in the main thread."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return

    def on_sigint(signum: int, frame) -> None:
        raise Signalled

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is on_sigint:  # a guard stopped by a signal leaves it ignored
            signal.signal(signal.SIGINT, signal.default_int_handler)


class Interrupted(KeyboardInterrupt):
    """The run was interrupted and its processes ended; the line saying so is already printed."""

    reported = True


@dataclass
class Run:
    """A guarded run: its mark, what stopped it, and how to say what it saved."""

    command: str
    mark: str
    saved: Callable[[], str]
    signum: int | None = None  # the first SIGINT or SIGTERM received
    stopped: int = 0
    keeper: subprocess.Popen | None = None

    def processes(self) -> dict[int, Proc]:
        return run_processes(self.mark, os.getpid(), self._spared())

    def _spared(self) -> set[int]:
        """The keeper, and this process's own multiprocessing resource tracker: it ignores SIGTERM and
        ends by itself when this process does, after unlinking what the workers left."""
        spared = {self.keeper.pid} if self.keeper else set()
        tracker = sys.modules.get("multiprocessing.resource_tracker")
        pid = getattr(getattr(tracker, "_resource_tracker", None), "_pid", None)
        return spared | ({pid} if pid else set())

    def line(self, how: str) -> str:
        what = signal.Signals(self.signum).name if self.signum else "KeyboardInterrupt"
        try:
            saved = self.saved()
        except Exception as e:  # noqa: BLE001  the line must still come out
            saved = f"could not say what was saved ({type(e).__name__}: {e})"
        return (f"{self.command}: interrupted ({what}): {how} {self.stopped} process"
                f"{'' if self.stopped == 1 else 'es'} of the run; {saved}")


_active: Run | None = None


def say_saved(saved: Callable[[], str]) -> None:
    """Tell the guarded run (if any) how to say what it saved, once that is known (a results folder)."""
    if _active is not None:
        _active.saved = saved


@contextlib.contextmanager
def guard(command: str, saved: Callable[[], str] = lambda: "nothing was saved") -> Iterator[Run]:
    """Run the block as one run (see the module): interrupted, it ends every process it started and
    raises ``Interrupted`` (exit 130) after one line on stderr naming ``command``, the processes
    stopped and ``saved()``; a child that ended without its work (``ProcessFailed``) is raised again with
    ``saved()`` added.  Nested in a guarded run, it is that run."""
    global _active
    if _active is not None:
        yield _active
        return
    run = Run(command, MARK_PREFIX + uuid.uuid4().hex[:12], saved)
    os.environ[run.mark] = str(os.getpid())
    subreaper = become_subreaper()
    run.keeper = _start_keeper(run.mark)
    main = threading.current_thread() is threading.main_thread()
    previous = {}
    closing = False
    owner = os.getpid()

    def on_signal(signum: int, frame) -> None:
        if os.getpid() != owner:
            # A fork of this process (a pool forked without exec) inherits the handler, and the group's
            # Ctrl-C then the run's SIGTERM made it print "killed" and end the run as its own.  The
            # run is this process's to end: the fork just dies of the signal.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if run.signum is not None:  # the second: everything now
            left = run.processes()
            run.stopped = max(run.stopped, len(left))
            signal_all(left, signal.SIGKILL)
            print(run.line("killed"), file=sys.stderr, flush=True)
            os._exit(EXIT_INTERRUPTED)
        run.signum = signum
        left = run.processes()
        run.stopped = len(left)
        signal_all(left, signal.SIGTERM)  # they leave while this process unwinds
        if not closing:
            raise Signalled

    if main:
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, on_signal)
    _active = run
    interrupted = False
    try:
        yield run
    except KeyboardInterrupt:
        interrupted = True
    except ProcessFailed as e:  # work not done: the command's one line says what is kept
        raise ProcessFailed(f"{e}; {saved()}") from None
    finally:
        closing = True
        try:
            left = run.processes()
            run.stopped = max(run.stopped, len(left))
            # What the first signal asked to leave gets its grace; leftovers of a run that ended
            # otherwise (a crash) are ended the same way.
            if left:
                end(left)
            _stop_keeper(run.keeper)
            reap()
            interrupted = interrupted or run.signum is not None
            if interrupted:
                print(run.line("stopped"), file=sys.stderr, flush=True)
        finally:
            _active = None
            os.environ.pop(run.mark, None)
            if subreaper:
                become_subreaper(False)
            if main:
                for signum, handler in previous.items():
                    # Stopped by a signal, the command only says so and exits 130: one more Ctrl-C
                    # then would only cut that short with a traceback.
                    signal.signal(signum, signal.SIG_IGN if run.signum is not None else handler)
    if interrupted:
        raise Interrupted()


# --- the keeper: ends the run's processes when the run's own process is gone ----------------------


def _start_keeper(mark: str) -> subprocess.Popen | None:
    """The keeper of this run: in a session of its own (Ctrl-C to the terminal's group spares it), not
    carrying the mark, reading a pipe only this process holds open; None where it cannot start (then
    the workers' own watch remains)."""
    env = {k: v for k, v in os.environ.items() if k != mark}
    package_parent = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([package_parent, *filter(None, [env.get("PYTHONPATH")])])
    try:
        return subprocess.Popen([sys.executable, "-m", "relu2.host.lifecycle", "keep", mark], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True, close_fds=True)
    except OSError:
        return None


def _stop_keeper(keeper: subprocess.Popen | None) -> None:
    """The run ended here, and ended its processes itself: the keeper leaves without looking."""
    if keeper is None:
        return
    try:
        keeper.stdin.write(_DONE)
        keeper.stdin.close()
        keeper.wait(GRACE_S)
    except (OSError, subprocess.TimeoutExpired):
        keeper.kill()


def keep(mark: str) -> None:
    """The keeper's life: wait for the end of its pipe on stdin (a blocking read, no wake-ups).  The run
    says it is done before it closes the pipe; a pipe closed without that (by the kernel, as the run's
    process died) means the run's processes are left to end: every process still carrying ``mark``."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    said = b""
    while chunk := sys.stdin.buffer.read(4096):
        said += chunk
    if said == _DONE:
        return
    me = os.getpid()
    for _ in range(3):  # a dying process may start another: look again
        table = process_table()
        left = {p for p in carrying(mark, table) if p != me and not table[p].zombie}
        if not left:
            return
        end(left)


if __name__ == "__main__" and sys.argv[1:2] == ["keep"]:
    keep(sys.argv[2])
