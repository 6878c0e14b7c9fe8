"""The plan of a compare: every cell the trusted suites measure, unnarrowed, read from their
benchmarks/bench_relu2.py (the instrument's own: CI copies it before removing the checkout).  The
judge holds a compare folder against it: a planned cell a side lacks is missing."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
from dataclasses import dataclass
from pathlib import Path

from relu2.records.asv_names import MODULE, Cell, decode
from relu2.records.compare_folder import CompareFolder, shown
from relu2.vocab.errors import ResultsError

# The environment that narrows the suites (benchmarks/bench_relu2.py): never the plan's.
PLAN_ENV_PREFIX, PLAN_ENV = "RELU2_BENCH_", ("RELU2_INSTRUMENT",)


@dataclass(frozen=True)
class Plan:
    """Every cell the suites measure, unnarrowed: (cell, unit) of each timing, peak memory and
    summary (a kernel fingerprint is no figure: without it a cell only loses the repick exemption)."""

    source: str
    suites: tuple[str, ...]
    cells: tuple[tuple[Cell, str], ...]

    def check_compare(self, meta: CompareFolder) -> None:
        """ResultsError unless the compare measured every suite of the plan, unnarrowed."""
        wrong = []
        if sorted(meta.suites) != sorted(self.suites):
            wrong.append(f"suites {shown(list(meta.suites), 200)}, not all of {', '.join(self.suites)}")
        if meta.narrowed:
            wrong.append(f"narrowed by {shown(meta.narrowed, 200)}")
        if meta.cells is not None:
            wrong.append("only some cells (relu2 confirm's cells)")
        if wrong:
            raise ResultsError(f"{meta.path / 'compare.json'}: not a compare of the whole plan of {self.source} "
                                 f"({'; '.join(wrong)}): measure without --suites, RELU2_BENCH_SUITES, "
                                 "RELU2_BENCH_QUICK or RELU2_BENCH_IMPLS")


@contextlib.contextmanager
def _without_suite_environment():
    """os.environ without the variables that narrow the suites (or name another instrument) for the block."""
    saved = {k: v for k, v in os.environ.items() if k.startswith(PLAN_ENV_PREFIX) or k in PLAN_ENV}
    for k in saved:
        del os.environ[k]
    try:
        yield
    finally:
        os.environ.update(saved)


def read_plan(suites_dir: str | os.PathLike) -> Plan:
    """The plan of the suites in ``suites_dir`` (a benchmarks/ folder holding bench_relu2.py, the
    instrument's own: CI copies it before removing the checkout), every suite, unnarrowed.  Importing
    it runs only the vocabulary of the installed relu2 (schema, interface, asv_run), never torch."""
    path = Path(suites_dir) / f"{MODULE}.py"
    if not path.is_file():
        raise ResultsError(f"{path}: no suites to take the plan from (--plan names the instrument's benchmarks/)")
    try:
        with _without_suite_environment():
            spec = importlib.util.spec_from_file_location(f"_relu2_plan_{MODULE}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            suites = list(module._selected())
        cells = []
        for suite in suites:
            for method in sorted(a for a in dir(suite) if a.startswith("track_")):
                fn = getattr(suite, method)
                unit = (getattr(fn, "unit", None) or getattr(suite, "unit", "")) if fn is not None else ""
                if fn is None or unit not in ("seconds", "bytes"):
                    continue
                for combo in itertools.product(*suite.params):
                    params = tuple((n, str(v)) for n, v in zip(suite.param_names, combo))
                    cells.append((decode(f"{MODULE}.{suite.__name__}.{method}", params, unit), unit))
        summaries = getattr(module, "Implementations", None)
        for method in sorted(a for a in dir(summaries) if a.startswith("track_")) if summaries else ():
            cells.append((decode(f"{MODULE}.Implementations.{method}", (), "seconds"), "seconds"))
    except Exception as e:  # noqa: BLE001  any failure to read the plan refuses, in one line
        raise ResultsError(f"{path}: the plan cannot be read ({type(e).__name__}: {e})") from None
    unique = list({c.identity: (c, u) for c, u in cells}.values())  # suites share cells, as the results do
    return Plan(str(suites_dir), tuple(s.__name__ for s in suites), tuple(unique))
