"""Nothing lost: interrupted sweeps resume, result files are written atomically, malformed ones are named."""

from __future__ import annotations

import collections
import functools
import json
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
import asv_fixture as fx  # noqa: E402

from relu2 import cli
from relu2.runs import asv_run
from relu2.measure import sweep  # noqa: E402
from relu2.host.files import atomic_write_text  # noqa: E402
from relu2.records.rows import read_csv, write_csv  # noqa: E402
from relu2.vocab.schema import grid_cells as default_cells  # noqa: E402
from relu2.measure.sweep import run_resumable  # noqa: E402
from relu2.measure.timing import Budget  # noqa: E402

FAST = Budget(samples=2, sample_ms=0.1, max_calls=8)
SIZES = [256, 512, 1024]  # one (dtype, shape) group each
MODES = ("hot", "launch")


class Counted:
    """relu², counting its calls by input size, raising KeyboardInterrupt on ``interrupt_at`` elements."""

    def __init__(self) -> None:
        self.calls: collections.Counter[int] = collections.Counter()
        self.interrupt_at: int | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls[x.numel()] += 1
        if x.numel() == self.interrupt_at:
            raise KeyboardInterrupt
        return torch.square(torch.relu(x))


@pytest.fixture
def counted(temporary_impl) -> Counted:
    fn = Counted()
    temporary_impl("counted", fn)
    return fn


def _resume(cells, checkpoint: Path, commit: str = "abc123", machine: str = "box"):
    return run_resumable(cells, MODES, "cpu", machine, commit, checkpoint, budget=FAST)


def _figures(rows):
    return [(r.impl, r.dtype, r.numel, r.mode) for r in rows]


def _expected(cells):
    return [(c.impl, c.dtype, c.numel, m) for c in cells for m in MODES]


# --- resumable sweeps ------------------------------------------------------------------------


def test_interrupted_sweep_keeps_finished_groups_and_resumes_with_the_rest(tmp_path, counted, capsys):
    cells = default_cells(["copy", "counted"], ["float32"], SIZES)
    checkpoint = tmp_path / "sweep.partial.csv"

    counted.interrupt_at = 512
    with pytest.raises(KeyboardInterrupt):
        _resume(cells, checkpoint)
    saved = read_csv(checkpoint)
    assert _figures(saved) == _expected([c for c in cells if c.numel == 256])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.partial.csv"]  # no temp file left

    counted.interrupt_at = None
    counted.calls.clear()
    capsys.readouterr()
    rows = _resume(cells, checkpoint)
    assert set(counted.calls) == {512, 1024}  # the finished group is not measured again
    assert "resuming: 1 of 3 groups already measured in" in capsys.readouterr().err
    assert _figures(rows) == _expected(cells)
    assert all(r.status == "ok" for r in rows)
    assert [r.median_s for r in rows[:len(saved)]] == [r.median_s for r in saved]  # taken as saved
    assert _figures(read_csv(checkpoint)) == _expected(cells)


def test_rows_follow_the_cells_order_across_groups(tmp_path, counted):
    by_size = default_cells(["counted", "copy"], ["float32"], [512, 256])
    interleaved = [by_size[0], by_size[2], by_size[1], by_size[3]]  # groups 512, 256, 512, 256
    rows = _resume(interleaved, tmp_path / "partial.csv")
    assert _figures(rows) == _expected(interleaved)
    again = _resume(interleaved, tmp_path / "partial.csv")  # everything resumed, same order
    assert _figures(again) == _expected(interleaved)


def test_group_missing_a_cell_is_measured_again(tmp_path, counted):
    checkpoint = tmp_path / "partial.csv"
    _resume(default_cells(["copy"], ["float32"], [256]), checkpoint)
    rows = _resume(default_cells(["copy", "counted"], ["float32"], [256]), checkpoint)
    assert counted.calls[256] > 0
    assert _figures(rows) == _expected(default_cells(["copy", "counted"], ["float32"], [256]))


@pytest.mark.parametrize("other", [{"commit": "def456"}, {"machine": "elsewhere"}])
def test_checkpoint_of_another_commit_or_machine_is_ignored(tmp_path, counted, capsys, other):
    cells = default_cells(["copy", "counted"], ["float32"], [256, 512])
    checkpoint = tmp_path / "partial.csv"
    _resume(cells, checkpoint)
    counted.calls.clear()
    capsys.readouterr()
    rows = _resume(cells, checkpoint, **other)
    assert set(counted.calls) == {256, 512}
    assert "warning: ignoring checkpoint" in capsys.readouterr().err
    assert {(r.machine, r.commit) for r in rows} == {(other.get("machine", "box"), other.get("commit", "abc123"))}
    assert {(r.machine, r.commit) for r in read_csv(checkpoint)} == {(r.machine, r.commit) for r in rows}


