"""Work counters (issue 38), read from Nsight Compute output recorded on the H200 by the project's own
command (docs/aa/counters-h200-2026-12-03: `relu2 counters`, two boxes, its README says how)."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

from relu2.measure import counters
from relu2.records.work import EXACT, MARKER, NcuOutputError, Work, describe_change, parse_ncu_csv, read_report, split_launches
from relu2.vocab.schema import Cell

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from conftest import refused  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "aa" / "counters-h200-2026-12-03"
AA = [DATA / "box-a" / "aa-1", DATA / "box-a" / "aa-2", DATA / "box-a" / "aa-3", DATA / "box-b" / "aa-1",
      DATA / "box-b" / "aa-2"]


def _csv(run: Path) -> str:
    return gzip.decompress((run / "ncu.csv.gz").read_bytes()).decode()


def test_the_recorded_csv_reads_back_to_the_recorded_counts():
    """What the command wrote (counters.json) is what its parser reads from ncu's own CSV."""
    run = DATA / "box-a" / "smoke"
    launches = split_launches(parse_ncu_csv(_csv(run)))
    recorded = read_report(run)
    assert launches == [w for works in recorded.works.values() for w in works]
    fused = recorded.work(Cell("fused", "bfloat16", 1024, (1024,)))
    assert [k.name for k in fused.kernels] == ["void <unnamed>::relu2_kernel<__nv_bfloat16, 8>(const T1 *, T1 *, long)"]
    assert fused.total("instructions") == 336 and fused.total("global_loads") == 4


def test_every_marker_opens_a_launch_and_is_never_counted():
    kernels = parse_ncu_csv(_csv(DATA / "box-a" / "smoke"))
    markers = [k for k in kernels if MARKER in k.name]
    launches = split_launches(kernels)
    assert len(markers) == len(launches) == 12  # 6 cells, 2 launches each
    assert all(MARKER not in k.name for w in launches for k in w.kernels)


def test_exact_counters_are_identical_in_every_aa_run_and_launch():
    """The claim docs/methodology.md makes: across 5 runs on 2 boxes, 2 launches each, every exact
    counter of every kernel is the same in each cell that ran one kernel (autotuning picks aside)."""
    seen: dict[Cell, list[Work]] = {}
    for run in AA:
        for cell, works in read_report(run).works.items():
            seen.setdefault(cell, []).extend(works)
    assert len(seen) == 300 and all(len(w) == 10 for w in seen.values())
    repicked = {c for c, works in seen.items() if len({w.launches for w in works}) > 1}
    assert {c.impl for c in repicked} <= {"compile_dynamic", "compile_dim0", "compile_model"}
    for cell, works in seen.items():
        if cell not in repicked:
            assert all(w.same_as(works[0]) for w in works), cell.describe()
    # and the counters left out are not exact: the DRAM bytes of some cell differ between runs
    assert any(len({w.total("dram_read_bytes") for w in works}) > 1 for works in seen.values())
    assert set(EXACT) == {"instructions", "global_loads", "global_stores", "load_bytes", "store_bytes"}


def test_a_kernel_change_is_seen_in_every_cell_and_a_comment_in_none():
    base = read_report(DATA / "box-a" / "aa-1")
    planted = read_report(DATA / "box-a" / "slow-fused-5-blocks")
    comment = read_report(DATA / "box-a" / "comment-only")
    fused = [c for c in planted.works if c.impl == "fused"]
    assert len(fused) == 30
    assert all(describe_change(base.work(c), planted.work(c)) for c in fused)
    assert not any(describe_change(base.work(c), comment.work(c)) for c in comment.works)
    big = Cell("fused", "bfloat16", 2**28, (65536, 4096))
    said = describe_change(base.work(big), planted.work(big))
    assert said.startswith("registers 24 -> 32, instructions +32.1%") and "global_loads +5.0%" in said
    # copy, measured beside the planted kernel, did the same work
    assert all(not describe_change(base.work(c), planted.work(c)) for c in planted.works if c.impl == "copy")


def test_the_same_planted_change_counts_alike_on_two_boxes():
    a = read_report(DATA / "box-a" / "slow-fused-5-blocks")
    b = read_report(DATA / "box-b" / "slow-fused-5-blocks")
    assert a.works.keys() == b.works.keys() and all(a.work(c).same_as(b.work(c)) for c in a.works)


