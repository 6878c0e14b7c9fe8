"""Work counters (issue 38), read from Nsight Compute output recorded on the H200 by the project's own
command (docs/aa/counters-h200-2026-12-03: `relu2 counters`, two boxes, its README says how)."""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import sys
from dataclasses import replace
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


def test_a_cell_that_fails_mid_launch_costs_only_its_own_counts():
    """The child lists each cell with the markers it launched: a launch cut short by an error is
    dropped with its cell, and every later cell keeps its own launches (one failure once made ncu's
    count disagree with the child's and lost every cell's counters)."""
    run = DATA / "box-a" / "smoke"
    recorded = read_report(run)
    cells = list(recorded.works)
    groups = split_launches(parse_ncu_csv(_csv(run)))
    ran = [{"cell": c.to_json(), "markers": 2, "reason": None} for c in cells]
    ran[1].update(markers=1, reason="RuntimeError: CUDA error: an illegal memory access")
    counted = counters.attribute(ran, groups[:3] + groups[4:])
    assert counted.failed == {cells[1]: "RuntimeError: CUDA error: an illegal memory access"}
    assert counted.works == {c: recorded.works[c] for c in cells if c != cells[1]}
    with pytest.raises(RuntimeError, match="ncu listed 12 profiled launches, the child made 11"):
        counters.attribute(ran, groups)


FAKE_NCU = """#!{python}
# Plays ncu back: the recorded CSV into --log-file, the child's list of finished cells into its done file.
import json, sys
args = sys.argv[1:]
log, done = args[args.index("--log-file") + 1], args[-1]
open(log, "w").write(open({csv!r}).read())
if {finished!r} != "none":
    open(done, "w").write({finished!r})
print("==ERROR== playing back a failure" if {status} else "", file=sys.stderr)
sys.exit({status})
"""


def _fake_ncu(tmp_path, monkeypatch, finished: list[dict] | None, status: int = 0, csv: str | None = None) -> None:
    recorded = tmp_path / "recorded.csv"
    recorded.write_text(_csv(DATA / "box-a" / "smoke") if csv is None else csv)
    ncu = tmp_path / "ncu"
    ncu.write_text(FAKE_NCU.format(python=sys.executable, csv=str(recorded), finished=json.dumps({"cells": finished}) if finished is not None else "none",
                                   status=status))
    ncu.chmod(0o755)
    monkeypatch.setenv(counters.ENV_NCU, str(ncu))


def test_a_counting_process_that_dies_keeps_the_cells_it_finished(tmp_path, monkeypatch):
    """The child lists each cell as it finishes: ncu's launches past them are the dying cell's, dropped;
    the cells after it are named, with how the process ended."""
    recorded = read_report(DATA / "box-a" / "smoke")
    cells = list(recorded.works)
    finished = [{"cell": c.to_json(), "markers": 2, "reason": None} for c in cells[:3]]
    _fake_ncu(tmp_path, monkeypatch, finished, status=139)
    counted = counters.count(cells, launches=2)
    assert counted.works == {c: recorded.works[c] for c in cells[:3]}
    assert set(counted.failed) == set(cells[3:])
    assert all(why.startswith("not counted: the counting process exited with status 139") for why in counted.failed.values())
    found, why = counters.figures(cells, "cuda")  # what the sweep and asv's suites record: said, not silent
    assert set(found) == set(cells[:3])
    assert why.startswith("work counters: 3 of 6 cells not counted (first: not counted: the counting process exited")


