"""Plots of tidy result rows (``relu2.records.rows.Row``): latency, bandwidth, speed-up and history.

Every figure is written twice, PNG (150 dpi) and SVG, atomically (saved to a temporary file in the
target folder, then renamed).  Only rows with status "ok" are drawn; failed and skipped figures are
left out (the history plot marks them on the axis).  The size plots use the grid rows only (shape
``(numel // 4096, 4096)`` or ``(numel,)``): model-shape rows sit at other sizes and would zig-zag
the lines; when there are no grid rows, all rows are used.

Styles come from ``relu2.vocab.schema``: colour and marker per implementation, line style per timing
mode.  Legends sit outside the axes.
"""

from __future__ import annotations

import io
import math
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import matplotlib

matplotlib.use("Agg")  # no display here; must come before pyplot
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402

from relu2.host import git  # noqa: E402
from relu2.host.files import atomic_write_text  # noqa: E402
from relu2.records.rows import Row  # noqa: E402
from relu2.show.table import speedups as by_id  # noqa: E402
from relu2.vocab import schema  # noqa: E402  (read at call time: the modes are the schema's MODES)
from relu2.vocab.errors import UsageError  # noqa: E402
from relu2.vocab.schema import (BASELINE, OK, ROOFLINE, ROUTED_TOP_K, STATUSES, dtype_order, impl_order,  # noqa: E402
                                impl_style, is_grid_shape, parse_shape)
from relu2.vocab.schema import mode as mode_of  # noqa: E402

DPI = 150

# ---------------------------------------------------------------------------------------------
# pure helpers: selecting and formatting


def ok_rows(rows: Iterable[Row]) -> list[Row]:
    """Rows with a usable figure (status ok, finite positive median)."""
    return [r for r in rows if r.status == OK and math.isfinite(r.median_s) and r.median_s > 0]


def is_grid_row(row: Row) -> bool:
    """True for the size-grid cells, whose shape follows from numel alone."""
    return is_grid_shape(row.numel, row.shape)


def size_rows(rows: Iterable[Row]) -> list[Row]:
    """The rows to draw against numel: grid rows when there are any, else all of them."""
    rows = list(rows)
    grid = [r for r in rows if is_grid_row(r)]
    return grid or rows


def latest_commit(rows: Sequence[Row]) -> tuple[str, str]:
    """``(machine, commit)`` of the most recent row by commit date (ties: the last one seen)."""
    if not rows:
        raise ValueError("no rows")
    best = max(enumerate(rows), key=lambda ir: (ir[1].date, ir[0]))[1]
    return best.machine, best.commit


def select_commit(rows: Sequence[Row], commit: str | None = None, machine: str | None = None) -> list[Row]:
    """The rows of one machine at one commit: ``commit`` (a prefix) or the latest; ValueError when none match."""
    rows = [r for r in rows if machine is None or r.machine == machine]
    if commit:
        matches = sorted({r.commit for r in rows if r.commit.startswith(commit)})
        if commit in matches:  # a full name, clean or +dirty-, is itself however many others it prefixes
            matches = [commit]
        if not matches:
            raise UsageError(f"no results for commit {commit!r}")
        if len(matches) > 1:
            raise UsageError(f"commit {commit!r} is ambiguous: {', '.join(short_commit(m) for m in matches)}")
        picked = [r for r in rows if r.commit == matches[0]]
        m = latest_commit(picked)[0]
        return [r for r in picked if r.machine == m]
    m, c = latest_commit(rows)
    return [r for r in rows if r.machine == m and r.commit == c]


