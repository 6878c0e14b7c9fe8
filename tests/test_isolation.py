"""Isolation: an implementation that segfaults, aborts, hangs or runs out of memory costs only its own cells.

Each one runs in a worker process of its own (relu2.measure.isolation); these implementations are defined
at module level so the workers can unpickle them.
"""

from __future__ import annotations

import csv
import ctypes
import os
import sys
import time
from pathlib import Path

import pytest

import relu2
from conftest import requires_cuda
from relu2 import cli
from relu2.host.proc import death_reason
from relu2.measure.isolation import WorkerPool
from relu2.vocab.schema import grid_cells

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))

FAST = ["--samples", "2", "--sample-ms", "0.2", "--modes", "hot", "--no-progress"]


def segfaults(x):
    ctypes.string_at(0)  # reads address 0: SIGSEGV


def aborts(x):
    os.abort()


def hangs(x):
    time.sleep(3600)


def exhausts_memory(x):
    raise MemoryError("simulated: the host is out of memory")


BAD = {"segfaults": segfaults, "aborts": aborts, "hangs": hangs, "exhausts_memory": exhausts_memory}


@pytest.fixture
def bad_impls():
    for name, fn in BAD.items():
        relu2.register(name, fn, replace=True)
    yield list(BAD)
    for name in BAD:
        relu2.unregister(name)


def _rows(path: Path) -> dict[tuple[str, str], dict]:
    return {(r["impl"], r["numel"]): r for r in csv.DictReader(open(path))}


@pytest.mark.slow
def test_crashing_and_hanging_implementations_cost_only_their_own_cells(bad_impls, tmp_path, capsys):
    out = tmp_path / "sweep"
    code = cli.main(["sweep", "--device", "cpu", "--impl", ",".join(["eager", *bad_impls, "fused"]),
                     "--dtype", "float32", "--sizes", "2^10,2^12", "--timeout", "5", "--out", str(out), *FAST])
    assert code == 1
    rows = _rows(out / "sweep.csv")
    assert len(rows) == 2 * 7  # eager, four bad ones, fused and copy at two sizes: nothing lost
    for impl in ("eager", "fused", "copy"):
        for numel in ("1024", "4096"):
            assert rows[(impl, numel)]["status"] == "ok" and float(rows[(impl, numel)]["median_s"]) > 0
    assert "killed by SIGSEGV" in rows[("segfaults", "1024")]["reason"]
    assert "killed by SIGABRT" in rows[("aborts", "1024")]["reason"]
    assert "no answer in 5 s while measuring hangs float32 1024" in rows[("hangs", "1024")]["reason"]
    for impl in ("segfaults", "aborts", "hangs"):  # the rest of a dead worker's cells: failed, saying why
        later = rows[(impl, "4096")]
        assert later["status"] == "failed" and later["reason"].startswith("not measured: ")
    for numel in ("1024", "4096"):  # an exception is no crash: the worker lives on
        row = rows[("exhausts_memory", numel)]
        assert row["status"] == "failed" and "MemoryError: simulated" in row["reason"]
    assert not (out / "sweep.partial.csv").exists()


def test_an_unpicklable_registration_fails_with_the_rule(tmp_path):
    relu2.register("closure", lambda x: x, replace=True)
    try:
        with WorkerPool(["closure"], "cpu") as pool:
            (cell,) = grid_cells(["closure"], ["float32"], [64])
            result = pool.measure(cell, ["hot"], "cpu", None)
    finally:
        relu2.unregister("closure")
    assert result.status == "failed"
    assert "cannot be sent to an isolated worker" in result.reason and "module level" in result.reason


def test_death_reasons_read_as_words():
    assert death_reason(-11).startswith("was killed by SIGSEGV")
    assert death_reason(-6).startswith("was killed by SIGABRT")
    assert death_reason(3) == "exited with status 3"


@requires_cuda
@pytest.mark.cuda
def test_gpu_out_of_bounds_store_costs_only_its_own_cells(tmp_path):
    from oob_kernel import relu_squared_out_of_bounds

    relu2.register("oob_triton", relu_squared_out_of_bounds, devices=("cuda",), replace=True)
    try:
        out = tmp_path / "sweep"
        code = cli.main(["sweep", "--device", "cuda", "--impl", "eager,oob_triton,fused,compile",
                         "--dtype", "bfloat16", "--sizes", "2^20,2^24", "--out", str(out), *FAST])
    finally:
        relu2.unregister("oob_triton")
    assert code == 1
    rows = _rows(out / "sweep.csv")
    for impl in ("eager", "fused", "compile", "copy"):
        assert all(rows[(impl, n)]["status"] == "ok" for n in (str(2**20), str(2**24)))
    first = rows[("oob_triton", str(2**20))]
    assert first["status"] == "failed" and "illegal memory access" in first["reason"]
    assert rows[("oob_triton", str(2**24))]["reason"].startswith("not measured: ")


