"""The tidy result row shared by ``relu2 sweep``, ``relu2 export``, the plots and the gate, and its CSV file.

``Row`` is generated from ``relu2.vocab.schema.COLUMNS``, and ``make_row`` is the one place a row is built:
the sweep and the asv reader both call it, so a derived metric is computed the same way for both.
"""

from __future__ import annotations

import csv
import io
import math
import os
import sys
from dataclasses import asdict, field, make_dataclass, replace
from pathlib import Path
from typing import Any, Iterable

from relu2.host.files import atomic_write_text
from relu2.vocab.errors import CsvError
from relu2.vocab.schema import COLUMN_NAMES, COLUMNS, OK, OUTLIER, OUTLIER_FACTOR, ROOFLINE, derive

Row = make_dataclass(
    "Row",
    [(c.name, c.kind) if c.required else (c.name, c.kind, field(default=c.default)) for c in COLUMNS],
    frozen=True,
    kw_only=True,
)
Row.__module__ = __name__
Row.__doc__ = ("One figure: one implementation on one input in one timing mode, on one machine at one commit. "
               "Fields are relu2.vocab.schema.COLUMNS; times are seconds; a failed or skipped figure has NaN times "
               "and the reason.")

_NAN = float("nan")


def make_row(
    *, machine: str, commit: str, date: str, impl: str, dtype: str, numel: int, shape: str, mode: str,
    status: str, reason: str = "", median_s: float = _NAN, q25_s: float = _NAN, q75_s: float = _NAN,
    copy_median_s: float = _NAN, **measured: Any,
) -> Row:
    """A Row from what was measured; every derived column comes from ``relu2.vocab.schema.derive``.

    ``copy_median_s`` is the roofline's median for the same input and mode in the same run (NaN
    when there is none).  ``measured`` holds optional measured columns (``peak_bytes``).
    """
    if status != OK:
        median_s = q25_s = q75_s = _NAN
    values = dict(machine=machine, commit=commit, date=date, impl=impl, dtype=dtype, numel=numel, shape=shape,
                  mode=mode, median_s=median_s, q25_s=q25_s, q75_s=q75_s, status=status, reason=reason,
                  copy_median_s=copy_median_s, **measured)
    derive(values)
    del values["copy_median_s"]
    return Row(**values)


def flag_outliers(rows: Iterable[Row]) -> list[Row]:
    """``rows`` with the ``outlier`` flag (``relu2.vocab.schema.OUTLIER``) set where it holds and cleared
    where it does not, judged within each machine, commit, implementation, dtype and mode.

    The one place the flag is computed: every set of rows passes here (the sweep's rows, every CSV
    written or read, the plots of asv results), so running it again changes nothing.
    """
    rows = list(rows)
    series: dict[tuple, dict[int, Row]] = {}  # per series: the fastest ok figure at each size
    for r in rows:
        if r.status == OK and math.isfinite(r.median_s) and r.median_s > 0:
            at = series.setdefault((r.machine, r.commit, r.impl, r.dtype, r.mode), {})
            if r.numel not in at or r.median_s < at[r.numel].median_s:
                at[r.numel] = r
    out = []
    for r in rows:
        flags = [f for f in r.flags.split(";") if f and f != OUTLIER]
        at = series.get((r.machine, r.commit, r.impl, r.dtype, r.mode), {})
        if r.numel in at and r.median_s > 0 and _is_outlier(r, at):
            flags.append(OUTLIER)
        joined = ";".join(flags)
        out.append(r if joined == r.flags else replace(r, flags=joined))
    return out


def _is_outlier(row: Row, at: dict[int, Row]) -> bool:
    sizes = sorted(at)
    k = sizes.index(row.numel)
    bounds = []
    if k > 0:  # the smaller neighbour, scaled up by the bytes: time grows no faster than bytes
        smaller = at[sizes[k - 1]]
        bounds.append(smaller.median_s * row.bytes / smaller.bytes)
    if k + 1 < len(sizes):  # the larger neighbour as it is: more bytes never take less time
        bounds.append(at[sizes[k + 1]].median_s)
    return bool(bounds) and all(row.median_s >= OUTLIER_FACTOR * b for b in bounds)


