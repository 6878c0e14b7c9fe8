"""The tidy result row shared by ``relu2 sweep``, ``relu2 export``, the plots and the gate, and its CSV file."""

from __future__ import annotations

import csv
import os
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Iterable

STATUSES = ("ok", "failed", "skipped")
ROOFLINE_IMPL = "copy"  # the implementation every figure's roofline_fraction is measured against
MODES = ("hot", "cold", "launch")


@dataclass(frozen=True)
class Row:
    """One figure: one implementation on one input in one timing mode, on one machine at one commit.

    Times are seconds.  ``bytes`` is what relu² must move (2 x numel x itemsize); ``gbps`` is
    bytes / median; ``roofline_fraction`` is the copy implementation's median over this median,
    both from the same run (1.0 means as fast as a device copy of the same bytes).  A failed or
    skipped figure has status "failed"/"skipped", NaN times and the reason.
    """

    machine: str
    commit: str
    date: str  # ISO 8601
    impl: str
    dtype: str  # "float32", "float16", "bfloat16"
    numel: int
    shape: str  # "4096x4096"
    mode: str  # hot | cold | launch
    median_s: float
    q25_s: float
    q75_s: float
    bytes: int
    gbps: float
    roofline_fraction: float
    status: str
    reason: str = ""


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(Row))
_INT_COLUMNS = {"numel", "bytes"}
_FLOAT_COLUMNS = {"median_s", "q25_s", "q75_s", "gbps", "roofline_fraction"}


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename, so a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)  # mkstemp makes the file owner-only; give it the mode a plain open() would
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_csv(rows: Iterable[Row], path: str | os.PathLike) -> None:
    """Write rows as a CSV with the ``COLUMNS`` header, atomically."""
    import io

    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(asdict(row))
    atomic_write_text(path, buf.getvalue())


def read_csv(path: str | os.PathLike) -> list[Row]:
    """Rows from a CSV written by ``write_csv``; ValueError naming the file when it is not one."""
    path = Path(path)
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = set(COLUMNS) - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: not a relu2 results CSV (missing columns: {', '.join(sorted(missing))})")
        rows = []
        for line_no, raw in enumerate(reader, start=2):
            try:
                rows.append(Row(**{k: _parse(k, raw[k]) for k in COLUMNS}))
            except (TypeError, ValueError) as e:
                raise ValueError(f"{path}:{line_no}: malformed row: {e}") from None
    return rows


def _parse(column: str, value: str):
    if column in _INT_COLUMNS:
        return int(value)
    if column in _FLOAT_COLUMNS:
        return float(value) if value not in ("", None) else float("nan")
    return value