def test_ncu_output_that_does_not_read_is_work_not_done_said_in_one_line(tmp_path, monkeypatch, capsys):
    """A CSV without the launch columns, a child that listed nothing: ProcessFailed, which relu2's main
    says in one line (exit 1), and which the sweep's and asv's figures take as "not counted"."""
    from relu2 import cli
    from relu2.host.proc import ProcessFailed
    from relu2.measure import figures

    cells = list(read_report(DATA / "box-a" / "smoke").works)
    text = _csv(DATA / "box-a" / "smoke")
    header = text[text.index('"ID",'):].split("\n", 1)[0]
    _fake_ncu(tmp_path, monkeypatch, [], csv=text.replace(header, header.replace('"Grid Size"', '"Grid"')))
    with pytest.raises(ProcessFailed, match="ncu's output did not read: .*Grid Size"):
        counters.count(cells[:1])
    _, why = figures.measure(cells[:1], "cuda")
    assert "ncu's output did not read" in why
    _fake_ncu(tmp_path, monkeypatch, None, status=1)  # ncu refused: no child ran
    monkeypatch.setattr(cli.machine, "resolve_device", lambda device: "cuda")
    code = cli.main(["counters", "--out", str(tmp_path / "out"), "--impl", "eager", "--dtype", "float32",
                     "--sizes", "1024"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert "relu2 counters: ncu exited with status 1: ==ERROR== playing back a failure" in err
    assert not (tmp_path / "out").exists()
    finished = [{"cell": c.to_json(), "markers": 2, "reason": None} for c in cells]
    _fake_ncu(tmp_path, monkeypatch, finished, status=1, csv=text[:text.index('"ID",')])  # refused every kernel
    with pytest.raises(ProcessFailed, match="^ncu exited with status 1: ==ERROR== playing back a failure$"):
        counters.count(cells, launches=2)


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
    lacking = Work(tuple(replace(k, counts={**k.counts, "instructions": math.nan}) for k in work.kernels))
    assert Work.from_json(json.loads(json.dumps(lacking.to_json()))).same_as(lacking)  # a counter this ncu lacks


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


def test_the_exact_counters_are_the_same_on_an_h100_as_on_the_h200(capsys, tmp_path):
    """Three A/A runs on an H100 box (2026-12-05) read with the five H200 runs as one set: every exact
    counter the same in every cell that ran one launch configuration (same sm_90 code, same grids)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import counters_aa

    assert counters_aa.main([str(DATA), str(DATA.parent / "counters-h100-2026-12-05")]) == 0
    out = capsys.readouterr().out
    assert "8 A/A runs on 3 boxes" in out
    for counter in ("instructions", "global_loads", "global_stores", "load_bytes", "store_bytes"):
        assert f"{counter:<18} 266/266  0%" in out, out
    (tmp_path / "box-a").mkdir()
    assert counters_aa.main([str(DATA), str(tmp_path)]) == 2  # two boxes of one name would be one
    assert "box names repeat" in capsys.readouterr().err


def _only(counted: counters.Counted, cells) -> counters.Counted:
    """The counts of ``cells`` alone: what relu2 compare counts (the cells whose kernel differs)."""
    return type(counted)({c: counted.works[c] for c in cells})


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
    write_work(folder, "", _only(base, fused), _only(planted, fused))
    report = gate_compare(folder)
    assert any("work counted for the 30 cells whose kernel differs: 30 did other work (fused)" in n for n in report.notes())
    flagged = next(c for c in report.regressions if c.label == fx.PLANTED_LABEL)
    assert "registers 24 -> 32, instructions +32.1%" in flagged.kernel  # the fixture records no fingerprint
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


# --- the rule: a cell whose work changed is judged at its share of the budget among the changed ----------

H200_COMPARES = ROOT / "docs" / "aa" / "compare-h200-2026-12-02"


def _with_counted_work(tmp_path: Path, compare: Path, base: Path, head: Path) -> Path:
    """A copy of a recorded H200 compare folder with a DIR/work.json of recorded H200 counts (both sides'
    every Grid cell), as relu2 compare writes it when it counts."""
    import shutil

    from relu2.records.compare_folder import write_work

    folder = tmp_path / compare.name
    shutil.copytree(compare, folder)
    write_work(folder, "", read_report(base), read_report(head))
    return folder


def _fused_grid(changes) -> dict[str, object]:
    return {c.label: c for c in changes if dict(c.params).get("impl") == "fused" and ".Grid." in c.benchmark}


def test_cells_whose_work_changed_are_judged_by_the_same_box_model_at_their_own_share(tmp_path):
    """The compare of the 5-blocks plant recorded on the H200 (box g), with the work counted for the same
    patch on the H200: the 60 fused Grid cells judged (hot, cold) did other work, so each is judged by
    the H200's same-box model (which judges only such cells) at 1/60 of the budget; every other cell
    is judged exactly as without counters, by the cross-box model at 1/244."""
    from relu2.judge.gate import gate_compare

    recorded = H200_COMPARES / "h200-g-main_planted_slow_fused_5_blocks"
    before = gate_compare(recorded)
    after = gate_compare(_with_counted_work(tmp_path, recorded, DATA / "box-a" / "aa-1",
                                            DATA / "box-a" / "slow-fused-5-blocks"))
    assert (before.noise["work_changed"], after.noise["work_changed"], after.noise["gated"]) == (0, 60, 244)
    assert any("60 of the 244 gated cells did other work" in n for n in after.notes())
    assert any("the cells whose exact work changed with its same-box model" in n for n in after.notes())
    assert not before.undecided  # nothing changed work: every cell is settled
    was, now = _fused_grid(before.cells), _fused_grid(after.cells)
    gated = [label for label, c in now.items() if c.threshold == c.threshold]
    assert len(gated) == 60 and all("instructions +" in now[label].work for label in gated)
    beyond = [label for label in gated if "numel=67108864" in label or "numel=268435456" in label]
    assert len(beyond) == 12 and all(now[label].threshold < was[label].threshold for label in beyond)
    assert all(c.work == "" for c in after.cells if dict(c.params).get("impl") == "copy" and ".Grid." in c.benchmark)
    same = lambda report: sorted((c.label, c.threshold) for c in report.cells  # noqa: E731
                                 if c.label not in now and c.threshold == c.threshold)
    assert same(after) == same(before)  # no other cell's bar moved
    # At 3 rounds the 13 fused cells that failed before fail, and 3 more whose moves were under the floor in
    # seconds (a changed cell has none); 20 others are not settled (relu2 compare measures them again)
    failing = _fused_grid(after.regressions)
    assert set(_fused_grid(before.regressions)) < set(failing) and len(failing) == 16
    assert {c.label for c in after.regressions} - set(failing) == {c.label for c in before.regressions} - set(failing)
    undecided = _fused_grid(after.undecided)
    assert len(undecided) == len(after.undecided) == 20 and not set(undecided) & set(failing)
    # Its power is stated beside its bar, by the rule that judges it: the changed cells' own rows
    rows = {(r.family, r.mode, r.band): r for r in after.resolution}
    changed = rows[("fixed kernels, work changed (3 rounds)", "hot", "> 4x L2")]
    assert changed.cells == 6 and changed.smallest_detectable < rows[("fixed kernels", "hot", "> 4x L2")].smallest_detectable
    assert not any("work changed" in r.family for r in before.resolution)


def test_a_compare_measures_again_only_the_changed_cells_its_rounds_do_not_settle(tmp_path):
    """relu2 compare's choice of cells for more rounds (``unsettled``) is the verdict's own list, as cells
    a round's process measures: on the recorded 5-blocks compare, the 20 undecided fused figures are
    fused cells (a cell undecided hot and cold is measured once), never a failing or an unchanged one."""
    from relu2.judge.gate import gate_compare
    from relu2.runs.compare import unsettled

    folder = _with_counted_work(tmp_path, H200_COMPARES / "h200-g-main_planted_slow_fused_5_blocks",
                                DATA / "box-a" / "aa-1", DATA / "box-a" / "slow-fused-5-blocks")
    info = json.loads((folder / "compare.json").read_text())
    cells = unsettled(folder, {**info, "added_rounds": 0})
    report = gate_compare(folder)
    wanted = {(dict(c.params)["dtype"], int(dict(c.params)["numel"])) for c in report.undecided}
    assert {(c.impl, c.dtype, c.numel) for c in cells} == {("fused", d, n) for d, n in wanted}
    assert len(cells) == len(wanted) < len(report.undecided) == 20
    aa = _with_counted_work(tmp_path / "aa", H200_COMPARES / "h200-g-main_main", DATA / "box-a" / "aa-1",
                            DATA / "box-b" / "aa-1")
    assert unsettled(aa, {**json.loads((aa / "compare.json").read_text()), "added_rounds": 0}) == []


def test_a_changed_cell_is_confirmed_at_the_share_that_flagged_it(tmp_path):
    """relu2 confirm's re-measurement of a cell whose work changed is judged at the changed cells'
    share: 1.04x is past its bar there (1.035x), not past the bar of every gated cell's share (1.044x)."""
    from relu2.judge.gate import gate_compare
    from relu2.records.compare_folder import read_compare

    folder = _with_counted_work(tmp_path, H200_COMPARES / "h200-g-main_planted_slow_fused_5_blocks",
                                DATA / "box-a" / "aa-1", DATA / "box-a" / "slow-fused-5-blocks")
    first = gate_compare(folder)
    cell = next(c for c in first.regressions if c.label == "Grid.track_hot(impl=fused, dtype=bfloat16, numel=268435456)")
    assert cell.work and 1.03 < cell.threshold < 1.04
    meta, again = read_compare(folder), tmp_path / "again.json"
    again.write_text(json.dumps({"base": meta.base, "head": meta.head, "machine": meta.machine,
                                 "instrument": meta.instrument, "cells": [{
        "benchmark": cell.benchmark, "params": dict(cell.params), "base_rounds": [cell.base] * 6,
        "head_rounds": [cell.base * 1.04] * 6}]}))
    report = gate_compare(folder, confirmed=again)  # the other flagged cells, not re-measured, still fail
    assert cell.label in [c.label for c in report.regressions] and not report.unconfirmed
    without = gate_compare(H200_COMPARES / "h200-g-main_planted_slow_fused_5_blocks", confirmed=again)
    assert [c.label for c in without.unconfirmed] == [cell.label]


def test_a_gpu_whose_model_judges_only_changed_work_gates_those_cells_and_reports_the_rest(monkeypatch):
    """The H100's only model judges the cells whose exact work changed (no model of it holds out of sample
    for the others): the recorded in-L2 plant of an H100 box it did not learn from fails on fused cells
    alone, each at 1/60 of the budget; every unchanged cell is reported, not gated; the comment-only branch
    and an A/A of that box change no work and pass with nothing gated; and relu2 compare on an H100
    measures judged (check_judgeable refuses a GPU only where no model of it judges any cell)."""
    from relu2.judge.gate import gate_compare
    from relu2.runs import compare

    box = ROOT / "docs" / "aa" / "compare-h100-2026-12-05-b"
    planted = gate_compare(box / "h100-main_planted_slow_fused_in_l2")
    assert planted.exit_code == 1 and planted.noise["gated"] == planted.noise["work_changed"] == 60
    assert planted.noise["per_changed_cell"] == pytest.approx(0.05 / 60)
    assert planted.regressions and all(dict(c.params)["impl"] == "fused" and c.work for c in planted.regressions)
    unchanged = [c for c in planted.cells if not c.work]
    assert unchanged and all(c.threshold != c.threshold for c in unchanged)  # NaN: not gated
    assert any("the cells whose work did not change are reported, not gated" in n for n in planted.notes())
    assert "the 60 cells whose work changed share it" in planted.budget_line()
    for name in ("h100-main_planted_comment_only", "h100-main_main"):
        quiet = gate_compare(box / name)
        assert (quiet.exit_code, quiet.noise["gated"], quiet.noise["work_changed"]) == (0, 0, 0)
    launch = gate_compare(box / "h100-main_main", gate_launch=2.0)  # only launch gated: its line still reads
    assert launch.noise["gated"] > 0 and "no cell's work changed" in launch.render("text")
    monkeypatch.setattr(compare, "resolve_device", lambda asked: "cuda")
    monkeypatch.setattr(compare, "gpu_name_apart", lambda: "NVIDIA H100 80GB HBM3")
    compare.check_judgeable("cuda", None)  # not refused (a GPU with no model is: tests/test_compare.py)


def test_a_token_suite_cell_finds_its_counted_work_by_its_decoded_shape():
    """Nemotron, VllmShapes, ModelShapes name tokens and hidden, not numel, and no dtype: the counted
    work is found by the decoded cell (its suite's dtype, its shape)."""
    from relu2.records.compare_folder import CountedWork

    base, planted = read_report(DATA / "box-a" / "aa-1"), read_report(DATA / "box-a" / "slow-fused-5-blocks")
    grid = Cell("fused", "bfloat16", 2**22, (1024, 4096))
    as_tokens = Cell("fused", "bfloat16", 2**22, (512, 8192))  # the same work, relabelled as a token cell
    work = CountedWork("", {as_tokens: base.work(grid)}, {as_tokens: planted.work(grid)})
    assert "instructions +32.1%" in work.change_at("fused", "bfloat16", "512x8192")
    assert work.change_at("fused", "bfloat16", "1024x4096") is None  # not counted under that shape
    assert work.change_at("fused", "bfloat16", "") is None  # a summary: no one cell


@pytest.mark.parametrize("aa", ["h200-g-main_main", "h200-j-main_main-3", "h200-l-main_main-3"])
def test_an_aa_compare_with_its_work_counted_is_judged_exactly_as_without(tmp_path, aa):
    """Unchanged code changes no counter (the A/A counts of two H200 boxes), so the lower bar meets no
    cell: the verdict, every threshold and every flag are those of the same compare without counters
    (j-3 and l-3 are the A/As the same-box model's held-out check flagged)."""
    from relu2.judge.gate import gate_compare

    recorded = H200_COMPARES / aa
    before = gate_compare(recorded)
    after = gate_compare(_with_counted_work(tmp_path, recorded, DATA / "box-a" / "aa-1", DATA / "box-b" / "aa-1"))
    assert after.noise["work_changed"] == 0
    assert [(c.label, c.threshold, c.moved) for c in after.cells] == [(c.label, c.threshold, c.moved) for c in before.cells]
    assert [c.label for c in after.regressions] == [c.label for c in before.regressions]
    assert after.exit_code == before.exit_code
    assert all(c.work == "" for c in _fused_grid(after.cells).values())


def test_the_history_gate_reads_changed_work_from_the_counters_both_commits_recorded():
    """Across boxes the counters travel as figures (track_instructions, ...): a cell whose exact
    counters differ is judged at the changed cells' share, one whose counters agree as before."""
    from relu2.judge.rule import Rule, compare
    from relu2.records.asv_names import Cell as AsvCell
    from relu2.records.asv_results import Measurement

    def m(impl: str, measure: str, value: float, commit: str) -> Measurement:
        params = (("impl", impl), ("dtype", "bfloat16"), ("numel", "1048576"))
        cell = AsvCell("bench_relu2.Grid", measure, params, impl, "bfloat16", "1048576")
        return Measurement(cell, "box", "box", commit, 0, "ok", value, (value,), False, "", "1",
                           "count" if measure in EXACT else "seconds")

    def side(commit: str, fused_instructions: float) -> list[Measurement]:
        out = []
        for impl, instructions in (("fused", fused_instructions), ("triton", 100.0)):
            out.append(m(impl, "hot", 1.0, commit))
            out += [m(impl, name, instructions if name == "instructions" else 7.0, commit) for name in EXACT]
        return out

    seen = []
    def rule_for(b: Measurement, gated: int, changed: bool = False) -> Rule:  # timings are gated, the counters are figures
        seen.append((b.cell.impl, b.cell.measure, gated))
        return Rule(b.cell.timing_mode is not None, 1.05, 0.0)

    found = compare(side("a", 100.0), side("b", 106.0), rule_for)
    assert found.gated == 2 and found.work_changed == 1
    assert ("fused", "hot", 1) in seen and ("triton", "hot", 2) in seen
    work = {c.label.split("impl=")[1].split(",")[0]: c.work for c in found.cells}
    assert work == {"fused": "instructions +6.0%", "triton": ""}
    # Sides of other software: counters move with no change of code, so none is read
    assert compare(side("a", 100.0), side("b", 106.0), rule_for, count_work=False).work_changed == 0
    # Another autotuned pick of the same code (its fingerprint's code digits the same) is no other work
    from dataclasses import replace

    picked = lambda ms, pick: [replace(x, fingerprint="abcdef" + pick * 6) for x in ms]  # noqa: E731
    assert compare(picked(side("a", 100.0), "1"), picked(side("b", 106.0), "2"), rule_for).work_changed == 0
    assert compare(picked(side("a", 100.0), "1"), picked(side("b", 106.0), "1"), rule_for).work_changed == 1


def test_the_truth_script_takes_the_median_pair_and_scores_a_compare_against_it(tmp_path, capsys):
    """scripts/truth.py: a cell's true ratio is the median over pairs of sweeps; a compare catches the
    fused cells truly past their band's ``matters`` that it FAILed, and names any other FAIL."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import truth

    from relu2.records.rows import make_row, write_csv

    cells = [("bfloat16", 2**10, "hot"), ("bfloat16", 2**28, "hot"), ("float32", 2**28, "cold")]
    slower = {(2**10, "1"): 1.10, (2**10, "2"): 1.00, (2**10, "3"): 1.08, (2**28, "1"): 1.02, (2**28, "2"): 1.04,
              (2**28, "3"): 1.05}
    for i in "123":
        for side in ("main", "planted"):
            rows = [make_row(machine="m", commit="c", date="d", impl="fused", dtype=d, numel=n, shape=str(n), mode=mode,
                             status="ok", median_s=1e-6 * n ** 0.5 * (slower[(n, i)] if side == "planted" else 1.0))
                    for d, n, mode in cells]
            (tmp_path / f"{side}-{i}").mkdir()
            write_csv(rows, tmp_path / f"{side}-{i}" / "sweep.csv")
    (tmp_path / "main-0").mkdir()  # a process whose planted one was lost: no pair, not paired with planted-1
    write_csv(rows, tmp_path / "main-0" / "sweep.csv")
    assert len(truth.pairs_of(tmp_path)) == 3
    ratios = truth.true_ratios(truth.pairs_of(tmp_path))
    assert ratios[("bfloat16", 2**10, "hot")] == pytest.approx((1.08, 1.00, 1.10))
    assert ratios[("float32", 2**28, "cold")] == pytest.approx((1.04, 1.02, 1.05))
    pooled = truth.true_ratios(truth.pairs_of(tmp_path) + truth.pairs_of(tmp_path)[1:2])  # another box's pair: 1.00x
    assert pooled[("bfloat16", 2**10, "hot")] == pytest.approx((1.04, 1.00, 1.10))  # the median of four
    fail = lambda impl, dtype, numel, mode: {"benchmark": f"bench_relu2.Grid.track_{mode}",  # noqa: E731
                                             "params": {"impl": impl, "dtype": dtype, "numel": str(numel)}}
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"exit_code": 1, "verdict": "fail", "regressions": [
        fail("fused", "bfloat16", 2**28, "hot"), fail("eager", "float16", 2**20, "cold"), {"benchmark": "x", "params": {}}]}))
    assert truth.main([str(tmp_path), "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^all +3 +1  \(33%\)$", out, re.M)  # 1.08x in the L2, 1.04x twice beyond it; one FAILed
    assert "FAIL of other implementations: 1\n  ('eager', 'float16', 1048576, 'cold')" in out
    assert f"measured by {os.path.relpath(tmp_path)}: c\n" in out  # one instrument: no warning

    other = tmp_path / "box-2"  # a second box's truth, one pair: 2^10 hot not slowed there
    for side, ratio in (("main", 1.0), ("planted", 1.0)):
        (other / f"{side}-1").mkdir(parents=True)
        write_csv([make_row(machine="m", commit="c2", date="d", impl="fused", dtype="bfloat16", numel=2**10,
                            shape=str(2**10), mode="hot", status="ok", median_s=1e-6 * ratio)], other / f"{side}-1" / "sweep.csv")
    assert truth.main([str(tmp_path), str(other), str(tmp_path), "--report", str(report), str(report)]) == 0
    out = capsys.readouterr().out
    assert out.count(f"{report}: exit 1, verdict fail") == 2  # --report A B, as a shell's {e,f} writes it
    assert "median over 4 pairs of sweeps of 2 folders (smallest-largest); 2 cells left out, not in every pair" in out
    assert re.search(r"^hot +bfloat16 +1024 +in L2 +1.0400  \(1.0000-1.1000\)$", out, re.M)
    assert f"{os.path.relpath(other)}: c2  (more than one instrument" in out  # another instrument's pairs pooled
    with pytest.raises(SystemExit):
        truth.main([str(tmp_path), str(tmp_path / "report.json")])  # a file, not a truth folder


# Every compare judged live with counters and added rounds, as the box said: (folder under docs/aa, exit
# status, regressions, UNDECIDED, gated cells, fused cells whose kernel differs (counted), of them those
# that did other work).  The H200 gates every cell (its cross-box model); the H100 only those whose work changed.
LIVE_COMPARES = [
    ("compare-h200-2026-12-05/h200-main_planted_slow_fused_5_blocks", 1, 23, 9, 244, 30, 30),
    ("compare-h200-2026-12-05/h200-main_planted_slow_fused_in_l2", 1, 9, 7, 244, 30, 30),
    ("compare-h200-2026-12-05/h200-main_planted_comment_only", 0, 0, 0, 244, 30, 0),
    ("compare-h200-2026-12-06/h200-main_planted_slow_fused_5_blocks", 1, 23, 7, 244, 30, 30),
    ("compare-h200-2026-12-06/h200-main_planted_slow_fused_in_l2", 1, 9, 8, 244, 30, 30),
    ("compare-h200-2026-12-06/h200-main_planted_comment_only", 0, 0, 0, 244, 0, 0),
    ("compare-h100-2026-12-06-e/h100-main_planted_slow_fused_in_l2", 1, 9, 0, 60, 30, 30),
    ("compare-h100-2026-12-06-e/h100-main_planted_slow_fused_5_blocks", 1, 22, 0, 60, 30, 30),
    ("compare-h100-2026-12-06-e/h100-main_planted_comment_only", 0, 0, 0, 0, 0, 0),
    ("compare-h100-2026-12-06-f/h100-main_planted_slow_fused_in_l2", 1, 10, 0, 60, 30, 30),
    ("compare-h100-2026-12-06-f/h100-main_planted_slow_fused_8_blocks", 1, 26, 0, 60, 30, 30),
    ("compare-h100-2026-12-06-f/h100-main_planted_scatter_fused_12", 1, 60, 0, 60, 30, 30),
    ("compare-h100-2026-12-06-f/h100-main_planted_comment_only", 0, 0, 0, 0, 0, 0),
    ("compare-h100-2026-12-06-g/h100-main_planted_slow_fused_in_l2", 1, 11, 0, 60, 30, 30),
    ("compare-h100-2026-12-06-g/h100-main_planted_slow_fused_5_blocks", 1, 23, 0, 60, 30, 30),
    ("compare-h100-2026-12-06-g/h100-main_planted_slow_fused_8_blocks", 1, 24, 0, 60, 30, 30),
    ("compare-h100-2026-12-06-g/h100-main_planted_comment_only", 0, 0, 0, 0, 0, 0),
    ("compare-h100-2026-12-06-h/h100-main_planted_scatter_fused_12", 1, 60, 0, 60, 30, 30),
    ("compare-h100-2026-12-06-h/h100-main_planted_slow_fused_in_l2", 1, 9, 0, 60, 30, 30),
    ("compare-h100-2026-12-07/h100-main_planted_slow_fused_in_l2", 1, 10, 0, 60, 30, 30),  # hot method 4
    ("compare-h100-2026-12-07-b/h100-main_planted_slow_fused_in_l2", 1, 9, 0, 60, 30, 30),  # hot method 4
    ("compare-h100-2026-12-07-c/h100-main_planted_slow_fused_8_blocks", 1, 24, 0, 60, 30, 30),  # hot method 4
    ("compare-h100-2026-12-07-c/h100-main_planted_scatter_fused_12", 1, 60, 0, 60, 30, 30),  # hot method 4
    ("compare-h100-2026-12-07-d/h100-main_planted_slow_fused_8_blocks", 1, 25, 0, 60, 30, 30),  # hot method 4
    ("compare-h100-2026-12-07-d/h100-main_planted_comment_only", 0, 0, 0, 0, 0, 0),  # hot method 4
]


@pytest.mark.parametrize("folder, exit_code, regressions, undecided, gated, differs, did_other_work",
                         LIVE_COMPARES)
def test_the_live_compares_give_their_verdict_again(folder, exit_code, regressions, undecided, gated, differs,
                                                    did_other_work):
    """The compares relu2 compare made and judged on the box, with counters and added rounds (two H200 boxes,
    four H100 boxes the H100's changed-work model did not learn from): judged again here, each plant fails
    on fused alone (its cells whose work changed, or its summary figure, Implementations.track_fused),
    as many as the box said, each of its 60 changed cells (hot, cold) counted; the comment-only branch
    changes no work and passes."""
    from relu2.judge.gate import gate_compare

    report = gate_compare(ROOT / "docs" / "aa" / folder)
    assert (report.exit_code, len(report.regressions), len(report.undecided)) == (exit_code, regressions, undecided)
    assert all(dict(r.params).get("impl") == "fused" and r.work or r.benchmark.endswith("track_fused")
               for r in report.regressions)
    assert (report.noise["gated"], report.noise["work_changed"]) == (gated, 60 if did_other_work else 0)
    assert any(n.startswith(f"work counted for the {differs} cells whose kernel differs: {did_other_work} did other work")
               for n in report.notes())


def test_a_resumed_compare_keeps_the_work_its_earlier_run_counted(tmp_path, monkeypatch):
    """A compare stopped after counting and resumed on the same box keeps DIR/work.json (the same commits'
    exact counts), without a second ncu pass; one that counted other cells, or none, counts again."""
    from relu2.records.compare_folder import read_work, write_work
    from relu2.runs import compare

    base, planted = read_report(DATA / "box-a" / "aa-1"), read_report(DATA / "box-a" / "slow-fused-5-blocks")
    fused = sorted((c for c in planted.works if c.impl == "fused"), key=lambda c: c.name("hot"))
    extra = [next(c for c in planted.works if c.impl != "fused" and planted.works[c] and base.works.get(c))]
    kernels = {"base": {c: "k0" for c in fused}, "head": {c: "k1" for c in fused}}
    monkeypatch.setattr(compare, "kernels_of", lambda paths: kernels[paths[0]])
    monkeypatch.setattr(counters, "unavailable", lambda device: "")
    counted = []
    monkeypatch.setattr(counters, "count", lambda cells, **kw: counted.append(list(cells)) or _only(planted, cells))
    sides = [compare.Side(name, name, tmp_path) for name in ("base", "head")]
    ruler = compare.Ruler(tmp_path, tmp_path)
    done = compare.Measured(*sides, [], {"base": ["base"], "head": ["head"]}, {})
    said: list[str] = []

    folder = tmp_path / "c"
    folder.mkdir()
    write_work(folder, "", _only(base, fused), _only(planted, fused))
    compare.count_changed_work(*sides, ruler, tmp_path, done, "cuda", folder, said.append)
    assert counted == [] and said == ["relu2 compare: work of the 30 cells whose kernel differs kept from the earlier run"]
    assert sum(1 for c in fused if read_work(folder).change(c)) == 30

    write_work(folder, "", _only(base, fused[:3]), _only(planted, fused[:3]))  # another compare's cells
    compare.count_changed_work(*sides, ruler, tmp_path, done, "cuda", folder, said.append)
    write_work(folder, "", _only(base, fused + extra), _only(planted, fused + extra))  # more cells than changed
    compare.count_changed_work(*sides, ruler, tmp_path, done, "cuda", folder, said.append)
    write_work(folder, "not counted: ncu refused")
    compare.count_changed_work(*sides, ruler, tmp_path, done, "cuda", folder, said.append)
    (folder / "work.json").write_text("{")  # not a record of work
    compare.count_changed_work(*sides, ruler, tmp_path, done, "cuda", folder, said.append)
    assert counted == [fused] * 8  # both sides, four times


def test_hot_levels_reads_the_two_levels_of_recorded_rounds(capsys):
    """scripts/hot_levels.py --rounds: a level starts where a sorted round is more than 3% above the one
    before it; head/base is read level by level where both sides show the same two (the H200's in-L2
    plant, fused hot fp16 2^10, as docs/lab/results.md quotes it)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import hot_levels

    assert hot_levels.levels([1.14, 1.06, 1.141, 1.058]) == [1.058, 1.14]
    assert hot_levels.levels([1.00, 1.02, 1.04, 1.06]) == [1.00]  # a drift in small steps is one level
    folder = ROOT / "docs/aa/compare-h200-2026-12-06/h200-main_planted_slow_fused_in_l2"
    assert hot_levels.main(["--rounds", str(folder)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^  fused hot float16 1024 +\.\.\.HHHHHHHHH \| HH\.HHHHHHHHH   like with like: 1\.045x, 1\.044x$", out, re.M)
    assert not re.search(r"^  fused hot bfloat16 1024 ", out, re.M)  # one level a side: not listed
    assert hot_levels.main(["--rounds", str(folder.parent)]) == 2  # not a compare folder


def test_hot_levels_tells_an_address_effect_from_noise(capsys):
    """scripts/hot_levels.py --report: a series whose figures repeat their pattern offset by offset in
    every process is set by the address (the H100's input placements, docs/aa/hot-levels-h100-2026-12-07);
    one whose processes do not agree is noise (its output placements)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import hot_levels

    rows = [{"run": run, "x": o, "ms": ms} for run, noise in (("a", 0.0), ("b", 0.01))
            for o, ms in enumerate([1.0, 1.04, 1.0, 1.04, 1.02])
            for ms in [ms + noise * (-1) ** o]]
    spread, r = hot_levels.address_effect(rows, "x")
    assert spread == pytest.approx(0.04) and r > 0.8
    shuffled = [{**row, "ms": 1.0 + 0.04 * ((row["x"] * (3 if row["run"] == "b" else 1)) % 5 == 1)} for row in rows]
    assert abs(hot_levels.address_effect(shuffled, "x")[1]) < 0.5
    assert hot_levels.address_effect(rows[:5], "x")[1] is None  # one process: nothing to correlate
    for argv in (["--instrument", "/no/such/folder/x.jsonl"], ["--first", str(ROOT), "0", "probe"], ["--first", "x", "-1", "probe"]):
        assert hot_levels.main(argv) == 2  # refused before measuring (no GPU is touched), nothing written
    assert not Path("/no/such/folder").exists()
    assert hot_levels.main(["--report", str(ROOT / "docs/aa/hot-levels-h100-2026-12-07/levels-box1.jsonl.gz")]) == 0
    out = capsys.readouterr().out
    by_series = re.findall(r"^NVIDIA H100 80GB HBM3 (\w+) +(\w+) +(x|out) .*\n(?:    .*\n)*?    figures span ([\d.]+)% .* r = (-?[\d.]+)", out, re.M)
    assert len(by_series) == 8
    for impl, dtype, varied, span, r in by_series:
        assert (float(r) > 0.8) == (varied == "x"), (impl, dtype, varied, r)