def _refuses_to_unpickle(reason: str):
    raise RuntimeError(reason)


class _RebuiltNowhere:
    """An implementation that pickles but cannot be rebuilt in a worker (its set-up fails there)."""

    def __call__(self, x):
        return x

    def __reduce__(self):
        return (_refuses_to_unpickle, ("this implementation cannot be rebuilt here",))


def test_a_worker_that_cannot_set_up_says_why(temporary_impl):
    temporary_impl("cannot_set_up", _RebuiltNowhere())
    with WorkerPool(["cannot_set_up"], "cpu") as pool:
        (cell,) = grid_cells(["cannot_set_up"], ["float32"], [64])
        result = pool.measure(cell, ["hot"], "cpu", None)
    assert result.status == "failed" and "could not set up 'cannot_set_up'" in result.reason
    assert "cannot be rebuilt here" in result.reason


def holds_a_semaphore_and_hangs(x):
    import multiprocessing

    holds_a_semaphore_and_hangs.lock = multiprocessing.get_context("spawn").Lock()  # as tqdm's lock does
    time.sleep(3600)


@pytest.mark.slow
def test_a_worker_stopped_for_a_timeout_leaks_no_semaphore(tmp_path):
    import subprocess

    script = tmp_path / "stop.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import relu2\nfrom test_isolation import holds_a_semaphore_and_hangs\n"
        "from relu2.measure.isolation import WorkerPool\nfrom relu2.vocab.schema import grid_cells\n"
        "if __name__ == '__main__':\n"
        "    relu2.register('holds', holds_a_semaphore_and_hangs, replace=True)\n"
        "    with WorkerPool(['holds'], 'cpu', timeout_s=2) as pool:\n"
        "        (cell,) = grid_cells(['holds'], ['float32'], [64])\n"
        "        print(pool.measure(cell, ['hot'], 'cpu', None).reason)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert "no answer in 2 s" in done.stdout, done.stderr
    assert "leaked semaphore" not in done.stderr, done.stderr


def test_an_implementation_the_package_does_not_provide_is_skipped_not_failed():
    """Today's suite names implementations an older commit lacks: their cells are n/a at that commit
    (a failed cell would read as a regression of code that never existed)."""
    cell = grid_cells(["not_in_this_commit"], ["float32"], [1024])[0]
    with WorkerPool(["not_in_this_commit"], "cpu", timeout_s=60) as pool:
        result = pool.measure(cell, ("hot",), "cpu", None)
    assert result.status == "skipped" and "not provided here" in result.reason


def _sigint_disposition(conn) -> None:
    import signal as _signal

    conn.send(_signal.getsignal(_signal.SIGINT) == _signal.SIG_IGN)


def test_a_worker_is_born_ignoring_ctrl_c_and_the_pool_keeps_its_own_handler():
    """Ctrl-C to the group while a worker's interpreter starts must not kill it mid-import."""
    import multiprocessing
    import signal as _signal

    from relu2.measure.isolation import _sigint_held

    before = _signal.getsignal(_signal.SIGINT)
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    with _sigint_held():
        process = ctx.Process(target=_sigint_disposition, args=(child,))
        process.start()
    assert parent.poll(60) and parent.recv() is True  # ignored from its first instruction
    process.join(10)
    assert _signal.getsignal(_signal.SIGINT) is before and not _signal.pthread_sigmask(_signal.SIG_BLOCK, set())


def test_a_child_that_times_out_is_ended_with_every_process_below_it(tmp_path):
    """ncu's target, a round's workers: killing only the child left them running beside what is
    measured next (a fake ncu that starts its target in the background and waits on it)."""
    import os
    import sys
    import time

    from relu2.host.proc import run_child

    pid_file = tmp_path / "target.pid"
    fake = (f"import subprocess, sys; t = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
            f"open({str(pid_file)!r}, 'w').write(str(t.pid)); print('launched the target', flush=True); t.wait()")
    ended = run_child([sys.executable, "-c", fake], timeout_s=3)
    assert ended.code is None and ended.tail.startswith("no answer in 3 s"), ended
    target = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(target, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(target, 9)
        pytest.fail(f"the target {target} outlived its timed-out parent")
