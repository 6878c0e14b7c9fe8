"""Plots from tidy rows: every file written as non-empty PNG and SVG, failed rows skipped."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
import asv_fixture as fx  # noqa: E402

from relu2.show import plot  # noqa: E402
from relu2.records.asv_results import load_rows  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def rows():
    return load_rows(fx.RESULTS)


def assert_images(paths: list[Path], stems: set[str]) -> None:
    assert {p.stem for p in paths} == stems
    assert sorted(p.suffix for p in paths) == sorted([".png", ".svg"] * len(stems))
    for p in paths:
        data = p.read_bytes()
        assert len(data) > 10_000, p
        if p.suffix == ".png":
            assert data.startswith(PNG_MAGIC)
        else:
            assert b"<svg" in data[:2000]
    assert not [q for q in paths[0].parent.iterdir() if q.name.endswith(".tmp")]  # atomic writes


def test_plot_all_latest_commit(rows, tmp_path):
    written = plot.plot_all(rows, tmp_path)
    impls = ["eager", "compile", "compile_dynamic", "fused", "triton"]
    history = {f"history-{i}-bfloat16-268435456-hot" for i in impls}
    assert_images(written, {"latency", "bandwidth", "speedup", "tokens"} | history)  # tokens: ModelShapes
    svg = (tmp_path / "latency.svg").read_text()
    assert f"{fx.MACHINE} @ {fx.COMMIT_3[:8]}" in svg  # title: machine and commit (text kept as text)
    assert "latency per call (µs" in svg and "256M" in svg


def test_commit_selection(rows, tmp_path):
    # plot_all draws select_commit(rows, commit); checked here without drawing everything again.
    assert {r.commit for r in plot.select_commit(rows)} == {fx.COMMIT_3}
    assert {r.commit for r in plot.select_commit(rows, fx.COMMIT_1[:6])} == {fx.COMMIT_1}
    with pytest.raises(ValueError, match="no results for commit"):
        plot.plot_all(rows, tmp_path, commit="deadbeef")
    assert f"@ {fx.COMMIT_1[:8]}" in plot.title_of("latency", plot.select_commit(rows, fx.COMMIT_1))


def test_rows_of_an_edited_tree_are_named_apart_from_their_commit(rows):
    """A sweep of an edited kernel records HEAD+dirty-<digest> (relu2.runs.sweep_job.measured_state):
    its plots are titled with the mark, and the clean commit's full name still picks the clean rows."""
    dirty = f"{fx.COMMIT_1}+dirty-0123456789ab"
    both = list(rows) + [dataclasses.replace(r, commit=dirty) for r in rows if r.commit == fx.COMMIT_1]
    assert {r.commit for r in plot.select_commit(both, fx.COMMIT_1)} == {fx.COMMIT_1}
    assert {r.commit for r in plot.select_commit(both, dirty)} == {dirty}
    with pytest.raises(ValueError, match=r"ambiguous: .*\+dirty-0123456789ab"):
        plot.select_commit(both, fx.COMMIT_1[:6])
    assert f"@ {fx.COMMIT_1[:8]}+dirty-0123456789ab" in plot.title_of("latency", plot.select_commit(both, dirty))


def test_each_plot_alone(rows, tmp_path):
    at = plot.select_commit(rows, fx.COMMIT_2)
    assert_images(plot.plot_latency(at, tmp_path / "l"), {"latency"})
    assert_images(plot.plot_bandwidth(at, tmp_path / "b"), {"bandwidth"})
    assert_images(plot.plot_speedup(at, tmp_path / "s"), {"speedup"})
    cell = plot.plot_history(rows, "fused", "bfloat16", 16777216, "hot", tmp_path / "h")
    assert_images(cell, {"history-fused-bfloat16-16777216-hot"})


def test_failed_and_skipped_rows_are_skipped(rows, tmp_path):
    # commit 1 has a failed fused float32 cell and triton float32 is n/a everywhere.
    at = plot.select_commit(rows, fx.COMMIT_1)
    assert {r.status for r in at} == {"ok", "failed", "skipped"}
    assert plot.plot_latency(at, tmp_path)
    history = plot.plot_history(rows, "fused", "float32", 1024, "hot", tmp_path)  # failed, then ok twice
    assert history and "failed" in (tmp_path / "history-fused-float32-1024-hot.svg").read_text()
    nothing_ok = [dataclasses.replace(r, status="failed") for r in at]
    assert plot.plot_all(nothing_ok, tmp_path / "none") == []
    assert plot.plot_history(rows, "triton", "float32", 1024, "hot", tmp_path) == []


def test_rows_of_one_uncommitted_sweep(rows, tmp_path):
    # A `relu2 sweep` CSV: one machine, no commit; no history plot then.
    sweep = [dataclasses.replace(r, commit="", date="") for r in plot.select_commit(rows, fx.COMMIT_3)]
    written = plot.plot_all(sweep, tmp_path)
    assert {p.stem for p in written} == {"latency", "bandwidth", "speedup", "tokens"}
    assert "uncommitted" in (tmp_path / "latency.svg").read_text()


