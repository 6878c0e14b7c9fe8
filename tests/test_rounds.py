"""Figures measured in rounds (relu2.measure.rounds): independent worker processes, merged without losing a fate."""

from __future__ import annotations

import json
import os

import pytest

from relu2.measure.outcome import CellResult, Outcome
from relu2.measure.rounds import merge, measure, rounds_from_env
from relu2.vocab.schema import FAILED, OK, SKIPPED, Cell
from relu2.measure.timing import Timing

CELL = Cell("fused", "float32", 1024, (1024,))


def _round(medians: dict[str, float] | None = None, status: str = OK, reason: str = "", kernel: str = "k1",
           peak: int | None = 10, modes: dict[str, Outcome] | None = None) -> CellResult:
    outcomes = modes or {m: Outcome(OK, timing=Timing(m, (s, s * 1.1, s * 0.9))) for m, s in (medians or {}).items()}
    if status != OK:
        outcomes = {m: Outcome(status, reason) for m in ("hot", "cold")}
    return CellResult(CELL, status, reason, outcomes, peak, kernel, {"hot": 0.5, "agreement": 0.25})


def test_a_merged_figure_has_one_sample_a_round_each_that_round_s_median():
    merged = merge([_round({"hot": 1e-6, "cold": 2e-6}), _round({"hot": 3e-6, "cold": 2e-6}),
                    _round({"hot": 2e-6, "cold": 4e-6}, peak=12)])
    assert merged.status == OK and merged.kernel == "k1" and merged.peak_bytes == 12
    assert merged.outcomes["hot"].timing.samples_s == pytest.approx((1e-6, 3e-6, 2e-6))
    assert merged.outcomes["hot"].median_s == pytest.approx(2e-6)
    assert merged.outcomes["cold"].median_s == pytest.approx(2e-6)
    assert merged.seconds == {"hot": 1.5, "agreement": 0.75}  # the cost of every round


def test_a_cell_that_failed_in_one_round_failed_with_that_round_named():
    merged = merge([_round({"hot": 1e-6}), _round(status=FAILED, reason="the worker was killed by SIGSEGV"),
                    _round({"hot": 1e-6})])
    assert merged.status == FAILED and merged.reason == "round 2 of 3: the worker was killed by SIGSEGV"
    assert all(o.status == FAILED for o in merged.outcomes.values())


def test_failed_outranks_skipped_and_a_reason_every_round_gave_is_given_once():
    merged = merge([_round(status=SKIPPED, reason="out of memory"), _round(status=FAILED, reason="differs")])
    assert (merged.status, merged.reason) == (FAILED, "round 2 of 2: differs")
    merged = merge([_round(status=SKIPPED, reason="needs CUDA")] * 3)
    assert (merged.status, merged.reason) == (SKIPPED, "needs CUDA")


def test_one_mode_failing_in_one_round_fails_that_mode_only():
    broken = {"hot": Outcome(OK, timing=Timing("hot", (1e-6,))), "cold": Outcome(FAILED, "capture failed")}
    merged = merge([_round({"hot": 1e-6, "cold": 1e-6}), _round(modes=broken)])
    assert merged.status == OK and merged.outcomes["hot"].status == OK
    assert (merged.outcomes["cold"].status, merged.outcomes["cold"].reason) == (FAILED, "round 2 of 2: capture failed")


def test_generated_code_that_differs_between_rounds_fails_the_cell():
    merged = merge([_round({"hot": 1e-6}), _round({"hot": 1e-6}, kernel="k2")])
    assert merged.status == FAILED and "k1, k2" in merged.reason
    assert merged.outcomes["hot"].status == FAILED


def test_the_same_code_picked_differently_between_rounds_is_measured_and_named_by_its_picks():
    """Seen on the H200: compile_dynamic float32 (1, 4096) picked another launch configuration in one
    of three rounds (same code digits 5d722f, other pick digits)."""
    from relu2.vocab.schema import only_repicked, with_picks

    a, b = "5d722f5c994792e2", "5d722f9b387c92e2"
    merged = merge([_round({"hot": 1e-6}, kernel=a), _round({"hot": 2e-6}, kernel=b), _round({"hot": 1e-6}, kernel=a)])
    assert merged.status == OK and merged.outcomes["hot"].timing.samples_s == (1e-6, 2e-6, 1e-6)
    assert merged.kernel == with_picks([b, a]) and only_repicked(merged.kernel, a)  # code kept, picks named
    assert merged.kernel[:6] == "5d722f" and merged.kernel[12:] == "92e2"
    assert with_picks([a, a]) == a and with_picks([a, "77777700000092e2"]) is None