def size_label(numel: float) -> str:
    """``2^k`` sizes as 1K, 64K, 1M, 256M, 1G (binary prefixes); others as plain numbers."""
    n = int(round(numel))
    for shift, suffix in ((30, "G"), (20, "M"), (10, "K")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{suffix}"
    return f"{n:,}"


def number_label(value: float) -> str:
    """Axis numbers without scientific notation: 0.5, 2, 30, 1,000."""
    if value >= 1:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def ratio_label(value: float) -> str:
    """A speed-up tick with two or three significant digits: 0.002×, 0.19×, 1.5×, 12×, 1,024×."""
    if value >= 100:
        return f"{value:,.0f}×"
    return f"{value:.3g}×" if value >= 1 else f"{value:.2g}×"


HEADROOM = 1.08  # above a linear axis's highest line or ceiling, so neither touches the frame


def short_commit(commit: str) -> str:
    """The hash's first 8 digits, and an edited tree's mark (``+dirty-<digest>``) whole: rows of an
    edited kernel are never titled as the commit's."""
    if not commit:
        return "uncommitted"
    sha, plus, rest = commit.partition("+")
    return sha[:8] + plus + rest


def title_of(what: str, rows: Sequence[Row]) -> str:
    """``"relu² latency — fixture-machine @ 746046a6 (2026-11-23)"``."""
    r = rows[0]
    date = f" ({r.date[:10]})" if r.date else ""
    return f"relu² {what} — {r.machine or 'unknown machine'} @ {short_commit(r.commit)}{date}"


def series(rows: Iterable[Row], value: Callable[[Row], float]) -> list[tuple[int, float, Row]]:
    """``(numel, value, row)`` sorted by numel, one per numel (the first seen: ``shadowed`` names the rest)."""
    seen: dict[int, tuple[int, float, Row]] = {}
    for r in rows:
        seen.setdefault(r.numel, (r.numel, value(r), r))
    return [seen[n] for n in sorted(seen)]


def shadowed(rows: Iterable[Row]) -> dict[str, str]:
    """The shapes a plot against size leaves out (shape -> the shape drawn in its place): a size axis
    has one point per element count and implementation, and model shapes can share one (4096x3072,
    1024x12288)."""
    first: dict[tuple[str, str, str, int], str] = {}
    hidden: dict[str, str] = {}
    for r in rows:
        drawn = first.setdefault((r.impl, r.dtype, r.mode, r.numel), r.shape)
        if drawn != r.shape:
            hidden.setdefault(r.shape, drawn)
    return hidden


def copy_ceiling_gbps(rows: Iterable[Row], dtype: str | None = None) -> float | None:
    """copy's achieved GB/s at its largest size (hot mode preferred): the practical bandwidth ceiling."""
    copies = [r for r in ok_rows(rows) if r.impl == ROOFLINE and (dtype is None or r.dtype == dtype)]
    if not copies:
        return None
    largest = max(r.numel for r in copies)
    at_largest = [r for r in copies if r.numel == largest]
    hot = [r for r in at_largest if r.mode == "hot"] or at_largest
    return max(r.gbps for r in hot)


def groups(rows: Iterable[Row], *keys: str) -> dict[tuple, list[Row]]:
    out: dict[tuple, list[Row]] = defaultdict(list)
    for r in rows:
        out[tuple(getattr(r, k) for k in keys)].append(r)
    return out


# ---------------------------------------------------------------------------------------------
# drawing helpers


def _save(fig, out_dir: str | os.PathLike, stem: str) -> list[Path]:
    """Write ``stem.png`` and ``stem.svg`` atomically; returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in ("png", "svg"):
        target = out / f"{stem}.{fmt}"
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, dpi=DPI, bbox_inches="tight")
        atomic_write_text(target, buf.getvalue())
        written.append(target)
    plt.close(fig)
    return written


def _size_axis(ax, numels: Iterable[int]) -> None:
    """log2 x axis with a tick at every measured size (thinned to at most 10, always keeping the largest)."""
    ticks = sorted(set(numels))
    ax.set_xscale("log", base=2)
    step = max(1, math.ceil(len(ticks) / 10))
    ax.xaxis.set_major_locator(FixedLocator(ticks[::-1][::step][::-1]))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: size_label(v)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("elements (numel)")
    ax.grid(True, which="major", alpha=0.3)


def _log_y(ax) -> None:
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: number_label(v)))
    ax.grid(True, which="major", axis="y", alpha=0.3)


def _panels(n: int, sharey: bool = True):
    fig, axes = plt.subplots(1, n, figsize=(4.6 * n + 0.4, 4.4), sharey=sharey, squeeze=False)
    return fig, list(axes[0])


def _legend(fig, impls: Sequence[str], modes: Sequence[str], extra: Sequence[Line2D] = ()) -> None:
    """One legend for the whole figure, right of the panels: colours are impls, line styles modes."""
    handles = [Line2D([], [], color=impl_style(i, impls).colour, marker=impl_style(i, impls).marker, linestyle="-",
                      label=i) for i in impls]
    handles += [Line2D([], [], color="black", linestyle=mode_of(m).linestyle, label=mode_of(m).label) for m in modes]
    handles += list(extra)
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False, fontsize=9)


def _draw_lines(ax, rows: Sequence[Row], modes: Sequence[str], value: Callable[[Row], float],
                band: Callable[[Row], tuple[float, float]] | None = None, skip: Iterable[str] = (),
                among: Iterable[str] = ()) -> None:
    """One line per implementation and mode; ``among``: every implementation of the figure, so that a
    panel's lines have the legend's styles (``relu2.vocab.schema.impl_style``)."""
    among = tuple(among) or tuple(r.impl for r in rows)
    for impl in impl_order(r.impl for r in rows):
        if impl in skip:
            continue
        colour, marker = impl_style(impl, among).colour, impl_style(impl, among).marker
        for m in modes:
            pts = series((r for r in rows if r.impl == impl and r.mode == m), value)
            if not pts:
                continue
            xs = [p[0] for p in pts]
            ax.plot(xs, [p[1] for p in pts], color=colour, marker=marker, markersize=4,
                    linestyle=mode_of(m).linestyle, linewidth=1.4)
            if band is not None:
                lo_hi = [band(p[2]) for p in pts]
                ax.fill_between(xs, [b[0] for b in lo_hi], [b[1] for b in lo_hi], color=colour, alpha=0.18,
                                linewidth=0)
            flagged = [p for p in pts if p[2].flags]
            if flagged:  # implausible figures (relu2.vocab.schema.FLAG_DOCS) are marked, never hidden
                ax.scatter([p[0] for p in flagged], [p[1] for p in flagged], **FLAG_MARK)


FLAG_MARK = dict(marker="x", s=60, color="#B00020", linewidths=1.8, zorder=5)


def _flag_handle(rows: Iterable[Row]) -> list[Line2D]:
    """A legend entry for the flag mark when any drawn row is flagged."""
    if not any(r.flags for r in rows):
        return []
    return [Line2D([], [], linestyle="", marker=FLAG_MARK["marker"], color=FLAG_MARK["color"],
                   markersize=8, label="implausible figure\n(see the flags column)")]


def speedup_ticks(lo: float, hi: float) -> list[float]:
    """Speed-up axis ticks: powers of 2 (and 1.5 x them when the range is narrow) covering [lo, hi],
    at most 10, always at least two (log2 alone leaves two or three labels on a narrow range, and
    matplotlib's LogLocator with two subs gives none on a wide one)."""
    lo, hi = min(lo, hi), max(lo, hi)
    first, last = math.floor(math.log2(lo)), math.ceil(math.log2(hi))
    subs = (1.0, 1.5) if last - first <= 3 else (1.0,)
    ticks = [m * 2.0**k for k in range(first, last + 1) for m in subs]
    inside = [t for t in ticks if lo / 1.001 <= t <= hi * 1.001]
    if len(inside) < 2:
        inside = [t for t in ticks if lo / 2 <= t <= hi * 2][:3]
    step = max(1, math.ceil(len(inside) / 10))
    return inside[::step]


def kernel_modes() -> tuple[str, ...]:
    """The modes whose figure is the kernel's own time (``relu2.vocab.schema.Mode.kernel_time``): the latency
    and bandwidth plots' lines; a mode with host overhead would read as a slower kernel there."""
    return tuple(m.name for m in schema.MODES if m.kernel_time)


def speedup_modes() -> tuple[str, ...]:
    """The speed-up plot's modes: the first kernel-time mode and every mode with host overhead."""
    return kernel_modes()[:1] + tuple(m.name for m in schema.MODES if not m.kernel_time)


def _modes_present(rows: Sequence[Row], wanted: Sequence[str]) -> list[str]:
    present = {r.mode for r in rows}
    return [m for m in wanted if m in present]


# ---------------------------------------------------------------------------------------------
# the plots


def _per_dtype(rows: Sequence[Row], out_dir: str | os.PathLike, stem: str, *, title: str, ylabel: str,
               draw: Callable[[Any, list[Row]], str | None], modes: Sequence[str], extra: list | None = None,
               finish: Callable[[Sequence[Any]], None] | None = None, flags: bool = True) -> list[Path]:
    """The frame every size plot shares: a panel per dtype over the sizes (log axis), the y label, the
    title, the legend, saved as PNG and SVG.  ``draw(ax, rows of the dtype)`` draws a panel and returns
    its title (None: the dtype's name); ``finish(axes)`` runs once every panel is drawn (what the panels
    share: y limits); ``extra`` holds legend entries the panels added."""
    dtypes = dtype_order(r.dtype for r in rows)
    fig, axes = _panels(len(dtypes))
    extra = [] if extra is None else extra
    for ax, dtype in zip(axes, dtypes):
        sub = [r for r in rows if r.dtype == dtype]
        named = draw(ax, sub)
        _size_axis(ax, (r.numel for r in sub))
        ax.set_title(named or dtype)
    if finish is not None:
        finish(axes)
    axes[0].set_ylabel(ylabel)
    fig.suptitle(title_of(title, rows))
    _legend(fig, impl_order(r.impl for r in rows), modes, extra + (_flag_handle(rows) if flags else []))
    fig.tight_layout()
    return _save(fig, out_dir, stem)


FLOOR_STYLE = {"color": "black", "linestyle": (0, (1, 2)), "linewidth": 1.6}  # copy's floor and ceiling


def plot_latency(rows: Sequence[Row], out_dir: str | os.PathLike, modes: Sequence[str] | None = None,
                 stem: str = "latency") -> list[Path]:
    """Latency (µs) vs numel, log-log, a panel per dtype, a line per impl, median with IQR band.

    One line style per mode (default: the kernel-time modes, ``kernel_modes``).  The memory floor (bytes ÷ copy's GB/s at its largest size) is the
    dotted black line.  ``rows`` should be one machine at one commit (see ``select_commit``).
    Returns the PNG and SVG paths, or [] when there is nothing to draw.
    """
    rows = size_rows(ok_rows(rows))
    modes = _modes_present(rows, modes or kernel_modes())
    rows = [r for r in rows if r.mode in modes]
    if not rows:
        return []
    extra: list = []

    def draw(ax, sub: list[Row]) -> str | None:
        _draw_lines(ax, sub, modes, lambda r: r.median_s * 1e6, band=lambda r: (r.q25_s * 1e6, r.q75_s * 1e6),
                    among={r.impl for r in rows})
        ceiling = copy_ceiling_gbps(sub)
        if ceiling:
            pts = series(sub, lambda r: r.bytes / (ceiling * 1e9) * 1e6)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], **FLOOR_STYLE)
            if not extra:
                extra.append(Line2D([], [], **FLOOR_STYLE, label="memory floor: bytes ÷ copy's GB/s\nat its largest size"))
        _log_y(ax)
        return f"{sub[0].dtype} (copy ceiling {ceiling:,.0f} GB/s)" if ceiling else None

    def finish(axes) -> None:
        # The panels share y: the floor of tiny inputs is far below any launch, so it must not squash
        # the data, and the top holds every panel's highest figure.
        axes[0].set_ylim(0.5 * min(min(r.q25_s, r.median_s) for r in rows) * 1e6,
                         2 * max(max(r.q75_s, r.median_s) for r in rows) * 1e6)

    return _per_dtype(rows, out_dir, stem, title="latency", ylabel="latency per call (µs, median; band: IQR)",
                      draw=draw, modes=modes, extra=extra, finish=finish)


