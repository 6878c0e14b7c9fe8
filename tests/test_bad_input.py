"""Bad input gets one clear line on stderr, exit 2, and nothing written."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

import relu2
from relu2 import cli
from relu2.measure import sweep
from relu2.measure.timing import MAX_CPU_SETS, cpu_rotation_sets

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
import asv_fixture as fx  # noqa: E402
from conftest import refused  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

NO_GPU = not torch.cuda.is_available()


@pytest.mark.parametrize("token", ["0", "-5", "2^99", "2^-1", "1.5", "0x10", "4Q"])
def test_a_bad_size_is_named_with_the_forms_accepted(token, tmp_path, capsys):
    out = tmp_path / "out"
    line = refused(["sweep", "--sizes", f"2^10,{token}", "--out", str(out)], capsys, repr(token))
    assert "2^20" in line or "2^40" in line
    assert not out.exists()


def test_no_sizes_at_all_isrefused(tmp_path, capsys):
    refused(["sweep", "--sizes", ",", "--out", str(tmp_path / "out")], capsys, "no sizes")
    assert not (tmp_path / "out").exists()


def test_a_size_that_cannot_fit_is_refused_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "out"
    refused(["sweep", "--device", "cpu", "--sizes", "2^39", "--impl", "eager", "--out", str(out)], capsys,
             "549755813888 elements", "needs about")
    assert not out.exists()


def test_tiny_sizes_run_and_the_cpu_cold_rotation_is_bounded(tmp_path):
    assert cpu_rotation_sets(set_bytes=8, cache_bytes=300 << 20, free_bytes=8 << 30) == MAX_CPU_SETS
    assert cpu_rotation_sets(set_bytes=2 << 30, cache_bytes=300 << 20, free_bytes=8 << 30) == 1
    assert cpu_rotation_sets(set_bytes=64 << 20, cache_bytes=300 << 20, free_bytes=1 << 30) == 4  # memory-bound
    code = cli.main(["sweep", "--device", "cpu", "--sizes", "1,16", "--impl", "eager", "--dtype", "float32",
                     "--modes", "cold", "--samples", "2", "--sample-ms", "0.2", "--no-progress", "--in-process",
                     "--out", str(tmp_path / "out")])
    assert code == 0


@pytest.mark.skipif(not NO_GPU, reason="there is a GPU here")
@pytest.mark.parametrize("command", ["check", "info", "sweep"])
def test_cuda_asked_for_without_a_gpu(command, tmp_path, capsys):
    argv = [command, "--device", "cuda"] + (["--out", str(tmp_path / "out")] if command == "sweep" else [])
    refused(argv, capsys, "--device cuda", "torch.cuda.is_available() is False")
    assert not (tmp_path / "out").exists()


def test_the_copy_reference_is_not_relu2(capsys):
    refused(["check", "--impl", "copy"], capsys, "copy is a reference, not relu²")
    with pytest.raises(ValueError, match="reference"):
        relu2.relu_squared(torch.ones(4), impl="copy")
    with pytest.raises(ValueError, match="reference"):
        relu2.check_agreement("copy", torch.ones(4))


def test_an_implementation_named_that_cannot_run_here(capsys, tmp_path):
    if not NO_GPU:
        pytest.skip("triton runs here")
    refused(["check", "--impl", "triton", "--device", "cpu"], capsys, "cannot run here", "triton")
    refused(["sweep", "--impl", "triton", "--device", "cpu", "--sizes", "2^10", "--no-progress",
              "--out", str(tmp_path / "out")], capsys, "cannot run here", "triton")
    assert not (tmp_path / "out" / "sweep.csv").exists()


@pytest.mark.parametrize("x, what", [(torch.arange(4), "torch.int64"), ([1.0, -2.0], "list"),
                                     (torch.ones(2, dtype=torch.bool), "torch.bool")])
def test_check_agreement_names_a_bad_input(x, what):
    with pytest.raises(TypeError, match=what):
        relu2.check_agreement("eager", x)


def test_a_second_sweep_into_the_same_folder_isrefused(tmp_path, capsys):
    out = tmp_path / "out"
    with sweep.locked(out, "relu2 sweep (the first)"):
        refused(["sweep", "--device", "cpu", "--impl", "eager", "--sizes", "2^10", "--no-progress",
                  "--out", str(out)], capsys, "is in use by pid", "relu2 sweep (the first)")
    assert sorted(p.name for p in out.iterdir()) == []  # the lock file goes with its holder


def test_a_machine_folder_without_results_is_no_machine(tmp_path, capsys):
    results = fx.copy_results(tmp_path / "results")
    (results / "empty-box").mkdir()
    shutil.copy(results / fx.MACHINE / "machine.json", results / "empty-box" / "machine.json")
    assert cli.main(["gate", fx.COMMIT_1[:8], fx.COMMIT_2[:8], "--results", str(results),
                     "--allow-missing", fx.FIXED_AT_2]) == 0


def test_an_unwritable_output_is_named_not_its_temporary_file(tmp_path, capsys):
    line = refused(["export", str(fx.RESULTS), "--out", "/proc/relu2-export.csv"], capsys, "/proc/relu2-export.csv")
    assert ".tmp" not in line


def test_binary_garbage_given_to_plot_is_named(tmp_path, capsys):
    garbage = tmp_path / "garbage.csv"
    garbage.write_bytes(bytes(range(256)) * 16)
    refused(["plot", str(garbage), "--out", str(tmp_path / "plots")], capsys, str(garbage))
    assert not (tmp_path / "plots").exists()


# --- issue 19: nothing silent ------------------------------------------------------------------


@pytest.mark.parametrize("option, value", [("--sample-ms", "inf"), ("--sample-ms", "nan"), ("--sample-ms", "-1"),
                                           ("--timeout", "inf"), ("--samples", "0")])
def test_a_number_that_times_nothing_is_refused_when_parsed(option, value, tmp_path, capsys):
    out = tmp_path / "o1"
    refused(["sweep", "--device", "cpu", "--impl", "eager", option, value, "--out", str(out)], capsys,
             option, repr(value))
    assert not out.exists()


@pytest.mark.parametrize("command", [["sweep", "--device", "cpu"], ["plot", str(fx.RESULTS)]])
def test_an_empty_output_folder_isrefused(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    refused([*command, "--out", ""], capsys, "--out", "''")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_refused_sweep_leaves_nothing_and_a_finished_one_no_lock(tmp_path, capsys):
    out = tmp_path / "o1"
    if NO_GPU:  # refused after the workers report: still nothing written
        refused(["sweep", "--impl", "triton", "--device", "cpu", "--sizes", "2^10", "--no-progress",
                  "--out", str(out)], capsys, "cannot run here", "triton")
        assert not out.exists()
    assert cli.main(["sweep", "--device", "cpu", "--impl", "eager", "--dtype", "float32", "--sizes", "2^10",
                     "--modes", "hot", "--samples", "2", "--sample-ms", "0.2", "--no-progress", "--in-process",
                     "--out", str(out)]) == 0
    assert not (out / ".relu2.lock").exists()


@pytest.mark.parametrize("value", ["abc", "-5", "nan", "inf", "0"])
def test_a_bad_relu2_timeout_is_refused_by_sweep(value, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RELU2_TIMEOUT", value)
    out = tmp_path / "o1"
    refused(["sweep", "--device", "cpu", "--impl", "eager", "--sizes", "2^10", "--no-progress", "--out", str(out)],
             capsys, f"RELU2_TIMEOUT={value!r}")
    assert not out.exists()


def test_the_gate_echoes_a_bad_floor_as_typed(capsys):
    refused(["gate", fx.COMMIT_2[:8], fx.COMMIT_3[:8], "--results", str(fx.RESULTS), "--floor-us", "-5"], capsys,
             "--floor-us", "'-5'")


def test_a_bug_is_not_unusable_input(monkeypatch, tmp_path):
    from relu2.show import plot

    def broken(*args, **kwargs):
        raise ValueError("a bug in plotting")

    monkeypatch.setattr(plot, "plot_all", broken)
    with pytest.raises(ValueError, match="a bug in plotting"):
        cli.main(["plot", str(fx.RESULTS), "--out", str(tmp_path / "plots")])
    assert cli._is_usage_error(relu2.vocab.errors.UsageError("bad input"))
    assert not cli._is_usage_error(OSError("a bug")) and not cli._is_usage_error(KeyError("a bug"))


# --- issue 31: tracebacks for bad input become one line ---------------------------------------------


def test_plot_into_a_file_isrefused(tmp_path, capsys):
    results = fx.copy_results(tmp_path / "results")
    target = tmp_path / "a-file"
    target.write_text("kept\n")
    for out in (target, target / "below"):
        refused(["plot", str(results), "--out", str(out)], capsys, "not a folder", str(out))
    assert target.read_text() == "kept\n"


def test_inspect_of_an_input_the_device_cannot_hold_isrefused(capsys):
    refused(["inspect", "eager", "--shape", "1048576x1048576", "--device", "cpu"], capsys,
             "1048576x1048576", "needs about")


def _asv_config(tmp_path: Path, results: Path) -> Path:
    conf = tmp_path / "asv.conf.json"
    conf.write_text(json.dumps({"version": 1, "project": "p", "project_url": "https://example.invalid", "repo": ".",
                                "branches": ["main"], "results_dir": str(results), "html_dir": str(tmp_path / "html")}))
    return conf


def test_publish_without_results_or_with_an_option_asv_refuses_is_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    refused(["publish", "--config", str(_asv_config(tmp_path, tmp_path / "empty"))], capsys,
             "nothing to publish", "benchmarks.json")
    conf = _asv_config(tmp_path, fx.copy_results(tmp_path / "results"))
    refused(["publish", "--config", str(conf), "--", "--bogus-option"], capsys,
             "asv publish", "unrecognized arguments: --bogus-option")
    assert not (tmp_path / "html").exists()


def test_asv_run_of_a_bad_ref_is_one_line_and_records_no_machine(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # asv's machine file is ~/.asv-machine.json
    monkeypatch.chdir(fx.FIXTURE_DIR.parents[1])
    refused(["asv", "run", "--machine", "nosuchbox", "no-such-ref..HEAD"], capsys,
             "'no-such-ref..HEAD' is not a range of commits", "bad revision")
    assert "rev-list" not in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("machine_file", [None, '{"nosuchbox": {"machine": "nosuchbox"', "[]", '{"a": 1}'])
def test_asv_run_refuses_an_unbalanced_range_or_a_damaged_machine_file_in_one_line(tmp_path, capsys, monkeypatch,
                                                                                  machine_file):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(fx.FIXTURE_DIR.parents[1])
    if machine_file is None:
        refused(["asv", "run", "--machine", "nosuchbox", "HEAD~1..HEAD'"], capsys, "not a range of commits",
                "No closing quotation")
        assert list(tmp_path.iterdir()) == []
        return
    (tmp_path / ".asv-machine.json").write_text(machine_file)  # cut short by a kill, or not asv's
    refused(["asv", "run", "--machine", "nosuchbox", "HEAD~1..HEAD"], capsys, ".asv-machine.json", "mend or remove it")
    assert (tmp_path / ".asv-machine.json").read_text() == machine_file


# --- issue 31, item 3: a reader never exits 0 for a folder it could not read ---------------------


def _garbage(results: Path, how: str) -> Path:
    path = fx.result_file(results, fx.COMMIT_2)
    text = path.read_text()
    path.write_text(text[: len(text) // 2] if how == "truncated" else "not json at all \x00\x01")
    return path


@pytest.mark.parametrize("how", ["truncated", "garbage"])
def test_publish_export_and_gate_refuse_a_broken_result_file(tmp_path, capsys, how):
    results = fx.copy_results(tmp_path / "results")
    bad = _garbage(results, how)
    conf = json.loads((ROOT / "asv.conf.json").read_text())
    conf.update(results_dir=str(results), html_dir=str(tmp_path / "html"), repo=str(ROOT))
    (tmp_path / "asv.conf.json").write_text(json.dumps(conf))
    refused(["publish", "--config", str(tmp_path / "asv.conf.json")], capsys, bad.name)
    assert not (tmp_path / "html").exists()  # nothing written
    refused(["export", str(results), "--out", str(tmp_path / "x.csv")], capsys, bad.name)
    assert not (tmp_path / "x.csv").exists()
    refused(["gate", fx.COMMIT_1[:8], fx.COMMIT_3[:8], "--results", str(results)], capsys, bad.name)


def test_export_of_a_folder_with_no_machine_isrefused(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    shutil.copy(fx.RESULTS / "benchmarks.json", tmp_path / "empty" / "benchmarks.json")
    refused(["export", str(tmp_path / "empty"), "--out", str(tmp_path / "x.csv")], capsys, "no machine")
    assert not (tmp_path / "x.csv").exists()


def test_noise_check_of_a_box_that_is_not_there_isrefused(capsys):
    refused(["noise", "check", str(ROOT / "docs/aa/results"), "--exclude-box", "nosuch"], capsys,
             "'nosuch' names no box")
