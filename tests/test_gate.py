"""The regression gate over asv results: planted and edited regressions, failures, unusable input."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
import asv_fixture as fx  # noqa: E402

from relu2.asv_results import ResultsError, load_records  # noqa: E402
from relu2.gate import GateInputError, GateReport, format_value, gate, is_significant  # noqa: E402

LAUNCH_COMPILE = ("bench_relu2.ModelShapes.track_launch", {"impl": "compile", "tokens": 64, "hidden": 21504})
COLD_EAGER = ("bench_relu2.Grid.track_cold", {"impl": "eager", "dtype": "float32", "numel": 65536})


@pytest.fixture
def results(tmp_path) -> Path:
    return fx.copy_results(tmp_path / "results")


def labels(changes) -> list[str]:
    return [c.label for c in changes]


def test_planted_regression_fails_the_gate():
    report = gate(fx.RESULTS, fx.COMMIT_2[:7], fx.COMMIT_3[:7])
    assert isinstance(report, GateReport) and report.exit_code == 1
    assert labels(report.regressions) == [fx.PLANTED_LABEL]
    assert report.regressions[0].ratio == pytest.approx(1.5, rel=0.02)
    assert report.new_failures == [] and report.improvements == []
    assert (report.machine, report.base, report.head) == (fx.MACHINE, fx.COMMIT_2, fx.COMMIT_3)
    text = report.format()
    assert fx.PLANTED_LABEL in text and "1.50x" in text and "FAIL (exit 1)" in text
    assert "18.6 µs" in text and "28.0 µs" in text


def test_scaled_cell_is_named(results):
    # Between commits 1 and 2 only triton got faster; slow one unrelated cell down by 1.5x at commit 2.
    fx.edit_cell(results, fx.COMMIT_2, *LAUNCH_COMPILE, scale=1.5)
    report = gate(results, fx.COMMIT_1, fx.COMMIT_2)
    assert report.exit_code == 1
    assert labels(report.regressions) == ["ModelShapes.track_launch(impl=compile, tokens=64, hidden=21504)"]
    assert report.improvements and all("impl=triton" in c.label for c in report.improvements)


def test_slowdown_within_factor_passes(results):
    fx.edit_cell(results, fx.COMMIT_3, *COLD_EAGER, scale=1.5)
    report = gate(results, fx.COMMIT_2, fx.COMMIT_3, factor=1.6)
    assert report.exit_code == 0 and report.regressions == []


def test_equal_commits_pass():
    report = gate(fx.RESULTS, fx.COMMIT_3, fx.COMMIT_3)
    assert report.exit_code == 0
    assert (report.regressions, report.new_failures, report.improvements) == ([], [], [])
    assert report.compared > 0 and "PASS (exit 0)" in report.format()


def test_newly_failing_cell_fails_the_gate(results):
    fx.edit_cell(results, fx.COMMIT_3, *COLD_EAGER, fail=True)
    report = gate(results, fx.COMMIT_2, fx.COMMIT_3)
    assert report.exit_code == 1
    assert labels(report.new_failures) == ["Grid.track_cold(impl=eager, dtype=float32, numel=65536)"]
    assert "NEW FAILURES" in report.format() and "failed" in report.format()


def test_newly_skipped_cell_is_reported_but_passes(results):
    fx.edit_cell(results, fx.COMMIT_2, *COLD_EAGER, skip=True)
    report = gate(results, fx.COMMIT_2[:8], fx.COMMIT_2[:8])
    assert report.exit_code == 0
    report = gate(results, fx.COMMIT_1, fx.COMMIT_2)
    assert labels(report.new_skips) == ["Grid.track_cold(impl=eager, dtype=float32, numel=65536)"]
    assert report.exit_code == 0 and "NEWLY SKIPPED" in report.format()


def test_a_fixed_failure_is_not_a_regression():
    # fused float32 1024 fails at commit 1 and works at commit 2.
    report = gate(fx.RESULTS, fx.COMMIT_1, fx.COMMIT_2)
    assert report.exit_code == 0 and report.new_failures == [] and report.regressions == []


def test_significance_uses_asv_statistics():
    cells = {c.key: c for c in load_records(fx.RESULTS, commit=fx.COMMIT_2)}
    cells3 = {c.key: c for c in load_records(fx.RESULTS, commit=fx.COMMIT_3)}
    key = next(k for k, c in cells.items() if c.label() == fx.PLANTED_LABEL)
    assert is_significant(cells[key], cells3[key])  # 1.5x, 15 samples each: Mann-Whitney rejects
    assert not is_significant(cells[key], cells[key])


def test_unknown_commit_is_input_error():
    with pytest.raises(GateInputError, match="no results for commit 'deadbeef'"):
        gate(fx.RESULTS, "deadbeef", fx.COMMIT_3)
    with pytest.raises(GateInputError, match="no results for commit"):
        gate(fx.RESULTS, fx.COMMIT_2, "0123456")


def test_ambiguous_commit_is_input_error(results):
    src = fx.result_file(results, fx.COMMIT_3)
    data = json.loads(src.read_text())
    data["commit_hash"] = fx.COMMIT_3[:8] + "f" * 32
    (src.parent / f"{fx.COMMIT_3[:8]}-other-env.json").write_text(json.dumps(data))
    with pytest.raises(GateInputError, match="ambiguous"):
        gate(results, fx.COMMIT_2, fx.COMMIT_3[:8])


def test_no_results_is_input_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(GateInputError, match="no asv results"):
        gate(tmp_path / "empty", "a", "b")
    with pytest.raises(GateInputError, match="no such results folder"):
        gate(tmp_path / "absent", "a", "b")


def test_several_machines_need_a_choice(results):
    other = results / "other-machine"
    shutil.copytree(results / fx.MACHINE, other)
    for path in other.glob("*.json"):
        data = json.loads(path.read_text())
        if path.name == "machine.json":
            data["machine"] = "other-machine"
        else:
            data["params"]["machine"] = "other-machine"
        path.write_text(json.dumps(data))
    with pytest.raises(GateInputError, match="several machines.*fixture-machine, other-machine"):
        gate(results, fx.COMMIT_2, fx.COMMIT_3)
    assert gate(results, fx.COMMIT_2, fx.COMMIT_3, machine="other-machine").exit_code == 1
    with pytest.raises(GateInputError, match="no results for machine 'nope'"):
        gate(results, fx.COMMIT_2, fx.COMMIT_3, machine="nope")


def test_malformed_json_names_the_file(results):
    bad = fx.result_file(results, fx.COMMIT_3)
    bad.write_text('{"version": 2, "commit_hash": ')
    with pytest.raises(ResultsError, match=bad.name):  # GateInputError is a ResultsError
        gate(results, fx.COMMIT_2, fx.COMMIT_3)


def test_bad_factor_is_input_error():
    with pytest.raises(GateInputError, match="factor"):
        gate(fx.RESULTS, fx.COMMIT_2, fx.COMMIT_3, factor=0.9)


def test_format_value_units():
    assert format_value(2.5e-6, "seconds") == "2.50 µs"
    assert format_value(2.8e-4, "seconds") == "280 µs"
    assert format_value(5e-9, "seconds") == "5.00 ns"
    assert format_value(1.5, "seconds") == "1.50 s"
    assert format_value(3 * 2**20, "bytes") == "3.00 MiB"
    assert format_value(None, "seconds") == "failed"
    assert format_value(float("nan"), "seconds") == "n/a"
