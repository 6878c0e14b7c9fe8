"""Reading asv results into tidy rows: the synthetic fixture written by asv itself (tests/fixtures)."""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
import asv_fixture as fx  # noqa: E402

from relu2.vocab.errors import ResultsError  # noqa: E402
from relu2.records.asv_results import (  # noqa: E402
    FAILED_REASON,
    commits,
    export_csv,
    load_measurements,
    load_rows,
    machines,
    resolve_commit,
    rows_of,
    unquote,
)
from relu2.records.rows import read_csv  # noqa: E402
from relu2.vocab.schema import COLUMN_NAMES as COLUMNS  # noqa: E402
from relu2.vocab.schema import MODE_NAMES as MODES  # noqa: E402
from relu2.vocab.schema import format_shape, grid_shape  # noqa: E402


@pytest.fixture(scope="module")
def rows():
    return load_rows(fx.RESULTS)


def test_machines_and_commits_in_date_order():
    assert machines(fx.RESULTS) == [fx.MACHINE]
    assert commits(fx.RESULTS, fx.MACHINE) == [fx.COMMIT_1, fx.COMMIT_2, fx.COMMIT_3]
    assert commits(fx.RESULTS) == [fx.COMMIT_1, fx.COMMIT_2, fx.COMMIT_3]


def test_every_timing_cell_becomes_one_row(rows):
    # Grid: 6 impls x 2 dtypes x 5 sizes; ModelShapes: 6 impls x 3 token counts; 3 modes; 3 commits.
    assert len(rows) == (6 * 2 * 5 + 6 * 3) * 3 * 3
    assert {r.mode for r in rows} == set(MODES)  # peak memory (bytes) is not a timing row
    assert {r.machine for r in rows} == {fx.MACHINE}
    assert [r.commit for r in rows[:1]] == [fx.COMMIT_1] and rows[-1].commit == fx.COMMIT_3
    assert rows[0].date == "2026-11-09T12:00:00+00:00"


def test_statuses_and_reasons(rows):
    failed = [r for r in rows if r.status == "failed"]
    assert {(r.commit, r.impl, r.dtype, r.numel) for r in failed} == {(fx.COMMIT_1, "fused", "float32", 1024)}
    assert sorted(r.mode for r in failed) == ["cold", "hot", "launch"]
    assert all(r.reason == FAILED_REASON and math.isnan(r.median_s) and math.isnan(r.gbps) for r in failed)
    skipped = [r for r in rows if r.status == "skipped"]
    assert {(r.impl, r.dtype) for r in skipped} == {("triton", "float32")}
    assert len(skipped) == 5 * 3 * 3 and all(r.reason.startswith("n/a") for r in skipped)
    ok = [r for r in rows if r.status == "ok"]
    assert all(r.reason == "" and r.q25_s <= r.median_s <= r.q75_s for r in ok)


def test_params_become_impl_dtype_numel_and_shape(rows):
    grid = [r for r in rows if r.dtype == "float32" and r.impl == "eager" and r.mode == "hot"
            and r.commit == fx.COMMIT_1]
    assert [(r.numel, r.shape) for r in grid] == [
        (1024, "1024"), (65536, "16x4096"), (1048576, "256x4096"), (16777216, "4096x4096"),
        (268435456, "65536x4096")]
    model = [r for r in rows if r.shape.endswith("x21504")]
    assert {r.shape for r in model} == {"1x21504", "64x21504", "4096x21504"}
    assert {r.dtype for r in model} == {"bfloat16"}  # the model-shape suite has no dtype parameter
    assert all(r.numel == int(r.shape.split("x")[0]) * 21504 for r in model)


def test_bytes_gbps_and_roofline(rows):
    by_key = {(r.commit, r.impl, r.dtype, r.shape, r.mode): r for r in rows}
    r = by_key[(fx.COMMIT_3, "fused", "bfloat16", "4096x4096", "hot")]
    copy = by_key[(fx.COMMIT_3, "copy", "bfloat16", "4096x4096", "hot")]
    assert r.bytes == 2 * 16777216 * 2
    assert r.gbps == pytest.approx(r.bytes / r.median_s / 1e9)
    assert r.roofline_fraction == pytest.approx(copy.median_s / r.median_s)
    assert copy.roofline_fraction == pytest.approx(1.0)
    # The planted 1.5x shows in the roofline: about 0.92 of copy before, about 0.61 after.
    before = by_key[(fx.COMMIT_2, "fused", "bfloat16", "4096x4096", "hot")]
    assert before.roofline_fraction / r.roofline_fraction == pytest.approx(1.5, rel=0.02)
    f32 = by_key[(fx.COMMIT_2, "eager", "float32", "65536x4096", "cold")]
    assert f32.bytes == 2 * 268435456 * 4


def test_commit_prefix_selects_one_commit():
    rows = load_rows(fx.RESULTS, commit=fx.COMMIT_2[:6])
    assert {r.commit for r in rows} == {fx.COMMIT_2}
    assert resolve_commit(fx.RESULTS, fx.COMMIT_3[:4].upper()) == fx.COMMIT_3
    with pytest.raises(ResultsError, match="no results for commit 'deadbeef'"):
        load_rows(fx.RESULTS, commit="deadbeef")


