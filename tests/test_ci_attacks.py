"""Attacks on the GPU workflow's verdict, each run through benchmarks.yml's own "Judge each machine"
step, as the judge job runs it, with the shipped noise model (issues 26 and 39).

Issue 26, shown on the CPU with the old workflow's own steps:

1. **The tampered judge.**  Code of the head runs where it is measured; there it can rewrite the
   instrument installed on that box (relu2/verdict.py) and drop files into the measured folder.  The
   old workflow judged with that copy; the new one judges in another job, on a hosted machine, with
   the instrument installed fresh from the default branch's commit, reading only the folder's data.
   Shown: the tampered copy passes a 7x slowdown, the judge step fails it.
2. **The ground fingerprint.**  For the paths that do not autotune (fused, triton, vllm_cuda) the
   kernel fingerprint comes from code the head controls; a head that makes its kernel 3x slower and
   grinds a comment (today, comments do not move it: an unused constant) until the fingerprint's first
   6 hex digits match the base's was "repicked, never failing".  The judge step fails it: the
   exemption is only for paths that autotune.

Issue 39, at b478d2b's workflow (each test here fails there):

1. **Every machine the workflow measures is judged.**  The H100 had no shipped model, so every
   H100 folder exited 2: the machines are now those with a model, and each judges an honest A/A.
2. **The folder decides the figures only.**  Its GPU (``none`` chose the CPU model: nothing gated),
   its L2, its cells (deleted from both sides: fewer compared, nothing said), a flat re-measurement
   (every flagged cell "unconfirmed") and its free strings (markdown in the comment) are checked
   against what the judge trusts: the runner's GPU, the model, the instrument's own suites.
3. **A crafted folder cannot silence the judge** (a folder named ``report.d`` stopped the step: no
   comment, no status, the required check waiting forever).

The step runs in bash as the judge job runs it: ``$RUNNER_TEMP/venv/bin/relu2`` a copy of the package
in a folder of its own (``_install``), the suites copied as the install step copies them, and no
``RELU2_*`` variable (the workflow sets none: the copy reads its own relu2/noise_model.json, the model
the fresh install has), on compare folders holding the whole plan of the suites (``_planned_folder``).
"""

from __future__ import annotations

import atexit
import functools
import itertools
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import pytest
import yaml  # asv's dependency

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
import asv_fixture as fx  # noqa: E402

from conftest import ROOT  # noqa: E402
from relu2.judge import noise  # noqa: E402
from relu2.records.asv_names import decode  # noqa: E402
from relu2.vocab.schema import MODE_NAMES, bytes_moved, kernel_id  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures"
WORKFLOW = ROOT / ".github" / "workflows" / "benchmarks.yml"
GRID = ("bench_relu2.Grid.track_hot", "bench_relu2.Grid.track_cold")
KERNEL = "bench_relu2.Grid.track_kernel"
INSTRUMENT = "c" * 40
BASE, HEAD = fx.COMMIT_2, fx.COMMIT_3  # any two hashes: the folders are made here
ROUNDS = 15
SHIPPED_NOTE = "judged with its cross-box model"  # relu2.judge.gate.pick_model: the shipped model of that GPU judged
COLUMNS = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b", "stats_q_25",
           "stats_q_75", "stats_number", "stats_repeat", "samples", "profile"]


def _jobs() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())["jobs"]


def _machines() -> dict[str, str]:
    """The judge's MACHINES: each runner label and the GPU it stands for."""
    return json.loads(_jobs()["judge"]["env"]["MACHINES"])


