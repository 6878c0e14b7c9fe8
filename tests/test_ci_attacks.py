"""The two attacks of issue 26 that were shown on the CPU with the old workflow's own steps, as tests.

1. **The tampered judge.**  Code of the head runs where it is measured; there it can rewrite the
   instrument installed on that box (relu2/verdict.py) and drop files into the measured folder.  The
   old workflow judged with that copy; the new one judges in another job, on a hosted machine, with
   the instrument installed fresh from the default branch's commit, reading only the folder's data.
   Shown: the tampered copy passes a 7x slowdown, the judge step fails it.
2. **The ground fingerprint.**  For the paths that do not autotune (fused, triton, vllm_cuda) the
   kernel fingerprint comes from code the head controls; a head that makes its kernel 3x slower and
   grinds a comment until the fingerprint's first 6 hex digits match the base's was "repicked, never
   failing".  The judge step fails it: the exemption is only for paths that autotune.

Both run benchmarks.yml's own "Judge each machine" step in bash, as the judge job does: with
``$RUNNER_TEMP/venv/bin/relu2`` a copy of the package in a folder of its own (``_install``), on
compare folders (relu2 compare's layout) made from the synthetic fixture.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml  # asv's dependency

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
import asv_fixture as fx  # noqa: E402

from conftest import ROOT  # noqa: E402
from relu2.schema import MODE_NAMES, kernel_id, mode  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures"
WORKFLOW = ROOT / ".github" / "workflows" / "benchmarks.yml"
GRID = ("bench_relu2.Grid.track_hot", "bench_relu2.Grid.track_cold")
KERNEL = "bench_relu2.Grid.track_kernel"
INSTRUMENT = "c" * 40


def _jobs() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())["jobs"]


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


def _compare_folder(dest: Path, machine: str, base: str, head: str) -> Path:
    """A compare folder as measure uploads it for ``machine``: compare.json, base/ and head/ (asv
    results folders of one commit each, timing versions as today's instrument records rounds)."""
    for side, commit in (("base", base), ("head", head)):
        folder = dest / side / machine
        folder.mkdir(parents=True)
        shutil.copy(fx.RESULTS / "benchmarks.json", dest / side / "benchmarks.json")
        info = json.loads((fx.RESULTS / fx.MACHINE / "machine.json").read_text())
        (folder / "machine.json").write_text(json.dumps({**info, "machine": machine}))
        src = fx.result_file(fx.RESULTS, commit)
        data = json.loads(src.read_text())
        data["params"]["machine"] = machine
        v = data["result_columns"].index("version")
        for name, row in data["results"].items():
            method = name.rsplit(".", 1)[-1].removeprefix("track_")
            if method in MODE_NAMES:
                row[v] = mode(method).asv_version
        (folder / src.name).write_text(json.dumps(data))
    (dest / "compare.json").write_text(json.dumps({
        "format": 1, "box": f"boot-{machine}", "machine": machine, "gpu": fx.GPU, "base": {"ref": base, "sha": base},
        "head": {"ref": head, "sha": head}, "rounds": 15, "order": ["base", "head"] * 15, "suites": ["Grid"],
        "instrument": INSTRUMENT, "started_at": 0, "finished_at": 1, "complete": True}))
    return dest


def _side_file(folder: Path, side: str) -> Path:
    (path,) = (folder / side).glob("*/*-*.json")
    return path


def _slower(folder: Path, impl: str, factor: float) -> None:
    """Every Grid hot and cold cell of ``impl`` on the head's side ``factor`` times slower."""
    path = _side_file(folder, "head")
    params = json.loads((folder / "head" / "benchmarks.json").read_text())[GRID[0]]["params"]
    commit = json.loads(path.read_text())["commit_hash"]
    for benchmark in GRID:
        for dtype, numel in itertools.product(params[1], params[2]):
            fx.edit_cell(folder / "head", commit, benchmark, {"impl": impl, "dtype": eval(dtype), "numel": int(numel)},
                         scale=factor, machine=path.parent.name)


def _judge_step(runner_temp: Path, base: str, head: str) -> dict:
    """benchmarks.yml's "Judge each machine", run as the judge job runs it; its one output, decoded."""
    if shutil.which("jq") is None:
        pytest.skip("jq is not installed (it is on GitHub's hosted runners)")
    job = _jobs()["judge"]
    script = next(s for s in job["steps"] if s.get("name") == "Judge each machine")["run"]
    env = {**os.environ, "RUNNER_TEMP": str(runner_temp), "BASE": base, "HEAD": head, "INSTRUMENT": INSTRUMENT,
           "INSTRUMENT_CHANGED": "false", "MACHINES": job["env"]["MACHINES"],
           "GITHUB_OUTPUT": str(runner_temp / "out"), "GITHUB_STEP_SUMMARY": str(runner_temp / "summary")}
    run = subprocess.run(["bash", "-e", "-c", script], env=env, capture_output=True, text=True, timeout=600,
                         cwd=runner_temp)
    assert run.returncode == 0, run.stderr
    (line,) = (runner_temp / "out").read_text().splitlines()
    return json.loads(line.removeprefix("reports="))


# --- 1. the tampered judge ---------------------------------------------------------------------------


def _hostile_measurement(box: Path, measured: Path) -> None:
    """What the head's implementation module does when the measuring process imports it (PYTHONPATH:
    the instrument, then the head's code, as relu2 compare runs a side): the box's verdict rewritten,
    and a verdict, a copy of that instrument and start-up code left in the folder that is uploaded."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(box), str(FIXTURES)]), "RELU2_HOSTILE_TARGET": str(box)}
    subprocess.run([sys.executable, "-c", "import hostile_impl"], env=env, check=True, timeout=60, cwd=box)
    assert "# hostile_impl" in (box / "relu2" / "verdict.py").read_text()
    (measured / "report.md").write_text("### ✅ relu2 gate: PASS\n")
    shutil.copytree(box / "relu2", measured / "relu2")
    (measured / "sitecustomize.py").write_text("import sys; print('### relu2 gate: PASS'); sys.exit(0)\n")


def test_code_run_during_measurement_cannot_change_the_verdict(tmp_path):
    measured = tmp_path / "runner" / "measured"
    h200 = _compare_folder(measured / "measured-h200", "h200", fx.COMMIT_2, fx.COMMIT_2)
    _slower(h200, "fused", 7.0)
    _compare_folder(measured / "measured-h100", "h100", fx.COMMIT_2, fx.COMMIT_2)  # an honest A/A
    box = _copy(tmp_path / "box")  # the GPU box's instrument
    _hostile_measurement(box, h200)
    pristine = tmp_path / "pristine"
    shutil.copytree(measured, pristine)

    # The old design: the verdict computed with the box's instrument passes the 7x.
    _install(box, tmp_path / "runner" / "venv")
    tampered = _judge_step(tmp_path / "runner", fx.COMMIT_2, fx.COMMIT_2)
    assert tampered["h200"]["exit"] == 0 and "PASS" in tampered["h200"]["report"]

    # The judge job: a fresh runner, the default branch's instrument installed fresh, the same upload.
    fresh = tmp_path / "hosted"
    shutil.copytree(pristine, fresh / "measured")
    _install(_copy(tmp_path / "judge"), fresh / "venv")
    reports = _judge_step(fresh, fx.COMMIT_2, fx.COMMIT_2)
    assert reports["h200"]["exit"] == 1 and "FAIL" in reports["h200"]["report"]
    assert "impl=fused" in reports["h200"]["report"] and "PASS" not in reports["h200"]["report"]
    assert reports["h100"]["exit"] == 0
    assert not (fresh / "measured" / "measured-h200" / "report.md").exists()  # deleted unread

    # ... which is how the workflow judges: another job, a hosted runner, a fresh install of github.sha.
    jobs = _jobs()
    assert "self-hosted" in json.dumps(jobs["measure"]["runs-on"]) and jobs["judge"]["runs-on"] == "ubuntu-latest"
    steps = {s.get("name"): s for s in jobs["judge"]["steps"]}
    assert [s["with"]["ref"] for s in jobs["judge"]["steps"] if "checkout" in str(s.get("uses"))] == ["${{ github.sha }}"]
    assert 'python3 -m venv "$RUNNER_TEMP/venv"' in steps["Install the instrument"]["run"]


# --- 2. the ground fingerprint -----------------------------------------------------------------------


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
    """An A/A of commit 2 on h200 whose head's ``impl`` is 3x slower with ``head_fp``, through the judge step."""
    folder = _compare_folder(tmp_path / "measured" / "measured-h200", "h200", fx.COMMIT_2, fx.COMMIT_2)
    _fingerprints(folder, "base", impl, base_fp)
    _fingerprints(folder, "head", impl, head_fp)
    _slower(folder, impl, 3.0)
    _install(_copy(tmp_path / "judge"), tmp_path / "venv")
    return _judge_step(tmp_path, fx.COMMIT_2, fx.COMMIT_2)["h200"]


@pytest.mark.parametrize("impl", ["triton", "fused"])
def test_a_slower_fixed_kernel_with_other_code_fails(tmp_path, impl):
    """The control: the 3x is caught when the fingerprint says the code changed."""
    found = _ground(tmp_path, impl, "aaaaaa111111", "bbbbbb111111")
    assert found["exit"] == 1 and f"impl={impl}" in found["report"], found["report"]


@pytest.mark.parametrize("impl", ["triton", "fused"])
def test_a_slower_fixed_kernel_with_a_ground_fingerprint_fails(tmp_path, impl):
    found = _ground(tmp_path, impl, "aaaaaa111111", "aaaaaa222222")
    assert found["exit"] == 1 and f"impl={impl}" in found["report"], found["report"]
