"""relu2.measure.timing: the three figures, their statistics, the cache and byte helpers (CPU here, CUDA on a GPU)."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import requires_cuda
from relu2.measure import timing
from relu2.host.machine import machine_info
from relu2.measure.reference import relu_squared_reference
from relu2.measure.inputs import dtype_name, dtype_of
from relu2.vocab.schema import MODE_NAMES, bytes_moved
from relu2.measure.timing import Budget, Timing, quantile, time_fn

FAST = Budget(samples=5, sample_ms=0.3, max_calls=32)


def _sane(t: Timing, mode: str, n_samples: int | None = None) -> None:
    assert t.mode == mode
    if n_samples is not None:
        assert len(t.samples_s) == n_samples
    assert all(math.isfinite(s) and s > 0 for s in t.samples_s)
    assert min(t.samples_s) <= t.q25_s <= t.median_s <= t.q75_s <= max(t.samples_s)
    assert t.median_s < 1.0  # seconds per call of a small relu²: anything near a second is a unit bug


def test_quantile_interpolates_like_numpy():
    samples = [4.0, 1.0, 3.0, 2.0]
    assert quantile(samples, 0.5) == 2.5
    assert quantile(samples, 0.25) == 1.75
    assert quantile(samples, 0.75) == 3.25
    assert quantile([7.0], 0.25) == quantile([7.0], 0.75) == 7.0
    with pytest.raises(ValueError):
        quantile([], 0.5)


def test_timing_summaries_and_validation():
    t = Timing("hot", (3.0, 1.0, 2.0))
    assert (t.q25_s, t.median_s, t.q75_s) == (1.5, 2.0, 2.5)
    with pytest.raises(ValueError, match="mode"):
        Timing("warm", (1.0,))
    with pytest.raises(ValueError):
        Timing("hot", ())


@pytest.mark.parametrize("mode", ["hot", "cold", "launch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_modes_give_sane_samples(mode, dtype):
    x = torch.randn(64, 4096).to(dtype)
    _sane(time_fn(relu_squared_reference, x, mode, FAST), mode, FAST.samples)


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="unknown timing mode"):
        time_fn(relu_squared_reference, torch.ones(8), "warm")


def test_time_all_gives_every_mode():
    figures = timing.time_all(torch.clone, torch.ones(1024), budget=FAST)
    assert set(figures) == {"hot", "cold", "launch"}


def _recording(fn):
    seen: list[int] = []

    def wrapped(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.data_ptr())
        return fn(x)

    return wrapped, seen


def test_cold_rotates_over_copies_larger_than_the_cache(monkeypatch):
    monkeypatch.setattr(timing, "cpu_cache_bytes", lambda *a, **k: 64 << 10)  # a 64 KiB "LLC"
    x = torch.randn(1024)  # 4 KiB in + 4 KiB out per call
    fn, seen = _recording(relu_squared_reference)
    # One call per sample, enough samples to go round the whole rotation.
    time_fn(fn, x, "cold", Budget(samples=40, sample_ms=1e-6, max_calls=1))
    sets = math.ceil(timing.ROTATION_FACTOR * (64 << 10) / bytes_moved(1024, "float32"))
    assert len(set(seen)) == sets == 32
    assert sets * bytes_moved(1024, "float32") >= timing.ROTATION_FACTOR * (64 << 10)


def test_hot_and_launch_reuse_one_input():
    x = torch.randn(1024)
    for mode in ("hot", "launch"):
        fn, seen = _recording(relu_squared_reference)
        time_fn(fn, x, mode, FAST)
        assert set(seen) == {x.data_ptr()}


def test_calls_per_sample_is_adaptive_and_bounded():
    budget = Budget(samples=3, sample_ms=5.0, max_calls=100)
    assert timing._calls_per_sample(1e-3, budget) == 5  # 1 ms calls: 5 per 5 ms sample
    assert timing._calls_per_sample(1.0, budget) == 1  # slower than a sample: one call
    assert timing._calls_per_sample(1e-9, budget) == 100  # tiny: capped
    assert timing._calls_per_sample(1e-9, budget, limit=7) == 7


def _stub_triton(monkeypatch, events: list[str], tries: list[tuple[int, list[float]]], budget_ms: float = 0.2) -> None:
    """A triton whose do_bench_cudagraph calls fn in triton 3's order (warm-up, five to estimate, then
    the graph's calls while capturing) and returns replays in ms; each call takes the next of ``tries``
    (calls in the graph, replays)."""
    import sys
    import types

    capturing = False
    left = list(tries)

    def do_bench_cudagraph(fn, rep, return_mode):
        nonlocal capturing
        assert return_mode == "all"
        assert rep == budget_ms, "the graph is sized for the round's sample time"
        calls, replays = left.pop(0)
        for _ in range(1 + 5):
            fn()
        capturing = True
        for _ in range(calls):
            fn()
        capturing = False
        return replays

    triton = types.ModuleType("triton")
    triton.testing = types.SimpleNamespace(do_bench_cudagraph=do_bench_cudagraph)
    monkeypatch.setitem(sys.modules, "triton", triton)
    monkeypatch.setitem(sys.modules, "triton.testing", triton.testing)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: events.append(f"sleep {cycles}"), raising=False)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing)


def test_hot_sizes_its_graph_from_the_gpu_not_the_host(monkeypatch):
    """Hot method 3: do_bench_cudagraph estimates its graph's length from five eager calls right after
    its warm-up call; the warm-up leaves the GPU asleep so those five are timed as the GPU runs them
    (timed as the host launched them, every process got another length: docs/lab/results.md).  One
    sleep, after the first call, never inside the graph; the first replay is dropped."""
    events: list[str] = []
    budget = Budget(samples=3, sample_ms=0.2, max_calls=16)
    _stub_triton(monkeypatch, events, [(200, [2e-3, 1e-3, 1e-3])])  # 200 calls of 1 µs: the 0.2 ms asked
    x = torch.ones(4)
    samples = timing._cuda_hot(lambda x: events.append("call"), x, budget)
    warm = timing.hot_input_count(bytes_moved(4, "float32"), timing.l2_bytes(x.device))  # one call a copy
    assert events == ["call"] * warm + ["call", f"sleep {timing.ESTIMATE_SLEEP_CYCLES}"] + ["call"] * (5 + 200)
    assert samples == [1e-6, 1e-6]  # ms to s, the first replay (the graph's upload) left out


def test_hot_measures_again_a_graph_its_estimate_left_short(monkeypatch, capsys):
    """A host stall past the sleep makes the estimate read the GPU idle: a graph of a few calls, each
    carrying a large share of the graph's fixed cost (an H100 A/A had figures 3.7x their cell's other
    rounds).  Such a graph, lasting under SHORT_GRAPH of the sample time, is measured again."""
    events: list[str] = []
    budget = Budget(samples=3, sample_ms=0.2, max_calls=16)
    short = (4, [9e-3, 3.6e-3, 3.6e-3])  # 4 calls of 3.6 µs: 14 µs of the 200 asked
    sound = (150, [2e-3, 1.3e-3, 1.3e-3])  # 150 calls of 1.3 µs: 195 µs
    _stub_triton(monkeypatch, events, [short, sound])
    samples = timing._cuda_hot(lambda x: events.append("call"), torch.ones(4), budget)
    assert samples == pytest.approx([1.3e-6, 1.3e-6])
    assert events.count(f"sleep {timing.ESTIMATE_SLEEP_CYCLES}") == 2  # each try estimates behind its own sleep
    # a line of its own that starts with HOT_NOTE: what relu2 compare looks for in a round's log
    assert capsys.readouterr().err.startswith(
        f"{timing.HOT_NOTE}a graph of 4 calls lasted 0.014 ms of the 0.2 ms asked (try 1 of 3)")


def test_hot_keeps_the_longest_graph_when_every_estimate_stalled(monkeypatch):
    events: list[str] = []
    budget = Budget(samples=3, sample_ms=0.2, max_calls=16)
    tries = [(4, [9e-3, 3.6e-3, 3.6e-3]), (9, [5e-3, 2.0e-3, 2.0e-3]), (2, [9e-3, 6e-3, 6e-3])]
    _stub_triton(monkeypatch, events, tries)
    samples = timing._cuda_hot(lambda x: events.append("call"), torch.ones(4), budget)
    assert samples == pytest.approx([2.0e-6, 2.0e-6])
    assert events.count(f"sleep {timing.ESTIMATE_SLEEP_CYCLES}") == timing.HOT_TRIES == len(tries)


def test_hot_input_copies_stay_within_a_quarter_of_the_l2():
    """Hot method 4 cycles over HOT_INPUTS copies of a tiny input, fewer as they near 1/HOT_L2_SHARE of
    the L2, one from there up (an H200's 60 MiB L2 here)."""
    l2 = 60 << 20
    assert timing.hot_input_count(bytes_moved(2**10, "bfloat16"), l2) == timing.HOT_INPUTS == 16
    assert timing.hot_input_count(bytes_moved(2**20, "bfloat16"), l2) == 3  # 4 MiB each: 15 MiB of room
    assert timing.hot_input_count(bytes_moved(2**22, "bfloat16"), l2) == 1
    assert timing.hot_input_count(0, l2) == 16 and timing.hot_input_count(1, 0) == 1


def test_hot_calls_take_the_copies_by_turns(monkeypatch):
    """The graph's calls cycle over the input and its copies (each equal to it), in the same order
    each time round: the warm-up, the five estimate calls and the captured calls all take turns, after
    one call on each copy before any of them (a compiled fn recompiles outside the capture)."""
    events: list[str] = []
    monkeypatch.setattr(timing, "HOT_INPUTS", 3)
    x = torch.arange(4.0)
    seen: list[torch.Tensor] = []
    _stub_triton(monkeypatch, events, [(200, [2e-3, 1e-3, 1e-3])])
    timing._cuda_hot(seen.append, x, Budget(samples=3, sample_ms=0.2, max_calls=16))
    assert len(seen) == 3 + 1 + 5 + 200 and seen[0] is x
    assert [t is seen[i % 3] for i, t in enumerate(seen)] == [True] * len(seen)
    assert len({id(t) for t in seen}) == 3 and all(torch.equal(t, x) for t in seen)


@pytest.mark.parametrize("triton", ["absent", "older than return_mode"])
def test_hot_without_triton_s_timer_checks_its_own_graph_too(monkeypatch, triton):
    """The written-out method (no triton, or one whose do_bench_cudagraph returns no replays) sizes its
    graph from the same kind of estimate, so a short graph of it is measured again as well."""
    import sys
    import types

    if triton == "absent":
        monkeypatch.setitem(sys.modules, "triton", None)
        monkeypatch.setitem(sys.modules, "triton.testing", None)
    else:
        def do_bench_cudagraph(fn, rep, return_mode):
            assert return_mode in ("min", "max", "mean", "median")  # triton 2's modes
        old = types.ModuleType("triton")
        old.testing = types.SimpleNamespace(do_bench_cudagraph=do_bench_cudagraph)
        monkeypatch.setitem(sys.modules, "triton", old)
        monkeypatch.setitem(sys.modules, "triton.testing", old.testing)
    tries = [([3.6e-6] * 3, 4), ([1.3e-6] * 3, 150)]  # 14 µs of the 200 asked, then 195 µs
    monkeypatch.setattr(timing, "graph_replay_samples", lambda call, budget: tries.pop(0))
    budget = Budget(samples=3, sample_ms=0.2, max_calls=16)
    assert timing._cuda_hot(lambda x: None, torch.ones(4), budget) == [1.3e-6] * 3
    assert not tries


def test_a_written_out_graph_held_to_max_calls_is_not_measured_again(monkeypatch, capsys):
    """Without triton's timer the graph is capped at max_calls: a fast kernel's graph is short by the
    budget, not by a stalled estimate, and is not measured three times with a warning each."""
    import sys

    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.setitem(sys.modules, "triton.testing", None)
    tries = [([1e-6] * 3, 16)]  # 16 µs of the 200 asked: the cap, 16 calls
    monkeypatch.setattr(timing, "graph_replay_samples", lambda call, budget: tries.pop(0))
    assert timing._cuda_hot(lambda x: None, torch.ones(4), Budget(samples=3, sample_ms=0.2, max_calls=16)) == [1e-6] * 3
    assert not tries and "stalled" not in capsys.readouterr().err


def test_a_graph_longer_than_its_sample_time_or_of_uncounted_calls_is_never_short():
    budget = Budget(samples=3, sample_ms=2.0)
    assert timing._short_graph([1e-6], 400, budget)  # 0.4 ms of 2
    assert not timing._short_graph([1e-6], 500, budget)  # a quarter: the bound
    assert not timing._short_graph([3e-3], 1, budget)  # one call longer than the sample time
    assert not timing._short_graph([1e-6], 0, budget)  # no capture seen: nothing to judge


def test_budget_validation():
    with pytest.raises(ValueError):
        Budget(samples=0)


def test_bytes_and_dtype_helpers():
    assert bytes_moved(1024, "bfloat16") == 4096
    assert bytes_moved(1024, "float32") == 8192
    assert dtype_of("torch.float16") is torch.float16
    assert dtype_name(torch.bfloat16) == "bfloat16"
    with pytest.raises(ValueError):
        dtype_of("float7")


def test_every_mode_has_a_timer_on_every_device():
    assert {device: set(timers) for device, timers in timing.TIMERS.items()} == {
        "cuda": set(MODE_NAMES), "cpu": set(MODE_NAMES)}


def test_cpu_cache_size_from_sysfs(tmp_path):
    for index, size in enumerate(["32K", "1024K", "32768K", "48M"]):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size + "\n")
    assert timing.cpu_cache_bytes(tmp_path) == 48 << 20
    assert timing.cpu_cache_bytes(tmp_path / "missing") == timing.CPU_CACHE_FALLBACK_BYTES
    assert timing.l2_bytes("cpu") == timing.cpu_cache_bytes()


