"""Tracking as the README says: git refs wherever a commit is asked for, and relu2 asv run's preparation."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
import asv_fixture as fx  # noqa: E402

from relu2 import cli
from relu2.host import git  # noqa: E402
from relu2.runs import asv_run  # noqa: E402
from relu2.records.asv_results import resolve_commit  # noqa: E402
from relu2.vocab.errors import ResultsError


@pytest.fixture
def checkout(tmp_path) -> Path:
    """The fixture's git history checked out, with its asv results inside (as a project keeps results/)."""
    repo = tmp_path / "project"
    subprocess.run(["git", "clone", "-q", str(fx.BUNDLE), str(repo)], check=True)
    shutil.copytree(fx.RESULTS, repo / "results")
    subprocess.run(["git", "-C", str(repo), "tag", "v1", fx.COMMIT_1], check=True)
    return repo


def test_git_refs_name_commits_with_results(checkout):
    results = checkout / "results"
    assert resolve_commit(results, "main") == fx.COMMIT_3
    assert resolve_commit(results, "main~1") == fx.COMMIT_2
    assert resolve_commit(results, "HEAD~2") == fx.COMMIT_1 == resolve_commit(results, "v1")
    assert resolve_commit(results, fx.COMMIT_2[:7].upper()) == fx.COMMIT_2  # prefixes, any case
    with pytest.raises(ResultsError, match=r"no results for commit 'Main~9'"):  # the input, as typed
        resolve_commit(results, "Main~9")


def test_gate_plot_and_export_take_git_refs(checkout, tmp_path, capsys):
    results = str(checkout / "results")
    assert cli.main(["gate", "main~1", "main", "--results", results]) == 1  # the planted regression
    assert fx.PLANTED_LABEL in capsys.readouterr().out
    assert cli.main(["plot", results, "--commit", "main~1", "--out", str(tmp_path / "plots")]) == 0
    assert fx.COMMIT_2[:8] in (tmp_path / "plots" / "latency.svg").read_text()
    assert cli.main(["export", results, "--commit", "v1", "--out", str(tmp_path / "v1.csv")]) == 0
    assert {r["commit"] for r in csv.DictReader(open(tmp_path / "v1.csv"))} == {fx.COMMIT_1}


def test_relu2_asv_run_records_the_machine_and_points_at_torch(tmp_path, monkeypatch):
    machine_file = tmp_path / "asv-machine.json"
    name = asv_run.record_machine("ci-box", str(machine_file))
    data = json.loads(machine_file.read_text())
    assert name == "ci-box" and data["version"] == 1
    assert {"gpu", "driver", "cuda", "torch", "triton", "cpu", "ram", "machine"} <= set(data["ci-box"])
    import torch

    assert data["ci-box"]["torch"] == torch.__version__
    assert Path(asv_run.torch_site(), "torch").is_dir()


