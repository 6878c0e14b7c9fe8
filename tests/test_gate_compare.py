"""The paired verdict on a compare folder (relu2 compare's layout, docs/tracking.md), and the
same-box model learned from A/A compares.  The folders are made here from the synthetic asv fixture."""

from __future__ import annotations

import json
import math
import re
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
import asv_fixture as fx  # noqa: E402

from relu2 import cli
from relu2.judge import noise  # noqa: E402
from relu2.vocab.errors import ResultsError  # noqa: E402
from relu2.judge.gate import gate_compare  # noqa: E402
from relu2.judge.learn import compare_runs, noise_check, noise_learn  # noqa: E402
from relu2.vocab.schema import MODE_NAMES, mode  # noqa: E402

from conftest import refused  # noqa: E402


def make_compare(dest: Path, base: str, head: str, *, complete: bool = True, box: str = "boot-1",
                 gpu: str | None = None, head_scale: list | None = None) -> Path:
    """DIR/compare.json, DIR/base/ and DIR/head/ (plain asv results folders holding one commit each)."""
    dest.mkdir(parents=True)
    for side, commit in (("base", base), ("head", head)):
        folder = dest / side
        (folder / fx.MACHINE).mkdir(parents=True)
        shutil.copy(fx.RESULTS / "benchmarks.json", folder / "benchmarks.json")
        info = json.loads((fx.RESULTS / fx.MACHINE / "machine.json").read_text())
        info["gpu"] = gpu or info["gpu"]
        (folder / fx.MACHINE / "machine.json").write_text(json.dumps(info))
        src = fx.result_file(fx.RESULTS, commit)
        shutil.copy(src, folder / fx.MACHINE / src.name)
    for side in ("base", "head"):  # as today's instrument records them: its methods' pinned versions
        path = next((dest / side / fx.MACHINE).glob("*-*.json"))
        data = json.loads(path.read_text())
        v = data["result_columns"].index("version")
        for name, row in data["results"].items():
            method = name.rsplit(".", 1)[-1].removeprefix("track_")
            if method in MODE_NAMES:
                row[v] = mode(method).asv_version
        path.write_text(json.dumps(data))
    for (bench, params), scale in head_scale or ():
        fx.edit_cell(dest / "head", head, bench, params, scale=scale)
    (dest / "compare.json").write_text(json.dumps({
        "format": 1, "box": box, "machine": fx.MACHINE, "gpu": gpu or fx.GPU, "base": {"ref": "b", "sha": base},
        "head": {"ref": "h", "sha": head}, "rounds": 15, "order": ["base", "head"] * 15, "suites": ["Grid"],
        "instrument": "0" * 40, "started_at": 0, "finished_at": 1, "complete": complete}))
    return dest


PLANTED = (fx.PLANTED_BENCH, fx.PLANTED_PARAMS)


def test_a_paired_compare_flags_the_planted_regression(tmp_path):
    report = gate_compare(make_compare(tmp_path / "c", fx.COMMIT_2, fx.COMMIT_3))
    assert report.paired and report.exit_code == 1
    assert [c.label for c in report.regressions] == [fx.PLANTED_LABEL]
    assert any("paired" in n and "boot-1" in n for n in report.notes())
    # no same-box model for this GPU: judged with its cross-box one, saying so
    assert any("no same-box noise model" in n for n in report.notes())


def test_an_aa_compare_passes_and_a_step_fails(tmp_path):
    aa = gate_compare(make_compare(tmp_path / "aa", fx.COMMIT_3, fx.COMMIT_3))
    assert aa.exit_code == 0 and aa.compared and any("A/A" in n for n in aa.notes())
    step = gate_compare(make_compare(tmp_path / "ab", fx.COMMIT_3, fx.COMMIT_3, head_scale=[(PLANTED, 1.5)]))
    assert step.exit_code == 1 and [c.label for c in step.regressions] == [fx.PLANTED_LABEL]


