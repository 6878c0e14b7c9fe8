"""The asv suites: discovery, the lazy-import rule, the cache contract, and a real asv run + publish."""

from __future__ import annotations

import importlib
import json
import math
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

def _asv_script() -> str:
    import asv

    return str(Path(asv.__file__).parent / "benchmark.py")


def _asv_env(home: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, HOME=str(home), **extra)
    for var in ("RELU2_BENCH_QUICK", "RELU2_BENCH_IMPLS"):
        if var not in extra:
            env.pop(var, None)
    return env


@pytest.fixture
def bench(monkeypatch):
    """benchmarks.bench_relu2 imported with a quick grid of eager, copy, triton and a wrong one."""
    monkeypatch.setenv("RELU2_BENCH_QUICK", "1")
    monkeypatch.setenv("RELU2_BENCH_IMPLS", "eager,copy,triton,wrong")
    module = importlib.reload(importlib.import_module("benchmarks.bench_relu2"))
    yield module
    monkeypatch.undo()
    importlib.reload(module)  # back to the grid the environment asks for


def test_module_imports_without_torch():
    code = "import sys; import benchmarks.bench_relu2; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_suites_take_their_grid_and_modes_from_the_package():
    from benchmarks import bench_relu2 as b
    from relu2.vocab import schema

    impls, dtypes, numels = b.Grid.params
    assert (tuple(dtypes), tuple(numels)) == (schema.DTYPES, schema.DEFAULT_SIZES)
    assert impls[:len(b.SUITE_IMPLS)] == list(b.SUITE_IMPLS)
    assert b.ModelShapes.params[1:] == [list(schema.MODEL_TOKENS), list(schema.MODEL_HIDDEN)]
    assert b.VllmShapes.params[1:] == [list(schema.VLLM_TOKENS), list(schema.VLLM_HIDDEN)]
    assert b.Nemotron.params[1:] == [list(schema.NEMOTRON_TOKENS), list(schema.NEMOTRON_WIDTHS)]
    for mode in schema.MODES:
        method = getattr(b.Grid, f"track_{mode.name}")
        assert method.version == mode.asv_version and method.less_is_better is True


def test_asv_discovers_the_suites(tmp_path):
    out = tmp_path / "discovered.json"
    subprocess.run([sys.executable, _asv_script(), "discover", str(ROOT / "benchmarks"), str(out)],
                   cwd=tmp_path, env=_asv_env(tmp_path), check=True)
    found = {b["name"]: b for b in json.loads(out.read_text())}
    from relu2.vocab.schema import CELL_FIGURES, MODE_NAMES

    counters = [f.method for f in CELL_FIGURES if f.method != "peak_memory"]  # the work counters
    expected = {f"bench_relu2.{suite}.track_{what}" for suite in ("Grid", "ModelShapes")
                for what in (*MODE_NAMES, "peak_memory", "kernel", *counters)}
    expected |= {f"bench_relu2.{suite}.track_{what}" for suite in ("VllmShapes", "Nemotron", "WarmupOrder")
                 for what in (*MODE_NAMES, "kernel", *counters)}
    from benchmarks.bench_relu2 import SUITE_IMPLS

    expected |= {f"bench_relu2.Implementations.track_{impl}" for impl in SUITE_IMPLS}  # the overview's tiles
    assert set(found) == expected
    grid = found["bench_relu2.Grid.track_hot"]
    assert grid["param_names"] == ["impl", "dtype", "numel"]
    assert grid["params"][0] == ["'eager'", "'compile'", "'compile_dynamic'", "'fused'", "'triton'", "'copy'"]
    assert grid["params"][1] == ["'float32'", "'float16'", "'bfloat16'"]
    assert grid["params"][2] == [str(4**k) for k in range(5, 15)]
    model = found["bench_relu2.ModelShapes.track_cold"]
    assert model["param_names"] == ["impl", "tokens", "hidden"]
    assert model["params"][1:] == [["1", "16", "128", "1024", "4096", "16384"], ["3072", "12288"]]
    for name, b in found.items():
        assert b["type"] == "track"
        assert b.get("less_is_better") is (None if name.endswith("track_kernel") else True), name
        assert b["unit"] == {"track_peak_memory": "bytes", "track_kernel": "kernel id",
                             **{f"track_{c}": "count" for c in counters}}.get(name.rsplit(".", 1)[-1], "seconds")
        assert b["setup_cache_timeout"] >= 1800
    assert len({b["setup_cache_key"] for b in found.values()}) == 1  # one measurement for every suite
    assert found["bench_relu2.Implementations.track_fused"]["params"] == []
    vllm = found["bench_relu2.VllmShapes.track_hot"]
    assert vllm["param_names"] == ["impl", "tokens", "hidden"]
    assert vllm["params"][1] == [str(t) for t in (1, 16, 64, 128, 256, 1024, 2048, 8192, 16384, 131072)]
    assert vllm["params"][2] == ["3072", "9728", "12288"]
    assert vllm["params"][0] == ["'eager'", "'compile_dynamic'", "'compile_dim0'", "'fused'", "'vllm_cuda'", "'copy'"]
    nemotron = found["bench_relu2.Nemotron.track_hot"]
    assert nemotron["params"][0] == ["'eager'", "'compile_dynamic'", "'compile_dim0'", "'compile_model'",
                                     "'eager_inplace'", "'fused'", "'vllm_cuda'", "'copy'"]
    assert nemotron["params"][2] == [str(w) for w in (1856, 3712, 5376, 12288, 15680, 20480, 21504, 30720, 32768)]


