"""relu2 bisect: the search over a fake oracle (no measuring), then the command on a fixture repository
measured for real (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relu2 import bisect
from relu2.bisect import LIKE_BAD, LIKE_GOOD, NOT_REPRODUCED, SAME, SLOWER, FASTER, UNCLEAR, UNKNOWN, Plan

COMMITS = [f"{i:02d}" + "c" * 38 for i in range(9)]  # GOOD is COMMITS[0], BAD COMMITS[8]
FUSED, TOY = "fused:float32:262144:hot", "toy:float32:262144:hot"


class FakeBox:
    """An oracle over a made-up history: each cell's time per commit index, with a small, fixed
    alternation between rounds (never random: a test must give the same answer every run)."""

    def __init__(self, times: dict[str, list[float]], broken: dict[int, str] | None = None,
                 failed: dict[tuple[str, int], str] | None = None, wobble: float = 0.02):
        self.times, self.broken, self.failed, self.wobble = times, broken or {}, failed or {}, wobble
        self.calls: list[tuple[tuple[str, ...], tuple[str, ...], int]] = []

    def __call__(self, sides, cells, rounds, first):
        self.calls.append((tuple(sides), tuple(cells), rounds))
        index = [COMMITS.index(s) for s in sides]
        for i in index:
            if i in self.broken:
                raise bisect.Unmeasurable(self.broken[i])
        out = {}
        for cell in cells:
            per_side = []
            for k, i in enumerate(index):
                if (cell, i) in self.failed:
                    per_side.append(self.failed[(cell, i)])
                    continue
                per_side.append([self.times[cell][i] * (1 + self.wobble * (-1) ** (r + k)) for r in range(first, first + rounds)])
            out[cell] = per_side
        return out

    @property
    def probes(self) -> list[str]:
        return [sides[1] for sides, _, _ in self.calls if len(sides) == 3]


def step_at(index: int, before: float = 1.0, after: float = 1.5, count: int = 9) -> list[float]:
    """A cell's times: ``before`` up to the commit at ``index``, ``after`` from it on."""
    return [before if i < index else after for i in range(count)]


def run(box: FakeBox, cells: list[str], **plan) -> tuple[list[bisect.Step], list[bisect.Finding]]:
    p = Plan(COMMITS, cells, **plan)
    steps = bisect.search(p, box)
    tracks = bisect.replay(p.cells, len(p.commits), steps, p.factor)
    return steps, bisect.findings(p.commits, tracks, steps)


# --- the paired rule ----------------------------------------------------------------------------------


def test_pair_reads_rounds_side_by_side():
    assert pair_of([1, 1, 1], [1.5, 1.5, 1.5]) == SLOWER
    assert pair_of([1.5, 1.5, 1.5], [1, 1, 1]) == FASTER
    assert pair_of([1, 1.1, 0.9], [1.02, 1.08, 0.93]) == SAME
    # A box that slows down as a whole over the rounds: paired, each round's ratio is 1.5
    assert pair_of([1, 2, 4], [1.5, 3, 6]) == SLOWER
    # One round of three against the others: the median says slower, the rounds disagree
    assert pair_of([1, 1, 1], [1.5, 1.5, 0.5]) == UNCLEAR
    assert pair_of([1, 1], [2, 2]) == UNCLEAR  # too few rounds to say
    # One wild round (another process took the core) does not move a median of three
    assert pair_of([1, 1, 1000], [1.01, 0.99, 1.0]) == SAME


def pair_of(a, b):
    return bisect.pair(a, b, 1.2)


def test_the_three_answers():
    good, bad = [1.0] * 3, [1.5] * 3
    assert bisect.answer(good, [1.0] * 3, bad, SLOWER, 1.2) == LIKE_GOOD
    assert bisect.answer(good, [1.5] * 3, bad, SLOWER, 1.2) == LIKE_BAD
    assert bisect.answer(good, [1.22] * 3, bad, SLOWER, 1.2) == UNKNOWN  # halfway: both moved
    assert bisect.answer(good, [1.3, 1.0, 1.5], bad, SLOWER, 1.2) == UNKNOWN  # rounds disagree
    # an improvement bisected the same way
    assert bisect.answer(bad, [1.0] * 3, good, FASTER, 1.2) == LIKE_BAD


# --- the search -------------------------------------------------------------------------------------


def test_names_the_sixth_commit_of_nine_in_four_measured_steps():
    box = FakeBox({TOY: step_at(5)})
    steps, found = run(box, [TOY])
    assert [f.verdict for f in found] == ["culprit"]
    assert found[0].first_bad == COMMITS[5] and found[0].last_good == COMMITS[4]
    assert sum(s.measured for s in steps) <= 4
    assert found[0].figures["first_bad"]["vs_good"] == pytest.approx(1.5, rel=0.05)
    assert found[0].figures["last_good"]["vs_good"] == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("culprit", range(1, 9))
def test_every_culprit_position_is_found_in_log2_steps(culprit):
    box = FakeBox({TOY: step_at(culprit)})
    steps, found = run(box, [TOY])
    assert found[0].first_bad == COMMITS[culprit] and found[0].verdict == "culprit"
    assert len(steps) <= 4  # step 0 and three halvings of eight candidates