def test_checkpoint_of_other_modes_is_ignored(tmp_path, counted, capsys):
    cells = default_cells(["counted"], ["float32"], [256])
    checkpoint = tmp_path / "partial.csv"
    run_resumable(cells, ("hot",), "cpu", "box", "abc123", checkpoint, budget=FAST)
    counted.calls.clear()
    _resume(cells, checkpoint)
    assert counted.calls[256] > 0
    assert "timed in modes hot" in capsys.readouterr().err


def test_malformed_checkpoint_is_ignored_with_a_warning_naming_it(tmp_path, counted, capsys):
    checkpoint = tmp_path / "partial.csv"
    checkpoint.write_text("machine,commit\nhalf a li")
    rows = _resume(default_cells(["counted"], ["float32"], [256]), checkpoint)
    assert len(rows) == len(MODES) and counted.calls[256] > 0
    err = capsys.readouterr().err
    assert "ignoring unreadable checkpoint" in err and str(checkpoint) in err


# --- the CLI ---------------------------------------------------------------------------------


@pytest.fixture
def fast_cli(monkeypatch):
    """``relu2 sweep`` with a tiny timing budget (cmd_sweep looks run_resumable up at call time)."""
    monkeypatch.setattr(sweep, "run_resumable", functools.partial(sweep.run_resumable, budget=FAST))


def test_cli_sweep_writes_the_csv_and_removes_the_checkpoint(tmp_path, fast_cli):
    out = tmp_path / "out"
    code = cli.main(["sweep", "--sizes", "2^10", "--impl", "eager", "--dtype", "float32", "--modes", "hot",
                     "--out", str(out), "--no-progress"])
    assert code == 0
    assert [(r.impl, r.mode) for r in read_csv(out / "sweep.csv")] == [("eager", "hot"), ("copy", "hot")]
    assert not (out / "sweep.partial.csv").exists()
    assert [p.name for p in out.glob(".*")] == []  # no temporary file left, and no lock


def test_cli_sweep_interrupted_then_resumed(tmp_path, fast_cli, counted, capsys):
    out = tmp_path / "out"
    # In this process: the implementation raises KeyboardInterrupt where Ctrl-C would strike
    # (a worker process ignores SIGINT and leaves it to the sweep).
    argv = ["sweep", "--sizes", "256,512", "--impl", "counted", "--dtype", "float32", "--modes", "hot",
            "--out", str(out), "--no-progress", "--machine", "box", "--in-process"]
    counted.interrupt_at = 512
    assert cli.main(argv) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "same command again" in err and "sweep.partial.csv" in err
    assert not (out / "sweep.csv").exists()
    assert [r.numel for r in read_csv(out / "sweep.partial.csv")] == [256, 256]  # counted and copy

    counted.interrupt_at = None
    counted.calls.clear()
    assert cli.main(argv) == 0
    assert set(counted.calls) == {512}
    assert [(r.impl, r.numel) for r in read_csv(out / "sweep.csv")] == [
        ("counted", 256), ("copy", 256), ("counted", 512), ("copy", 512)]
    assert not (out / "sweep.partial.csv").exists()


# --- atomic writes ---------------------------------------------------------------------------


def _refuse_replace(monkeypatch):
    def refuse(src, dst):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(os, "replace", refuse)


def test_atomic_write_text_keeps_the_old_file_when_the_rename_fails(tmp_path, monkeypatch):
    path = tmp_path / "sweep.csv"
    path.write_text("old\n")
    _refuse_replace(monkeypatch)
    with pytest.raises(OSError, match="simulated"):
        atomic_write_text(path, "new\n")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["sweep.csv"]


def test_checkpoint_survives_a_failed_rewrite(tmp_path, counted, monkeypatch):
    checkpoint = tmp_path / "partial.csv"
    cells = default_cells(["counted"], ["float32"], [256, 512])
    _resume(cells[:1], checkpoint)
    before = checkpoint.read_bytes()
    _refuse_replace(monkeypatch)
    with pytest.raises(OSError, match="simulated"):
        _resume(cells, checkpoint)
    assert checkpoint.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["partial.csv"]


SAMPLES = [
    {"b": [1.5, None, float("inf")], "a": {"z": "ü", "y": [1, 2]}, "commit_hash": "abc"},
    {},
]