def test_copy_bandwidth_on_cpu_is_plausible():
    gbps = timing.copy_bandwidth("cpu", numel=2**20, budget=FAST)
    assert 0.05 < gbps < 10_000


def test_peak_memory_is_a_gpu_figure():
    assert timing.peak_memory_bytes(torch.clone, torch.ones(16)) is None


def test_machine_info_has_the_asv_keys_as_strings():
    info = machine_info()
    assert set(info) == {"gpu", "driver", "cuda", "torch", "triton", "l2_bytes"}
    assert all(isinstance(v, str) and v for v in info.values())
    assert info["torch"] == torch.__version__


def test_figures_measured_on_the_cpu_of_a_gpu_box_record_no_gpu(monkeypatch):
    """A compare run with --device cpu on an H200 box recorded the H200, and was judged by its model."""
    from types import SimpleNamespace

    from relu2.host import machine

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(L2_cache_size=1 << 20))
    monkeypatch.setattr(machine, "gpu_name", lambda: "NVIDIA H200")
    monkeypatch.setattr(machine, "nvidia_driver_version", lambda: "570")
    assert (machine_info()["gpu"], machine_info("cuda")["l2_bytes"]) == ("NVIDIA H200", str(1 << 20))
    assert {k: machine_info("cpu")[k] for k in ("gpu", "driver", "l2_bytes")} == dict.fromkeys(("gpu", "driver", "l2_bytes"), "none")


