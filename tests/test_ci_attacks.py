"""The two attacks of issue 26 that were shown on the CPU with the old workflow's own steps, as tests.

1. **The tampered judge.**  Code of the head runs where it is measured; there it can rewrite the
   instrument installed on that box (relu2/verdict.py).  The old workflow judged with that copy; the
   new one judges in another job, on another machine, with the instrument installed fresh from the
   default branch's commit.  Shown: the tampered copy passes a 7x slowdown, a fresh copy fails it.
2. **The ground fingerprint.**  For the paths that do not autotune (fused, triton, vllm_cuda) the
   kernel fingerprint comes from code the head controls; a head that makes its kernel 3x slower and
   grinds a comment until the fingerprint's first 6 hex digits match the base's was "repicked, never
   failing".  The repick exemption must apply only to paths that autotune.

The verdicts run as the judge job runs them: ``relu2 gate`` of a copy of the package in a folder of
its own (``_relu2``), on results folders made from the synthetic fixture.
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

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
import asv_fixture as fx  # noqa: E402

from conftest import ROOT  # noqa: E402
from relu2.schema import kernel_id  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures"
GRID = ("bench_relu2.Grid.track_hot", "bench_relu2.Grid.track_cold")
KERNEL = "bench_relu2.Grid.track_kernel"


def _instrument_copy(dest: Path) -> Path:
    """The package as a job installs it: a copy in a folder of its own, nothing shared with this checkout."""
    shutil.copytree(ROOT / "relu2", dest / "relu2", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def _relu2(instrument: Path, *args: str) -> subprocess.CompletedProcess:
    """``relu2 ARGS`` with ``instrument``'s package first on the path, in isolated mode (-I: no
    PYTHONPATH, no current folder, no user site)."""
    code = f"import sys; sys.path.insert(0, {str(instrument)!r}); from relu2.cli import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-I", "-c", code, *args], capture_output=True, text=True, timeout=300,
                          cwd=instrument)


def _slower(results: Path, commit: str, impl: str, factor: float) -> None:
    """Every Grid hot and cold cell of ``impl`` at ``commit`` ``factor`` times slower."""
    params = json.loads((results / "benchmarks.json").read_text())[GRID[0]]["params"]
    for benchmark in GRID:
        for dtype, numel in itertools.product(params[1], params[2]):
            fx.edit_cell(results, commit, benchmark, {"impl": impl, "dtype": eval(dtype), "numel": int(numel)},
                         scale=factor)


# --- 1. the tampered judge ---------------------------------------------------------------------------


def test_code_run_during_measurement_cannot_change_the_verdict(tmp_path):
    results = fx.copy_results(tmp_path / "results")
    _slower(results, fx.COMMIT_3, "fused", 7.0)
    gate = ("gate", fx.COMMIT_2, fx.COMMIT_3, "--results", str(results), "--format", "json")

    # The measuring box: its installed instrument, then an implementation module of the head imported
    # by the measuring process (PYTHONPATH: the instrument, then the head's code, as relu2 compare
    # runs a side), which rewrites the verdict there.
    box = _instrument_copy(tmp_path / "box")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(box), str(FIXTURES)]), "RELU2_HOSTILE_TARGET": str(box)}
    subprocess.run([sys.executable, "-c", "import hostile_impl"], env=env, check=True, timeout=60, cwd=box)
    assert "return False" in (box / "relu2" / "verdict.py").read_text()
    tampered = _relu2(box, *gate)
    assert tampered.returncode == 0 and json.loads(tampered.stdout)["verdict"] == "pass", tampered.stderr

    # The judge job: the default branch's instrument installed fresh on another machine.
    judge = _instrument_copy(tmp_path / "judge")
    fresh = _relu2(judge, *gate)
    report = json.loads(fresh.stdout)
    assert fresh.returncode == 1 and report["verdict"] == "fail", fresh.stderr
    assert {c["label"].split("(")[1].split(",")[0] for c in report["regressions"]} == {"impl=fused"}
    assert min(c["ratio"] for c in report["regressions"]) > 6

    # ... which is how the workflow judges: another job, a hosted runner, a fresh install of github.sha.
    import yaml

    jobs = yaml.safe_load((ROOT / ".github" / "workflows" / "benchmarks.yml").read_text())["jobs"]
    assert "self-hosted" in json.dumps(jobs["measure"]["runs-on"]) and jobs["judge"]["runs-on"] == "ubuntu-latest"
    steps = {s.get("name"): s for s in jobs["judge"]["steps"]}
    assert [s["with"]["ref"] for s in jobs["judge"]["steps"] if "checkout" in str(s.get("uses"))] == ["${{ github.sha }}"]
    assert 'python3 -m venv "$RUNNER_TEMP/venv"' in steps["Install the instrument"]["run"]
    assert '"$RUNNER_TEMP/venv/bin/relu2" gate ' in steps["Judge each machine"]["run"]


# --- 2. the ground fingerprint -----------------------------------------------------------------------


def _fingerprints(results: Path, machine: str, commit: str, impl: str, fingerprint: str) -> None:
    """A ``Grid.track_kernel`` benchmark (unit "kernel id", as the suite records it) at ``commit`` on
    ``machine``: ``fingerprint`` for ``impl``'s cells, a fingerprint of its own for every other one."""
    benchmarks = json.loads((results / "benchmarks.json").read_text())
    if KERNEL not in benchmarks:
        benchmarks[KERNEL] = dict(benchmarks[GRID[0]], name=KERNEL, unit="kernel id")
        (results / "benchmarks.json").write_text(json.dumps(benchmarks))
    path = fx.result_file(results, commit, machine)
    data = json.loads(path.read_text())
    row = list(data["results"][GRID[0]])
    columns = data["result_columns"]
    params = row[columns.index("params")]
    ids = [float(kernel_id(fingerprint)) if eval(p[0]) == impl else float(kernel_id(f"{i:06x}0000ffffff"))
           for i, p in enumerate(itertools.product(*params))]
    row[columns.index("result")] = ids
    for name in ("stats_ci_99_a", "stats_ci_99_b", "stats_q_25", "stats_q_75", "samples"):
        if name in columns and columns.index(name) < len(row):
            row[columns.index(name)] = None
    data["results"][KERNEL] = row
    path.write_text(json.dumps(data))