@pytest.mark.parametrize("data", SAMPLES)
@pytest.mark.parametrize("api_version", [None, 2])
@pytest.mark.parametrize("compact", [False, True])
def test_atomic_write_json_writes_what_asv_writes(tmp_path, data, api_version, compact):
    from asv import util

    util.write_json(str(tmp_path / "asv.json"), data, api_version, compact=compact)
    asv_run.atomic_write_json(str(tmp_path / "sub" / "relu2.json"), data, api_version, compact=compact)
    assert (tmp_path / "sub" / "relu2.json").read_bytes() == (tmp_path / "asv.json").read_bytes()
    assert data.get("version") is None  # the caller's dict is left alone, as asv does
    mode = (tmp_path / "asv.json").stat().st_mode & 0o777
    assert (tmp_path / "sub" / "relu2.json").stat().st_mode & 0o777 == mode


def test_atomic_write_json_keeps_the_old_file_when_the_rename_fails(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    path.write_text('{"old": 1}')
    _refuse_replace(monkeypatch)
    with pytest.raises(OSError, match="simulated"):
        asv_run.atomic_write_json(str(path), {"new": 2}, 2)
    assert path.read_text() == '{"old": 1}'
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_asv_writes_through_the_atomic_writer_only_while_relu2_asv_runs(tmp_path, monkeypatch):
    """A real asv command (``asv machine`` writes ~/.asv-machine.json with util.write_json)."""
    from asv import util

    original, atomic = util.write_json, asv_run.atomic_write_json
    used = []

    def spy(*args, **kw):
        used.append(args[0])
        return atomic(*args, **kw)

    monkeypatch.setattr(asv_run, "atomic_write_json", spy)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "asv.conf.json").write_text('{"version": 1, "project": "x", "repo": "."}')
    assert cli.main(["asv", "machine", "--yes", "--machine", "box"]) == 0
    assert used == [str(tmp_path / ".asv-machine.json")]
    assert "box" in json.loads((tmp_path / ".asv-machine.json").read_text())
    assert util.write_json is original  # restored after the command


def test_asv_subcommand_help_and_exit_status(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["asv", "--help"])
    assert e.value.code == 0
    help_text = capsys.readouterr().out
    assert "atomic" in help_text and "--skip-existing-commits" in help_text
    assert cli.main(["asv", "--", "--version"]) == 0
    assert "asv" in capsys.readouterr().out
    assert cli.main(["asv", "no-such-command"]) == 2  # argparse's usage error inside asv


def test_asv_modules_call_write_json_through_the_module():
    """The atomic writer only takes effect if asv never binds write_json by name."""
    import ast

    import asv

    root = Path(asv.__file__).parent
    for source in root.rglob("*.py"):
        tree = ast.parse(source.read_text(encoding="utf-8"))
        imported = [a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for a in node.names]
        assert "write_json" not in imported and "*" not in imported, source
    assert "util.write_json(path, data, self.api_version" in (root / "results.py").read_text()


# --- malformed result files ------------------------------------------------------------------


def test_export_of_a_truncated_result_file_names_it(tmp_path, capsys):
    results = fx.copy_results(tmp_path / "results")
    bad = fx.result_file(results, fx.COMMIT_2)
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])  # a write cut short
    assert cli.main(["export", str(results), "--out", str(tmp_path / "out.csv")]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "Traceback" not in err
    assert not (tmp_path / "out.csv").exists()


def test_plot_of_a_malformed_sweep_csv_names_it(tmp_path, capsys):
    good = tmp_path / "sweep.csv"
    write_csv(_resume(default_cells(["copy"], ["float32"], [256]), tmp_path / "p.csv"), good)
    good.write_text(good.read_text().replace(",256,", ",many,", 1))
    assert cli.main(["plot", str(good), "--out", str(tmp_path / "plots")]) == 2
    err = capsys.readouterr().err
    assert f"{good}:2: malformed row" in err


def test_a_checkpoint_cut_short_keeps_its_complete_rows(tmp_path, counted):
    checkpoint = tmp_path / "sweep.partial.csv"
    cells = default_cells(["counted"], ["float32"], SIZES)
    _resume(cells, checkpoint)
    text = checkpoint.read_text()
    checkpoint.write_text(text[: len(text) - 9])  # the last row's tail lost: a write cut short
    counted.calls.clear()
    rows = _resume(cells, checkpoint)
    assert set(counted.calls) == {SIZES[-1]}  # only the group whose last row was cut is measured again
    assert _figures(rows) == _expected(cells)


@pytest.mark.slow
def test_sigterm_ends_a_sweep_as_ctrl_c_does(tmp_path):
    """A kill (a CI job's timeout) leaves no lock and no traceback, keeps what was measured, exit 130."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "relu2", "sweep", "--device", "cpu", "--impl", "eager",
                             "--dtype", "float32,float16,bfloat16", "--sizes", "2^10,2^12,2^14,2^16,2^18",
                             "--modes", "hot", "--samples", "3", "--no-progress", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not (out / "sweep.partial.csv").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err and "sweep.partial.csv" in err, err
    assert not (out / ".relu2.lock").exists() and (out / "sweep.partial.csv").exists()