def plot_bandwidth(rows: Sequence[Row], out_dir: str | os.PathLike, modes: Sequence[str] | None = None,
                   stem: str = "bandwidth") -> list[Path]:
    """Achieved GB/s (2 × numel × itemsize ÷ median) vs numel, a panel per dtype, with copy's ceiling.

    Hot figures of small inputs are L2 bandwidth and can rise above the DRAM ceiling.  Default modes:
    ``kernel_modes``.
    """
    rows = size_rows(ok_rows(rows))
    modes = _modes_present(rows, modes or kernel_modes())
    rows = [r for r in rows if r.mode in modes and math.isfinite(r.gbps)]
    if not rows:
        return []
    extra: list = []
    ceilings: list[float] = []

    def draw(ax, sub: list[Row]) -> str | None:
        _draw_lines(ax, sub, modes, lambda r: r.gbps,
                    band=lambda r: (r.bytes / r.q75_s / 1e9, r.bytes / r.q25_s / 1e9), among={r.impl for r in rows})
        ceiling = copy_ceiling_gbps(sub)
        if ceiling:
            ceilings.append(ceiling)
            ax.axhline(ceiling, **FLOOR_STYLE)
            if not extra:
                extra.append(Line2D([], [], **FLOOR_STYLE, label="copy ceiling: copy's GB/s\nat its largest size"))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        return f"{sub[0].dtype} (copy ceiling {ceiling:,.0f} GB/s)" if ceiling else None

    def finish(axes) -> None:
        # The panels share y: a limit set by the first panel would push a later panel's lines and ceiling off the top.
        axes[0].set_ylim(0, HEADROOM * max([r.gbps for r in rows] + ceilings))

    return _per_dtype(rows, out_dir, stem, title="bandwidth", ylabel="achieved bandwidth (GB/s, read + write)",
                      draw=draw, modes=modes, extra=extra, finish=finish)