def test_a_csv_without_the_launch_columns_is_refused_by_name():
    with pytest.raises(NcuOutputError, match="Kernel Name"):
        parse_ncu_csv('"ID","Process ID","Metric"\n"","",""\n"1","2","3"\n')
    assert parse_ncu_csv("==PROF== no kernel was profiled\n") == []


def test_a_metric_this_ncu_lacks_reads_as_no_figure():
    text = _csv(DATA / "box-a" / "smoke")
    header = text[text.index('"ID",'):].split("\n", 1)[0]
    renamed = text.replace(header, header.replace("dram__bytes_read.sum", "dram__bytes_read.sum.renamed"))
    kernels = parse_ncu_csv(renamed)
    assert all(k.counts["dram_read_bytes"] != k.counts["dram_read_bytes"] for k in kernels)  # NaN
    assert kernels[1].counts["instructions"] > 0


def test_work_round_trips_through_json():
    work = read_report(DATA / "box-a" / "smoke").work(Cell("eager", "bfloat16", 1024, (1024,)))
    assert len(work.kernels) == 2  # eager: clamp, then pow
    assert Work.from_json(json.loads(json.dumps(work.to_json()))) == work


def test_without_cuda_the_counters_say_why_in_one_line(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("there is a GPU here")
    assert counters.unavailable("cpu").startswith("not measured here:")
    refused(["counters", "--out", str(tmp_path / "c")], capsys, "not measured here")
    assert not (tmp_path / "c").exists()


def test_without_ncu_the_counters_say_why(monkeypatch):
    monkeypatch.setenv(counters.ENV_NCU, "/nonexistent/ncu")
    assert "no ncu" in counters.unavailable("cuda")


def test_the_aa_script_prints_the_table_docs_quote(capsys):
    sys.path.insert(0, str(ROOT / "scripts"))
    import counters_aa

    assert counters_aa.main([str(DATA)]) == 0
    out = capsys.readouterr().out
    assert "5 A/A runs on 2 boxes" in out and "instructions       274/274  0%" in out
    assert "box-a/comment-only: work changed in 0 of 60 cells" in out


def test_a_compare_reports_the_exact_work_change_beside_each_changed_kernel(tmp_path):
    """gate --compare reads DIR/work.json (relu2 compare writes it on CUDA: the cells whose kernel
    differs, counted once per side) and names each counted cell's change beside its kernel."""
    from test_gate_compare import make_compare

    import asv_fixture as fx
    from relu2.judge.gate import gate_compare
    from relu2.records.compare_folder import write_work

    folder = make_compare(tmp_path / "c", fx.COMMIT_3, fx.COMMIT_3, head_scale=[((fx.PLANTED_BENCH, fx.PLANTED_PARAMS), 1.5)])
    base, planted = read_report(DATA / "box-a" / "aa-1"), read_report(DATA / "box-a" / "slow-fused-5-blocks")
    fused = [c for c in planted.works if c.impl == "fused"]
    keep = lambda counted: type(counted)({c: counted.works[c] for c in fused})  # noqa: E731
    write_work(folder, "", keep(base), keep(planted))
    report = gate_compare(folder)
    assert any("work counted for the 30 cells whose kernel differs: 30 did other work (fused)" in n for n in report.notes())
    flagged = next(c for c in report.regressions if c.label == fx.PLANTED_LABEL)
    assert ": registers 24 -> 32, instructions +32.1%" in flagged.kernel
    assert "instructions +32.1%" in report.render("markdown")


def test_a_compare_without_counters_says_why_once(tmp_path):
    from test_gate_compare import make_compare

    import asv_fixture as fx
    from relu2.judge.gate import gate_compare
    from relu2.records.compare_folder import write_work

    folder = make_compare(tmp_path / "c", fx.COMMIT_3, fx.COMMIT_3)
    write_work(folder, counters.unavailable("cpu"))
    notes = [n for n in gate_compare(folder).notes() if "work counters" in n]
    assert notes == ["work counters: not measured here: counters are read by Nsight Compute on CUDA, and this run is on cpu"]