def write_stdout(text: str) -> None:
    """All of ``text`` to stdout, or BrokenPipeError.  Unbuffered (PYTHONUNBUFFERED=1, -u), stdout's
    text layer hands a pipe one write and drops what the pipe did not take when its reader left,
    so a ``| head`` looked like a complete export."""
    sys.stdout.flush()
    data = memoryview(text.encode(sys.stdout.encoding or "utf-8"))
    while data:
        data = data[sys.stdout.buffer.write(data) or 0:]
    sys.stdout.buffer.flush()


def csv_text(rows: Iterable[Row]) -> str:
    """Rows as CSV text with the ``COLUMN_NAMES`` header; a CSV is a whole set, so ``flag_outliers`` first."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMN_NAMES, lineterminator="\n")
    writer.writeheader()
    for row in flag_outliers(rows):
        writer.writerow(asdict(row))
    return buf.getvalue()


def write_csv(rows: Iterable[Row], path: str | os.PathLike) -> None:
    """Write rows as a CSV with the ``COLUMN_NAMES`` header, atomically."""
    atomic_write_text(path, csv_text(rows))


def read_csv(path: str | os.PathLike, complete_lines_only: bool = False) -> list[Row]:
    """Rows from a CSV written by ``write_csv``, or by an older relu2 with fewer columns.

    A missing column with a default is filled with it; a missing derived column is derived again.
    ``complete_lines_only``: a last line without its newline (a write cut short) is left out, the
    complete rows kept.  CsvError naming the file when it is not a results CSV.
    """
    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8") as f:
            text = f.read()
        if complete_lines_only and not text.endswith("\n"):
            # write_csv ends every row with a newline: one without it was cut short, and a cut in a
            # number still parses (3.4e-0 for 3.4e-06), so only the newline tells.
            text = text[: text.rfind("\n") + 1]
    except UnicodeDecodeError:
        raise CsvError(f"{path}: not a relu2 results CSV (not UTF-8 text)") from None
    except OSError as e:
        raise CsvError(f"{path}: cannot read: {e.strerror or e}") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    present = set(reader.fieldnames or ())
    missing = [c.name for c in COLUMNS if c.required and c.derive is None and c.name not in present]
    if missing:
        raise CsvError(f"{path}: not a relu2 results CSV (missing columns: {', '.join(missing)})")
    raw = list(enumerate(reader, start=2))
    rederive = any(c.derive is not None and c.name not in present for c in COLUMNS)
    rows = []
    for line_no, record in raw:
        try:
            values = {c.name: _parse(c, record[c.name]) for c in COLUMNS if c.name in present}
        except (TypeError, ValueError) as e:
            raise CsvError(f"{path}:{line_no}: malformed row: {e}") from None
        for c in COLUMNS:
            if c.name not in values and not c.required:
                values[c.name] = c.default
        rows.append(values)
    # A CSV of an older relu2 lacks the flags that compare rows with their neighbours.
    return flag_outliers(_rederived(rows) if rederive else [Row(**values) for values in rows])


def _rederived(rows: list[dict]) -> list[Row]:
    copies = {(v["machine"], v["commit"], v["dtype"], v["shape"], v["mode"]): v["median_s"]
              for v in rows if v["impl"] == ROOFLINE and v["status"] == OK}
    measured = {c.name for c in COLUMNS if c.derive is None}
    out = []
    for v in rows:
        key = (v["machine"], v["commit"], v["dtype"], v["shape"], v["mode"])
        kept = {k: val for k, val in v.items() if k in measured}
        out.append(make_row(copy_median_s=copies.get(key, _NAN), **kept))
    return out


def _parse(column, value: str | None):
    if value is None:
        raise ValueError(f"no value for {column.name}")
    if column.kind is int:
        return int(value)
    if column.kind is float:
        return float(value) if value != "" else math.nan
    return value