def speedups(rows: Sequence[Row]) -> list[tuple[Row, float]]:
    """``(row, baseline median ÷ row median)`` for every ok non-baseline row whose baseline twin is ok."""
    rows = ok_rows(rows)
    ratio = by_id(rows)
    return [(r, ratio[id(r)]) for r in rows if r.impl != BASELINE and id(r) in ratio]


def plot_speedup(rows: Sequence[Row], out_dir: str | os.PathLike, modes: Sequence[str] | None = None,
                 stem: str = "speedup") -> list[Path]:
    """Speed-up over eager (eager median ÷ median) vs numel, a panel per dtype; 1 = as fast as eager.

    By default (``speedup_modes``) the first kernel-time mode (hot) and the modes with host overhead
    (launch: what eager mode pays): the gap between them is the gain graph replay hides.  copy, in
    grey, is the bound a one-pass kernel can reach.
    """
    pairs = speedups(size_rows(ok_rows(rows)))
    modes = _modes_present([r for r, _ in pairs], modes or speedup_modes())
    pairs = [(r, s) for r, s in pairs if r.mode in modes]
    if not pairs:
        return []
    value = {id(r): s for r, s in pairs}
    srows = [r for r, _ in pairs]
    ticks = speedup_ticks(min([*value.values(), 1.0]), max([*value.values(), 1.0]))

    def draw(ax, sub: list[Row]) -> None:
        _draw_lines(ax, sub, modes, lambda r: value[id(r)], among={r.impl for r in srows})
        ax.axhline(1.0, color=impl_style(BASELINE).colour, linewidth=1.0)
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_locator(FixedLocator(ticks))  # the panels share y: one set for all
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: ratio_label(v)))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.grid(True, which="major", axis="y", alpha=0.3)

    extra = [Line2D([], [], color=impl_style(BASELINE).colour, linewidth=1.0, label=f"{BASELINE} = 1×")]
    return _per_dtype(srows, out_dir, stem, title=f"speed-up over {BASELINE}",
                      ylabel=f"speed-up over {BASELINE} (×, higher is better)", draw=draw, modes=modes, extra=extra)