def _copy(dest: Path) -> Path:
    """The package in a folder of its own, nothing shared with this checkout."""
    shutil.copytree(ROOT / "relu2", dest / "relu2", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def _install(instrument: Path, venv: Path) -> None:
    """``venv/bin/relu2`` running ``instrument``'s package, in isolated mode (-I: no PYTHONPATH, no
    current folder, no user site): what the judge job's fresh venv gives its step."""
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    code = f"import sys; sys.path.insert(0, {str(instrument)!r}); from relu2.cli import main; sys.exit(main())"
    tool = venv / "bin" / "relu2"
    tool.write_text(f"#!/bin/sh\nexec {sys.executable} -I -c {json.dumps(code)} \"$@\"\n")
    tool.chmod(0o755)


def _clean_env() -> dict[str, str]:
    """This process's environment without RELU2_* (conftest sets RELU2_NOISE_MODEL for other tests;
    the workflow sets none)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RELU2_")}


# --- compare folders holding the whole plan ------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _described() -> tuple[dict, ...]:
    """benchmarks.json of the repository's suites, unnarrowed: as relu2 compare's record step lists them."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "benchmarks.json"
        code = ("import contextlib, io, sys; from asv_runner.discovery import list_benchmarks; buf = io.StringIO()\n"
                "with contextlib.redirect_stdout(io.StringIO()): list_benchmarks(sys.argv[1], buf)\n"
                "open(sys.argv[2], 'w').write(buf.getvalue())")
        subprocess.run([sys.executable, "-c", code, str(ROOT / "benchmarks"), str(out)], env=_clean_env(),
                       cwd=ROOT, check=True, timeout=300)
        return tuple(json.loads(out.read_text()))


def _figure(cell, unit: str) -> tuple[float, list[float] | None]:
    """A cell's synthetic figure (a median, and its rounds for a timing): the same at every call."""
    if unit == "kernel id":
        return (math.nan if cell.impl in ("eager", "copy") else
                float(kernel_id(f"{zlib.crc32(cell.impl.encode()) & 0xffffff:06x}{cell.numel % 0xffffff:06x}"))), None
    moved = bytes_moved(cell.numel, cell.dtype) if cell.numel else 2**24
    if unit == "bytes":
        return float(moved), None
    speed = 2.5e12 + (zlib.crc32(cell.impl.encode()) % 1000) * 1e9
    seconds = {"hot": 4e-6, "cold": 7e-6, "launch": 9e-6}.get(cell.measure, 5e-6) + moved / speed
    seed = zlib.crc32(repr(cell.identity).encode())
    rounds = [seconds * (1 + 0.001 * (((seed >> (i % 16)) + 3 * i) % 5 - 2)) for i in range(ROUNDS)]
    return statistics.median(rounds), rounds


def _results(described: list[dict], machine: str, commit: str, info: dict) -> dict:
    """An asv results file (format 2) of ``commit``: every parameter combination of every benchmark."""
    results = {}
    for b in described:
        values, samples = [], []
        combos = list(itertools.product(*b["params"])) if b["params"] else [()]
        for combo in combos:
            params = tuple((n, v.strip("'")) for n, v in zip(b["param_names"], combo))
            value, rounds = _figure(decode(b["name"], params, b["unit"]), b["unit"])
            values.append(value)  # NaN: skipped (asv's n/a), as eager's and copy's kernel fingerprints
            samples.append(rounds)
        row = [values, b["params"], b.get("version"), 1796045233610, 0.5, None, None, None, None, None, None,
               samples if any(s is not None for s in samples) else None, None]
        while row and row[-1] is None:
            row.pop()
        results[b["name"]] = row
    return {"commit_hash": commit, "env_name": "relu2-compare", "date": 1794830400000,
            "params": {**info, "python": "3.12"}, "python": "3.12", "requirements": {}, "env_vars": {},
            "result_columns": COLUMNS, "results": results, "durations": {}, "version": 2}


def _machine_info(machine: str, gpu: str) -> dict:
    shipped = noise.model_for(noise.load_models(noise.DEFAULT_MODEL_PATH), gpu, noise.CROSS_BOX)
    l2 = shipped.l2_bytes if shipped else 50 * 2**20
    return {"machine": machine, "gpu": gpu, "l2_bytes": str(l2), "torch": "2.9.0+cu128", "triton": "3.5.0",
            "cuda": "12.8", "driver": "570.133.20", "cpu": "synthetic", "num_cpu": "16", "os": "Linux",
            "ram": "128GB", "arch": "x86_64", "version": 1}


@functools.lru_cache(maxsize=4)
def _pristine(machine: str, gpu: str) -> Path:
    """An A/A compare folder of the whole plan, made once a session and copied by ``_planned_folder``."""
    dest = Path(tempfile.mkdtemp(prefix="relu2-planned-")) / "folder"
    atexit.register(shutil.rmtree, dest.parent, True)
    described = list(_described())
    for side, commit in (("base", BASE), ("head", HEAD)):
        folder = dest / side / machine
        folder.mkdir(parents=True)
        (dest / side / "benchmarks.json").write_text(json.dumps({**{b["name"]: b for b in described}, "version": 2}))
        (folder / "machine.json").write_text(json.dumps(_machine_info(machine, gpu)))
        data = _results(described, machine, commit, _machine_info(machine, gpu))
        (folder / f"{commit[:8]}-relu2-compare.json").write_text(json.dumps(data))
    suites = sorted({b["name"].split(".")[1] for b in described} - {"Implementations"},
                    key=["Grid", "ModelShapes", "VllmShapes", "Nemotron", "WarmupOrder"].index)
    (dest / "compare.json").write_text(json.dumps({
        "format": 1, "box": f"boot-{machine}-1f0e", "machine": machine, "gpu": gpu, "device": "cuda",
        "base": {"ref": BASE, "sha": BASE}, "head": {"ref": HEAD, "sha": HEAD}, "rounds": ROUNDS,
        "order": ["base", "head"] * ROUNDS, "suites": suites, "narrowed": {}, "cells": None,
        "instrument": INSTRUMENT, "started_at": "2026-12-01T00:00:00Z", "finished_at": "2026-12-01T01:00:00Z",
        "complete": True}))
    return dest


def _planned_folder(dest: Path, machine: str, gpu: str | None = None) -> Path:
    """A compare folder as measure uploads it for ``machine``: the whole plan of the suites, base and
    head the same figures (an A/A; the tests edit them), recorded on ``gpu`` (default: the one the
    workflow says that runner stands for)."""
    shutil.copytree(_pristine(machine, gpu or _machines()[machine]), dest)
    return dest


def _side_file(folder: Path, side: str) -> Path:
    (path,) = (folder / side).glob("*/*-*.json")
    return path


def _edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _slower(folder: Path, impl: str, factor: float, dtypes=None, sizes=None) -> None:
    """Every Grid hot and cold cell of ``impl`` (of ``dtypes`` and ``sizes``) on the head's side
    ``factor`` times slower."""
    path = _side_file(folder, "head")
    params = json.loads((folder / "head" / "benchmarks.json").read_text())[GRID[0]]["params"]
    commit = json.loads(path.read_text())["commit_hash"]
    cells = [(benchmark, {"impl": impl, "dtype": eval(dtype), "numel": int(numel)})
             for benchmark in GRID for dtype, numel in itertools.product(params[1], params[2])
             if not (dtypes and eval(dtype) not in dtypes) and not (sizes and int(numel) not in sizes)]
    fx.edit_cells(folder / "head", commit, cells, scale=factor, machine=path.parent.name)


def _judge_step(runner_temp: Path, base: str = BASE, head: str = HEAD, check: bool = True):
    """benchmarks.yml's "Judge each machine", run as the judge job runs it, after its install step's
    copy of the suites; its one output, decoded (and the run, with ``check=False``)."""
    if shutil.which("jq") is None:
        pytest.skip("jq is not installed (it is on GitHub's hosted runners)")
    job = _jobs()["judge"]
    install = next(s for s in job["steps"] if s.get("name") == "Install the instrument")["run"]
    assert 'cp -R instrument/benchmarks "$RUNNER_TEMP/suites"' in install  # what the next line mirrors
    if not (runner_temp / "suites").exists():
        shutil.copytree(ROOT / "benchmarks", runner_temp / "suites", ignore=shutil.ignore_patterns("__pycache__"))
    script = next(s for s in job["steps"] if s.get("name") == "Judge each machine")["run"]
    literal = {k: str(v) for k, v in job["env"].items() if "${{" not in str(v)}
    env = {**_clean_env(), **literal, "RUNNER_TEMP": str(runner_temp), "BASE": base, "HEAD": head,
           "INSTRUMENT": INSTRUMENT, "INSTRUMENT_CHANGED": "false",
           "GITHUB_OUTPUT": str(runner_temp / "out"), "GITHUB_STEP_SUMMARY": str(runner_temp / "summary")}
    run = subprocess.run(["bash", "-e", "-c", script], env=env, capture_output=True, text=True, timeout=600,
                         cwd=runner_temp)
    if not check:
        return run
    assert run.returncode == 0, run.stderr
    (line,) = (runner_temp / "out").read_text().splitlines()
    return json.loads(line.removeprefix("reports="))


def _flagged(tool: Path, folder: Path) -> list[dict]:
    """The cells the measure step measures again: its own gate call's regressions (relu2 gate --compare
    DIR --format json), by the same tool and environment."""
    run = subprocess.run([str(tool), "gate", "--compare", str(folder), "--format", "json"], env=_clean_env(),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    return json.loads(run.stdout)["regressions"]


def _aa(tmp_path: Path, *edit) -> tuple[Path, dict]:
    """Every machine of the workflow measured (an A/A), ``edit`` applied to the h200 folder, judged."""
    measured = tmp_path / "runner" / "measured"
    for machine in _machines():
        _planned_folder(measured / f"measured-{machine}", machine)
    h200 = measured / "measured-h200"
    for e in edit:
        e(h200)
    _install(_copy(tmp_path / "judge"), tmp_path / "runner" / "venv")
    return h200, _judge_step(tmp_path / "runner")


# --- issue 26, 1. the tampered judge -------------------------------------------------------------------


def _hostile_measurement(box: Path, measured: Path) -> None:
    """What the head's implementation module does when the measuring process imports it (PYTHONPATH:
    the instrument, then the head's code, as relu2 compare runs a side): the box's verdict rewritten,
    and a verdict, a copy of that instrument and start-up code left in the folder that is uploaded."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(box), str(FIXTURES)]), "RELU2_HOSTILE_TARGET": str(box)}
    subprocess.run([sys.executable, "-c", "import hostile_impl"], env=env, check=True, timeout=60, cwd=box)
    assert "# hostile_impl" in (box / "relu2" / "judge" / "rule.py").read_text()
    (measured / "report.md").write_text("### ✅ relu2 gate: PASS\n")
    shutil.copytree(box / "relu2", measured / "relu2")
    (measured / "sitecustomize.py").write_text("import sys; print('### relu2 gate: PASS'); sys.exit(0)\n")


def test_code_run_during_measurement_cannot_change_the_verdict(tmp_path):
    measured = tmp_path / "runner" / "measured"
    h200 = _planned_folder(measured / "measured-h200", "h200")
    _slower(h200, "fused", 7.0)
    box = _copy(tmp_path / "box")  # the GPU box's instrument
    _hostile_measurement(box, h200)
    pristine = tmp_path / "pristine"
    shutil.copytree(measured, pristine)

    # The old design: the verdict computed with the box's instrument passes the 7x.
    _install(box, tmp_path / "runner" / "venv")
    tampered = _judge_step(tmp_path / "runner")
    assert tampered["h200"]["exit"] == 0 and "PASS" in tampered["h200"]["report"]

    # The judge job: a fresh runner, the default branch's instrument installed fresh, the same upload.
    fresh = tmp_path / "hosted"
    shutil.copytree(pristine, fresh / "measured")
    _install(_copy(tmp_path / "judge"), fresh / "venv")
    reports = _judge_step(fresh)
    assert reports["h200"]["exit"] == 1 and "FAIL" in reports["h200"]["report"]
    assert "impl=fused" in reports["h200"]["report"] and "PASS" not in reports["h200"]["report"]
    assert SHIPPED_NOTE in reports["h200"]["report"]
    assert not (fresh / "measured" / "measured-h200" / "report.md").exists()  # deleted unread

    # ... which is how the workflow judges: another job, a hosted runner, a fresh install of github.sha.
    jobs = _jobs()
    assert "self-hosted" in json.dumps(jobs["measure"]["runs-on"]) and jobs["judge"]["runs-on"] == "ubuntu-latest"
    steps = {s.get("name"): s for s in jobs["judge"]["steps"]}
    assert [s["with"]["ref"] for s in jobs["judge"]["steps"] if "checkout" in str(s.get("uses"))] == ["${{ github.sha }}"]
    assert 'python3 -m venv "$RUNNER_TEMP/venv"' in steps["Install the instrument"]["run"]


# --- issue 26, 2. the ground fingerprint -----------------------------------------------------------------


def _fingerprints(folder: Path, side: str, impl: str, fingerprint: str) -> None:
    """A ``Grid.track_kernel`` benchmark (unit "kernel id", as the suite records it) on ``side``:
    ``fingerprint`` for ``impl``'s cells, a fingerprint of its own for every other cell."""
    benchmarks = json.loads((folder / side / "benchmarks.json").read_text())
    benchmarks[KERNEL] = dict(benchmarks[GRID[0]], name=KERNEL, unit="kernel id")
    (folder / side / "benchmarks.json").write_text(json.dumps(benchmarks))
    path = _side_file(folder, side)
    data = json.loads(path.read_text())
    row = list(data["results"][GRID[0]])
    columns = data["result_columns"]
    params = row[columns.index("params")]
    row[columns.index("result")] = [
        float(kernel_id(fingerprint if eval(p[0]) == impl else f"{i:06x}0000ffffff"))
        for i, p in enumerate(itertools.product(*params))]
    for name in ("stats_ci_99_a", "stats_ci_99_b", "stats_q_25", "stats_q_75", "samples"):
        if columns.index(name) < len(row):
            row[columns.index(name)] = None
    data["results"][KERNEL] = row
    path.write_text(json.dumps(data))


def _ground(tmp_path: Path, impl: str, base_fp: str, head_fp: str) -> dict:
    """An A/A on h200 whose head's ``impl`` is 3x slower with ``head_fp``, through the judge step."""
    folder = _planned_folder(tmp_path / "measured" / "measured-h200", "h200")
    _fingerprints(folder, "base", impl, base_fp)
    _fingerprints(folder, "head", impl, head_fp)
    _slower(folder, impl, 3.0)
    _install(_copy(tmp_path / "judge"), tmp_path / "venv")
    return _judge_step(tmp_path)["h200"]


@pytest.mark.parametrize("impl", ["triton", "fused"])
def test_a_slower_fixed_kernel_with_other_code_fails(tmp_path, impl):
    """The control: the 3x is caught when the fingerprint says the code changed."""
    found = _ground(tmp_path, impl, "aaaaaa111111", "bbbbbb111111")
    assert found["exit"] == 1 and f"impl={impl}" in found["report"], found["report"]


@pytest.mark.parametrize("impl", ["triton", "fused"])
def test_a_slower_fixed_kernel_with_a_ground_fingerprint_fails(tmp_path, impl):
    found = _ground(tmp_path, impl, "aaaaaa111111", "aaaaaa222222")
    assert found["exit"] == 1 and f"impl={impl}" in found["report"], found["report"]


# --- issue 39, 1. every machine the workflow measures is judged -------------------------------------------


def test_every_machine_the_workflow_measures_is_judged_by_the_shipped_model(tmp_path):
    """b478d2b measured an H100 and required its status, and the shipped model has none of it: every
    H100 folder exited 2.  An honest A/A on each machine passes, judged by the shipped model."""
    assert "RELU2_NOISE_MODEL" not in WORKFLOW.read_text() and "--noise-model" not in WORKFLOW.read_text()
    _, reports = _aa(tmp_path)
    assert set(reports) == set(_machines())
    for machine, gpu in _machines().items():
        report = reports[machine]["report"]
        assert reports[machine]["exit"] == 0 and "relu2 gate: PASS" in report, report
        # the shipped file's model, not a test's (the H200's same-box model judges only cells whose work changed)
        gpu_ = re.escape(gpu)
        assert re.search(rf"no same-box noise model for {gpu_}: {SHIPPED_NOTE} \(wider: two boxes"
                         rf"|{SHIPPED_NOTE} \(wider: the same-box model of {gpu_} ", report), report
        planned = re.search(r"\((\d+) of (\d+) planned cells\)", report)
        assert planned and planned.group(1) == planned.group(2) and int(planned.group(2)) > 2000, report


def test_every_gpu_the_matrix_measures_has_a_shipped_model():
    models = noise.load_models(noise.DEFAULT_MODEL_PATH)
    jobs = _jobs()
    assert set(jobs["measure"]["strategy"]["matrix"]["gpu"]) == set(_machines())
    for machine, gpu in _machines().items():
        assert noise.is_gpu(gpu), machine
        assert noise.model_for(models, gpu, noise.SAME_BOX) or noise.model_for(models, gpu, noise.CROSS_BOX), gpu


# --- issue 39, 2. the folder decides the figures only ---------------------------------------------------------


def _gpu(where: str, name: str):
    """Record ``name`` as the GPU: in both sides' machine.json ("sides"), the head's only ("head"),
    compare.json ("compare"), or all three ("all")."""

    def edit(folder: Path) -> None:
        if where in ("sides", "head", "all"):
            for side in ("head",) if where == "head" else ("base", "head"):
                _edit_json(next((folder / side).glob("*/machine.json")), gpu=name)
        if where in ("compare", "all"):
            _edit_json(folder / "compare.json", gpu=name)
    return edit


def _l2(size: int):
    def edit(folder: Path) -> None:
        for side in ("base", "head"):
            _edit_json(next((folder / side).glob("*/machine.json")), l2_bytes=str(size))
    return edit


@pytest.mark.parametrize("edit, why", [
    (_gpu("all", "none"), "NVIDIA H200"),  # b478d2b: PASS, "not gated": judged by the CPU's model
    (_gpu("head", "none"), "NVIDIA H200"),  # b478d2b: the head's GPU chose the model
    (_gpu("sides", "none"), "NVIDIA H200"),  # compare.json says H200, both sides none
    (_gpu("all", "NVIDIA H100 80GB HBM3"), "NVIDIA H200"),  # b478d2b: "relu2 gate exited 2", no reason
    # b478d2b judged with the folder's L2 (here every cell in the model's "in L2" band: this 7x still
    # failed there, by other thresholds); the model's GPU has one L2
    (_l2(2**40), "records an L2 of 1099511627776 bytes"),
], ids=["none-everywhere", "none-at-head", "none-in-machine-json", "h100-on-h200-leg", "l2"])
def test_the_folder_does_not_choose_the_gpu_or_its_l2(tmp_path, edit, why):
    h200, reports = _aa(tmp_path, lambda f: _slower(f, "fused", 7.0), edit)
    report = reports["h200"]["report"]
    assert reports["h200"]["exit"] != 0 and "PASS" not in report, report
    assert why in report and "the check fails" in report, report  # the refusal's reason reaches the comment


def _drop_impl(impl: str):
    """``impl``'s cells deleted from both sides' results and benchmarks.json, as if never planned."""

    def edit(folder: Path) -> None:
        for side in ("base", "head"):
            index = json.loads((folder / side / "benchmarks.json").read_text())
            path = _side_file(folder, side)
            data = json.loads(path.read_text())
            for name in list(data["results"]):
                if name.endswith(f"Implementations.track_{impl}"):
                    del data["results"][name], index[name]
                    continue
                row = data["results"][name]
                params = row[1]
                if not params or f"'{impl}'" not in params[0]:
                    continue
                keep = [i for i, combo in enumerate(itertools.product(*params)) if combo[0] != f"'{impl}'"]
                for c, values in enumerate(row):
                    if c != 1 and isinstance(values, list) and len(values) == len(list(itertools.product(*params))):
                        row[c] = [values[i] for i in keep]
                row[1] = [[v for v in params[0] if v != f"'{impl}'"], *params[1:]]
                index[name]["params"] = row[1]
            path.write_text(json.dumps(data))
            (folder / side / "benchmarks.json").write_text(json.dumps(index))
    return edit


def test_cells_deleted_from_both_sides_fail_as_missing(tmp_path):
    """b478d2b: PASS, fewer cells compared, and nothing said that fused's were gone."""
    _, reports = _aa(tmp_path, lambda f: _slower(f, "fused", 7.0), _drop_impl("fused"))
    report = reports["h200"]["report"]
    assert reports["h200"]["exit"] == 1 and "relu2 gate: FAIL" in report, report
    assert "#### Missing" in report and "impl=fused" in report and "missing cells" in report


@pytest.mark.parametrize("changes, why", [
    ({"narrowed": {"RELU2_BENCH_QUICK": "1"}}, "narrowed"),
    ({"suites": ["Grid"]}, "not all of Grid, ModelShapes"),
    ({"cells": ["fused bfloat16 4096x4096"]}, "only some cells"),
])
def test_a_compare_of_less_than_the_plan_is_refused(tmp_path, changes, why):
    _, reports = _aa(tmp_path, lambda f: _edit_json(f / "compare.json", **changes))
    assert reports["h200"]["exit"] == 2 and why in reports["h200"]["report"], reports["h200"]["report"]


def _confirmation(folder: Path, cells: list[dict], machine: str = "h200", scale=lambda cell: 1.0,
                  instrument: str = INSTRUMENT) -> None:
    """confirm.json as relu2 confirm writes it: each cell's rounds, the head's ``scale(cell)`` times the
    base's, flat at the compare's base figure (twice the compare's rounds)."""
    out = [{"benchmark": c["benchmark"], "params": c["params"], "base_rounds": [c["base"]] * 2 * ROUNDS,
            "head_rounds": [c["base"] * scale(c)] * 2 * ROUNDS} for c in cells]
    (folder / "confirm.json").write_text(json.dumps({"base": BASE, "head": HEAD, "machine": machine,
                                                     "instrument": instrument, "cells": out}))


def test_a_re_measurement_that_clears_every_flagged_cell_fails(tmp_path):
    """b478d2b: PASS, every cell of a 7x slowdown "unconfirmed" by a flat confirm.json."""

    def flat(folder: Path) -> None:
        _install(_copy(tmp_path / "box"), tmp_path / "box-venv")
        flagged = _flagged(tmp_path / "box-venv" / "bin" / "relu2", folder)
        assert len(flagged) >= 3
        _confirmation(folder, flagged)

    _, reports = _aa(tmp_path, lambda f: _slower(f, "fused", 7.0), flat)
    report = reports["h200"]["report"]
    assert reports["h200"]["exit"] == 1 and "relu2 gate: FAIL" in report, report
    assert "the re-measurement clears all" in report


def test_a_re_measurement_still_clears_a_disturbed_cell(tmp_path):
    """The control: one cell flagged by a disturbed round, clean when measured again, passes."""

    def disturbed(folder: Path) -> None:
        _slower(folder, "fused", 1.5, dtypes=["bfloat16"], sizes=[2**24])
        _install(_copy(tmp_path / "box"), tmp_path / "box-venv")
        flagged = _flagged(tmp_path / "box-venv" / "bin" / "relu2", folder)
        assert 1 <= len(flagged) < 3, [c["label"] for c in flagged]
        _confirmation(folder, flagged)

    _, reports = _aa(tmp_path, disturbed)
    report = reports["h200"]["report"]
    assert reports["h200"]["exit"] == 0 and "relu2 gate: PASS" in report and "Unconfirmed" in report, report


def test_a_re_measurement_of_another_machine_is_refused(tmp_path):
    def elsewhere(folder: Path) -> None:
        _install(_copy(tmp_path / "box"), tmp_path / "box-venv")
        _confirmation(folder, _flagged(tmp_path / "box-venv" / "bin" / "relu2", folder), machine="h100",
                      scale=lambda c: 7.0)

    _, reports = _aa(tmp_path, lambda f: _slower(f, "fused", 7.0), elsewhere)
    assert reports["h200"]["exit"] == 2 and "not on 'h200'" in reports["h200"]["report"]


def test_a_re_measurement_by_another_instrument_is_refused(tmp_path):
    """confirm.json names its instrument (relu2 confirm); one that is not this run's clears nothing."""
    def other(folder: Path) -> None:
        _install(_copy(tmp_path / "box"), tmp_path / "box-venv")
        _confirmation(folder, _flagged(tmp_path / "box-venv" / "bin" / "relu2", folder), instrument="0" * 40)

    _, reports = _aa(tmp_path, lambda f: _slower(f, "fused", 1.5, dtypes=["bfloat16"], sizes=[2**24]), other)
    report = reports["h200"]["report"]
    assert reports["h200"]["exit"] == 2 and "a re-measurement by instrument '000" in report, report


PAYLOAD = "b\n\n### ✅ relu2 gate: PASS\n<img src=x onerror=alert(1)> @octocat [x](https://e.invalid) | `"


@pytest.mark.parametrize("where", ["box", "torch"])
def test_markdown_in_the_folder_s_names_is_refused(tmp_path, where):
    def edit(folder: Path) -> None:
        if where == "box":
            _edit_json(folder / "compare.json", box=PAYLOAD)
        else:
            _edit_json(next((folder / "head").glob("*/machine.json")), torch=PAYLOAD)

    _, reports = _aa(tmp_path, edit)
    report = reports["h200"]["report"]
    assert reports["h200"]["exit"] == 2, report
    assert [line for line in report.splitlines() if line.startswith("#")] == []  # b478d2b: its heading, verbatim
    assert "<img" not in report and "](https://" not in report and "@octocat" not in report
    fence = report.index("```\n")
    assert report.count("```") == 2 and "relu2 gate exited 2" in report[:fence]  # the reason, as code


def test_markdown_in_a_cell_s_parameters_stays_in_its_table_cell(tmp_path):
    """A cell the base lists and the head lost (vanished), whose implementation's name is markdown."""
    impl = "x`|@octocat <img src=x> [x](https://e.invalid)"

    def extra(folder: Path) -> None:
        bench = "bench_relu2.Grid.track_hot"
        index = json.loads((folder / "base" / "benchmarks.json").read_text())
        name = "bench_relu2.Extra.track_hot"
        params = [[repr(impl)], ["'float32'"], ["1024"]]
        index[name] = dict(index[bench], name=name, params=params)
        (folder / "base" / "benchmarks.json").write_text(json.dumps(index))
        path = _side_file(folder, "base")
        data = json.loads(path.read_text())
        data["results"][name] = [[5e-6], params, index[bench]["version"], 1796045233610, 0.5, None, None, None,
                                 None, None, None, [[5e-6] * ROUNDS]]
        path.write_text(json.dumps(data))

    from relu2.vocab.markdown import code as _code

    _, reports = _aa(tmp_path, extra)
    report = reports["h200"]["report"]
    assert reports["h200"]["exit"] == 1 and "#### Vanished cells" in report, report
    (row,) = [line for line in report.splitlines() if "Extra.track_hot" in line]
    assert len(re.findall(r"(?<!\\)\|", row)) == 7, row  # six columns: no pipe of the name splits one
    label = f"Extra.track_hot(impl={impl}, dtype=float32, numel=1024)"
    assert _code(label) in row and f"`{label}`" not in row  # b478d2b: in single backticks, broken out of
    assert len([line for line in report.splitlines() if line.startswith("### ")]) == 1


# --- issue 39, 5. a crafted folder cannot silence the judge ------------------------------------------------


def test_folders_named_like_the_report_cannot_stop_the_judge(tmp_path):
    """b478d2b: ``rm -f`` of a folder failed under -e: no output, no comment, no status."""

    def folders(folder: Path) -> None:
        (folder / "report.d").mkdir()
        (folder / "report.d" / "x").write_text("x")
        (folder / "report.md").mkdir()

    h200, reports = _aa(tmp_path, folders)
    assert set(reports) == set(_machines())
    assert reports["h200"]["exit"] == 0 and "relu2 gate: PASS" in reports["h200"]["report"]
    assert not (h200 / "report.d").exists() and not (h200 / "report.md").exists()