@pytest.mark.parametrize("missing, message", [
    ("config", "asv.conf.json not found"),
    ("torch", "torch is not importable"),
    ("virtualenv", "need the virtualenv package"),
])
def test_relu2_asv_run_refuses_in_one_line_before_building(missing, message, tmp_path, monkeypatch, capsys):
    import importlib.util

    monkeypatch.chdir(fx.FIXTURE_DIR.parents[1] if missing != "config" else tmp_path)
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name == missing:
            return None
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert cli.main(["asv", "run", "--machine", "x", "HEAD^!"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


@pytest.mark.parametrize("var, value, message", [
    ("RELU2_BENCH_SUITES", "Nope", "names no suite"),
    ("RELU2_TIMEOUT", "abc", "expected a positive number"),
    ("RELU2_ROUNDS", "0", "expected a whole number of rounds"),
    ("RELU2_ROUNDS", "2.5", "expected a whole number of rounds"),
])
def test_relu2_asv_run_refuses_a_bad_suite_variable_before_asv_starts(var, value, message, tmp_path, monkeypatch,
                                                                       capsys):
    monkeypatch.chdir(fx.FIXTURE_DIR.parents[1])
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv(var, value)
    assert cli.main(["asv", "run", "--machine", "x", "HEAD^!"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / ".asv-machine.json").exists()  # refused before anything is written


# --- issue 31: a run that could not measure an implementation says so -----------------------------


def _skip_every_cell_of(results: Path, impl: str) -> None:
    """Every cell of ``impl`` n/a (NaN, as asv stores a skipped cell) in every result file."""
    import itertools
    import math

    for path in (results / fx.MACHINE).glob("*-*.json"):
        data = json.loads(path.read_text())
        columns = data["result_columns"]
        for row in data["results"].values():
            entry = dict(zip(columns, row))
            if not entry.get("params") or entry.get("result") is None:
                continue
            for i, combo in enumerate(itertools.product(*entry["params"])):
                if combo[0] == repr(impl):
                    entry["result"][i] = math.nan
        path.write_text(json.dumps(data))


def test_an_implementation_never_measured_is_named_and_fails_the_run_that_asked_for_it(tmp_path, capsys,
                                                                                       monkeypatch):
    results = fx.copy_results(tmp_path / "results")
    _skip_every_cell_of(results, "triton")
    monkeypatch.delenv("RELU2_BENCH_IMPLS", raising=False)
    assert asv_run.reached(results, fx.MACHINE, since=0)["triton"] is False
    assert asv_run.reached(results, fx.MACHINE, since=0)["fused"] is True
    # The measured package's other kernels ran: said, and not a failure of the run.
    assert asv_run.say_never_measured(results, fx.MACHINE, 0, declared={"fused", "triton"}) is False
    assert "triton: every cell n/a" in capsys.readouterr().err
    # All the measured package has in the suites (a CUDA-only kernel on a CPU machine), or named: a failure.
    assert asv_run.say_never_measured(results, fx.MACHINE, 0, declared={"triton", "not-in-the-suites"}) is True
    monkeypatch.setenv("RELU2_BENCH_IMPLS", "eager,triton,copy")
    assert asv_run.say_never_measured(results, fx.MACHINE, 0, declared=set()) is True
    # Files older than the run are not this run's.
    assert asv_run.reached(results, fx.MACHINE, since=2**40) == {}


def test_a_narrowed_run_gets_a_results_folder_of_its_own(tmp_path, monkeypatch, capsys):
    base = tmp_path / "asv.conf.json"
    shutil.copy(fx.FIXTURE_DIR.parents[1] / "asv.conf.json", base)
    argv = ["run", "--machine", "m", "main~1..main"]
    monkeypatch.delenv("RELU2_BENCH_IMPLS", raising=False)
    monkeypatch.delenv("RELU2_BENCH_QUICK", raising=False)
    assert asv_run._narrowed(argv, str(base)) == argv  # the whole suites: the tracked folder
    monkeypatch.setenv("RELU2_BENCH_QUICK", "1")
    config = tmp_path / ".asv" / "narrowed" / "asv.conf.json"
    assert asv_run._narrowed(argv, str(base)) == ["run", "--config", str(config), *argv[1:]]
    conf = json.loads(config.read_text())
    assert conf["results_dir"] == str(tmp_path / ".asv" / "narrowed" / "results")
    assert conf["benchmark_dir"] == str(tmp_path / "benchmarks") and conf["repo"] == str(tmp_path / ".")
    assert "RELU2_BENCH_QUICK narrows the suites" in capsys.readouterr().err
    chosen = ["run", "--config", "mine.json", "HEAD^!"]
    assert asv_run._narrowed(chosen, str(base)) == chosen  # a results folder the user chose


@pytest.fixture
def instrument_repo(tmp_path) -> Path:
    """A scratch checkout of one commit: relu2/a.py (the instrument's folder) and docs/a.md (outside it)."""
    repo = tmp_path / "project"
    for path, text in (("relu2/a.py", "x = 1\n"), ("docs/a.md", "a\n")):
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True)
    return repo


def test_an_edited_instrument_is_named_apart_from_its_commit(instrument_repo, tmp_path):
    repo = instrument_repo
    sha = git.head(repo)
    paths = ("relu2",)
    assert git.state(repo, paths) == sha
    (repo / "docs" / "a.md").write_text("b\n")  # outside the instrument's folders
    assert git.state(repo, paths) == sha
    (repo / "relu2" / "a.py").write_text("x = 2\n")
    edited = git.state(repo, paths)
    assert edited.startswith(f"{sha}+dirty-")
    assert git.state(repo / "relu2", paths) == edited  # named from inside, the same
    (repo / "relu2" / "a.py").write_text("x = 3\n")
    assert git.state(repo, paths) not in (sha, edited)  # another edit, another instrument
    (repo / "relu2" / "a.py").write_text("x = 2\n")
    assert git.state(repo, paths) == edited  # the same content, the same name
    (repo / "relu2" / "b.py").write_text("")  # untracked
    assert git.state(repo, paths) not in (sha, edited)
    (repo / "relu2" / "b.py").unlink()
    (repo / "relu2" / "a.py").unlink()  # deleted
    assert git.state(repo, paths) not in (sha, edited)
    (tmp_path / "plain").mkdir()
    assert git.state(tmp_path / "plain") == "unknown"


def test_a_sweep_names_an_edited_kernel_apart_from_its_commit(instrument_repo, monkeypatch, tmp_path):
    """A sweep's rows record the state of the code it ran: an edit to the kernel sources is another
    commit (so a resume after it starts over), one to the docs is not."""
    from relu2.runs import sweep_job

    repo = instrument_repo
    (repo / "csrc").mkdir()
    (repo / "csrc" / "k.cu").write_text("// kernel\n")
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "two"], check=True)
    from relu2_impls import fused

    assert sweep_job.ENV_CSRC_DIR == fused.ENV_CSRC_DIR
    monkeypatch.delenv(sweep_job.ENV_CSRC_DIR, raising=False)
    sha = git.head(repo)
    assert sweep_job.measured_state(repo) == sha
    (repo / "docs" / "a.md").write_text("b\n")
    assert sweep_job.measured_state(repo) == sha
    (repo / "csrc" / "k.cu").write_text("// another kernel\n")
    edited = sweep_job.measured_state(repo)
    assert edited.startswith(f"{sha}+dirty-")
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "k.cu").write_text("// a planted kernel\n")
    monkeypatch.setenv(sweep_job.ENV_CSRC_DIR, str(planted))
    assert sweep_job.measured_state(repo).startswith(f"{edited}+csrc-")  # built from elsewhere: said too
    assert sweep_job.measured_state().startswith(git.head(Path(__file__).resolve().parents[1]))  # this package's checkout


def test_an_instrument_file_whose_name_is_not_utf8_is_named_too(instrument_repo):
    repo = instrument_repo
    sha = git.head(repo)
    odd = os.fsencode(str(repo / "relu2")) + b"/caf\xe9.py"
    with open(odd, "wb") as f:
        f.write(b"y = 1\n")
    first = git.state(repo, ("relu2",))
    assert first.startswith(f"{sha}+dirty-") and first != f"{sha}+dirty-unknown"
    with open(odd, "wb") as f:
        f.write(b"y = 2\n")
    assert git.state(repo, ("relu2",)) not in (sha, first)


def test_an_instrument_git_cannot_read_is_never_named_clean(instrument_repo, monkeypatch):
    repo = instrument_repo
    sha = git.head(repo)
    real = git.try_output
    monkeypatch.setattr(git, "try_output", lambda r, *a: None if a[0] == "status" else real(r, *a))
    assert git.state(repo, ("relu2",)) == f"{sha}+dirty-unknown"