# --- CUDA (run on the GPU box) -------------------------------------------------------------


def test_the_timers_gpu_tests_are_what_a_gpu_run_selects():
    """The box runs ``pytest -m cuda``: each CUDA test here must carry the marker, not only a skip
    without CUDA (with a skipif alone none of them ran on any GPU box)."""
    gpu_tests = {name: f for name, f in globals().items() if name.startswith("test_cuda_")}
    assert len(gpu_tests) >= 6
    for name, f in gpu_tests.items():
        assert "cuda" in {m.name for m in getattr(f, "pytestmark", [])}, name


@requires_cuda
@pytest.mark.parametrize("mode", ["hot", "cold", "launch"])
def test_cuda_modes_give_sane_samples(mode):
    x = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16)
    _sane(time_fn(relu_squared_reference, x, mode), mode)


@requires_cuda
@pytest.mark.parametrize("numel", [2**10, 2**23])
def test_cuda_hot_cycles_its_graph_over_l2_resident_copies(numel):
    """Hot method 4 on a GPU: the calls inside the graph take HOT_INPUTS inputs by turns, each bitwise
    the input, at their own addresses; an input whose copies would fill more than 1/HOT_L2_SHARE of the
    L2 is timed on itself alone (method 3's graph)."""
    x = torch.randn(numel, device="cuda", dtype=torch.bfloat16)
    seen: dict[int, torch.Tensor] = {}

    def fn(t: torch.Tensor) -> torch.Tensor:
        if torch.cuda.is_current_stream_capturing():
            seen.setdefault(t.data_ptr(), t)  # compared after: no synchronizing call inside a capture
        return relu_squared_reference(t)

    time_fn(fn, x, "hot", Budget(samples=3, sample_ms=0.5))
    want = timing.hot_input_count(bytes_moved(numel, "bfloat16"), timing.l2_bytes("cuda"))
    assert len(seen) == want == (timing.HOT_INPUTS if numel == 2**10 else 1)
    assert x.data_ptr() in seen and all(torch.equal(t, x) for t in seen.values())