def test_the_routed_experts_width_is_measured_at_six_rows_a_token(bench):
    """Nemotron-3-Nano's routed experts run relu² on [tokens x 6, 1856]; readers agree on the shape."""
    from relu2.vocab.schema import geometry

    cell = bench.Nemotron.cell("eager", 8, 1856)
    assert cell.shape == (48, 1856)
    assert geometry({"impl": "eager", "tokens": "8", "hidden": "1856"}) == (48 * 1856, "48x1856")
    assert bench.Nemotron.cell("eager", 8, 3712).shape == (8, 3712)


def _discovered_benchmarks_json(tmp_path: Path) -> dict:
    """What asv's discovery writes as benchmarks.json for today's suites (the first thing `asv run` does,
    here without running any: relu2 asv run refuses a --bench that matches nothing)."""
    code = """
import sys
from asv import environment, repo
from asv.benchmarks import Benchmarks
from asv.config import Config
conf = Config.load(sys.argv[1])
envs = list(environment.get_environments(conf, ["existing:same"]))
found = Benchmarks.discover(conf, repo.get_repo(conf), envs, [repo.get_repo(conf).get_hash_from_name("HEAD")])
found.save()
"""
    conf = json.loads((ROOT / "asv.conf.json").read_text())
    conf.update(repo=str(ROOT), benchmark_dir=str(ROOT / "benchmarks"), results_dir=str(tmp_path / "results"),
                env_dir=str(tmp_path / "env"))
    config = tmp_path / "asv.conf.json"
    config.write_text(json.dumps(conf))
    env = _asv_env(tmp_path)
    env.pop("RELU2_BENCH_SUITES", None)
    subprocess.run([sys.executable, "-c", code, str(config)], cwd=ROOT, env=env, check=True, capture_output=True,
                   timeout=300)
    return json.loads((tmp_path / "results" / "benchmarks.json").read_text())


@pytest.mark.slow
def test_the_committed_benchmarks_json_is_what_a_run_writes(tmp_path):
    """A run rewrites results/benchmarks.json from discovery: it stays byte-for-byte what is committed
    (the README's tracking command leaves the checkout clean) only if the two agree in every field."""
    recorded = json.loads((ROOT / "results" / "benchmarks.json").read_text())
    assert _discovered_benchmarks_json(tmp_path) == recorded, (
        "results/benchmarks.json is stale: regenerate it with asv's discovery (this test's _discovered_benchmarks_json, "
        "with results_dir results) and commit it")


def test_versions_follow_the_methods_and_keep_the_committed_history(tmp_path):
    """Every benchmark's version is its mode's method version; committed results carry today's version,
    or (a ruler changed since) an earlier method's, never a version no method had."""
    from relu2.vocab.schema import KERNEL_ASV_VERSIONS_BEFORE, MODES

    recorded = json.loads((ROOT / "results" / "benchmarks.json").read_text())
    for mode in MODES:
        for suite in ("Grid", "ModelShapes", "VllmShapes", "Nemotron", "WarmupOrder"):
            assert recorded[f"bench_relu2.{suite}.track_{mode.name}"]["version"] == mode.asv_version
    earlier = {v for m in MODES for v in m.versions_before} | set(KERNEL_ASV_VERSIONS_BEFORE)
    for path in (ROOT / "results").glob("*/*.json"):
        if path.name == "machine.json":
            continue
        data = json.loads(path.read_text(), parse_constant=float)
        for name, version in zip(data["results"], (r[data["result_columns"].index("version")]
                                                   for r in data["results"].values())):
            today = recorded.get(name, {}).get("version")
            assert version == today or version in earlier, f"{path.name}: {name} at version {version[:12]}"