@pytest.mark.parametrize("value", ["0", "-1", "2.5", "abc", "21"])
def test_a_bad_rounds_variable_is_refused(value, monkeypatch):
    monkeypatch.setenv("RELU2_ROUNDS", value)
    with pytest.raises(ValueError, match="RELU2_ROUNDS"):
        rounds_from_env()


def test_rounds_default_to_three_and_are_read_from_the_environment(monkeypatch):
    monkeypatch.delenv("RELU2_ROUNDS", raising=False)
    assert rounds_from_env() == 3
    monkeypatch.setenv("RELU2_ROUNDS", " 5 ")
    assert rounds_from_env() == 5


def who_measures(x):
    """relu² that writes down which process ran it and with which compiler caches (in a worker)."""
    from relu2.measure.reference import relu_squared_reference

    with open(os.environ["RELU2_TEST_WHO"], "a") as f:
        f.write(json.dumps([os.getpid(), os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
                            os.environ.get("TORCHINDUCTOR_FX_GRAPH_CACHE")]) + "\n")
    return relu_squared_reference(x)


@pytest.mark.slow
def test_each_round_is_a_fresh_process_sharing_the_first_round_s_compiler_caches(temporary_impl, tmp_path, monkeypatch):
    who = tmp_path / "who"
    monkeypatch.setenv("RELU2_TEST_WHO", str(who))
    temporary_impl("who", who_measures)
    from relu2.measure.timing import QUICK_BUDGET

    cells = [Cell("who", "float32", 1024, (1024,)), Cell("eager", "float32", 1024, (1024,))]
    lines: list[str] = []
    done = measure([("suite", cells)], "cpu", 3, budget=QUICK_BUDGET, say=lines.append)
    seen = [json.loads(line) for line in who.read_text().splitlines()]
    assert len({pid for pid, _, _ in seen}) == 3  # one worker process a round
    assert len({cache for _, cache, _ in seen}) == 1 and {fx for *_, fx in seen} == {"0"}
    assert not os.path.exists(seen[0][1])  # the measurement's caches are gone with it
    result = done.cells[cells[0]]
    assert result.status == OK and all(len(o.timing.samples_s) == 3 for o in result.outcomes.values())
    assert set(done.cells) == set(cells) and any(r.cell.impl == "copy" for r in done.results)  # the roofline too
    assert len(done.workers_s) == len(done.rounds_s) == 3
    assert [line for line in lines if "workers ready" in line][-1].startswith("relu2: round 3/3")


@pytest.mark.slow
def test_a_compiled_path_generates_the_same_fingerprinted_kernel_in_every_round():
    """The later rounds generate the code again (inductor's graph cache off) over the first round's
    caches: the fingerprint is the same in each, so the merged cell is measured, not failed."""
    from relu2.measure.timing import QUICK_BUDGET

    cells = [Cell("compile", "float32", 4096, (4096,))]
    done = measure([("suite", cells)], "cpu", 2, budget=QUICK_BUDGET, say=lambda line: None)
    result = done.cells[cells[0]]
    assert result.status == OK, result.reason
    assert result.kernel and all(len(o.timing.samples_s) == 2 for o in result.outcomes.values())


def test_a_round_s_coordinator_reads_results_without_importing_torch():
    """The process that runs a round (or a sweep) starts the workers, sends them cells and unpickles
    their results; torch is the workers' (a second and more of every round's start, on a CPU)."""
    import pickle
    import subprocess
    import sys

    result = pickle.dumps(_round({"hot": 1e-6, "cold": 2e-6}))
    code = ("import pickle, sys\n"
            "from relu2.measure import isolation, outcome, rounds, sweep, timing\n"
            "r = pickle.loads(sys.stdin.buffer.read())\n"
            "assert r.median('hot') == 1e-6 and timing.ROUND_BUDGET and rounds.merge([r]).status == 'ok'\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], input=result, capture_output=True, check=True)
    assert out.stdout.decode().strip() == "False", out.stderr.decode()
