"""A compare folder, the contract between ``relu2 compare`` (which writes it) and the judge (which reads
it): ``DIR/compare.json`` (format 1: box, machine, gpu, base and head ref and sha, rounds, order,
suites, narrowed, cells, instrument, started_at, finished_at, complete), ``DIR/base/`` and
``DIR/head/`` (asv results folders), ``DIR/rounds/`` while it measures, and the verdict's
``DIR/report.*``.  docs/compare.md shows it.

A folder from CI was written where the head's code ran: the reader takes nothing on trust, and the
strings it passes on (which reach a pull-request comment) are of strict character sets.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from relu2.host.files import atomic_write_text
from relu2.records.work import counted_from_json, describe_change, report_json
from relu2.vocab.errors import ResultsError, UsageError
from relu2.vocab.schema import Cell, parse_shape

FORMAT = 1
COMPARE_FILE = "compare.json"
ROUNDS_DIR = "rounds"  # a run's rounds as they end, until its results are written (--resume reads them)
SIDE_NAMES = ("base", "head")
REPORT_FORMATS = {"text": "report.txt", "markdown": "report.md", "json": "report.json"}
WORK_FILE = "work.json"  # the work counters of the cells whose kernel differs, once per side (or why none)
# What a compare folder may record (it was written where the head's code ran, and these strings reach
# a pull-request comment): a box id (a boot id, a host name), and GPU and software names such as
# "NVIDIA H200", "2.9.0+cu128", "570.133.20".  Anything else is refused, not escaped.
BOX_ID = re.compile(r"[A-Za-z0-9._:-]{1,100}")
RECORDED_NAME = re.compile(r"[A-Za-z0-9 ._:+()/-]{0,100}")


# --- writing --------------------------------------------------------------------------------------------


def write_info(folder: Path, info: dict) -> None:
    """DIR/compare.json, whole or not at all."""
    atomic_write_text(folder / COMPARE_FILE, json.dumps(info, indent=2) + "\n")


# What must match for a compare to be resumed: the same measurement, on the same boot of the same box.
RESUME_KEYS = ("box", "machine", "device", "base", "head", "rounds", "suites", "narrowed", "cells", "instrument")


def kept_rounds(folder: Path) -> int:
    """How many measured rounds an incomplete compare in ``folder`` keeps for ``--resume``."""
    return len(list((folder / ROUNDS_DIR).glob("round-*.pickle")))


def incomplete(folder: Path) -> dict:
    """The compare.json of an incomplete compare in ``folder``; UsageError (one line) if there is none."""
    path = folder / COMPARE_FILE
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"--resume: {folder} holds no {COMPARE_FILE} (nothing to resume)") from None
    except (OSError, ValueError) as e:
        raise UsageError(f"--resume: {path} is unreadable ({e})") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise UsageError(f"--resume: {path} is not a compare of format {FORMAT}")
    if info.get("complete"):
        raise UsageError(f"--resume: {folder} is complete (judge it: relu2 gate --compare {folder})")
    return info


def check_resumable(folder: Path, earlier: dict, now: dict) -> None:
    """UsageError naming the first difference that makes ``earlier``'s rounds unpairable with ``now``'s."""
    for key in RESUME_KEYS:
        if earlier.get(key) != now.get(key):
            why = " (another boot or another box: rounds of two boxes are not paired)" if key == "box" else ""
            raise UsageError(f"--resume: {folder} was measured with another {key}{why}: "
                             f"{json.dumps(earlier.get(key))} against {json.dumps(now.get(key))}")


def default_out() -> Path:
    """Where a compare writes when no --out is given: a new folder under .asv/compare/ here."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path(".asv") / "compare" / f"compare-{stamp}-{os.getpid()}"


# --- reading --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompareFolder:
    """A compare folder's compare.json, checked (the layout: docs/compare.md)."""

    path: Path
    box: str
    machine: str
    gpu: str
    base: str  # full hashes
    head: str
    rounds: int
    suites: tuple[str, ...] = ()  # what the compare measured: the suites, how narrowed, which cells only
    narrowed: Any = field(default=None, compare=False)
    cells: Any = field(default=None, compare=False)
    added_rounds: int = 0  # more rounds, of the cells whose work changed and were not settled (relu2 compare)
    instrument: str = ""  # what measured both sides (relu2.runs.compare.instrument_state; "" in older folders)


def shown(value: Any, limit: int = 60) -> str:
    """A value from a folder in a one-line message (which CI quotes in a comment): its repr, cut, with
    every character but letters, digits and ``' " . , _ : + - / = ( ) { } space`` shown as ``?``."""
    text = re.sub(r"[^A-Za-z0-9'\" .,_:+\-/=(){} ]", "?", repr(value))
    return text if len(text) <= limit else text[:limit] + "..."