def test_labels():
    assert [plot.size_label(n) for n in (1024, 65536, 2**20, 2**28, 2**30, 3000)] == [
        "1K", "64K", "1M", "256M", "1G", "3,000"]
    assert plot.number_label(1000) == "1,000" and plot.number_label(0.5) == "0.5"
    assert plot.impl_order(["zeta", "copy", "eager"]) == ["eager", "copy", "zeta"]


def test_copy_ceiling_is_copy_at_its_largest_size(rows):
    at = plot.select_commit(rows, fx.COMMIT_3)
    ceiling = plot.copy_ceiling_gbps(at, "bfloat16")
    largest = [r for r in at if r.impl == "copy" and r.dtype == "bfloat16" and r.numel == 2**28 and r.mode == "hot"]
    assert ceiling == pytest.approx(largest[0].gbps)


@pytest.mark.parametrize("lo, hi", [(0.04, 16.0), (0.5, 1.0), (1.2, 2.5), (0.9, 1.1), (1.0, 400.0)])
def test_speedup_ticks_label_any_range(lo, hi):
    from relu2.show.plot import speedup_ticks

    ticks = speedup_ticks(lo, hi)
    assert 2 <= len(ticks) <= 10 and ticks == sorted(ticks)
    if hi / lo > 2:  # a real range: every tick is on the axis
        assert all(lo / 1.001 <= t <= hi * 1.001 for t in ticks)
    assert speedup_ticks(1.2, 2.5) == [1.5, 2.0]  # narrow: 1.5 x 2^k too


def test_implausible_figures_are_marked_in_the_plots(rows, tmp_path):
    from relu2.show.plot import _flag_handle, plot_latency, select_commit

    at = select_commit(rows)
    flagged = [dataclasses.replace(r, flags="above-roofline") if r.impl == "fused" else r for r in at]
    assert _flag_handle(at) == [] and _flag_handle(flagged)[0].get_label().startswith("implausible")
    assert plot_latency(flagged, tmp_path)  # draws, with the mark and its legend entry


# --- issue 19: every promised plot drawn or its absence explained -----------------------------