def test_asv_check_passes(tmp_path):
    run = subprocess.run([sys.executable, "-m", "asv", "check", "--python=same"], cwd=ROOT, env=_asv_env(tmp_path),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "No problems found" in run.stdout


def wrong_counting_calls(x):
    """relu² + 1, logging each call to $RELU2_TEST_CALLS (it runs in a worker process, not here)."""
    from relu2.measure.reference import relu_squared_reference

    with open(os.environ["RELU2_TEST_CALLS"], "a") as f:
        f.write(f"{x.numel()}\n")
    return relu_squared_reference(x) + 1


@pytest.mark.slow
def test_setup_cache_records_a_wrong_impl_failed_and_untimed(bench, temporary_impl, capsys, tmp_path, monkeypatch):
    from asv_runner.benchmarks.mark import SkipNotImplemented

    calls = tmp_path / "calls"
    monkeypatch.setenv("RELU2_TEST_CALLS", str(calls))
    temporary_impl("wrong", wrong_counting_calls)
    from relu2.vocab.schema import MIN_ROUNDS as DEFAULT_ROUNDS

    cache = bench.setup_cache()
    grid, model = bench.Grid(), bench.ModelShapes()
    # one agreement call per input and round (each round a fresh worker), no timing calls:
    # grid 1024 and 4096, ModelShapes 1x3072, VllmShapes 16x3072, Nemotron and WarmupOrder 8x3712 (shared)
    inputs = ["1024", "3072", "4096", "29696", "49152"]
    assert sorted(calls.read_text().split(), key=int) == sorted(inputs * DEFAULT_ROUNDS, key=int)
    assert len(cache["cells"]) == 5 * 4  # each of the four implementations once per input

    grid.setup(cache, "wrong", "float32", 1024)  # failed is not skipped: the track_ methods raise
    for track in (grid.track_hot, grid.track_cold, grid.track_launch, grid.track_peak_memory):
        with pytest.raises(RuntimeError, match="differ"):
            track(cache, "wrong", "float32", 1024)
    with pytest.raises(RuntimeError, match="differ"):
        model.track_hot(cache, "wrong", 1, 3072)

    for impl in ("eager", "copy"):
        grid.setup(cache, impl, "float32", 4096)
        figure = grid.track_cold(cache, impl, "float32", 4096)
        assert figure["number"] == 1 and len(figure["samples"]) == DEFAULT_ROUNDS  # one median a round
        assert all(isinstance(s, float) and 0 < s < 1 for s in figure["samples"])
        assert model.track_launch(cache, impl, 1, 3072)["samples"]
        if cache["device"] == "cpu":
            with pytest.raises(SkipNotImplemented):
                grid.track_peak_memory(cache, impl, "float32", 4096)
        else:
            assert grid.track_peak_memory(cache, impl, "float32", 4096) > 0

    if cache["device"] == "cpu":
        with pytest.raises(NotImplementedError, match="CUDA"):
            grid.setup(cache, "triton", "float32", 1024)
        assert "CUDA" in capsys.readouterr().err
    with pytest.raises(NotImplementedError, match="not measured"):
        grid.setup(cache, "eager", "float32", 2**30)


@pytest.mark.slow
def test_cache_is_plain_data_that_unpickles_without_torch(bench, tmp_path):
    cache = bench.setup_cache()
    path = tmp_path / "cache.pickle"
    path.write_bytes(pickle.dumps(cache))
    code = ("import pickle, sys; c = pickle.load(open(sys.argv[1], 'rb')); "
            "assert 'torch' not in sys.modules and 'relu2' not in sys.modules; print(sorted(c))")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['cells', 'device', 'why_not']"
    assert "not measured here" in cache["why_not"]  # on the CPU: the work counters are not read, and why


def _wrong_entry_point(where: Path) -> Path:
    """A 'wrong' implementation installed through the relu2.implementations entry point group."""
    where.mkdir()
    (where / "wrongimpl.py").write_text(
        "import ctypes\n"
        "import relu2\n\n"
        "def make():\n"
        "    return relu2.Implementation('wrong', lambda x: x.clone())\n\n"
        "def make_crash():\n"
        "    return relu2.Implementation('segfaults', lambda x: ctypes.string_at(0))\n")
    info = where / "wrongimpl-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: wrongimpl\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text("[relu2.implementations]\nwrong = wrongimpl:make\n"
                                           "segfaults = wrongimpl:make_crash\n")
    return where


