"""A re-measurement of flagged cells: what ``relu2 confirm --out FILE`` writes and ``relu2 gate
--confirmed FILE`` reads, decoded once here."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from relu2.vocab.errors import ResultsError


@dataclass(frozen=True)
class Remeasured:
    """One flagged cell measured again: per-round medians (seconds), each round a fresh process,
    base and head rounds interleaved on one box; a round that failed is nan in its place (the file's
    null), so round i of one side stays beside round i of the other."""

    benchmark: str  # as in the report: "bench_relu2.Grid.track_hot"
    params: tuple[tuple[str, str], ...]  # as in the report's ``params``
    base_rounds: tuple[float, ...]
    head_rounds: tuple[float, ...]


@dataclass(frozen=True)
class Remeasurement:
    """What ``relu2 gate --confirmed FILE`` reads (written by the re-measuring side, relu2 confirm):

    ``{"base": FULL_HASH, "head": FULL_HASH, "machine": NAME, "instrument": STATE,
       "cells": [{"benchmark": ..., "params": {...}, "base_rounds": [s, ...], "head_rounds": [s, ...]}]}``

    ``cells`` are the report's flagged regressions (``--format json``: each has ``benchmark`` and
    ``params``), at least ``MIN_ROUNDS`` rounds a side."""

    base: str
    head: str
    machine: str
    cells: tuple[Remeasured, ...]
    instrument: str = ""  # as compare.json names its own ("" in files older than it)

    def find(self, benchmark: str, params: Iterable[tuple[str, str]]) -> Remeasured | None:
        """The re-measurement of a cell (None: not re-measured; whether enough of its rounds pair up is
        the rule's to say).  Parameters match as a mapping: the report's JSON sorts them, asv's records
        keep their order."""
        wanted = dict(params)
        return next((c for c in self.cells if c.benchmark == benchmark and dict(c.params) == wanted), None)


def read_remeasurement(path: str | Path) -> Remeasurement:
    """The file of a re-measurement; ResultsError naming it when it is not one."""
    try:
        data = json.loads(Path(path).read_text())
        cells = tuple(Remeasured(
            str(c["benchmark"]), tuple((str(k), str(v)) for k, v in c["params"].items()),
            _rounds(c["base_rounds"]), _rounds(c["head_rounds"]),
        ) for c in data["cells"])
        out = Remeasurement(str(data["base"]), str(data["head"]), str(data.get("machine", "")), cells,
                            str(data.get("instrument", "")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ResultsError(f"{path}: not a re-measurement of flagged cells ({type(e).__name__}: {e})") from None
    return out


def _rounds(values: Iterable[float | None]) -> tuple[float, ...]:
    """A side's per-round medians; a failed round (null) is nan in its place."""
    return tuple(math.nan if x is None else float(x) for x in values)