def plot_memory(rows: Sequence[Row], out_dir: str | os.PathLike, stem: str = "memory") -> list[Path]:
    """GPU memory allocated at the peak of one call, as a multiple of the input's bytes, vs numel.

    A kernel that writes only its output sits at 1x (the output is as large as the input); eager's
    intermediate relu(x) shows as 2x.  [] when no row carries a peak (CPU runs).
    """
    rows = [r for r in size_rows(ok_rows(rows)) if math.isfinite(r.peak_bytes) and r.peak_bytes > 0]
    per_cell: dict[tuple, Row] = {}
    for r in rows:  # one figure per cell: the peak does not depend on the timing mode
        per_cell.setdefault((r.impl, r.dtype, r.numel), r)
    rows = list(per_cell.values())
    if not rows:
        return []

    def draw(ax, sub: list[Row]) -> None:
        for impl in impl_order(r.impl for r in sub):
            pts = series((r for r in sub if r.impl == impl), lambda r: r.peak_bytes / (r.bytes / 2))
            style = impl_style(impl, {r.impl for r in rows})
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=style.colour, marker=style.marker,
                    markersize=4, linewidth=1.4)
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
        ax.grid(True, which="major", axis="y", alpha=0.3)

    return _per_dtype(rows, out_dir, stem, title="GPU memory at the peak of one call",
                      ylabel="peak memory of one call\n(× the input's bytes)", draw=draw, modes=[], flags=False)


