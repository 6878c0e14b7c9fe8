"""Ctrl-C, SIGTERM or a kill of the run's process ends everything a long command started (issue 30).

Each command is started as a user's shell would, in a process group of its own, with a variable of
the test's own in its environment: every process the run starts inherits it, whatever group or
session asv puts it in, so the test finds them all in /proc without trusting the code under test.
The signal goes to the whole group (what Ctrl-C does) at a moment seen from outside (a build
process, the workers, a line of progress, a file written); the command must exit 130 within
``EXIT_S`` and leave no process ``LEFT_S`` later.  A kill (SIGKILL) goes to the run's process alone.
Everything a test starts is killed at its end, pass or fail.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

import pytest

from conftest import ROOT
from relu2.host.lifecycle import carrying
from relu2.host.proc import process_table

pytestmark = pytest.mark.slow

EXIT_S = 15.0  # from the signal to the command's exit
LEFT_S = 10.0  # then no process of the run may be left
MOMENT_S = 600.0  # the longest wait for a moment to come (an environment build on a loaded 2-core box)
QUICK = {"RELU2_BENCH_QUICK": "1", "RELU2_BENCH_SUITES": "Grid", "RELU2_ROUNDS": "1"}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class Launched:
    """A command started in a process group of its own, its processes marked for the test."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.mark = f"RELU2_TEST_{uuid.uuid4().hex[:10]}"
        self.output = ""
        self.proc = subprocess.Popen(argv, cwd=cwd, env={**os.environ, **env, self.mark: "1"},
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.output += line

    def processes(self) -> dict[int, str]:
        """pid -> command line of every live process carrying the test's mark."""
        table = process_table()
        return {p: _cmdline(p) for p in carrying(self.mark, table) if not table[p].zombie}

    def wait_for(self, moment: Callable[["Launched"], bool], what: str) -> None:
        deadline = time.monotonic() + MOMENT_S
        while not moment(self):
            assert self.proc.poll() is None, f"ended (exit {self.proc.returncode}) before {what}:\n{self.output[-3000:]}"
            assert time.monotonic() < deadline, f"no {what} in {MOMENT_S:g} s:\n{self.output[-3000:]}"
            time.sleep(0.1)

    def left_after(self, seconds: float) -> dict[int, str]:
        """The run's processes still alive once ``seconds`` have passed (sooner when none is)."""
        deadline = time.monotonic() + seconds
        while (left := self.processes()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left

    def kill_all(self) -> None:
        for pid in self.processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def launch():
    started: list[Launched] = []

    def start(argv: list[str], cwd: Path, **env: str) -> Launched:
        run = Launched(argv, cwd, env)
        started.append(run)
        return run

    yield start
    for run in started:
        run.kill_all()


@pytest.fixture
def load():
    """A load generator beside the run: busy processes, one per core, for the loaded case."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    yield busy
    for p in busy:
        p.kill()
        p.wait()


# --- the moments, seen from outside ---------------------------------------------------------------


def _with(*words: str) -> Callable[[Launched], bool]:
    return lambda run: any(all(w in cmd for w in words) for cmd in run.processes().values())


def _said(text: str) -> Callable[[Launched], bool]:
    return lambda run: text in run.output


def _both(a: Callable[[Launched], bool], b: Callable[[Launched], bool]) -> Callable[[Launched], bool]:
    return lambda run: a(run) and b(run)


WORKERS = _with("multiprocessing.spawn")  # a worker process of relu2.measure.isolation, starting or measuring


def _stop(run: Launched, signum: int) -> tuple[float, dict[int, str]]:
    """Send ``signum`` (to the group; SIGKILL to the run's process alone); seconds to exit, and what is left."""
    before = run.processes()
    assert len(before) > 1, before  # the moment has processes of the run to end
    sent = time.monotonic()
    if signum == signal.SIGKILL:
        os.kill(run.proc.pid, signum)
    else:
        os.killpg(run.proc.pid, signum)
    try:
        run.proc.wait(EXIT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {EXIT_S:g} s after {signal.Signals(signum).name}:\n{run.output[-3000:]}")
    took = time.monotonic() - sent
    run._reader.join(5)
    print(f"{signal.Signals(signum).name}: exited {run.proc.returncode} in {took:.1f} s; {len(before)} processes before")
    return took, run.left_after(LEFT_S)


def _check_stopped(run: Launched, signum: int, command: str) -> None:
    took, left = _stop(run, signum)
    assert left == {}, f"left {LEFT_S:g} s after the exit: {left}"
    if signum == signal.SIGKILL:
        return
    # Never -2: that was CPython's -m path after the signal landed in exec'd code (tests/test_lifecycle.py)
    assert run.proc.returncode == 130, run.output[-3000:]
    lines = [line for line in run.output.splitlines() if line.startswith(f"{command}: interrupted")]
    assert len(lines) == 1 and signal.Signals(signum).name in lines[0], run.output[-3000:]
    print(f"  {lines[0]}; {len(left)} left after {LEFT_S:g} s")
    assert "Traceback" not in run.output.split(lines[0])[-1], run.output[-3000:]


# --- relu2 sweep ------------------------------------------------------------------------------------


SWEEP = ["sweep", "--sizes", "1024,2048,4096,8192", "--impl", "eager", "--dtype", "float32", "--modes", "hot",
         "--no-progress", "--machine", "box"]


@pytest.mark.parametrize("signum, moment", [
    (signal.SIGINT, "workers"), (signal.SIGINT, "measuring"), (signal.SIGINT, "writing"),
    (signal.SIGTERM, "measuring"), (signal.SIGKILL, "measuring"),
])
def test_an_interrupted_sweep_ends_every_process_it_started(tmp_path, launch, signum, moment):
    out = tmp_path / "out"
    run = launch([sys.executable, "-m", "relu2", *SWEEP, "--out", str(out)], ROOT)
    run.wait_for({"workers": WORKERS, "measuring": _said("cells x 1 modes"),
                  "writing": lambda r: (out / "sweep.partial.csv").exists()}[moment], moment)
    _check_stopped(run, signum, "relu2 sweep")
    if signum != signal.SIGKILL:
        assert not (out / ".relu2.lock").exists()
        if moment == "writing":
            assert "kept in" in run.output


STUBBORN = """
import sys
import relu2
from relu2 import cli
from stubborn_impl import relu2_stubborn
relu2.register("stubborn", relu2_stubborn)
raise SystemExit(cli.main(sys.argv[1:]))
"""


def test_a_second_ctrl_c_ends_everything_at_once(tmp_path, launch):
    # The first Ctrl-C asks the workers to leave (SIGTERM, then a grace): this worker takes its time and
    # says when it got the SIGTERM, so the second Ctrl-C lands while the first is handled, however
    # loaded the machine is (a fixed sleep raced the first's handling on a busy 2-core VM).
    termed, started = tmp_path / "termed", tmp_path / "started"
    argv = [a if a != "eager" else "stubborn" for a in SWEEP]
    run = launch([sys.executable, "-c", STUBBORN, *argv, "--out", str(tmp_path / "out")], ROOT,
                 PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests" / "fixtures")]),
                 RELU2_TEST_TERMED=str(termed), RELU2_TEST_STARTED=str(started))
    run.wait_for(lambda _: started.exists(), "the worker running the implementation")
    os.killpg(run.proc.pid, signal.SIGINT)
    run.wait_for(lambda _: termed.exists(), "the first Ctrl-C reaching the worker")
    took, left = _stop(run, signal.SIGINT)
    assert left == {}, left
    assert run.proc.returncode == 130
    assert "relu2 sweep: interrupted (SIGINT): killed" in run.output, run.output[-2000:]


FORKED = """
import os, time
from relu2.host import lifecycle
try:
    with lifecycle.guard("forked"):
        if os.fork() == 0:  # as asv forks: the child runs Python, with the guard's handler
            time.sleep(60)
            os._exit(0)
        print("ready", flush=True)
        time.sleep(60)
except lifecycle.Interrupted:
    raise SystemExit(130)  # as relu2.cli exits
"""


def test_a_fork_of_a_guarded_process_leaves_the_run_to_it(launch):
    """Ctrl-C reaches the fork too (the group), then the run's SIGTERM: one line, the run's own."""
    run = launch([sys.executable, "-c", FORKED], ROOT, PYTHONPATH=str(ROOT))
    run.wait_for(_said("ready"), "the fork started")
    _check_stopped(run, signal.SIGINT, "forked")


# --- relu2 asv run ------------------------------------------------------------------------------------


def git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@example.com")
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True,
                          env=env).stdout.strip()


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A clone of this checkout with a second commit on top: two commits to measure, one environment
    (asv's, built by the first test that reaches it and kept for the others)."""
    root = tmp_path_factory.mktemp("interrupt")
    project = root / "project"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(project)], check=True)
    (project / "NOTE").write_text("a second commit\n")
    git(project, "add", "NOTE")
    git(project, "commit", "-qm", "a second commit")
    config = json.loads((project / "asv.conf.json").read_text())
    config["results_dir"] = str(root / "results")
    (project / "asv.test.json").write_text(json.dumps(config))
    (root / "commits.txt").write_text(f"{git(project, 'rev-parse', 'HEAD~1')}\n{git(project, 'rev-parse', 'HEAD')}\n")
    return project


def _asv_run(project: Path, launch, home: Path) -> Launched:
    results = json.loads((project / "asv.test.json").read_text())["results_dir"]
    for path in Path(results).glob("intr/*.json"):
        path.unlink()  # each test measures both commits from the start
    return launch([sys.executable, "-m", "relu2", "asv", "run", "-v", "--config", "asv.test.json", "--machine",
                   "intr", "--record-samples", "--bench", "Grid.track_hot",
                   f"HASHFILE:{project.parent / 'commits.txt'}"], project, HOME=str(home), **QUICK)


def _result_written(project: Path) -> Callable[[Launched], bool]:
    results = Path(json.loads((project / "asv.test.json").read_text())["results_dir"]) / "intr"
    return lambda run: any(p.name not in ("machine.json", "benchmarks.json") for p in results.glob("*.json"))


ASV_MOMENTS = {
    "build": lambda project: _with("pip"),  # the environment's creation, the wheel's build or install
    "workers": lambda project: WORKERS,
    "measuring": lambda project: _both(_said("workers ready"), WORKERS),
    "writing": _result_written,  # the first commit's results written, the second's under way
}


@pytest.mark.parametrize("signum, moment", [
    (signal.SIGINT, "build"), (signal.SIGINT, "workers"), (signal.SIGINT, "measuring"), (signal.SIGINT, "writing"),
    (signal.SIGTERM, "measuring"), (signal.SIGKILL, "workers"),
])
def test_an_interrupted_asv_run_ends_every_process_it_started(project, tmp_path, launch, signum, moment):
    run = _asv_run(project, launch, tmp_path)
    run.wait_for(ASV_MOMENTS[moment](project), moment)
    _check_stopped(run, signum, "relu2 asv")
    if signum != signal.SIGKILL:
        machine = json.loads((tmp_path / ".asv-machine.json").read_text())["intr"]
        assert machine["quiet"] in ("yes", "no") and machine["busy"], machine  # recorded for the run
        if moment == "writing":
            # The signal is sent once the first commit's file is there; on a fast box the second commit
            # (3 s of quick-grid measuring) can be written before it lands.  Never 0: one was on disk.
            saved = re.search(r"the results of (\d+) commit\(s\) are saved", run.output)
            assert saved and saved.group(1) in ("1", "2"), run.output[-2000:]


def test_an_asv_run_on_a_loaded_machine_stops_while_setting_up(project, tmp_path, launch, load):
    """The case of issue 30: Ctrl-C while the suites set up, on a loaded machine."""
    run = _asv_run(project, launch, tmp_path)
    run.wait_for(_both(_said("Setting up"), WORKERS), "setting up")
    _check_stopped(run, signal.SIGINT, "relu2 asv")
    machine = json.loads((tmp_path / ".asv-machine.json").read_text())["intr"]
    assert machine["quiet"] == "no" and "cores of the CPU" in machine["busy"], machine


# --- relu2 confirm ------------------------------------------------------------------------------------


@pytest.mark.parametrize("signum, moment", [
    (signal.SIGINT, "build"), (signal.SIGINT, "workers"), (signal.SIGTERM, "measuring"), (signal.SIGKILL, "workers"),
])
def test_an_interrupted_confirm_ends_every_process_it_started(project, tmp_path, launch, signum, moment):
    out = tmp_path / "confirm.json"
    run = launch([sys.executable, "-m", "relu2", "confirm", "HEAD~1", "HEAD", "--device", "cpu",
                  "--cell", "eager:float32:1024:hot", "--out", str(out)], project,
                 RELU2_CACHE_DIR=str(tmp_path / "kernel-cache"))
    run.wait_for({"build": _with("pip", "--target"), "workers": WORKERS,
                  "measuring": _both(_said("round 1/"), WORKERS)}[moment], moment)
    _check_stopped(run, signum, "relu2 confirm")
    assert not out.exists()
    if signum != signal.SIGKILL:
        assert git(project, "worktree", "list").count("\n") == 0  # the sides' worktrees are gone
    else:  # a kill unwinds nothing: the sides' worktrees stay listed; later tests of the project start without them
        for line in git(project, "worktree", "list").splitlines()[1:]:
            git(project, "worktree", "remove", "--force", line.split()[0])


# --- relu2 bisect ---------------------------------------------------------------------------------------


def test_an_interrupted_bisect_ends_every_process_it_started(project, tmp_path, launch):
    state = tmp_path / "state.json"
    trees = git(project, "worktree", "list")
    run = launch([sys.executable, "-m", "relu2", "bisect", "HEAD~1", "HEAD", "--repo", str(project), "--device", "cpu",
                  "--cell", "eager:float32:1024:hot", "--state", str(state)], project,
                 RELU2_CACHE_DIR=str(tmp_path / "kernel-cache"))
    run.wait_for(WORKERS, "workers")
    _check_stopped(run, signal.SIGINT, "relu2 bisect")
    assert git(project, "worktree", "list") == trees  # the probes' worktrees are gone


# --- a worker whose parent is killed -------------------------------------------------------------------


POOL = """
from relu2.measure.isolation import WorkerPool
from relu2.vocab.schema import Cell
from relu2.measure.timing import Budget
pool = WorkerPool(["eager"], "cpu")
print("ready", *pool.pids(), flush=True)
pool.measure(Cell("eager", "float32", 1024, (1024,)), ["hot"], "cpu", Budget(samples=1000, sample_ms=500))
"""  # a cell of ten minutes: the worker is busy timing, not waiting on its pipe, when its parent dies


def test_a_worker_whose_parent_is_killed_leaves_by_itself(launch):
    """No guard and no keeper here: a pool's process killed outright, its workers notice (PR_SET_PDEATHSIG)."""
    run = launch([sys.executable, "-c", POOL], ROOT, PYTHONPATH=str(ROOT))
    run.wait_for(_said("ready"), "the pool ready")
    time.sleep(1)  # the cell sent
    workers = [int(pid) for pid in run.output.split("ready", 1)[1].split()]
    assert workers and all(pid in run.processes() for pid in workers)
    os.kill(run.proc.pid, signal.SIGKILL)
    run.proc.wait(EXIT_S)
    left = run.left_after(LEFT_S)
    assert not set(workers) & set(left), left