def _ground(tmp_path: Path, impl: str, base_fp: str, head_fp: str) -> subprocess.CompletedProcess:
    """Commit 2 measured on two boxes (an A/A), the head's ``impl`` 3x slower with ``head_fp``."""
    results = fx.copy_results(tmp_path / "results")
    fx.copy_machine(results, "base-box")
    _fingerprints(results, "base-box", fx.COMMIT_2, impl, base_fp)
    _fingerprints(results, fx.MACHINE, fx.COMMIT_2, impl, head_fp)
    _slower(results, fx.COMMIT_2, impl, 3.0)  # the fixture's machine is the head's
    judge = _instrument_copy(tmp_path / "judge")
    return _relu2(judge, "gate", fx.COMMIT_2, fx.COMMIT_2, "--results", str(results), "--base-machine",
                  "base-box", "--head-machine", fx.MACHINE, "--format", "json")


@pytest.mark.parametrize("impl", ["triton", "fused"])
def test_a_slower_fixed_kernel_with_other_code_fails(tmp_path, impl):
    """The control: the 3x is caught when the fingerprint says the code changed."""
    run = _ground(tmp_path, impl, "aaaaaa111111", "bbbbbb111111")
    report = json.loads(run.stdout)
    assert run.returncode == 1 and report["regressions"] and not report["repicked"], run.stderr


@pytest.mark.xfail(strict=True, reason="relu2.verdict applies the repick exemption (relu2.schema.only_repicked: "
                   "the first 6 hex digits equal) to every fingerprinted path; the rule that limits it to paths "
                   "that autotune, on the whole hash, bounded in ratio, is the judge branch's (issue 26) and "
                   "is not on it yet")
@pytest.mark.parametrize("impl", ["triton", "fused"])
def test_a_slower_fixed_kernel_with_a_ground_fingerprint_fails(tmp_path, impl):
    run = _ground(tmp_path, impl, "aaaaaa111111", "aaaaaa222222")
    report = json.loads(run.stdout)
    assert run.returncode == 1 and len(report["regressions"]) >= 10, (report["repicked"][:1], run.stderr)
