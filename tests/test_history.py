"""History as the README runs it: every commit measured by today's instrument, or left out with its
reason; never an empty result; and a kernel in another repository tracked the same way.

Real asv runs on the quick CPU grid (eager and copy, float32, two sizes), one Grid benchmark, so each
commit costs a build and a few seconds of measuring.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow

QUICK = {"RELU2_BENCH_QUICK": "1", "RELU2_BENCH_SUITES": "Grid"}


def git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@example.com")
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True,
                          env=env).stdout.strip()


def relu2_asv(cwd: Path, home: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``relu2 asv ARGS`` as a user runs it, with a home of its own (asv's machine file)."""
    full = dict(os.environ, HOME=str(home), **QUICK, **env)
    full.pop("RELU2_BENCH_IMPLS", None) if "RELU2_BENCH_IMPLS" not in env else None
    return subprocess.run([sys.executable, "-m", "relu2", "asv", *args], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=900)


def results_of(folder: Path) -> dict[str, list]:
    """Commit -> the hot figures of its result file in ``folder``."""
    out = {}
    for path in folder.glob("*.json"):
        if path.name == "machine.json":
            continue
        data = json.loads(path.read_text(), parse_constant=float)
        hot = dict(zip(data["result_columns"], data["results"]["bench_relu2.Grid.track_hot"]))
        out[data["commit_hash"]] = hot["result"]
    return out


def first_with_interface(repo: Path) -> str:
    """The oldest commit of ``repo`` whose pyproject.toml declares implementations through interface 1."""
    from relu2.runs.asv_run import declared_implementations

    for commit in git(repo, "rev-list", "--reverse", "--first-parent", "HEAD").split():
        if declared_implementations(repo, commit)[0]:
            return commit
    raise AssertionError("no commit declares the interface")


def test_every_commit_is_measured_by_todays_instrument_or_left_out_with_its_reason(tmp_path):
    project = tmp_path / "project"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(project)], check=True)
    oldest = first_with_interface(project)
    before = git(project, "rev-parse", f"{oldest}~1")
    head = git(project, "rev-parse", "HEAD")
    previous = git(project, "rev-parse", "HEAD~1")
    # A commit whose own instrument is broken: if asv measured it with its own ruler, nothing would time.
    # The checkout asv runs in stays at HEAD: its working tree is the instrument.
    git(project, "checkout", "-q", "-b", "broken-ruler")
    timing = project / "relu2" / "measure" / "timing.py"
    timing.write_text(timing.read_text() + "\nraise ImportError('the commit under test brought its own ruler')\n")
    git(project, "commit", "-qam", "break this commit's own relu2.measure.timing")
    broken = git(project, "rev-parse", "HEAD")
    git(project, "checkout", "-q", "main")
    hashes = tmp_path / "commits.txt"
    hashes.write_text("\n".join([before, oldest, previous, head, broken]) + "\n")
    config = json.loads((project / "asv.conf.json").read_text())
    config["results_dir"] = str(tmp_path / "results")
    (project / "asv.test.json").write_text(json.dumps(config))

    run = relu2_asv(project, tmp_path, "run", "--config", "asv.test.json", "--machine", "ci", "--record-samples",
                    "--bench", "Grid.track_hot", f"HASHFILE:{hashes}")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "1 commit(s) not measured" in run.stderr and before[:8] in run.stderr
    assert "predates the implementations interface 1" in run.stderr
    assert run.stderr.count("seconds by implementation and phase") == 4  # where each commit's time went
    measured = results_of(tmp_path / "results" / "ci")
    assert set(measured) == {oldest, previous, head, broken}  # none empty, none missing
    for commit, values in measured.items():
        assert all(v is not None and 0 < v < 1 for v in values), (commit, values)
    ledger = (tmp_path / "results" / "ci" / "unmeasured.tsv").read_text()
    assert before in ledger and "interface 1" in ledger
    assert git(project, "status", "--porcelain", "--untracked-files=no") == ""


def test_a_result_with_no_figure_is_removed_and_its_reason_said(tmp_path):
    """A commit the suites cannot measure (here every cell skipped) leaves no all-null file behind."""
    project = tmp_path / "project"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(project)], check=True)
    config = json.loads((project / "asv.conf.json").read_text())
    config["results_dir"] = str(tmp_path / "results")
    (project / "asv.test.json").write_text(json.dumps(config))
    # Every cell above the CPU cap: the quick grid's sizes are below it, so choose no suite's cell.
    run = relu2_asv(project, tmp_path, "run", "--config", "asv.test.json", "--machine", "ci", "--bench",
                    "Grid.track_hot", "HEAD^!", RELU2_BENCH_IMPLS="triton")
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    assert "holds no figure" in run.stderr
    assert results_of(tmp_path / "results" / "ci") == {}
    assert git(project, "rev-parse", "HEAD") in (tmp_path / "results" / "ci" / "unmeasured.tsv").read_text()


