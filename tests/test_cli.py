"""The console script as a user runs it: help, check, sweep, plot, export and gate exit codes."""

import csv
import os
import sys
from pathlib import Path

import pytest
import torch

import relu2
from relu2 import cli

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
import asv_fixture as fx  # noqa: E402

SUBCOMMANDS = ("info", "check", "sweep", "plot", "export", "publish", "gate", "asv", "build")


def squares_everything(x):
    """Not relu²: it squares negatives too (module level, so a sweep's worker process can run it)."""
    return x * x


@pytest.fixture
def wrong_impl():
    relu2.register("squares_everything", squares_everything)
    yield "squares_everything"
    relu2.unregister("squares_everything")


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_explains_itself(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main([command, "--help"])
    assert exit_.value.code == 0
    assert len(capsys.readouterr().out) > 200


@pytest.mark.parametrize("text, numel", [("4096", 4096), ("2^20", 1 << 20), ("64K", 65536), ("16M", 1 << 24)])
def test_sizes_read_as_a_kernel_engineer_writes_them(text, numel):
    assert cli.parse_size(text) == numel


def test_a_bad_size_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        cli.main(["sweep", "--sizes", "lots", "--out", "x"])
    assert "not a size: 'lots'" in capsys.readouterr().err


def test_info_lists_every_implementation(capsys):
    assert cli.main(["info", "--no-bandwidth", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    for name in ("eager", "compile", "compile_dynamic", "fused", "triton", "copy"):
        assert name in out


def test_check_passes_on_correct_implementations(capsys):
    assert cli.main(["check", "--impl", "eager,fused", "--dtype", "float32,bfloat16", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "fused" in out and "FAIL" not in out


def test_check_exits_1_on_a_wrong_implementation(wrong_impl, capsys):
    assert cli.main(["check", "--impl", f"eager,{wrong_impl}", "--dtype", "float32", "--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert f"FAIL {wrong_impl} float32" in out and "ULP" in out


def test_check_refuses_an_unknown_implementation(capsys):
    assert cli.main(["check", "--impl", "nope"]) == 2
    assert "unknown implementation(s): nope" in capsys.readouterr().err


def test_sweep_over_two_sizes_writes_csv_and_plots(tmp_path, capsys):
    out = tmp_path / "sweep"
    args = ["sweep", "--device", "cpu", "--impl", "eager,fused", "--dtype", "float32", "--sizes", "2^10,2^12",
            "--modes", "hot,launch", "--no-progress", "--out", str(out)]
    assert cli.main(args) == 0
    rows = list(csv.DictReader(open(out / "sweep.csv")))
    cells = {(r["impl"], r["numel"], r["mode"]) for r in rows}
    assert cells == {(i, n, m) for i in ("eager", "fused", "copy") for n in ("1024", "4096") for m in ("hot", "launch")}
    assert all(r["status"] == "ok" and float(r["median_s"]) > 0 for r in rows)
    for plot in ("latency", "bandwidth", "speedup"):
        assert (out / f"{plot}.png").stat().st_size > 0 and (out / f"{plot}.svg").stat().st_size > 0
    assert "vs eager" in capsys.readouterr().out


def test_sweep_records_a_wrong_implementation_as_failed(wrong_impl, tmp_path):
    out = tmp_path / "sweep"
    args = ["sweep", "--device", "cpu", "--impl", f"eager,{wrong_impl}", "--dtype", "float32", "--sizes", "2^10",
            "--modes", "hot", "--no-progress", "--out", str(out)]
    assert cli.main(args) == 1
    rows = {r["impl"]: r for r in csv.DictReader(open(out / "sweep.csv"))}
    assert rows[wrong_impl]["status"] == "failed" and rows[wrong_impl]["median_s"] == "nan"
    assert "differ" in rows[wrong_impl]["reason"]
    assert rows["eager"]["status"] == "ok"


def test_sweep_refuses_cuda_without_a_gpu(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("there is a GPU here")
    assert cli.main(["sweep", "--device", "cuda", "--out", str(tmp_path)]) == 2
    assert "torch.cuda.is_available() is False" in capsys.readouterr().err


def test_plot_and_export_from_the_fixture_results(tmp_path):
    results = fx.copy_results(tmp_path / "results")
    assert cli.main(["plot", str(results), "--out", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "latency.png").exists()
    assert cli.main(["export", str(results), "--out", str(tmp_path / "all.csv")]) == 0
    statuses = {r["status"] for r in csv.DictReader(open(tmp_path / "all.csv"))}
    assert statuses == {"ok", "failed", "skipped"}


def test_gate_exit_codes_from_the_command_line(tmp_path, capsys):
    results = fx.copy_results(tmp_path / "results")
    assert cli.main(["gate", fx.COMMIT_2[:8], fx.COMMIT_3[:8], "--results", str(results)]) == 1
    assert "fused" in capsys.readouterr().out
    assert cli.main(["gate", fx.COMMIT_1[:8], fx.COMMIT_2[:8], "--results", str(results),
                     "--allow-missing", fx.FIXED_AT_2]) == 0
    assert cli.main(["gate", fx.COMMIT_2[:8], fx.COMMIT_2[:8], "--results", str(results)]) == 2  # one commit
    assert cli.main(["gate", "0000000", fx.COMMIT_2[:8], "--results", str(results)]) == 2


@pytest.mark.parametrize("unbuffered", ["", "1"])
@pytest.mark.parametrize("reads", [0, 1])
def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path, unbuffered, reads):
    # `relu2 export results | head -1`: the pipe closes before the CSV is written.  Unbuffered
    # (PYTHONUNBUFFERED=1), the pipe took part of one write and the rest was dropped: exit 0.
    import subprocess

    results = fx.copy_results(tmp_path / "results")
    proc = subprocess.Popen([sys.executable, "-m", "relu2.cli", "export", str(results)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": unbuffered})
    for _ in range(reads):
        proc.stdout.readline()
    proc.stdout.close()  # the reader is gone
    err = proc.stderr.read().decode()
    assert proc.wait() == 141 and "Traceback" not in err, err


def test_confirm_names_a_flagged_summary_it_cannot_measure(tmp_path, capsys):
    # Implementations.track_fused is a mean over Grid cells: confirm re-measures cells, so it must say
    # it left the summary alone, not that the report flags nothing.
    report = tmp_path / "gate.json"
    report.write_text('{"regressions": [{"benchmark": "bench_relu2.Implementations.track_fused", "params": {}}]}')
    assert cli.main(["confirm", "HEAD~1", "HEAD", "--from-gate", str(report)]) == 1  # work it could not do
    out, err = capsys.readouterr()
    assert "not re-measured: Implementations.track_fused" in err and "the gate still fails on it" in err
    assert "flags no cell" in out


def test_confirm_refuses_a_gate_report_whose_sides_are_not_objects(tmp_path, capsys):
    report = tmp_path / "gate.json"
    report.write_text('{"regressions": [], "base": "x"}')
    assert cli.main(["confirm", "HEAD~1", "HEAD", "--from-gate", str(report)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a relu2 gate JSON report (its base is not an object)" in err[0]


def test_publish_without_a_configuration_is_one_line(tmp_path, capsys):
    assert cli.main(["publish", "--config", str(tmp_path / "nope.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope.json" in err[0]