def token_rows(rows: Iterable[Row]) -> list[Row]:
    """The (tokens, hidden) rows of the model suites: 2-D shapes that are not the size grid's."""
    return [r for r in rows if not is_grid_row(r) and r.shape.count("x") == 1]


def plot_tokens(rows: Sequence[Row], out_dir: str | os.PathLike, mode: str = "hot", dtype: str = "bfloat16",
                stem: str = "tokens") -> list[Path]:
    """Latency (µs) vs tokens, one panel per width, one line per implementation: the model-shape view.

    Decode (1-512 tokens) and prefill (2048-16384) on one axis; copy's line is the memory floor of
    each shape.  [] when fewer than two token counts share a width.
    """
    rows = [r for r in token_rows(ok_rows(rows)) if r.mode == mode and r.dtype == dtype]
    by_width: dict[int, list[Row]] = defaultdict(list)
    for r in rows:
        by_width[parse_shape(r.shape)[1]].append(r)
    widths = sorted(w for w, sub in by_width.items() if len({x.shape for x in sub}) >= 2)
    if not widths:
        return []
    columns = min(4, len(widths))
    lines = math.ceil(len(widths) / columns)
    fig, axes = plt.subplots(lines, columns, figsize=(4.2 * columns + 0.4, 3.6 * lines), squeeze=False)
    flat = [ax for line in axes for ax in line]
    for ax, width in zip(flat, widths):
        sub = by_width[width]
        per_token = ROUTED_TOP_K.get(width, 1)  # a routed expert's input has top_k rows a token
        for impl in impl_order(r.impl for r in sub):
            pts = sorted({parse_shape(r.shape)[0] // per_token: r.median_s * 1e6 for r in sub if r.impl == impl}.items())
            style = impl_style(impl, {r.impl for r in rows})
            ax.plot([t for t, _ in pts], [v for _, v in pts], color=style.colour, marker=style.marker,
                    markersize=4, linewidth=1.4, linestyle=mode_of(mode).linestyle)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        _log_y(ax)
        ax.set_title(f"width {width:,}" + (f" ({per_token} rows a token)" if per_token > 1 else ""), fontsize=10)
        ax.set_xlabel("tokens")
    for ax in flat[len(widths):]:
        ax.axis("off")
    for line in axes:
        line[0].set_ylabel(f"latency per call (µs, {mode})")
    fig.suptitle(title_of(f"latency vs tokens ({dtype}, {mode_of(mode).label})", rows))
    _legend(fig, impl_order(r.impl for r in rows), [])
    fig.tight_layout()
    return _save(fig, out_dir, stem)


def plot_history(rows: Sequence[Row], impl: str, dtype: str, numel: int, mode: str,
                 out_dir: str | os.PathLike, stem: str | None = None, repo: str | os.PathLike | None = None) -> list[Path]:
    """One cell across commits: median (µs) with IQR error bars, commits in date (then git) order.

    Grid rows are preferred when a model-shape row has the same numel.  Failed or skipped commits
    are marked on the axis.  One machine: the one with the most rows for this cell.
    """
    cell = [r for r in rows if r.impl == impl and r.dtype == dtype and r.numel == numel and r.mode == mode]
    cell = size_rows(cell)
    if not cell:
        return []
    machine = max(groups(cell, "machine").items(), key=lambda kv: len(kv[1]))[0][0]
    cell = [r for r in cell if r.machine == machine]

    order = git.order({r.commit for r in cell}, repo)  # same-second commits: the repo's graph decides
    cell.sort(key=lambda r: (r.date, order.get(r.commit, -1), r.commit))
    by_commit: dict[str, Row] = {}
    for r in cell:  # one figure per commit; an ok figure beats a failed one
        if r.commit not in by_commit or (by_commit[r.commit].status != OK and r.status == OK):
            by_commit[r.commit] = r
    points = list(by_commit.values())
    if not any(p.status == OK for p in points):
        return []
    colour, marker = impl_style(impl).colour, impl_style(impl).marker
    fig, ax = plt.subplots(figsize=(max(6.5, 0.9 * len(points) + 2.5), 4.2))
    xs = list(range(len(points)))
    ok = [(x, p) for x, p in zip(xs, points) if p.status == OK and math.isfinite(p.median_s)]
    med = [p.median_s * 1e6 for _, p in ok]
    yerr = [[max(0.0, (p.median_s - p.q25_s) * 1e6) for _, p in ok],
            [max(0.0, (p.q75_s - p.median_s) * 1e6) for _, p in ok]]
    ax.errorbar([x for x, _ in ok], med, yerr=yerr, color=colour, marker=marker, markersize=6, capsize=4,
                linestyle=mode_of(mode).linestyle, linewidth=1.4)
    for x, p in zip(xs, points):
        if p.status != OK:
            ax.annotate(p.status, (x, 0), xycoords=("data", "axes fraction"), xytext=(0, 6),
                        textcoords="offset points", ha="center", color="#B00020", fontsize=9)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{short_commit(p.commit)}\n{p.date[:10]}" for p in points], fontsize=8)
    ax.set_xlim(-0.5, len(points) - 0.5)
    ax.set_xlabel("commit (oldest → newest)")
    ax.set_ylabel("latency per call (µs)\nmedian; bars: IQR")
    # From zero, so a 1.5x step looks like one; headroom above the highest bar.
    ax.set_ylim(0, max(p.q75_s for _, p in ok) * 1e6 * 1.2)
    ax.grid(True, axis="y", alpha=0.3)
    shape = points[0].shape
    ax.set_title(f"relu² history — {impl}, {dtype}, {size_label(numel)} elements ({shape}), {mode}\n"
                 f"{machine}", fontsize=11)
    fig.tight_layout()
    return _save(fig, out_dir, stem or f"history-{impl}-{dtype}-{numel}-{mode}")


def history_cells(rows: Sequence[Row]) -> list[tuple[str, str, int, str]]:
    """The cells ``plot_all`` draws a history for: every non-copy impl at the largest grid size, hot mode,
    bfloat16 (else the first dtype); none when there are fewer than two commits."""
    good = size_rows(ok_rows(rows))
    if len({r.commit for r in good}) < 2:
        return []
    dtypes = dtype_order(r.dtype for r in good)
    dtype = "bfloat16" if "bfloat16" in dtypes else dtypes[0]
    mode = "hot" if any(r.mode == "hot" for r in good) else sorted({r.mode for r in good})[0]
    sub = [r for r in good if r.dtype == dtype and r.mode == mode]
    numel = max(r.numel for r in sub)
    impls = impl_order(r.impl for r in sub if r.numel == numel and r.impl != ROOFLINE)
    return [(impl, dtype, numel, mode) for impl in impls]


class Drawn(list):
    """The files ``plot_all`` wrote (PNG and SVG), ``missing``: each promised plot not drawn -> why, and
    ``notes``: what the drawn plots leave out."""

    def __init__(self, files: Sequence[Path] = (), missing: dict[str, str] | None = None) -> None:
        super().__init__(files)
        self.missing: dict[str, str] = dict(missing or {})
        self.notes: list[str] = []


def nothing_to_draw(rows: Sequence[Row]) -> str:
    """Why ``rows`` hold no figure to draw ("" when they hold one): how many failed, were skipped, were NaN."""
    if ok_rows(rows):
        return ""
    counts = {s: sum(1 for r in rows if r.status == s) for s in STATUSES}
    unusable = counts[OK]  # ok in name, but no finite positive median (NaN, -1)
    parts = [f"{n} {s}" for s, n in counts.items() if n and s != OK]
    if unusable:
        parts.append(f"{unusable} {OK} without a finite positive median")
    return f"none of the {len(rows)} figures can be drawn ({', '.join(parts) or 'no rows'})"


def why_no_speedup(rows: Sequence[Row]) -> str:
    good = size_rows(ok_rows(rows))
    if not any(r.impl == BASELINE for r in good):
        return f"no ok {BASELINE} figure to divide by (every {BASELINE} figure failed, was skipped or is NaN)"
    return f"no implementation but {BASELINE} has an ok figure in hot or launch mode beside an ok {BASELINE} one"


def plot_all(rows: Sequence[Row], out_dir: str | os.PathLike, commit: str | None = None,
             repo: str | os.PathLike | None = None) -> Drawn:
    """Latency, bandwidth, speed-up and peak memory at one commit (default: the latest), plus history.

    ``repo`` is the git checkout the rows belong to (it orders same-second commits).  Returns every
    file written (PNG and SVG), with ``missing`` saying which promised plot was not drawn and why;
    nothing is drawn when the commit has no usable figure (``missing["all"]``).  Raises UsageError
    for a ``commit`` prefix matching no row or several commits.
    """
    at = select_commit(rows, commit) if rows else []
    empty = nothing_to_draw(at)
    if empty:
        return Drawn(missing={"all": empty})
    drawn = Drawn()
    hidden = shadowed(size_rows(ok_rows(at)))
    if hidden:
        drawn.notes.append("shapes that share an element count are drawn once against size (the CSV and table "
                           "hold them all): not drawn " + ", ".join(f"{shape} (drawn: {kept})"
                                                                    for shape, kept in hidden.items()))
    drawn += plot_latency(at, out_dir)
    drawn += plot_bandwidth(at, out_dir)
    speedup = plot_speedup(at, out_dir)
    drawn += speedup
    if not speedup:
        drawn.missing["speedup"] = why_no_speedup(at)
    memory = plot_memory(at, out_dir)
    drawn += memory
    if not memory:
        drawn.missing["memory"] = "no peak-memory figure: it is measured on CUDA only"
    tokens = plot_tokens(at, out_dir)
    drawn += tokens
    if not tokens and token_rows(ok_rows(at)):
        drawn.missing["tokens"] = "fewer than two token counts share a width"
    machine = at[0].machine
    mine = [r for r in rows if r.machine == machine]
    cells = history_cells(mine)
    for impl, dtype, numel, mode in cells:
        drawn += plot_history(mine, impl, dtype, numel, mode, out_dir, repo=repo)
    if not cells:
        drawn.missing["history"] = "results of one commit only: a history needs two"
    return drawn


def say_missing(drawn: Drawn, command: str) -> None:
    """One stderr line per promised plot not drawn, saying why, and one per note on what the plots leave out."""
    for name, why in drawn.missing.items():
        what = "nothing to draw" if name == "all" else f"no {name} plot"
        print(f"{command}: {what}: {why}", file=sys.stderr)
    for note in drawn.notes:
        print(f"{command}: {note}", file=sys.stderr)