TOY = '''"""A relu² kernel in another repository, measured by relu2-bench through interface 1."""
import torch
from relu2.vocab.interface import Implementation

REPEAT = {repeat}


def toy_relu_squared(x):
    for _ in range(REPEAT - 1):  # the planted slowdown: the same result, computed REPEAT times
        torch.square(torch.relu(x))
    return torch.square(torch.relu(x))


def toy():
    return Implementation("toy", toy_relu_squared, description="a kernel of another repository")
'''

PYPROJECT = '''[build-system]
requires = ["setuptools>=77", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "toykernel"
version = "0.1.0"

[project.entry-points."relu2.implementations"]
toy = "toykernel:toy"
'''


def toy_repo(where: Path) -> list[str]:
    """A git repository of a package ``toykernel`` with three commits; the third is 30x slower."""
    where.mkdir()
    git(where, "init", "-q", "-b", "main")
    (where / "pyproject.toml").write_text(PYPROJECT)
    commits = []
    for message, repeat, readme in (("toy kernel", 1, "a"), ("docs", 1, "b"), ("slower", 30, "b")):
        (where / "toykernel.py").write_text(TOY.format(repeat=repeat))
        (where / "README").write_text(readme)
        git(where, "add", "-A")
        git(where, "commit", "-qm", message)
        commits.append(git(where, "rev-parse", "HEAD"))
    return commits


def test_a_kernel_in_another_repository_is_tracked_and_the_gate_names_the_slow_commit(tmp_path):
    toy = tmp_path / "toykernel"
    c1, c2, c3 = toy_repo(toy)
    harness = tmp_path / "harness"  # this checkout's config and suites, with .asv/ of its own
    harness.mkdir()
    shutil.copy(ROOT / "asv.conf.json", harness / "asv.conf.json")
    (harness / "benchmarks").symlink_to(ROOT / "benchmarks")
    run = relu2_asv(harness, tmp_path, "run", "--repo", str(toy), "--machine", "ci", "--record-samples",
                    "--bench", "Grid.track_hot", "ALL", RELU2_BENCH_IMPLS="eager,toy,copy")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = harness / ".asv" / "toykernel" / "results"
    assert set(results_of(results / "ci")) == {c1, c2, c3}

    def gate(base: str, head: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "relu2", "gate", base, head, "--results", str(results),
                               "--machine", "ci", "--factor", "3"], capture_output=True, text=True, timeout=300)

    same = gate(c1, c2)
    assert same.returncode == 0, same.stdout + same.stderr
    slower = gate(c2, c3)
    assert slower.returncode == 1, slower.stdout + slower.stderr
    flagged = [line for line in slower.stdout.splitlines() if "impl=" in line]
    assert flagged and all("impl=toy" in line for line in flagged), slower.stdout


SLOWER_FUSED = '''

_fast = relu_squared


def relu_squared(x, out=None):  # the same result, computed 30 times
    for _ in range(29):
        _fast(x)
    return _fast(x, out)
'''


def slow_down_fused(checkout: Path) -> None:
    """Make the fused op of ``checkout`` 30x slower (bitwise the same): a planted regression."""
    fused_py = checkout / "relu2_impls" / "fused.py"
    fused_py.write_text(fused_py.read_text() + SLOWER_FUSED)


def test_the_base_judges_a_pull_request_that_grades_itself(tmp_path):
    """A pull request whose head makes the gate always pass and the fused kernel 30x slower: measured
    and gated from the base's checkout (as .github/workflows/benchmarks.yml does), the gate fails it;
    the head's own gate would have passed it."""
    judge = tmp_path / "judge"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(judge)], check=True)
    base = git(judge, "rev-parse", "HEAD")
    git(judge, "checkout", "-q", "-b", "pull-request")
    cli_py = judge / "relu2" / "cli.py"  # the head's gate passes whatever it is shown
    cli_py.write_text(cli_py.read_text() + "\n\ndef cmd_gate(args):\n    print('PASS')\n    return 0\n")
    slow_down_fused(judge)
    git(judge, "commit", "-qam", "faster, trust me")
    head = git(judge, "rev-parse", "HEAD")
    git(judge, "checkout", "-q", base)  # the judge: the base's working tree
    config = json.loads((judge / "asv.conf.json").read_text())
    config["results_dir"] = str(tmp_path / "results")
    (judge / "asv.test.json").write_text(json.dumps(config))
    cache = {"RELU2_CACHE_DIR": str(tmp_path / "kernel-cache"), "RELU2_BENCH_IMPLS": "fused,copy"}
    for commit in (base, head):
        run = relu2_asv(judge, tmp_path, "run", "--config", "asv.test.json", "--machine", "ci", "--record-samples",
                        "--bench", "Grid.track_hot", f"{commit}^!", **cache)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    def gate(checkout: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "relu2", "gate", base, head, "--results", str(tmp_path / "results"),
                               "--machine", "ci", "--factor", "3"], cwd=checkout, capture_output=True, text=True,
                              timeout=300)

    judged = gate(judge)  # `python -m relu2` from the base's checkout: the base's gate
    assert judged.returncode == 1, judged.stdout + judged.stderr
    flagged = [line for line in judged.stdout.splitlines() if "impl=" in line]
    assert flagged and all("impl=fused" in line for line in flagged), judged.stdout
    git(judge, "checkout", "-q", head)
    assert gate(judge).returncode == 0  # the head's own gate passes itself: why the base must judge


