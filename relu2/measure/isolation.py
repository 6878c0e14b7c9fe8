"""Each implementation measured in a worker process of its own, so a crashing kernel costs only its own cells.

A ``WorkerPool`` spawns one worker per implementation (``multiprocessing``'s spawn method: a fresh
interpreter with its own CUDA context, never a fork of a process that touched CUDA).  All workers
start together and report ready (torch imported, implementation resolved and built) before the
first cell is timed, so no start-up work runs beside a timing.  Then the sweep sends one
cell at a time to the worker of its implementation and waits for the answer:

* a worker that dies (segfault, abort, ``os._exit``) or whose CUDA context is broken after a cell
  (an illegal memory access is sticky) ends: that cell and the implementation's remaining cells are
  recorded "failed" with the reason (the signal's name, the CUDA error's text);
* a worker that gives no answer within ``timeout_s`` for one cell is killed: "no answer in N s";
* every other worker, the ``copy`` roofline and the ``eager`` reference among them, goes on.

Compiler state is part of a measurement: every worker gets empty, private caches for inductor and
Triton (``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``), removed when the pool closes, so a
compiled path's kernel never depends on what an earlier run left on disk.  A pool given a
``cache_root`` keeps each implementation's caches there instead, for the caller to pass to the next
pool and remove: the rounds of one measurement (``relu2.measure.rounds``) share what the first compiled and
autotuned.  Inductor's graph caches are off either way, so every process generates its code itself
and fingerprints what it generated (a graph served from that cache never passes through the hook
``relu2.measure.compiled`` reads).

Implementations added with ``relu2.register`` in the calling process are sent to the workers
pickled: ``fn`` must be picklable, i.e. a function (or an instance of a class) defined at module
level in an importable module or in the script being run (``if __name__ == "__main__":`` guards
the script's main code, as for any spawn-based ``multiprocessing``).  Entry points and built-ins
the workers find themselves.
"""

from __future__ import annotations

import contextlib
import faulthandler
import math
import multiprocessing
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from relu2.host.lifecycle import follow_parent
from relu2.host.proc import death_reason, environ
from relu2.vocab.errors import UsageError
from relu2.vocab.interface import why_not
from relu2.vocab.schema import FAILED, SKIPPED, Cell

if TYPE_CHECKING:
    from relu2.measure.outcome import CellResult
    from relu2.measure.timing import Budget

DEFAULT_TIMEOUT_S = 300.0  # per implementation and input: a cold compile or a 2^30-element cell fits
ENV_TIMEOUT = "RELU2_TIMEOUT"  # the same for the asv suites, in seconds
# Start-up (import torch, build the fused extension from cold, warm a compiled path up) has a limit
# of its own: the per-cell timeout of a test that plants a hang is seconds.
STARTUP_TIMEOUT_S = 900.0
_KILL_GRACE_S = 5.0