def test_ambiguous_prefix_is_an_error(tmp_path):
    results = fx.copy_results(tmp_path / "results")
    src = fx.result_file(results, fx.COMMIT_3)
    data = json.loads(src.read_text())
    data["commit_hash"] = fx.COMMIT_3[:8] + "0" * 32  # a second commit sharing the first 8 characters
    (src.parent / f"{fx.COMMIT_3[:8]}-other-env.json").write_text(json.dumps(data))
    with pytest.raises(ResultsError, match="ambiguous"):
        resolve_commit(results, fx.COMMIT_3[:8])


def test_memory_is_a_measurement_and_a_column_of_its_cells_row_not_a_row():
    measured = load_measurements(fx.RESULTS, commit=fx.COMMIT_1)
    memory = {(m.cell.impl, m.cell.dtype, m.cell.shape): m for m in measured if m.cell.measure == "peak_memory"}
    rows = rows_of(measured)
    assert memory and all(m.unit == "bytes" for m in memory.values())
    assert len(rows) == sum(1 for m in measured if m.unit == "seconds" and m.cell.measure in MODES)
    with_peak = [r for r in rows if not math.isnan(r.peak_bytes)]
    assert with_peak and all(r.peak_bytes == memory[(r.impl, r.dtype, r.shape)].value for r in with_peak)


def test_export_csv_to_file(tmp_path):
    out = tmp_path / "out" / "rows.csv"
    n = export_csv(fx.RESULTS, out)
    assert n == len(load_rows(fx.RESULTS))
    with open(out, newline="") as f:
        assert tuple(next(csv.reader(f))) == COLUMNS
    back = read_csv(out)
    assert len(back) == n and {r.status for r in back} == {"ok", "failed", "skipped"}
    assert not list(out.parent.glob(".*.tmp"))  # written through a temporary file and a rename


def test_export_csv_to_stdout(capsys):
    n = export_csv(fx.RESULTS, None, machine=fx.MACHINE)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ",".join(COLUMNS) and len(lines) == n + 1


def test_unknown_machine_and_missing_folder():
    with pytest.raises(ResultsError, match="no results for machine 'nope'"):
        load_rows(fx.RESULTS, machine="nope")
    with pytest.raises(ResultsError, match="no such results folder"):
        load_rows(fx.RESULTS / "missing")


def test_a_machine_folder_copied_by_hand_under_another_name_is_named_not_read_twice(tmp_path):
    # Its machine.json keeps the old name: the commits only in the copy were lost, the others read twice.
    import shutil

    results = fx.copy_results(tmp_path / "results")
    shutil.copytree(results / fx.MACHINE, results / "box-2")
    fx.result_file(results, fx.COMMIT_1).unlink()
    with pytest.raises(ResultsError, match=f"machine '{fx.MACHINE}' is recorded by several folders: box-2, {fx.MACHINE}"):
        load_measurements(results)


@pytest.mark.parametrize("content", ["{not json", "[1, 2, 3]", '{"version": 2, "hello": "world"}',
                                     '{"version": 99}'])
def test_malformed_or_foreign_result_file_names_the_file(tmp_path, content):
    results = fx.copy_results(tmp_path / "results")
    bad = fx.result_file(results, fx.COMMIT_2)
    bad.write_text(content)
    with pytest.raises(ResultsError) as err:
        load_rows(results)
    assert bad.name in str(err.value)


def test_malformed_cells_name_the_file(tmp_path):
    results = fx.copy_results(tmp_path / "results")
    bad = fx.result_file(results, fx.COMMIT_1)
    data = json.loads(bad.read_text())
    data["results"][fx.PLANTED_BENCH][0] = [1.0, 2.0]  # two values for sixty cells
    bad.write_text(json.dumps(data))
    with pytest.raises(ResultsError, match=bad.name):
        load_rows(results)


def test_missing_or_broken_benchmarks_json(tmp_path):
    results = fx.copy_results(tmp_path / "results")
    (results / "benchmarks.json").write_text("{")
    with pytest.raises(ResultsError, match="benchmarks.json"):
        load_rows(results)
    (results / "benchmarks.json").unlink()
    with pytest.raises(ResultsError, match="benchmarks.json: missing"):
        load_rows(results)


def test_helpers():
    assert unquote("'bfloat16'") == "bfloat16" and unquote("4096") == "4096"
    assert unquote("torch.bfloat16") == "bfloat16"
    assert [format_shape(grid_shape(n)) for n in (4096, 1000, 6000)] == ["1x4096", "1000", "6000"]


def test_every_recorded_benchmarks_json_is_one_shared_copy_whole():
    """docs/aa's asv folders hold benchmarks.json as links to one copy each (docs/aa/asv-benchmarks):
    a link broken by a move, or a copy whose bytes are not the ones its name digests, is caught here
    and not by a reader of old data months later."""
    import hashlib

    aa = Path(__file__).resolve().parents[1] / "docs" / "aa"
    shared = aa / "asv-benchmarks"
    files = [p for p in aa.rglob("benchmarks.json") if shared not in p.parents]
    assert files
    for path in files:
        assert path.is_symlink(), f"{path}: a copy of its own (python scripts/link_asv_benchmarks.py links it)"
        target = path.resolve()
        assert target.parent == shared.resolve() and target.is_file(), f"{path} -> {target}"
        assert hashlib.sha256(target.read_bytes()).hexdigest().startswith(target.stem), target