def test_confirm_measures_base_and_head_again_in_fresh_processes(tmp_path):
    """relu2 confirm builds both commits from worktrees and measures flagged cells round by round:
    a kernel made 30x slower at head is slower again; eager, which no commit touches, is not."""
    project = tmp_path / "project"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(project)], check=True)
    base = git(project, "rev-parse", "HEAD")
    git(project, "checkout", "-q", "-b", "slower")
    slow_down_fused(project)
    git(project, "commit", "-qam", "slower")
    head = git(project, "rev-parse", "HEAD")
    git(project, "checkout", "-q", base)
    out = tmp_path / "confirm.json"
    run = subprocess.run([sys.executable, "-m", "relu2", "confirm", base, head, "--rounds", "3", "--device", "cpu",
                          "--cell", "fused:float32:65536:hot", "--cell", "eager:float32:65536:hot", "--out", str(out)],
                         cwd=project, capture_output=True, text=True, timeout=900,
                         env=dict(os.environ, RELU2_CACHE_DIR=str(tmp_path / "kernel-cache"), OMP_NUM_THREADS="1"))
    # One intra-op thread, as the bisect tests run: with two, a 2-core box with two busy processes
    # ran eager relu² of 65536 floats at 16 ms a call in 4 of 6 fresh processes (an OpenMP worker
    # waiting a timeslice for its core) and at 18 µs in the others; with one, 19-21 µs in all six.
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert (report["base"], report["head"], report["rounds"]) == (base, head, 3)
    assert report["instrument"] == base  # the ruler: the clone's own relu2/, clean at base (as compare.json names it)
    from relu2.records.confirmed import read_remeasurement

    assert len(read_remeasurement(out).cells) == 2  # what relu2 gate --confirmed reads
    by_impl = {c["impl"]: c for c in report["cells"]}
    for cell in by_impl.values():
        assert len(cell["base_rounds"]) == len(cell["head_rounds"]) == 3  # a figure per round and side
    ratio = {impl: (sorted(c["head_rounds"])[0] / sorted(c["base_rounds"])[-1]) for impl, c in by_impl.items()}
    assert ratio["fused"] > 5, report
    # eager, untouched, is judged by its rounds' medians, as the gate reads rounds
    eager = by_impl["eager"]
    assert 0.2 < statistics.median(eager["head_rounds"]) / statistics.median(eager["base_rounds"]) < 5, report
    assert git(project, "worktree", "list").count("\n") == 0  # the worktrees are gone


def test_a_kernel_that_cannot_run_here_is_said_and_fails_the_run(tmp_path):
    """The recipe's kernel declared for CUDA only, measured on the CPU: every cell n/a.  The run says
    so and exits 1, not 0 as if it had measured it (issue 31)."""
    toy = tmp_path / "toykernel"
    toy_repo(toy)
    source = toy / "toykernel.py"
    source.write_text(source.read_text().replace('description=', 'devices=("cuda",), description='))
    git(toy, "commit", "-qam", "CUDA only")
    harness = tmp_path / "harness"
    harness.mkdir()
    shutil.copy(ROOT / "asv.conf.json", harness / "asv.conf.json")
    (harness / "benchmarks").symlink_to(ROOT / "benchmarks")
    run = relu2_asv(harness, tmp_path, "run", "--repo", str(toy), "--machine", "ci", "--bench", "Grid.track_hot",
                    "HEAD^!", RELU2_BENCH_IMPLS="eager,toy,copy")
    if torch_has_cuda():
        pytest.skip("CUDA is here: the kernel runs")
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    assert "toy: every cell n/a (skipped) on this machine, so it was not measured" in run.stderr


def torch_has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_a_narrowed_run_leaves_the_tracked_results_alone_and_says_where_it_wrote(tmp_path):
    """The README's CPU tracking command under RELU2_BENCH_QUICK=1: asv would rewrite the tracked
    results/benchmarks.json with the quick grid's parameters; the run goes to .asv/narrowed/ (issue 31)."""
    project = tmp_path / "project"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(project)], check=True)
    run = relu2_asv(project, tmp_path, "run", "--bench", "Grid.track_hot", "--machine", "mybox", "--record-samples",
                    "--skip-existing-commits", "HEAD^!")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    narrowed = project / ".asv" / "narrowed" / "results"
    assert f"this run's results go to {narrowed}, not results" in run.stderr
    assert git(project, "status", "--porcelain") == ""  # results/benchmarks.json untouched, nothing new
    assert set(results_of(narrowed / "mybox")) == {git(project, "rev-parse", "HEAD")}