def test_two_cells_that_moved_at_different_commits_are_reported_apart():
    box = FakeBox({TOY: step_at(3), FUSED: step_at(7, 1.0, 2.0)})
    steps, found = run(box, [TOY, FUSED])
    by = {f.cell: f for f in found}
    assert (by[TOY].first_bad, by[FUSED].first_bad) == (COMMITS[3], COMMITS[7])
    assert by[FUSED].figures["first_bad"]["vs_good"] == pytest.approx(2.0, rel=0.05)
    # the first probe serves both; after it their brackets part and each is measured alone
    assert box.calls[1][1] == (TOY, FUSED)
    assert any(cells == (TOY,) for _, cells, _ in box.calls) and any(cells == (FUSED,) for _, cells, _ in box.calls)


def test_a_commit_that_does_not_build_is_skipped_and_the_answer_is_its_range():
    box = FakeBox({TOY: step_at(5)}, broken={4: "does not build: setup.py exited 1"})
    steps, found = run(box, [TOY])
    assert found[0].verdict == "range"
    assert found[0].candidates == [COMMITS[4], COMMITS[5]]
    assert found[0].skipped == [{"commit": COMMITS[4], "reason": "does not build: setup.py exited 1"}]
    assert [s.reason for s in steps if not s.measured] == ["does not build: setup.py exited 1"]


def test_a_skipped_commit_outside_the_final_bracket_leaves_the_culprit_named():
    box = FakeBox({TOY: step_at(5)}, broken={2: "predates the implementations interface 1"})
    steps, found = run(box, [TOY])
    assert (found[0].verdict, found[0].first_bad, found[0].skipped) == ("culprit", COMMITS[5], [])


def test_a_failed_cell_skips_that_commit_for_that_cell_only():
    box = FakeBox({TOY: step_at(5), FUSED: step_at(5)}, failed={(FUSED, 4): "failed: 3 ulp at index 7"})
    _, found = run(box, [TOY, FUSED])
    by = {f.cell: f for f in found}
    assert by[TOY].verdict == "culprit" and by[TOY].first_bad == COMMITS[5]
    assert by[FUSED].verdict == "range" and by[FUSED].skipped[0]["reason"] == "failed: 3 ulp at index 7"


def test_an_unknown_answer_measures_more_rounds_up_to_the_budget_then_says_so():
    # commit 4 is halfway (1.3x GOOD, BAD 1.3x it): like neither end however long it is measured
    times = [1.0] * 4 + [1.3] + [1.69] * 4
    box = FakeBox({TOY: times})
    steps, found = run(box, [TOY], budget=9)
    probe = next(s for s in steps if s.index == 4)
    assert probe.rounds == 9 and probe.cells[TOY].answer == UNKNOWN
    assert [r for sides, _, r in box.calls if len(sides) == 3 and sides[1] == COMMITS[4]] == [3, 3, 3]
    assert found[0].verdict == "range" and "unknown after 9 rounds" in found[0].skipped[0]["reason"]


def test_unclear_rounds_are_measured_again_and_then_answered():
    """A probe whose first three rounds disagree is measured three more, and answered from all six."""
    class Late(FakeBox):
        def __call__(self, sides, cells, rounds, first):
            out = super().__call__(sides, cells, rounds, first)
            if len(sides) == 3 and first == 0:
                out[TOY][1][0] = 1.0  # the probe's first round looks like GOOD
            return out

    box = Late({TOY: step_at(5)})
    steps, found = run(box, [TOY])
    assert max(s.rounds for s in steps) == 6
    assert found[0].first_bad == COMMITS[5]


def test_no_step_between_good_and_bad_is_not_reproduced_and_measures_nothing_more():
    box = FakeBox({TOY: [1.0] * 9})
    steps, found = run(box, [TOY])
    assert [f.verdict for f in found] == [NOT_REPRODUCED] and len(steps) == 1
    assert bisect.exit_code(found) == 1


def test_an_interrupted_bisection_resumes_from_its_state_file(tmp_path):
    state = tmp_path / "state.json"
    plan = Plan(COMMITS, [TOY])

    class Interrupted(FakeBox):
        def __call__(self, sides, cells, rounds, first):
            if len(self.calls) == 2:
                raise KeyboardInterrupt
            return super().__call__(sides, cells, rounds, first)

    with pytest.raises(KeyboardInterrupt):
        bisect.search(plan, Interrupted({TOY: step_at(5)}), state=state)
    done = bisect.load_steps(plan, state)
    assert len(done) == 2  # step 0 and the first probe were kept
    again = FakeBox({TOY: step_at(5)})
    steps = bisect.search(plan, again, done, state=state)
    assert len(again.calls) == 2  # only the two probes left, not step 0 nor the first probe again
    found = bisect.findings(COMMITS, bisect.replay(plan.cells, 9, steps, plan.factor), steps)
    assert found[0].first_bad == COMMITS[5]
    assert len(bisect.load_steps(plan, state)) == 4


def test_a_state_file_of_another_bisection_is_refused(tmp_path):
    from relu2.machine import UsageError

    state = tmp_path / "state.json"
    bisect.search(Plan(COMMITS, [TOY]), FakeBox({TOY: step_at(5)}), state=state)
    with pytest.raises(UsageError, match="another bisection"):
        bisect.load_steps(Plan(COMMITS, [FUSED]), state)
    state.write_text("{not json")
    with pytest.raises(UsageError, match="not a relu2 bisect state file"):
        bisect.load_steps(Plan(COMMITS, [TOY]), state)