@pytest.mark.slow
def test_asv_run_and_publish_end_to_end(tmp_path):
    """`asv run --python=same` on the quick grid, then `asv publish`: the real asv, results in tmp_path."""
    conf = json.loads((ROOT / "asv.conf.json").read_text())
    conf.update(repo=str(ROOT), benchmark_dir=str(ROOT / "benchmarks"), results_dir=str(tmp_path / "results"),
                html_dir=str(tmp_path / "html"), env_dir=str(tmp_path / "env"))
    config = tmp_path / "asv.conf.json"
    config.write_text(json.dumps(conf))
    plugins = _wrong_entry_point(tmp_path / "plugins")
    env = _asv_env(tmp_path, RELU2_BENCH_QUICK="1", RELU2_BENCH_IMPLS="eager,copy,triton,wrong,segfaults",
                   ASV_PYTHONPATH=os.pathsep.join([str(ROOT), str(plugins)]))
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()

    def asv(*args: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
        run = subprocess.run([sys.executable, "-m", "asv", "--config", str(config), *args], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=600)
        assert run.returncode in ok, f"asv {args[0]} exited {run.returncode}:\n{run.stdout}\n{run.stderr}"
        return run

    asv("machine", "--yes", "--machine", "ci-box")
    # Three of the eight benchmarks keep it quick (each parameter combination is a process); asv
    # run exits 2 because the wrong implementation's cells fail, as they must.
    run = asv("run", "--python=same", "--quick", "--set-commit-hash", head, "--show-stderr",
              "--bench", "Grid.track_hot", "--bench", "Grid.track_peak_memory", "--bench", "ModelShapes.track_cold",
              ok=(2,))
    assert "elements differ" in run.stdout  # the wrong implementation's reason reaches asv's log
    assert "SIGSEGV" in run.stdout  # and the crashing one's

    (result_file,) = [p for p in (tmp_path / "results" / "ci-box").glob("*.json") if p.name != "machine.json"]
    saved = json.loads(result_file.read_text(), parse_constant=lambda c: float(c))
    results = saved["results"]
    columns = saved["result_columns"]
    hot = dict(zip(columns, results["bench_relu2.Grid.track_hot"]))
    assert hot["params"] == [["'eager'", "'copy'", "'triton'", "'wrong'", "'segfaults'"], ["'float32'"],
                             ["1024", "4096"]]
    values = hot["result"]  # impl-major: eager x2, copy x2, triton x2, wrong x2, segfaults x2
    assert all(v is not None and 0 < v < 1 for v in values[:4])  # measured, the crash notwithstanding
    assert all(v is not None and math.isnan(v) for v in values[4:6])  # skipped: n/a
    assert values[6:] == [None, None, None, None]  # failed
    for i in range(4):  # asv took median and quartiles from the samples
        assert hot["stats_q_25"][i] <= values[i] <= hot["stats_q_75"][i]
    memory = dict(zip(columns, results["bench_relu2.Grid.track_peak_memory"]))["result"]
    assert memory[6:] == [None, None, None, None]

    asv("publish")
    index = json.loads((tmp_path / "html" / "index.json").read_text())
    assert "bench_relu2.Grid.track_hot" in index["benchmarks"]
    assert (tmp_path / "html" / "index.html").exists()


def test_implementation_summary_is_the_geometric_mean_of_its_large_hot_cells(bench):
    from asv_runner.benchmarks.mark import SkipNotImplemented

    cells = {}
    for cell in bench.Grid.cells():
        hot = [2e-6, 4e-6, 3e-6] if cell.impl == "eager" else []
        cells[bench._key(cell)] = {"status": "ok", "modes": {"hot": {"status": "ok", "samples": hot}}}
    summary = bench.Implementations()
    with pytest.raises(SkipNotImplemented):  # the quick grid stops below 2^20 elements
        summary.track_eager({"device": "cpu", "cells": cells})
    big = bench.Grid.cell("eager", "float32", 2**20)
    bigger = bench.Grid.cell("eager", "float32", 2**22)
    cells[bench._key(big)] = {"status": "ok", "modes": {"hot": {"status": "ok", "samples": [1e-6, 1e-6, 1e-6]}}}
    cells[bench._key(bigger)] = {"status": "ok", "modes": {"hot": {"status": "ok", "samples": [4e-6, 4e-6, 9e-6]}}}
    bench.Grid.cells = classmethod(lambda cls: [big, bigger])  # reload() in the fixture restores it
    assert summary.track_eager({"device": "cpu", "cells": cells}) == pytest.approx(2e-6)
    cells[bench._key(bigger)]["modes"]["hot"] = {"status": "failed", "reason": "boom", "samples": []}
    with pytest.raises(RuntimeError, match="boom"):  # never a mean that moved because a cell dropped out
        summary.track_eager({"device": "cpu", "cells": cells})