def test_the_paired_rule_sets_round_i_beside_its_neighbours():
    from relu2.judge.rule import Figure, Rule, is_slower, move

    # the box drifted 10% during the run; head is 5% slower than base in each round, measured beside it
    base = Figure(1.05, (1.00, 1.05, 1.10), rounds=True)
    head = Figure(1.1025, (1.05, 1.1025, 1.155), rounds=True)
    assert move(base, head, paired=True) == pytest.approx(0.0488, abs=1e-3)
    assert is_slower(base, head, Rule(True, 1.03, 0.0), paired=True)
    assert not is_slower(base, Figure(1.05, (1.00, 1.05, 1.10), rounds=True), Rule(True, 1.03, 0.0), paired=True)


def test_an_incomplete_compare_is_refused(tmp_path, capsys):
    folder = make_compare(tmp_path / "c", fx.COMMIT_2, fx.COMMIT_3, complete=False)
    with pytest.raises(ResultsError, match="did not finish"):
        gate_compare(folder)
    assert cli.main(["gate", "--compare", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "complete: false" in err[0]


def test_a_compare_folder_that_is_not_one_is_refused(tmp_path):
    (tmp_path / "x").mkdir()
    with pytest.raises(ResultsError, match="not a relu2 compare folder"):
        gate_compare(tmp_path / "x")
    folder = make_compare(tmp_path / "c", fx.COMMIT_2, fx.COMMIT_3)
    shutil.rmtree(folder / "head")
    with pytest.raises(ResultsError, match="head: missing"):
        gate_compare(folder)


def test_a_gpu_without_a_model_of_its_own_is_refused_or_judged_by_factor_only(tmp_path, capsys):
    """c8c9b4b judged two H100 machines with the only shipped model, the H200's, and passed (the H100
    has a model of its own since: another GPU stands in)."""
    folder = make_compare(tmp_path / "c", fx.COMMIT_2, fx.COMMIT_3, gpu="NVIDIA B200")
    with pytest.raises(ResultsError, match="no noise model for NVIDIA B200.*--factor"):
        gate_compare(folder)
    by_factor = gate_compare(folder, factor=1.2)
    assert by_factor.exit_code == 1 and any("--factor 1.2 only" in n for n in by_factor.notes())
    assert cli.main(["gate", "--compare", str(folder), "--format", "json"]) == 2


def test_a_cpu_compare_without_a_cpu_model_says_so_and_gates_only_with_factor(tmp_path, monkeypatch):
    without_cpu = tmp_path / "models.json"  # the shipped file has a CPU same-box model (docs/lab/results.md)
    noise.save_models([m for m in noise.load_models() if m.gpu != "none"], without_cpu)
    monkeypatch.setenv(noise.MODEL_ENV, str(without_cpu))
    folder = make_compare(tmp_path / "c", fx.COMMIT_2, fx.COMMIT_3, gpu="none")
    report = gate_compare(folder)
    assert report.exit_code == 0 and not report.regressions and report.noise["gated"] == 0
    assert any("no same-box noise model for this CPU" in n for n in report.notes())
    assert gate_compare(folder, factor=1.2).exit_code == 1


def test_the_budget_line_names_the_rule_that_judged(tmp_path):
    folder = make_compare(tmp_path / "c", fx.COMMIT_2, fx.COMMIT_3, gpu="none")
    by_model = gate_compare(folder)  # the shipped CPU same-box model
    assert by_model.noise["gated"] and by_model.budget_line().startswith("noise model CPU (same-box): at most 5%")
    by_factor = gate_compare(folder, factor=1.2)  # the factor replaces the model's thresholds: no budget is spent
    assert by_factor.budget_line() == f"{by_factor.noise['gated']} cells gated by --factor 1.2"


def test_the_cli_renders_a_compare_and_refuses_mixed_arguments(tmp_path, capsys):
    folder = make_compare(tmp_path / "c", fx.COMMIT_2, fx.COMMIT_3)
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert cli.main(["gate", "--compare", str(folder), "--format", "json"]) == 1
    # Judging again reads: a committed compare (docs/aa) is judged in place, its box's report kept.
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
    data = json.loads(capsys.readouterr().out)
    assert data["paired"] is True and data["regressions"][0]["label"] == fx.PLANTED_LABEL
    assert cli.main(["gate", "a", "b", "--compare", str(folder)]) == 2


def test_the_same_box_model_is_learned_from_aa_compares_and_used(tmp_path):
    small = [(PLANTED, 1.004), (("bench_relu2.Grid.track_hot", {"impl": "eager", "dtype": "float32",
                                                                 "numel": 65536}), 0.997)]
    folders = [str(make_compare(tmp_path / f"aa{i}", fx.COMMIT_3, fx.COMMIT_3, box=f"boot-{i}", head_scale=small))
               for i in range(2)]
    out = tmp_path / "models.json"
    shutil.copy(noise.default_model_path(), out)
    model = noise_learn([], out, same_box=folders)
    assert model.kind == noise.SAME_BOX and model.gpu == fx.GPU and model.fits
    kinds = {(m.gpu, m.kind) for m in noise.load_models(out)}
    assert (fx.GPU, noise.SAME_BOX) in kinds and (fx.GPU, noise.CROSS_BOX) in kinds  # the others kept
    report = gate_compare(make_compare(tmp_path / "ab", fx.COMMIT_2, fx.COMMIT_3), noise_model=out)
    assert report.noise["model"] == f"{fx.GPU} ({noise.SAME_BOX})"
    assert not any("no same-box noise model" in n for n in report.notes())


def test_a_same_box_width_is_a_cells_spread_within_a_side_not_between_boxes(tmp_path):
    """A cell whose level differs between boxes (the 2^28 cells, by 1-3%) but whose rounds agree
    within each side gets a narrow same-box width; pooled over sides (the cross-box width) it is wide."""
    from dataclasses import replace

    base, _ = compare_runs(make_compare(tmp_path / "aa", fx.COMMIT_3, fx.COMMIT_3))
    m = next(m for m in base.measurements if m.cell.measure in ("hot", "cold") and m.rounds and len(m.samples) >= 2)
    runs = [replace(base, box=f"boot-{i}", measurements=(replace(m, samples=(level, level * 1.02, level * 1.01), started_at=i),))
            for i, level in enumerate((1e-5, 1.5e-5, 2e-5))]
    key = noise.width_key(m)
    assert noise.paired_widths_of(runs)[key] == pytest.approx(math.log(1.02))
    assert noise.widths_of(runs)[key] > math.log(1.5)


def test_a_width_is_learned_from_a_cells_newest_method_never_pooled_across_methods(tmp_path):
    """A new method may move a cell's level (hot method 3: 3-8% lower in the L2); rounds of two methods
    pooled would read that step as spread.  A cell recorded by today's method takes today's width; an
    earlier method the mode learns noise from serves only where today's recorded nothing."""
    from dataclasses import replace

    from relu2.vocab.schema import mode as mode_named

    base, _ = compare_runs(make_compare(tmp_path / "aa", fx.COMMIT_3, fx.COMMIT_3))
    m = next(m for m in base.measurements if m.cell.measure == "hot" and m.rounds and len(m.samples) >= 2)
    hot = mode_named("hot")
    older, today = hot.version_of(hot.method - 1), hot.asv_version
    assert older in hot.noise_versions  # what makes the earlier method's widths usable at all
    side = lambda i, version, level: replace(base, box=f"boot-{i}", measurements=(  # noqa: E731
        replace(m, version=version, samples=(level, level * 1.01, level * 1.02), started_at=i),))
    key = noise.width_key(m)
    both = [side(0, older, 1.1e-5), side(1, today, 1e-5)]
    assert noise.paired_widths_of(both)[key] == pytest.approx(math.log(1.02))
    assert noise.widths_of(both)[key] < math.log(1.03)  # pooled, the 10% step would read as spread
    assert noise.widths_of([side(0, older, 1.1e-5)])[key] > 0  # no round of today's: the earlier method's


def test_the_same_box_model_judges_each_cell_at_its_own_width(tmp_path):
    folders = [str(make_compare(tmp_path / f"aa{i}", fx.COMMIT_3, fx.COMMIT_3, box=f"boot-{i}")) for i in range(2)]
    model = noise_learn([], tmp_path / "models.json", same_box=folders)
    assert model.widths  # learned from the sides' rounds
    base, _ = compare_runs(folders[0])
    widths = noise.paired_widths_of([base])
    m = next(m for m in base.measurements if noise.width_key(m) in widths and widths[noise.width_key(m)] > 0)
    key = noise.group_of(m.cell, model.l2_bytes)
    assert model.widths[noise.width_key(m)] > 0
    assert model.width(m, key) == pytest.approx(model.widths[noise.width_key(m)], abs=1e-6)


def test_noise_learn_never_writes_the_shipped_model_unasked(tmp_path, monkeypatch, capsys):
    """Issue 31, item 4: relu2 noise learn RESULTS without --out rewrote relu2/noise_model.json."""
    before = noise.DEFAULT_MODEL_PATH.read_bytes()
    monkeypatch.chdir(Path(noise.__file__).parents[1])
    assert cli.main(["noise", "learn", "docs/aa/results"]) == 2
    assert "needs --out" in capsys.readouterr().err
    assert noise.DEFAULT_MODEL_PATH.read_bytes() == before


def test_the_json_lists_every_timed_cell_with_the_move_it_was_judged_by(tmp_path):
    step = gate_compare(make_compare(tmp_path / "ab", fx.COMMIT_3, fx.COMMIT_3, head_scale=[(PLANTED, 1.5)]))
    cells = {c["label"]: c for c in step.as_json()["cells"]}
    timed = [c for c in cells.values() if c["benchmark"].rsplit("_", 1)[-1] in MODE_NAMES]
    assert len(timed) == len(cells) > step.compared / 2  # every timing; peak memory is not one
    assert cells[fx.PLANTED_LABEL]["moved"] == pytest.approx(1.5, rel=0.02)  # every round 1.5x: so the median
    others = [c["moved"] for label, c in cells.items() if label != fx.PLANTED_LABEL]
    assert others and all(m == pytest.approx(1.0, rel=0.02) for m in others)  # the very same rounds
    assert all(c["threshold"] is None or c["threshold"] > 1 for c in cells.values())


def test_a_compare_s_flagged_cells_are_confirmed_or_not_by_their_re_measurement(tmp_path, capsys):
    folder = make_compare(tmp_path / "ab", fx.COMMIT_3, fx.COMMIT_3, head_scale=[(PLANTED, 1.5)])
    base_s = gate_compare(folder).regressions[0].base

    def again(name: str, head_scale: float, drift: float = 0.0) -> Path:  # as relu2 confirm writes it
        path = tmp_path / name
        base_rounds = [base_s * (1 + drift * i) for i in range(6)]  # the box drifting as it measures
        path.write_text(json.dumps({"base": fx.COMMIT_3, "head": fx.COMMIT_3, "machine": fx.MACHINE,
                                    "instrument": "0" * 40, "cells": [{
            "benchmark": fx.PLANTED_BENCH, "params": {k: str(v) for k, v in fx.PLANTED_PARAMS.items()},
            "base_rounds": base_rounds, "head_rounds": [b * head_scale for b in base_rounds]}]}))
        return path

    confirmed = cli.main(["gate", "--compare", str(folder), "--confirmed", str(again("slow.json", 1.5))])
    assert confirmed == 1 and "CONFIRMED REGRESSIONS" in capsys.readouterr().out
    gone = gate_compare(folder, confirmed=again("same.json", 1.0))
    assert gone.exit_code == 0 and [c.label for c in gone.unconfirmed] == [fx.PLANTED_LABEL]
    with pytest.raises(ResultsError, match="not of"):
        gate_compare(folder, confirmed=_other_commits(again("other.json", 1.5)))
    by_other = again("other-instrument.json", 1.0)  # one that would clear the cell, by another ruler
    by_other.write_text(by_other.read_text().replace('"0000000000', '"1111111111', 1))
    with pytest.raises(ResultsError, match="by instrument '1111"):
        gate_compare(folder, confirmed=by_other)
    # Judged paired, as the compare flagged it: a box drifting 2.5x over the rounds hides nothing (the
    # rounds' width would have needed 1.5x times 2.5)
    drifting = gate_compare(folder, confirmed=again("drift.json", 1.5, drift=0.3))
    assert drifting.exit_code == 1 and drifting.regressions[0].moved == pytest.approx(1.5)


def _other_commits(path: Path) -> Path:
    data = json.loads(path.read_text())
    data["base"] = fx.COMMIT_2
    path.write_text(json.dumps(data))
    return path


def test_the_text_shows_the_ratio_judged_beside_the_medians_ratio(tmp_path):
    report = gate_compare(make_compare(tmp_path / "ab", fx.COMMIT_3, fx.COMMIT_3, head_scale=[(PLANTED, 1.5)]))
    text = report.format()
    header = next(line for line in text.splitlines() if line.split()[:2] == ["ratio", "judged"])
    row = next(line for line in text.splitlines() if line.endswith(fx.PLANTED_LABEL))
    assert header and row.split()[1] == f"{report.regressions[0].moved:.2f}x" == "1.50x"
    assert "| ratio | judged |" in report.markdown()


def test_noise_check_same_box_leaves_each_box_out_and_names_each_compare(tmp_path, capsys):
    """The same-box model's out-of-sample check: learned without each box in turn, every compare folder
    of that box judged (both ways) by the gate's rule; one box makes many folders, each its own
    comparison, and a cell that moved 1.3x on the box left out fails its folder."""
    eager = ("bench_relu2.Grid.track_hot", {"impl": "eager", "dtype": "float32", "numel": 65536})
    small = [(PLANTED, 1.004), (eager, 0.997)]
    folders = [str(make_compare(tmp_path / f"aa{i}-{j}", fx.COMMIT_3, fx.COMMIT_3, box=f"boot-{i}",
                                head_scale=[(eager, 1.3)] if (i, j) == (2, 0) else small))
               for i in range(3) for j in range(2)]
    check = noise_check([], same_box=folders)
    assert sorted(check["boxes"]) == ["boot-0", "boot-1", "boot-2"]
    names = sorted(c["comparison"] for c in check["comparisons"])
    assert len(names) == 12 and f"{fx.MACHINE}: aa2-0" in names and f"{fx.MACHINE}: aa2-0, reversed" in names
    failing = {c["comparison"]: c["held_out"] for c in check["comparisons"] if c["false_flags"]}
    assert failing.get(f"{fx.MACHINE}: aa2-0") == "boot-2"
    assert cli.main(["noise", "check", *(f"--same-box={d}" for d in folders)]) == 0
    assert "no-change comparisons fail" in capsys.readouterr().out
    # one kind at a time, and a check needs something to check
    assert cli.main(["noise", "check", str(fx.RESULTS), f"--same-box={folders[0]}"]) == 2
    assert cli.main(["noise", "check"]) == 2
    assert cli.main(["noise", "check", f"--same-box={folders[0]}", f"--same-box={folders[1]}"]) == 2  # one box


# --- issue 39: what a compare folder from CI may decide ----------------------------------------------------


def _edit(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _machine_json(folder: Path, side: str) -> Path:
    return folder / side / fx.MACHINE / "machine.json"


@pytest.mark.parametrize("base_gpu, head_gpu, compare_gpu", [
    ("none", "none", fx.GPU),  # compare.json names the GPU, both sides none
    (fx.GPU, "none", fx.GPU),  # b478d2b: the head's "none" chose the CPU's model
    (fx.GPU, fx.GPU, "none"),
    ("NVIDIA H100 80GB HBM3", fx.GPU, fx.GPU),
])
def test_the_gpu_of_both_sides_and_the_compare_must_agree(tmp_path, capsys, base_gpu, head_gpu, compare_gpu):
    folder = make_compare(tmp_path / "c", fx.COMMIT_3, fx.COMMIT_3)
    _edit(_machine_json(folder, "base"), gpu=base_gpu)
    _edit(_machine_json(folder, "head"), gpu=head_gpu)
    _edit(folder / "compare.json", gpu=compare_gpu)
    with pytest.raises(ResultsError, match="the GPU is recorded as .*not judged"):
        gate_compare(folder)
    refused(["gate", "--compare", str(folder)], capsys, "base machine.json", "head machine.json", "compare.json")


def test_the_gpu_must_be_the_one_the_runner_stands_for(tmp_path, capsys):
    folder = make_compare(tmp_path / "c", fx.COMMIT_3, fx.COMMIT_3)
    assert gate_compare(folder, expect_gpu=fx.GPU).exit_code == 0
    with pytest.raises(ResultsError, match="not on the 'NVIDIA H200' this runner stands for"):
        gate_compare(folder, expect_gpu="NVIDIA H200")
    cpu = make_compare(tmp_path / "cpu", fx.COMMIT_3, fx.COMMIT_3, gpu="none")
    assert gate_compare(cpu).exit_code == 0  # a CPU compare, judged by the CPU's model, when none is expected
    for name in ("none", ""):  # ... and never when a GPU is
        refused(["gate", "--compare", str(cpu), "--expect-gpu", name], capsys, "--expect-gpu", "never none")
    refused(["gate", fx.COMMIT_2, fx.COMMIT_3, "--results", str(fx.RESULTS), "--expect-gpu", fx.GPU], capsys,
            "go with --compare DIR")
    refused(["gate", fx.COMMIT_2, fx.COMMIT_3, "--results", str(fx.RESULTS), "--plan", "benchmarks"], capsys,
            "go with --compare DIR")


def test_the_l2_is_the_model_s(tmp_path):
    """The bands (in L2, 1-4x L2, beyond) are the model's GPU's: a folder recording another L2 moved
    every cell between them."""
    folder = make_compare(tmp_path / "c", fx.COMMIT_3, fx.COMMIT_3)
    for side in ("base", "head"):
        _edit(_machine_json(folder, side), l2_bytes=str(2**40))
    with pytest.raises(ResultsError, match="records an L2 of 1099511627776 bytes.*learned with 62914560"):
        gate_compare(folder)
    for side in ("base", "head"):
        _edit(_machine_json(folder, side), l2_bytes=str(62914560))
    assert gate_compare(folder).exit_code == 0


@pytest.mark.parametrize("where, key, value", [
    ("compare", "box", "boot-1\n### relu2 gate: PASS"),
    ("compare", "box", "boot `x` @octocat"),
    ("compare", "gpu", "NVIDIA H200 <img src=x>"),
    ("head", "gpu", "NVIDIA H200\n\n### PASS"),
    ("head", "torch", "2.9.0 [x](https://e.invalid)"),
    ("base", "driver", "570 @octocat"),
])
def test_names_a_folder_records_are_refused_unless_plain(tmp_path, where, key, value):
    folder = make_compare(tmp_path / "c", fx.COMMIT_3, fx.COMMIT_3)
    _edit(folder / "compare.json" if where == "compare" else _machine_json(folder, where), **{key: value})
    with pytest.raises(ResultsError, match=f"{key} .*not read") as e:
        gate_compare(folder)
    assert not set("`@<[#\n") & set(str(e.value).split(": ", 1)[1])  # the message quotes nothing markdown reads


def test_honest_names_are_read():
    from relu2.records.compare_folder import BOX_ID, RECORDED_NAME

    assert BOX_ID.fullmatch("8c1f2a3e-5b6d-4e7f-8a9b-0c1d2e3f4a5b") and BOX_ID.fullmatch("h200-l:1")
    for name in ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "2.9.0+cu128", "570.133.20", "12.8", "n/a", "none", fx.GPU):
        assert RECORDED_NAME.fullmatch(name), name


def _planned(tmp_path: Path, name: str = "p") -> Path:
    from test_ci_attacks import _planned_folder  # the whole plan of the suites, an A/A on the H200

    return _planned_folder(tmp_path / name, "h200", "NVIDIA H200")


PLAN = Path(__file__).resolve().parents[1] / "benchmarks"


def test_a_compare_of_the_whole_plan_holds_every_planned_cell(tmp_path, monkeypatch):
    from relu2.judge.gate import read_plan

    monkeypatch.delenv(noise.MODEL_ENV, raising=False)  # the shipped model judges the H200
    monkeypatch.setenv("RELU2_BENCH_QUICK", "1")  # the caller's narrowing is not the plan's
    monkeypatch.setenv("RELU2_BENCH_SUITES", "Grid")
    plan = read_plan(PLAN)
    assert plan.suites == ("Grid", "ModelShapes", "VllmShapes", "Nemotron", "WarmupOrder")
    report = gate_compare(_planned(tmp_path), expect_gpu="NVIDIA H200", plan=PLAN)
    assert report.exit_code == 0 and report.planned == report.planned_compared == len(plan.cells) > 2000
    assert f"({len(plan.cells)} of {len(plan.cells)} planned cells)" in report.summary()


def test_a_planned_cell_absent_from_a_side_is_missing(tmp_path, monkeypatch):
    monkeypatch.delenv(noise.MODEL_ENV, raising=False)
    folder = _planned(tmp_path)
    for side in ("base", "head"):  # one benchmark gone from both sides, results and benchmarks.json
        path = next((folder / side).glob("*/*-*.json"))
        data = json.loads(path.read_text())
        del data["results"]["bench_relu2.Nemotron.track_hot"]
        path.write_text(json.dumps(data))
    report = gate_compare(folder, expect_gpu="NVIDIA H200", plan=PLAN)
    assert report.exit_code == 1 and report.missing and not report.regressions
    assert all(c.benchmark == "bench_relu2.Nemotron.track_hot" and c.why == "absent at base and head"
               for c in report.missing)
    assert "MISSING (in the plan" in report.format() and "#### Missing" in report.markdown()
    assert report.as_json()["missing"][0]["label"].startswith("Nemotron.track_hot(")
    allowed = gate_compare(folder, expect_gpu="NVIDIA H200", plan=PLAN, allow_missing=["Nemotron.*"])
    assert allowed.exit_code == 0 and not allowed.missing and len(allowed.allowed) == len(report.missing)
    assert gate_compare(folder).exit_code == 0  # without the plan nothing knew (b478d2b's judge)


@pytest.mark.parametrize("changes, why", [
    ({"suites": ["Grid"]}, "suites .*Grid.*, not all of Grid, ModelShapes"),
    ({"narrowed": {"RELU2_BENCH_IMPLS": "fused,eager"}}, "narrowed by"),
    ({"cells": ["x"]}, "only some cells"),
])
def test_a_compare_of_less_than_the_plan_is_refused(tmp_path, monkeypatch, changes, why):
    monkeypatch.delenv(noise.MODEL_ENV, raising=False)
    folder = _planned(tmp_path)
    _edit(folder / "compare.json", **changes)
    with pytest.raises(ResultsError, match=why):
        gate_compare(folder, plan=PLAN)
    assert gate_compare(folder).exit_code == 0  # what a user's own narrowed compare still gets, without --plan


def test_a_plan_that_cannot_be_read_is_refused(tmp_path):
    folder = make_compare(tmp_path / "c", fx.COMMIT_3, fx.COMMIT_3)
    with pytest.raises(ResultsError, match="no suites to take the plan from"):
        gate_compare(folder, plan=tmp_path)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "bench_relu2.py").write_text("raise RuntimeError('no')\n")
    with pytest.raises(ResultsError, match="the plan cannot be read .*RuntimeError: no"):
        gate_compare(folder, plan=tmp_path / "broken")


def _flat_confirmation(path: Path, report, machine: str = fx.MACHINE) -> Path:
    """A re-measurement of every regression of ``report``, flat at its base figure: it clears them all."""
    cells = [{"benchmark": c.benchmark, "params": dict(c.params), "base_rounds": [c.base] * 30,
              "head_rounds": [c.base] * 30} for c in report.regressions]
    path.write_text(json.dumps({"base": fx.COMMIT_3, "head": fx.COMMIT_3, "machine": machine, "instrument": "0" * 40,
                                "cells": cells}))
    return path


@pytest.mark.parametrize("flagged, contradicted", [(2, False), (3, True), (4, True)])
def test_a_re_measurement_that_clears_every_one_of_many_flagged_cells_fails(tmp_path, flagged, contradicted):
    from relu2.judge.rule import CONTRADICTED_FROM

    assert CONTRADICTED_FROM == 3
    sizes = [1048576, 16777216, 268435456, 65536][:flagged]
    folder = make_compare(tmp_path / "c", fx.COMMIT_3, fx.COMMIT_3, head_scale=[
        (("bench_relu2.Grid.track_hot", {"impl": "fused", "dtype": "bfloat16", "numel": n}), 3.0) for n in sizes])
    first = gate_compare(folder)
    assert len(first.regressions) == flagged, [c.label for c in first.regressions]
    report = gate_compare(folder, confirmed=_flat_confirmation(tmp_path / "again.json", first))
    assert report.contradicted is contradicted and len(report.unconfirmed) == flagged and not report.regressions
    assert report.exit_code == int(contradicted)
    assert ("the re-measurement clears all" in report.summary()) is contradicted
    assert report.as_json()["contradicted"] is contradicted


def test_a_re_measurement_that_confirms_one_cell_is_not_contradicted(tmp_path):
    sizes = [1048576, 16777216, 268435456]
    folder = make_compare(tmp_path / "c", fx.COMMIT_3, fx.COMMIT_3, head_scale=[
        (("bench_relu2.Grid.track_hot", {"impl": "fused", "dtype": "bfloat16", "numel": n}), 3.0) for n in sizes])
    first = gate_compare(folder)
    path = _flat_confirmation(tmp_path / "again.json", first)
    data = json.loads(path.read_text())
    data["cells"][0]["head_rounds"] = [x * 3.0 for x in data["cells"][0]["base_rounds"]]
    path.write_text(json.dumps(data))
    report = gate_compare(folder, confirmed=path)
    assert not report.contradicted and len(report.regressions) == 1 and report.exit_code == 1


def test_a_re_measurement_of_another_machine_is_refused(tmp_path):
    folder = make_compare(tmp_path / "c", fx.COMMIT_3, fx.COMMIT_3, head_scale=[(PLANTED, 1.5)])
    first = gate_compare(folder)
    for machine in ("h100", ""):
        with pytest.raises(ResultsError, match="a re-measurement on machine .*not on 'fixture-machine'"):
            gate_compare(folder, confirmed=_flat_confirmation(tmp_path / "again.json", first, machine=machine))


# --- the report's markdown: strings of the folder rendered as written ------------------------------------------


def test_code_keeps_a_string_in_its_table_cell():
    from relu2.vocab.markdown import code as _code

    assert _code("Grid.track_hot(impl=fused)") == "` Grid.track_hot(impl=fused) `"
    assert _code("a`b``c") == "``` a`b``c ```"  # a fence longer than any run inside
    assert _code("x|y") == "` x\\|y `"  # GFM splits the row at a pipe before it reads the code span
    assert _code("a\n\n### b\r\x1b[31m\u202eX") == "` a ### b [31m X `"  # one line, no control or direction
    assert len(_code("x" * 1000)) < 210


def test_prose_renders_as_written():
    from relu2.vocab.markdown import WORD_JOINER
    from relu2.vocab.markdown import prose as _prose

    text = _prose("b\n\n### ✅ PASS <img src=x onerror=alert(1)> @octocat #12 [x](https://e.invalid) *y* _z_ | `w` &amp;")
    assert "\n" not in text and "<" not in text and "&amp;amp;" in text
    assert "@octocat" not in text and f"@{WORD_JOINER}octocat" in text and f"#{WORD_JOINER}12" in text
    assert "\\[x\\](" in text and not re.search(r"(?<!\\)\]\(", text) and "https://" not in text  # no link
    assert "\\*y\\*" in text and "\\_z\\_" in text and "\\|" in text and "\\`w\\`" in text
    note = "base and head ran different software: torch n/a -> 2.12.0+cu130 (every figure may move with it)"
    assert _prose(note, 1000) == note  # an honest note is unchanged