def timeout_from_env(default: float = DEFAULT_TIMEOUT_S) -> float:
    """``$RELU2_TIMEOUT`` in seconds, else ``default``; UsageError (a ValueError) for anything but a
    positive finite number.  The one reading of the variable: ``relu2 sweep``, ``relu2 asv run`` and
    the suites all call this."""
    text = os.environ.get(ENV_TIMEOUT, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{ENV_TIMEOUT}={text!r}: expected a positive number of seconds")
    return value


@dataclass(frozen=True)
class Ready:
    """What a worker reports once its implementation is resolved (and built)."""

    available: bool
    broken: bool
    reason: str
    devices: tuple[str, ...]

    def why_not(self, device: str) -> str:
        return why_not(self.available, self.reason, self.devices, device)


# --- private compiler caches ---------------------------------------------------------------------


def cache_environment(root: str | os.PathLike) -> dict[str, str]:
    """The variables that point inductor's and Triton's caches into ``root``, with inductor's caches of
    whole graphs (FX graph, AOT autograd) off: Triton's compiled kernels and autotuning picks stay."""
    return {"TORCHINDUCTOR_CACHE_DIR": os.path.join(root, "inductor"), "TRITON_CACHE_DIR": os.path.join(root, "triton"),
            "TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}


@contextlib.contextmanager
def private_caches(prefix: str = "relu2-") -> Iterator[Path]:
    """Empty inductor and Triton caches for the block, in this process (as each worker has them for
    its life), removed after: what is compiled in the block is all that is in them."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        with environ(cache_environment(root)):
            yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --- the worker's side ----------------------------------------------------------------------------


def _worker_main(conn, name: str, registered: bytes, device: str, cache_dir: str, parent: int) -> None:
    """Resolve ``name``, say ready, then measure every cell sent until told to stop or the context breaks."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the sweep's to handle, not ours
    # Stopped (a timeout, the pool closing): leave through Python's exit, whose finalizers unlink the
    # semaphores this process made (tqdm's lock, a compile pool's queues).  Killed outright, they were
    # left to the resource tracker, which warned of "leaked semaphore objects" at shutdown.
    signal.signal(signal.SIGTERM, _leave)

    follow_parent(parent)  # the pool's process killed outright: this worker leaves too (SIGTERM)

    faulthandler.enable()  # a segfault in a kernel prints the Python stack it came from
    os.environ.update(cache_environment(cache_dir))  # for the worker's life; the pool removes the folder
    # Inductor compiles in this process, not in a pool of compile workers of its own: a graph of one
    # kernel gains nothing from the pool, and a pool per compiled path (16 processes each on the
    # H200 box, every round) costs seconds of start-up and competes for the CPU with the timing.
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

    from relu2.measure import registry
    from relu2.measure.cell import measure_cell
    from relu2.measure.outcome import all_modes, describe

    try:
        for impl in pickle.loads(registered):
            registry.register(impl.name, impl.fn, devices=impl.devices, description=impl.description, replace=True,
                              nan_to_zero=impl.nan_to_zero, writes_input=impl.writes_input)
        impl = registry.get(name)
        conn.send(("ready", Ready(impl.available, impl.broken, impl.reason, impl.devices)))
    except KeyError as e:  # the package under test provides no such implementation (at this commit): n/a
        conn.send(("ready", Ready(False, False, f"not provided here: {e.args[0]}", ())))
        return
    except BaseException as e:  # noqa: BLE001  report anything, then stop
        conn.send(("ready", Ready(False, True, f"the worker could not set up {name!r}: {describe(e)}", ())))
        return
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the sweep went away
            return
        if message is None:
            return
        cell, modes, budget = message
        try:
            result = measure_cell(cell, modes, device, budget)
        except BaseException as e:  # noqa: BLE001  measure_cell records failures; this is its own failure
            result = all_modes(cell, modes, FAILED, f"measuring raised {describe(e)}")
        broken = _broken_context(device)
        conn.send(("result", result, broken))
        if broken:
            return


def _leave(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _broken_context(device: str) -> str:
    """"" when the device still works after a cell; else why not (a sticky CUDA error's text)."""
    if device != "cuda":
        return ""
    import torch

    try:
        torch.cuda.synchronize()
        torch.empty(1, device="cuda").add_(1).item()
    except Exception as e:  # noqa: BLE001  any error here means the context is gone
        from relu2.measure.outcome import describe

        return describe(e)
    return ""


# --- the sweep's side -----------------------------------------------------------------------------


class _Worker:
    """One worker process and what became of it."""

    def __init__(self, name: str, process, conn, cache_dir: str, own_cache: bool = True) -> None:
        self.name = name
        self.process = process
        self.conn = conn
        self.cache_dir = cache_dir
        self.own_cache = own_cache  # removed with the worker; else the pool's caller keeps it
        self.ready: Ready | None = None
        self.dead = ""  # why this worker is gone ("" while it is alive)

    def ask_to_leave(self) -> None:
        """Tell the worker to finish (it exits after its current cell); ``stop`` waits for it."""
        if self.process.is_alive():
            try:
                self.conn.send(None)
            except (OSError, ValueError):
                pass

    def stop(self) -> None:
        """Ask the worker to leave, then make sure it has; its private caches go with it."""
        self.ask_to_leave()
        if self.process.is_alive():
            self.process.join(_KILL_GRACE_S)
        if self.process.is_alive():  # busy (a hang, a cell past its timeout): ask it to exit cleanly
            self.process.terminate()
            self.process.join(_KILL_GRACE_S)
        if self.process.is_alive():  # stuck where Python cannot run its exit: nothing else is left
            self.process.kill()
            self.process.join()
        self.conn.close()
        if self.own_cache:
            shutil.rmtree(self.cache_dir, ignore_errors=True)


@contextlib.contextmanager
def _sigint_held() -> Iterator[None]:
    """A worker spawned here is born ignoring SIGINT (an ignored signal stays ignored over exec, and
    Python then installs no handler of its own), so a Ctrl-C to the terminal's group never kills one
    while its interpreter starts: that printed "Fatal Python error: init_import_site" over the run's
    own line.  The worker ignores SIGINT anyway and leaves on the run's SIGTERM.  A Ctrl-C meanwhile
    is held (blocked, so not discarded) and reaches this process's handler once it is back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _unwind_on_sigterm() -> Any:
    """In a process that SIGTERM would end at once (asv's ``setup_cache`` process; a pool outside a
    ``relu2.host.lifecycle.guard``), SIGTERM leaves through Python's exit while a pool is open, so the pool
    closes its workers and removes their caches; the handler it replaced (None: none replaced)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return None
    return signal.signal(signal.SIGTERM, _leave)


class WorkerPool:
    """A worker per implementation; ``measure`` sends a cell to its implementation's worker.

    Use as a context manager (or call ``close``): the workers and their caches are removed at the end.
    """

    def __init__(self, names: Sequence[str], device: str, timeout_s: float = DEFAULT_TIMEOUT_S,
                 startup_timeout_s: float = STARTUP_TIMEOUT_S, cache_root: str | os.PathLike | None = None) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout must be > 0 s, got {timeout_s}")
        self.device = device
        self.timeout_s = timeout_s
        self.cache_root = cache_root  # None: each worker's caches are its own and go with it
        self.workers: dict[str, _Worker] = {}
        self._context = multiprocessing.get_context("spawn")
        self._sigterm = _unwind_on_sigterm()
        try:
            self._start(list(dict.fromkeys(names)), max(startup_timeout_s, timeout_s))
        except BaseException:  # Ctrl-C while they start: no worker and no private cache outlives the pool
            self.close()
            raise

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        # All are told first, so they tear their CUDA contexts down together, not one after another.
        for worker in self.workers.values():
            worker.ask_to_leave()
        for worker in self.workers.values():
            worker.stop()
        if self._sigterm is not None:
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None

    def pids(self) -> set[int]:
        return {w.process.pid for w in self.workers.values() if w.process.pid is not None}

    def ready(self, name: str) -> Ready | None:
        """What the worker of ``name`` reported at start-up (None if it never did)."""
        worker = self.workers.get(name)
        return worker.ready if worker else None

    # -- start-up --------------------------------------------------------------------------------

    def _start(self, names: list[str], startup_timeout_s: float) -> None:
        # Registered here means registered through the registry, so a process that never imported
        # it (a round's coordinator) has nothing to send, and need not import torch to learn that.
        registry = sys.modules.get("relu2.measure.registry")
        here = registry.registered_here() if registry is not None else {}
        for name in names:
            if self.cache_root is None:
                cache_dir = tempfile.mkdtemp(prefix=f"relu2-worker-{name}-")
            else:
                cache_dir = os.path.join(self.cache_root, name)
                os.makedirs(cache_dir, exist_ok=True)
            own = self.cache_root is None
            parent, child = self._context.Pipe()
            try:
                registered = pickle.dumps([here[name]] if name in here else [])
            except Exception as e:  # noqa: BLE001  a lambda or a closure cannot cross to another process
                worker = _Worker(name, _NoProcess(), parent, cache_dir, own)
                worker.ready = Ready(False, True, f"cannot be sent to an isolated worker: {type(e).__name__}: {e}; "
                                     "register a function defined at module level (docs/implementations.md)", ())
                worker.dead = worker.ready.reason
                self.workers[name] = worker
                child.close()
                continue
            process = self._context.Process(target=_worker_main,
                                            args=(child, name, registered, self.device, cache_dir, os.getpid()),
                                            name=f"relu2-worker-{name}", daemon=True)
            with _sigint_held():
                process.start()
            child.close()  # the worker holds the other end; EOF here then means it died
            self.workers[name] = _Worker(name, process, parent, cache_dir, own)
        deadline = time.monotonic() + startup_timeout_s
        for worker in self.workers.values():
            if worker.ready is not None:
                continue
            answer = self._receive(worker, deadline - time.monotonic(), startup_timeout_s, "starting up")
            if answer is not None:
                worker.ready = answer[1]

    def _receive(self, worker: _Worker, wait_s: float, limit_s: float, doing: str) -> tuple | None:
        """The worker's next message within ``wait_s``, or None when it died or stayed silent (then it is
        stopped, and ``dead`` says why)."""
        try:
            if worker.conn.poll(max(wait_s, 0.0)):
                return worker.conn.recv()
            worker.dead = f"no answer in {limit_s:g} s while {doing}"
        except (EOFError, OSError):
            worker.process.join(_KILL_GRACE_S)
            worker.dead = f"the worker {death_reason(worker.process.exitcode)} while {doing}"
        worker.stop()
        return None

    # -- measuring -------------------------------------------------------------------------------

    def measure(self, cell: Cell, modes: Sequence[str], device: str, budget: "Budget | None") -> "CellResult":
        """The cell measured by its implementation's worker; a dead or silent worker fails the cell."""
        from relu2.measure.outcome import all_modes

        if device != self.device:
            raise ValueError(f"this pool measures on {self.device}, not {device}")
        worker = self.workers.get(cell.impl)
        if worker is None:
            raise KeyError(f"no worker for {cell.impl!r}; the pool was started for {', '.join(self.workers)}")
        if worker.ready is not None and not worker.ready.available:  # absent here, or broken (its build failed)
            return all_modes(cell, modes, FAILED if worker.ready.broken else SKIPPED, worker.ready.reason)
        if worker.dead:
            return all_modes(cell, modes, FAILED, f"not measured: {worker.dead}")
        sent = time.perf_counter()
        try:
            worker.conn.send((cell, tuple(modes), budget))
        except (OSError, ValueError):
            pass  # it died since its last answer; _receive says how
        answer = self._receive(worker, self.timeout_s, self.timeout_s, f"measuring {cell.describe()}")
        if answer is None:
            return all_modes(cell, modes, FAILED, worker.dead)
        _, result, broken = answer
        # The round trip less the worker's own phases: pickling, the pipe, the device check after a cell.
        result.seconds["transfer"] = max(0.0, time.perf_counter() - sent - sum(result.seconds.values()))
        if broken:
            worker.dead = f"the device broke while measuring {cell.describe()}: {broken}"
            worker.stop()
            # A sticky CUDA error may have struck during an earlier mode's replay: no figure stands.
            return all_modes(cell, modes, FAILED, worker.dead)
        return result


class _NoProcess:
    """Stands in for a process that was never started (its implementation could not be sent)."""

    pid = None
    exitcode = None

    def is_alive(self) -> bool:
        return False

    def join(self, timeout: float | None = None) -> None:
        pass

    def kill(self) -> None:
        pass

