"""Nothing a user types loses their files (issue 40): outputs never overwrite what exists or what the
repository ships, names that become paths stay names, and every refusal comes before anything is
built, measured or written."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from relu2 import cli
from relu2.records import compare_folder
from relu2.host import outputs

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
import asv_fixture as fx  # noqa: E402
from conftest import refused  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _digest(path: Path) -> str:
    """A file's hash, or a folder's over every file under it (names and contents)."""
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(path)).encode() + p.read_bytes())
    return h.hexdigest()


@pytest.fixture
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


# --- data loss -------------------------------------------------------------------------------------


def test_publish_never_empties_a_folder_the_repository_ships(at_root, capsys):
    before = _digest(ROOT / "docs")
    refused(["publish", "--", "--html-dir", "docs"], capsys, "docs", "tracked by git", "emptied")
    refused(["publish", "--", "--html-dir=."], capsys, "would delete")
    assert _digest(ROOT / "docs") == before


def test_publish_refuses_a_folder_of_someone_elses_files(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    conf = tmp_path / "asv.conf.json"
    conf.write_text(json.dumps({"version": 1, "project": "relu2-bench", "repo": str(ROOT),
                                "results_dir": str(fx.copy_results(tmp_path / "results")),
                                "html_dir": str(tmp_path / "html")}))
    # every spelling asv's parser takes, not only the two written out in its help
    for spelled in (["--html-dir", str(mine)], [f"--html-dir={mine}"], ["-o", str(mine)], [f"-o{mine}"],
                    [f"-o={mine}"], ["--html", str(mine)], [f"--html-d={mine}"]):
        refused(["publish", "--config", str(conf), "--", *spelled], capsys, "holds files of its own")
    refused(["publish", "--config", str(conf), "--", "-o.", "--no-pull"], capsys, "would delete")
    refused(["publish", "--config", str(conf), "--", "--config", str(conf)], capsys, "relu2 publish --config")
    refused(["publish", "--config", str(conf), "--", "--bogus"], capsys, "unrecognized arguments: --bogus")
    assert (mine / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("target", ["README.md", "results/benchmarks.json", "relu2/noise_model.json"])
def test_export_never_overwrites_a_shipped_file(target, at_root, capsys):
    before = _digest(ROOT / target)
    refused(["export", "results", "--machine", "cpu-2core", "--out", target], capsys, target, "tracked by git",
            "--force")
    assert _digest(ROOT / target) == before


def test_export_overwrites_an_existing_file_only_when_told(tmp_path, capsys):
    out = tmp_path / "rows.csv"
    out.write_text("mine\n")
    refused(["export", str(fx.RESULTS), "--out", str(out)], capsys, "exists", "--force")
    assert out.read_text() == "mine\n"
    assert cli.main(["export", str(fx.RESULTS), "--out", str(out), "--force"]) == 0
    assert out.read_text().startswith("machine,commit")


def test_confirm_refuses_a_shipped_file_before_measuring(at_root, capsys):
    before = _digest(ROOT / "README.md")
    refused(["confirm", "HEAD", "HEAD", "--cell", "eager:float32:1024:hot", "--device", "cpu", "--out", "README.md"],
            capsys, "README.md", "tracked by git")
    assert _digest(ROOT / "README.md") == before


@pytest.mark.parametrize("command", [["sweep", "--device", "cpu", "--impl", "eager"], ["plot", "results"]])
def test_sweep_and_plot_never_replace_the_shipped_plots(command, at_root, capsys):
    before = _digest(ROOT / "docs" / "img" / "h200")
    refused([*command, "--out", "docs/img/h200"], capsys, "docs/img/h200", "tracked by git")
    assert _digest(ROOT / "docs" / "img" / "h200") == before


def test_plot_into_a_folder_of_other_files_needs_force(tmp_path, capsys):
    out = tmp_path / "plots"
    out.mkdir()
    (out / "mine.png").write_bytes(b"not a plot of ours")
    refused(["plot", str(fx.RESULTS), "--out", str(out)], capsys, "not empty", "--force")
    assert (out / "mine.png").read_bytes() == b"not a plot of ours"


def test_noise_learn_refuses_the_shipped_model_without_force(at_root, capsys):
    before = _digest(ROOT / "relu2" / "noise_model.json")
    refused(["noise", "learn", "--same-box", "docs/aa/compare-cpu-quiet/aa-04", "--out", "relu2/noise_model.json"],
            capsys, "tracked by git", "--force")
    assert _digest(ROOT / "relu2" / "noise_model.json") == before


def test_noise_learn_refuses_a_file_that_holds_no_model(tmp_path, at_root, capsys):
    other = tmp_path / "notes.json"
    other.write_text("{}")
    refused(["noise", "learn", "--same-box", "docs/aa/compare-cpu-quiet/aa-04", "--out", str(other)], capsys,
            "exists", "--force")
    assert other.read_text() == "{}"


@pytest.mark.parametrize("argv", [
    ["compare", "HEAD", "HEAD", "--machine", "../../escaped"],
    ["confirm", "HEAD", "HEAD", "--cell", "eager:float32:1024:hot", "--machine", "a/b"],
])
def test_a_machine_name_is_a_name_not_a_path(argv, at_root, tmp_path, capsys):
    refused([*argv, "--out", str(tmp_path / "out")], capsys, "a name, not a path")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("machine", ["../../../docs", ".", "a/b"])
def test_asv_run_refuses_a_machine_name_that_is_a_path(machine, at_root, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    refused(["asv", "run", "--machine", machine, "HEAD^!"], capsys, "a name, not a path")
    assert list(tmp_path.iterdir()) == []


def test_asv_run_repo_refuses_a_project_name_that_is_a_path(at_root, tmp_path, capsys):
    # the measured checkout's [project] name becomes .asv/<name>/ here: ".." would write ./asv.conf.json
    other = tmp_path / "other"
    other.mkdir()
    (other / "pyproject.toml").write_text('[project]\nname = ".."\n')
    subprocess.run(["git", "init", "-q", str(other)], check=True)
    before = _digest(ROOT / "asv.conf.json")
    refused(["asv", "run", "--repo", str(other), "HEAD^!"], capsys, "[project] name", "a name, not a path")
    assert _digest(ROOT / "asv.conf.json") == before


def test_name_part_takes_plain_names():
    assert outputs.name_part("h200-j") == "h200-j"
    assert outputs.name_part("cpu_2core.local") == "cpu_2core.local"


# --- the documented default works in a fresh clone ---------------------------------------------------


def test_compare_default_folder_is_made_on_the_way(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    default = compare_folder.default_out()
    assert not default.parent.exists()
    assert outputs.claim_dir(default) == default  # .asv/compare/ is made when the compare writes
    assert not default.parent.exists()


# --- refused before anything is written -----------------------------------------------------------------


@pytest.mark.parametrize("setting", [
    ("--noise-model", "/nonexistent.json"),
    ("RELU2_NOISE_MODEL", "/nonexistent.json"),
    ("RELU2_BENCH_IMPLS", "nosuch"),
    ("RELU2_BENCH_SUITES", "nosuch"),
    ("RELU2_BENCH_QUICK", "abc"),
])
def test_compare_refuses_bad_input_before_writing_anything(setting, at_root, tmp_path, capsys, monkeypatch):
    name, value = setting
    argv = ["compare", "HEAD", "HEAD", "--device", "cpu", "--out", str(tmp_path / "c")]
    if name.startswith("--"):
        argv += [name, value]
    else:
        monkeypatch.setenv(name, value)
    refused(argv, capsys, value if name != "RELU2_BENCH_QUICK" else "RELU2_BENCH_QUICK")
    assert not (tmp_path / "c").exists()


def test_compare_of_a_commit_older_than_the_interface_says_why(at_root, tmp_path, capsys):
    first = subprocess.run(["git", "rev-list", "--max-parents=0", "HEAD"], cwd=ROOT, capture_output=True,
                           text=True).stdout.split()[0]
    refused(["compare", first, "HEAD", "--device", "cpu", "--out", str(tmp_path / "c")], capsys,
            first[:8], "predates the implementations interface")
    assert not (tmp_path / "c").exists()


def test_bisect_refuses_a_state_file_it_cannot_write_before_step_zero(at_root, capsys):
    refused(["bisect", "HEAD~2", "HEAD", "--cell", "eager:float32:1024:hot", "--device", "cpu",
             "--state", "/proc/relu2-bisect-state.json"], capsys, "--state", "/proc")


def test_confirm_refuses_a_report_of_other_commits(at_root, tmp_path, capsys):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"base": {"commit": "0" * 40}, "head": {"commit": head},
                                  "regressions": [{"benchmark": "bench_relu2.Grid.track_hot",
                                                   "params": {"impl": "eager", "dtype": "float32", "numel": "1024"}}]}))
    refused(["confirm", "HEAD", "HEAD", "--from-gate", str(report), "--device", "cpu"], capsys,
            "judged base 00000000", "--cell")


@pytest.mark.parametrize("argv", [
    ["sweep", "--samples", "99999999999999999999", "--out", "OUT"],
    ["confirm", "HEAD", "HEAD", "--cell", "eager:float32:1024:hot", "--rounds", "99999999999"],
    ["bisect", "HEAD~1", "HEAD", "--cell", "eager:float32:1024:hot", "--budget", "99999999999999"],
    ["compare", "HEAD", "HEAD", "--rounds", "21"],
    ["counters", "--launches", "1000", "--out", "OUT"],
])
def test_counts_no_run_could_finish_are_refused(argv, tmp_path, capsys):
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    refused(argv, capsys, "at most")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, said", [
    (["--bench", "nosuch", "HEAD^!"], "matches no benchmark"),
    (["--python", "3.99", "HEAD^!"], "no such interpreter"),
    (["HEAD..HEAD"], "holds no commit"),
    (["--steps", "abc", "HEAD^!"], "--steps"),
])
def test_asv_run_refuses_bad_input_before_writing_anything(args, said, at_root, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    narrowed = ROOT / ".asv" / "narrowed" / "asv.conf.json"
    before = narrowed.stat().st_mtime_ns if narrowed.exists() else None
    refused(["asv", "run", "--machine", "box", *args], capsys, said)
    assert list(tmp_path.iterdir()) == []  # no ~/.asv-machine.json
    assert (narrowed.stat().st_mtime_ns if narrowed.exists() else None) == before


def test_inspect_on_a_machine_without_cuda_writes_nothing(at_root, tmp_path, capsys, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("there is a GPU here")
    monkeypatch.setenv("HOME", str(tmp_path))
    refused(["inspect", "eager", "--shape", "4096", "--device", "cuda"], capsys, "--device cuda")
    assert list(tmp_path.iterdir()) == []


# --- tracebacks and quiet acceptance --------------------------------------------------------------------


def test_plot_into_a_folder_it_cannot_write_is_one_line(capsys):
    refused(["plot", str(fx.RESULTS), "--out", "/proc/relu2-plots"], capsys, "/proc", "not writable")


def test_gate_of_a_compare_folder_refuses_a_results_folder_too(capsys):
    refused(["gate", "--compare", "somewhere", "--results", "results"], capsys, "--results does not go with it")


@pytest.mark.parametrize("option", ["--commit", "--machine"])
def test_an_empty_filter_is_refused_not_ignored(option, tmp_path, capsys):
    refused(["export", str(fx.RESULTS), option, "", "--out", str(tmp_path / "x.csv")], capsys, f"empty {option}")
    assert not (tmp_path / "x.csv").exists()


def test_build_refuses_a_max_jobs_that_is_no_count(capsys, monkeypatch):
    monkeypatch.setenv("MAX_JOBS", "abc")
    refused(["build"], capsys, "MAX_JOBS='abc'")


def test_version_prints_the_version(capsys):
    import relu2

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"relu2 {relu2.__version__}"


def test_a_sweep_stopped_while_writing_its_outputs_is_resumed_by_the_same_command(tmp_path):
    """sweep.csv and plots are written before the checkpoint is dropped, and a kill can leave an atomic
    write's temporary file: the folder is still the stopped sweep's own, and nothing else is."""
    from relu2.runs import sweep_job
    from relu2.vocab.errors import UsageError

    stopped = tmp_path / "stopped"
    stopped.mkdir()
    for name in ("sweep.partial.csv", "sweep.csv", "latency.png", "latency.svg", ".sweep.partial.csv.x1y2.tmp"):
        (stopped / name).write_text("")
    assert outputs.claim_dir(stopped, resume=sweep_job.resumable) == stopped
    killed = tmp_path / "killed-at-its-first-checkpoint"
    killed.mkdir()
    (killed / ".sweep.partial.csv.x1y2.tmp").write_text("")
    assert outputs.claim_dir(killed, resume=sweep_job.resumable) == killed
    (stopped / "notes.txt").write_text("mine")
    finished = tmp_path / "finished"
    finished.mkdir()
    for name in ("sweep.csv", "latency.png"):
        (finished / name).write_text("")
    for folder in (stopped, finished):
        with pytest.raises(UsageError, match="not empty; name a new folder, or --force"):
            outputs.claim_dir(folder, resume=sweep_job.resumable)