def folder_of(path: Path, data: Mapping[str, Any]) -> CompareFolder:
    """compare.json's fields as a CompareFolder, unchecked (``read_compare`` checks them; relu2 compare
    reads its own while it measures)."""
    return CompareFolder(path, str(data["box"]), str(data["machine"]), str(data.get("gpu", "")),
                         str(data["base"]["sha"]), str(data["head"]["sha"]), int(data.get("rounds", 0)),
                         tuple(str(s) for s in data.get("suites") or ()), data.get("narrowed"), data.get("cells"),
                         int(data.get("added_rounds", 0)), str(data.get("instrument", "")))


def read_compare(folder: str | os.PathLike) -> CompareFolder:
    """DIR/compare.json, checked: format 1, complete, both shas, a box id and a GPU name of the allowed
    characters; ResultsError naming what is wrong."""
    path = Path(folder)
    meta = path / COMPARE_FILE
    try:
        data = json.loads(meta.read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, not {FORMAT}")
        out = folder_of(path, data)
        complete = data["complete"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ResultsError(f"{meta}: not a relu2 compare folder ({type(e).__name__}: {e})") from None
    if complete is not True:
        raise ResultsError(f"{meta}: the compare did not finish (complete: {json.dumps(complete)}): its rounds "
                             "are not all there, so there is no verdict; measure it again")
    if not out.box:
        raise ResultsError(f"{meta}: no box recorded")
    if not BOX_ID.fullmatch(out.box):
        raise ResultsError(f"{meta}: box {shown(out.box)} is no box id (letters, digits and . _ : - only, "
                             "at most 100): not read")
    if not RECORDED_NAME.fullmatch(out.gpu):
        raise ResultsError(f"{meta}: gpu {shown(out.gpu)} is no GPU name (letters, digits, spaces and . _ : + ( ) / - "
                             "only, at most 100): not read")
    for side in ("base", "head"):
        if not (path / side).is_dir():
            raise ResultsError(f"{path / side}: missing (a compare folder holds base/ and head/ results folders)")
    return out


@dataclass(frozen=True)
class CountedWork:
    """DIR/work.json: each side's work of the cells whose kernel differs between them, or why none was
    counted ("not measured here: ..."); an absent file (an older compare) is "not counted"."""

    why: str
    base: dict = field(default_factory=dict)  # Cell -> Work
    head: dict = field(default_factory=dict)

    def change(self, cell: Any) -> str | None:
        """How the cell's work changed ("" the same), or None when it was not counted."""
        b, h = self.base.get(cell), self.head.get(cell)
        return describe_change(b, h) if b is not None and h is not None else None

    def change_at(self, impl: str, dtype: str, shape: str) -> str | None:
        """``change`` of the cell of a decoded benchmark result (its dtype the suite's where the
        benchmark names none: ``relu2.records.asv_names.Cell``); None: not counted."""
        try:
            dims = parse_shape(shape)
        except ValueError:  # a benchmark of no size (a summary): no one cell's work
            return None
        return self.change(Cell(impl, dtype, math.prod(dims), dims))

    def note(self) -> str:
        """What the work counters say of the compare, in one line."""
        if self.why:
            return f"work counters: {self.why}"
        changed = sorted({c.impl for c in self.base if self.change(c)})
        return (f"work counted for the {len(self.base)} cells whose kernel differs: "
                f"{sum(1 for c in self.base if self.change(c))} did other work" + (f" ({', '.join(changed)})" if changed else ""))


def write_work(folder: Path, why: str, base: Any = None, head: Any = None) -> None:
    """DIR/work.json: ``why`` nothing was counted, or both sides' Counted."""
    data = {"format": 1, "why": why, **({"base": report_json(base), "head": report_json(head)} if not why else {})}
    atomic_write_text(folder / WORK_FILE, json.dumps(data) + "\n")


def read_work(folder: str | os.PathLike) -> CountedWork:
    """DIR/work.json, read; ResultsError naming it when it is not one."""
    path = Path(folder) / WORK_FILE
    if not path.exists():
        return CountedWork("not counted (this compare recorded no work counters)")
    try:
        data = json.loads(path.read_text())
        if data.get("why"):
            return CountedWork(str(data["why"]))
        base, head = counted_from_json(data["base"]), counted_from_json(data["head"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ResultsError(f"{path}: not a record of work counters ({type(e).__name__}: {e})") from None
    return CountedWork("", {c: w[0] for c, w in base.works.items() if w}, {c: w[0] for c, w in head.works.items() if w})