@requires_cuda
def test_cuda_cold_is_not_faster_than_hot_and_launch_pays_overhead():
    small = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)  # 128 KiB: L2-resident when hot
    hot = time_fn(relu_squared_reference, small, "hot").median_s
    cold = time_fn(relu_squared_reference, small, "cold").median_s
    launch = time_fn(relu_squared_reference, small, "launch").median_s
    assert cold >= 0.9 * hot
    assert launch >= hot  # graph replay hides the launch cost that eager calls pay


@requires_cuda
def test_cuda_cold_matches_hot_far_above_l2():
    numel = 8 * timing.l2_bytes("cuda")  # 2-byte elements: in + out = 32x L2
    x = torch.randn(numel, device="cuda", dtype=torch.bfloat16)
    hot = time_fn(torch.clone, x, "hot").median_s
    cold = time_fn(torch.clone, x, "cold").median_s
    assert cold == pytest.approx(hot, rel=0.25)


@requires_cuda
def test_cuda_peak_memory_counts_the_temporaries():
    x = torch.randn(1 << 20, device="cuda")
    out_bytes = x.numel() * x.element_size()
    assert timing.peak_memory_bytes(torch.clone, x) == out_bytes
    assert timing.peak_memory_bytes(relu_squared_reference, x) == 2 * out_bytes  # relu's temporary too


@requires_cuda
def test_cuda_l2_and_copy_bandwidth():
    assert timing.l2_bytes("cuda") > 1 << 20
    assert 100 < timing.copy_bandwidth("cuda") < 20_000
    assert machine_info()["gpu"] != "none"
    assert machine_info("cpu")["gpu"] == "none"  # the CPU's figures on a GPU box are the CPU's