@pytest.mark.parametrize("median", [float("nan"), -1.0])
def test_nothing_to_draw_says_why_and_exits_1(rows, tmp_path, capsys, median):
    from relu2 import cli
    from relu2.records.rows import write_csv

    at = plot.select_commit(rows, fx.COMMIT_3)
    write_csv([dataclasses.replace(r, median_s=median) for r in at], tmp_path / "sweep.csv")
    assert cli.main(["plot", str(tmp_path / "sweep.csv"), "--out", str(tmp_path / "X")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing to draw" in err[0] and "figures" in err[0]
    assert not (tmp_path / "X").exists()
    failed = [dataclasses.replace(r, status="failed") for r in at]  # every cell of the commit asked for failed
    assert cli.main(["plot", str(fx.RESULTS), "--commit", fx.COMMIT_3[:8], "--out", str(tmp_path / "Y")]) == 0
    drawn = plot.plot_all(rows[: 0] + failed, tmp_path / "Z")
    assert list(drawn) == [] and "failed" in drawn.missing["all"] and not (tmp_path / "Z").exists()


def test_a_plot_not_drawn_is_named_with_the_reason(rows, tmp_path):
    at = plot.select_commit(rows, fx.COMMIT_3)
    no_eager = [dataclasses.replace(r, median_s=float("nan")) if r.impl == "eager" else r for r in at]
    drawn = plot.plot_all(no_eager, tmp_path)
    assert "speedup" not in {p.stem for p in drawn} and "eager" in drawn.missing["speedup"]
    cpu = [dataclasses.replace(r, peak_bytes=float("nan")) for r in at]
    assert "CUDA" in plot.plot_all(cpu, tmp_path / "cpu").missing["memory"]
    assert "history" in plot.plot_all(at, tmp_path / "one").missing


def test_speedup_ticks_read_as_ratios():
    assert [plot.ratio_label(v) for v in (2**-9, 0.1875, 1.0, 1.5, 12.0, 1024.0)] == [
        "0.002×", "0.19×", "1×", "1.5×", "12×", "1,024×"]


def test_every_line_and_ceiling_is_inside_the_axes(rows, tmp_path, monkeypatch):
    limits: dict[str, list[tuple[float, float]]] = {}
    save = plot._save

    def recording(fig, out_dir, stem):
        limits[stem] = [ax.get_ylim() for ax in fig.axes]
        return save(fig, out_dir, stem)

    monkeypatch.setattr(plot, "_save", recording)
    at = plot.select_commit(rows, fx.COMMIT_3)
    # float32 (the first panel) slow, bfloat16 fast: a limit frozen at the first panel cuts the others off
    at = [dataclasses.replace(r, median_s=r.median_s * 8, q25_s=r.q25_s * 8, q75_s=r.q75_s * 8)
          if r.dtype == "float32" else r for r in at]
    plot.plot_bandwidth(at, tmp_path)
    plot.plot_latency(at, tmp_path)
    top = max(r.gbps for r in plot.size_rows(plot.ok_rows(at)) if r.mode in ("hot", "cold"))
    ceiling = max(c for c in (plot.copy_ceiling_gbps(at, d) for d in ("float32", "float16", "bfloat16")) if c)
    assert all(hi >= max(top, ceiling) for _, hi in limits["bandwidth"])
    slowest = max(r.q75_s for r in plot.size_rows(plot.ok_rows(at)) if r.mode in ("hot", "cold")) * 1e6
    assert all(hi >= slowest for _, hi in limits["latency"])


def test_a_copy_far_above_the_rest_stays_inside_its_panel(rows, tmp_path, monkeypatch):
    """Issue 19 row 19: in one panel (float16) copy's GB/s, and so its ceiling, far above every other
    line: the line and the ceiling are inside the axes, in every panel of the shared y."""
    drawn: dict[str, list[tuple[tuple[float, float], list[float]]]] = {}
    save = plot._save

    def recording(fig, out_dir, stem):
        drawn[stem] = [(ax.get_ylim(), [y for line in ax.get_lines() for y in line.get_ydata()]) for ax in fig.axes]
        return save(fig, out_dir, stem)

    monkeypatch.setattr(plot, "_save", recording)
    at = plot.select_commit(rows, fx.COMMIT_3)
    # a float16 panel between the other two (the fixture has none: bfloat16's figures, renamed)
    fp16 = [dataclasses.replace(r, dtype="float16") for r in at if r.dtype == "bfloat16"]
    fast = at + [dataclasses.replace(r, median_s=r.median_s / 400, q25_s=r.q25_s / 400, q75_s=r.q75_s / 400,
                                     gbps=r.gbps * 400) if r.impl == "copy" else r for r in fp16]
    assert plot.plot_bandwidth(fast, tmp_path) and plot.plot_latency(fast, tmp_path)
    ceiling = plot.copy_ceiling_gbps(fast, "float16")
    fp16_ok = [r for r in plot.ok_rows(fast) if r.dtype == "float16"]
    assert max(r.gbps for r in fp16_ok if r.impl == "copy") > 10 * max(r.gbps for r in fp16_ok if r.impl != "copy")
    for stem in ("bandwidth", "latency"):  # nothing runs off the top (latency's memory floor may leave at the foot)
        assert len(drawn[stem]) == 3
        for (lo, hi), ys in drawn[stem]:
            assert ys and max(ys) <= hi and (stem == "latency" or min(ys) >= lo), stem
    assert any(ceiling in ys for _, ys in drawn["bandwidth"])  # the ceiling is drawn, inside


def test_the_tokens_axis_counts_tokens_at_a_routed_experts_width(rows, tmp_path, monkeypatch):
    # A routed expert's input has top_k rows a token (schema.activation_shape): its panel's x is tokens.
    from relu2.vocab.schema import ROUTED_TOP_K, activation_shape, format_shape

    width, top_k = next(iter(ROUTED_TOP_K.items()))
    template = plot.token_rows(r for r in rows if r.status == "ok")[0]
    routed = [dataclasses.replace(template, shape=format_shape(activation_shape(t, width)), numel=t * top_k * width)
              for t in (1, 64)]
    drawn = {}

    def keep(fig, out_dir, stem):
        drawn.update({ax.get_title(): [list(line.get_xdata()) for line in ax.get_lines()] for ax in fig.axes})
        return []

    monkeypatch.setattr(plot, "_save", keep)
    plot.plot_tokens(routed, tmp_path, mode=template.mode, dtype=template.dtype)
    assert drawn == {f"width {width:,} ({top_k} rows a token)": [[1, 64]]}


def test_shapes_that_share_an_element_count_are_named_not_dropped_silently(tmp_path, capsys):
    """A size axis has one point per element count: of model shapes 4096x3072 and 1024x12288 one is
    drawn, and the other is named on stderr (the CSV and table keep both)."""
    from relu2.records.rows import make_row
    from relu2.vocab.schema import OK

    shapes = [("4096x3072", 4096 * 3072), ("1024x12288", 1024 * 12288), ("64x3072", 64 * 3072)]
    rows = [make_row(machine="m", commit="c" * 40, date="2026-12-08T00:00:00", impl=impl, dtype="bfloat16",
                     numel=numel, shape=shape, mode="hot", status=OK, median_s=1e-5 * numel / 2**20,
                     q25_s=0.9e-5 * numel / 2**20, q75_s=1.1e-5 * numel / 2**20,
                     copy_median_s=1e-5 * numel / 2**20)
            for impl in ("eager", "copy") for shape, numel in shapes]
    assert plot.shadowed(rows) == {"1024x12288": "4096x3072"}
    drawn = plot.plot_all(rows, tmp_path)
    plot.say_missing(drawn, "relu2 plot")
    err = capsys.readouterr().err
    assert "relu2 plot: shapes that share an element count are drawn once against size" in err
    assert "not drawn 1024x12288 (drawn: 4096x3072)" in err
