"""Read an asv results folder into decoded ``Measurement``s (every reader's record), and those into tidy ``Row``s.

The gate, noise learning, confirm, export and the plots all read the same de-duplicated measurements:
a cell recorded twice is its newest run, and a measurement several suites list is one (one row).

asv stays the engine: files are opened with asv's own loaders (``asv.results.Results.load`` for a
result file, ``asv.util.load_json`` for ``benchmarks.json`` and ``machine.json``), so a format asv
understands is a format this module understands.  What asv cannot tell us is what its parameters
*mean*; that mapping lives here:

* the timing mode comes from the method name (``track_hot`` -> ``hot``), and only benchmarks whose
  unit is seconds are timing benchmarks; ``track_peak_memory`` (bytes) of the same suite and
  parameters fills the rows' ``peak_bytes``;
* parameter names come from ``benchmarks.json`` (never from a hard-coded module or class name);
  values are the ``repr`` strings asv stores, unquoted;
* a benchmark name and its parameters are decoded by ``relu2.records.asv_names`` (the dtype of a token
  suite, which records none, included); size comes from ``numel`` (shape ``(numel // 4096, 4096)`` when numel is a whole
  number of 4096-wide rows, else ``(numel,)``) or from ``tokens`` x ``hidden`` (``relu2.vocab.schema.activation_shape``: ``(tokens, hidden)``, top_k
  rows a token at a routed expert's width);
* asv stores a failed cell as null and a skipped one (setup raised NotImplementedError) as NaN.

Anything unreadable raises ``ResultsError`` with the offending file in the message.
"""

from __future__ import annotations

import ast
import datetime as _dt
import functools
import itertools
import math
import os
import sys
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

from relu2.host import git
from relu2.records.asv_names import KERNEL, Cell, decode, split, unit_of
from relu2.records.rows import Row, csv_text, make_row, write_csv, write_stdout
from relu2.vocab.errors import ResultsError
from relu2.vocab.schema import CELL_FIGURE_METHODS, FAILED, MODE_NAMES, OK, ROOFLINE, SKIPPED, kernel_hex, l2_of
from relu2.vocab.schema import mode as mode_named

# asv writes these two next to result files; they are not results.
_NOT_RESULT_FILES = {"machine.json", "benchmarks.json"}
FAILED_REASON = "failed during asv run; see the asv log (asv keeps no error text in results)"
SKIPPED_REASON = "n/a: setup raised NotImplementedError (asv stores skips as NaN)"


@dataclass(frozen=True)
class BenchmarkInfo:
    """What ``benchmarks.json`` says about one benchmark."""

    name: str  # "bench_relu2.Grid.track_hot"
    param_names: tuple[str, ...]
    unit: str
    version: str | None
    param_values: tuple[tuple[str, ...], ...] = ()  # each parameter's values, as asv's repr strings

    @property
    def method(self) -> str:
        """The method name, e.g. ``track_hot``."""
        return split(self.name)[1]


@dataclass(frozen=True)
class Record:
    """One benchmark at one parameter combination at one commit, as asv recorded it: the raw file's
    view, before ``measurements`` decodes and de-duplicates it for every reader."""

    machine: str
    commit: str
    date_ms: int
    env: str
    started_at: int  # asv's per-benchmark start time (ms); newer wins when environments collide
    benchmark: str
    params: tuple[tuple[str, str], ...]  # (name, unquoted value) in benchmarks.json order
    unit: str
    value: float | None  # None: failed; NaN: skipped
    stats: dict[str, Any] | None
    samples: list[float] | None
    version: str | None = None  # the benchmark's version when this cell was measured (asv keys history by it)

    @property
    def key(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        """What identifies this cell across commits."""
        return (self.benchmark, self.params)

    @property
    def cell(self) -> Cell:
        """What it measured (``relu2.records.asv_names.decode``)."""
        return decode(self.benchmark, self.params, self.unit)

    @property
    def status(self) -> str:
        """``ok``, ``failed`` (null in asv) or ``skipped`` (NaN in asv)."""
        return cell_status(self.value)

    def label(self) -> str:
        """A short human label: ``Grid.track_hot(impl=fused, dtype=bfloat16, numel=16777216)``."""
        short = ".".join(self.benchmark.split(".")[-2:])
        return f"{short}({', '.join(f'{k}={v}' for k, v in self.params)})"


@dataclass(frozen=True)
class Measurement:
    """One measurement of one commit on one box, decoded and de-duplicated: what every reader reads.

    ``samples`` are asv's (NaN and None dropped); ``rounds`` says they are one median per round (a
    fresh process each: the mode's method, read from ``version``).  ``fingerprint`` is the kernel
    recorded for the same input at the same commit ("" when none: eager and copy, or not recorded).
    ``box`` is where it was measured: ``<results folder>:<machine>`` (two folders may hold machines
    of one name that are different boxes), or a compare folder's ``box``."""

    cell: Cell
    machine: str
    box: str
    commit: str
    date_ms: int
    status: str  # ok, failed (null in asv) or skipped (NaN in asv)
    value: float | None  # the figure asv stores (the median of the samples); None failed, NaN skipped
    samples: tuple[float, ...] = ()
    rounds: bool = False
    fingerprint: str = ""
    version: str | None = None  # the benchmark's version: its method
    unit: str = "seconds"
    also: tuple[str, ...] = ()  # other suites listing the same measurement
    started_at: int = 0
    quartiles: tuple[float, float] = (math.nan, math.nan)  # q25, q75: asv's stats, else of the samples

    @property
    def benchmark(self) -> str:
        return self.cell.benchmark

    @property
    def params(self) -> tuple[tuple[str, str], ...]:
        return self.cell.params

    @property
    def reason(self) -> str:
        return {OK: "", FAILED: FAILED_REASON, SKIPPED: SKIPPED_REASON}[self.status]

    def label(self) -> str:
        return self.cell.label()

    @property
    def width(self) -> float:
        """log(max/min) of its rounds: the spread between processes this figure shows (0 without rounds)."""
        clean = [s for s in self.samples if s > 0]
        return math.log(max(clean) / min(clean)) if self.rounds and len(clean) >= 2 else 0.0


def measurements(records: Iterable[Record], box: str | None = None) -> list[Measurement]:
    """Records -> Measurements, one per (machine, commit, what it measured).

    A cell recorded twice (two environments or runs) is the newest (``started_at``); a measurement
    several suites list (same implementation, dtype, shape and mode) is held by the first suite by
    name, the others named in ``also``; a kernel fingerprint is attached to the cells of its input,
    not returned on its own."""
    newest: dict[tuple, Record] = {}
    for r in records:
        key = (r.machine, r.commit, r.key)
        if key not in newest or r.started_at >= newest[key].started_at:
            newest[key] = r
    kernels: dict[tuple, str] = {}
    for r in newest.values():
        cell = r.cell
        if cell.measure == KERNEL and r.status == OK:
            kernels[(r.machine, r.commit, cell.input)] = kernel_hex(r.value)
    out: dict[tuple, Measurement] = {}
    for r in sorted(newest.values(), key=lambda r: (r.date_ms, r.machine, r.commit, r.benchmark)):
        cell = r.cell
        if cell.measure == KERNEL:
            continue
        key = (r.machine, r.commit, cell.identity)
        if key in out:
            first = out[key]
            out[key] = replace(first, also=first.also + (cell.suite.rsplit(".", 1)[-1],))
            continue
        mode = cell.measure if cell.measure in MODE_NAMES else None
        out[key] = Measurement(
            cell=cell, machine=r.machine, box=box or r.machine, commit=r.commit, date_ms=r.date_ms, status=r.status,
            value=r.value, samples=tuple(float(s) for s in r.samples or () if s is not None and not math.isnan(s)),
            rounds=bool(mode) and mode_named(mode).samples_are_rounds(r.version),
            fingerprint=kernels.get((r.machine, r.commit, cell.input), ""), version=r.version, unit=r.unit,
            started_at=r.started_at,
            quartiles=quartiles(float(r.value), r.stats, r.samples) if r.status == OK else (math.nan, math.nan))
    return list(out.values())


def box_of(results_dir: str | os.PathLike, machine: str) -> str:
    """A recorded box: the results folder and the machine's name (never the name alone)."""
    return f"{os.path.normpath(str(results_dir))}:{machine}"


# ---------------------------------------------------------------------------------------------
# pure helpers


def cell_status(value: float | None) -> str:
    """asv's encoding of a cell's fate: null is a failure, NaN a skip, a number a result."""
    if value is None:
        return FAILED
    if isinstance(value, float) and math.isnan(value):
        return SKIPPED
    return OK


@functools.cache  # a few distinct values, repeated in every cell of every file
def unquote(value_repr: str) -> str:
    """A parameter value as asv stores it (its ``repr``) back to plain text: ``"'fused'"`` -> ``fused``."""
    try:
        value = ast.literal_eval(value_repr)
    except (ValueError, SyntaxError):
        value = value_repr  # e.g. "torch.bfloat16" is not a literal
    text = str(value)
    return text.removeprefix("torch.")


def iso_date(js_timestamp_ms: int | float | None) -> str:
    """asv's commit date (JavaScript milliseconds) as ISO 8601 UTC."""
    if js_timestamp_ms is None:
        return ""
    stamp = _dt.datetime.fromtimestamp(js_timestamp_ms / 1000, tz=_dt.timezone.utc)
    return stamp.isoformat(timespec="seconds")


def quartiles(value: float, stats: dict[str, Any] | None, samples: Sequence[float] | None) -> tuple[float, float]:
    """q25 and q75: asv's stats when stored, else from the samples, else the median itself."""
    if stats and stats.get("q_25") is not None and stats.get("q_75") is not None:
        return float(stats["q_25"]), float(stats["q_75"])
    if samples:
        from asv_runner.statistics import quantile

        clean = [s for s in samples if s is not None and not math.isnan(s)]
        if clean:
            return quantile(clean, 0.25), quantile(clean, 0.75)
    return value, value


def row_of(m: Measurement, copy_median_s: float = math.nan, **side: Any) -> Row:
    """The tidy row of one timing measurement, through ``relu2.records.rows.make_row`` (``copy_median_s``:
    the roofline's figure for the same input and mode; ``side``: measured columns such as ``peak_bytes``)."""
    q25, q75 = m.quartiles
    return make_row(
        machine=m.machine, commit=m.commit, date=iso_date(m.date_ms), impl=m.cell.impl, dtype=m.cell.dtype,
        numel=m.cell.numel, shape=m.cell.shape, mode=m.cell.measure, status=m.status, reason=m.reason,
        median_s=m.value if m.status == OK else math.nan, q25_s=q25, q75_s=q75, copy_median_s=copy_median_s,
        **({"kernel": m.fingerprint} if m.fingerprint else {}), **side,
    )


def is_timing(m: Measurement) -> bool:
    """A figure in seconds of one timing mode: what a tidy row holds."""
    return m.unit == "seconds" and m.cell.measure in MODE_NAMES


def rows_of(measured: Iterable[Measurement]) -> list[Row]:
    """The tidy rows of the timing measurements among ``measured``, in order: each with the roofline's
    figure of the same machine, commit, mode and input (its own suite's preferred) and the cell figures
    (``schema.CELL_FIGURES``: peak memory, work counters) its suite measured for the same parameters."""
    measured = list(measured)
    roofline = lambda m: (m.machine, m.commit, m.cell.measure, m.cell.dtype, m.cell.shape)  # noqa: E731
    in_suite = lambda m: (m.machine, m.commit, m.cell.suite, m.params)  # noqa: E731
    same_suite: dict[tuple, float] = {}
    any_suite: dict[tuple, float] = {}
    figures: dict[tuple, dict[str, float]] = {}  # the cell figures (peak memory, work counters) of each cell
    for m in measured:
        if m.status != OK:
            continue
        if m.cell.measure in CELL_FIGURE_METHODS:
            figures.setdefault(in_suite(m), {})[CELL_FIGURE_METHODS[m.cell.measure].column] = float(m.value)
        elif is_timing(m) and m.cell.impl == ROOFLINE:
            same_suite[(m.cell.suite, *roofline(m))] = float(m.value)
            any_suite.setdefault(roofline(m), float(m.value))
    rows = []
    for m in filter(is_timing, measured):
        if not m.cell.shape:
            warnings.warn(f"{m.label()} at {m.commit[:8]} is not a relu2 timing cell (it names no size); left out",
                          stacklevel=2)
            continue
        copy = same_suite.get((m.cell.suite, *roofline(m)), any_suite.get(roofline(m), math.nan))
        rows.append(row_of(m, copy, **figures.get(in_suite(m), {})))
    return rows


# ---------------------------------------------------------------------------------------------
# reading files


def _asv():
    # Imported lazily: asv pulls in a fair amount and most of relu2 never needs it.
    try:
        from asv import results as asv_results
        from asv import util as asv_util
        from asv.benchmarks import Benchmarks
        from asv.machine import Machine
    except ImportError as e:
        raise ResultsError(f"asv is not importable by {sys.executable} ({e}): pip install asv") from None

    return asv_results, asv_util, Benchmarks, Machine


def _load_json(path: Path, api_version: int) -> dict:
    _, asv_util, _, _ = _asv()
    try:
        data = asv_util.load_json(str(path), api_version=api_version)
    except asv_util.UserError as e:
        raise ResultsError(f"{path}: {e}") from None
    except (OSError, ValueError, TypeError) as e:
        raise ResultsError(f"{path}: cannot read: {e}") from None
    if not isinstance(data, dict):
        raise ResultsError(f"{path}: not an asv file (expected a JSON object)")
    return data


def _check_dir(results_dir: str | os.PathLike) -> Path:
    path = Path(results_dir)
    if not path.is_dir():
        raise ResultsError(f"{path}: no such results folder")
    return path


def load_benchmarks(results_dir: str | os.PathLike) -> dict[str, BenchmarkInfo]:
    """The benchmarks asv discovered, from ``<results_dir>/benchmarks.json``."""
    path = _check_dir(results_dir) / "benchmarks.json"
    if not path.is_file():
        raise ResultsError(f"{path}: missing (asv writes it on every run; it names the parameters)")
    _, _, Benchmarks, _ = _asv()
    data = _load_json(path, Benchmarks.api_version)
    out = {}
    for name, b in data.items():
        try:
            out[name] = BenchmarkInfo(
                name=name, param_names=tuple(b.get("param_names") or ()), unit=str(b.get("unit", "")),
                version=b.get("version"), param_values=tuple(tuple(str(v) for v in vs) for vs in b.get("params") or ()),
            )
        except (AttributeError, TypeError) as e:
            raise ResultsError(f"{path}: malformed entry {name!r}: {e}") from None
    return out


def machine_info(results_dir: str | os.PathLike, machine: str) -> dict[str, Any]:
    """What the machine's ``machine.json`` records (asv's keys plus gpu, driver, cuda, torch, l2_bytes)."""
    _, _, _, Machine = _asv()
    folder = machine_folder(_check_dir(results_dir), machine)
    path = folder / "machine.json" if folder else None
    return _load_json(path, Machine.api_version) if path and path.is_file() else {}


def _recorded_name(folder: Path) -> str:
    _, _, _, Machine = _asv()
    return str(_load_json(folder / "machine.json", Machine.api_version).get("machine", folder.name))


def machine_folder(results_dir: Path, machine: str) -> Path | None:
    """The folder of ``machine``: the one so named, else the one whose machine.json records that name.

    asv names the folder after machine.json's ``machine``, but a folder copied or renamed by hand
    keeps its old name inside: either name finds it, everywhere (reading, listing, machine.json).
    """
    named = results_dir / machine
    if (named / "machine.json").is_file():
        return named
    found = [sub for sub in sorted(results_dir.iterdir()) if sub.is_dir() and (sub / "machine.json").is_file()
             and _recorded_name(sub) == machine]
    if len(found) > 1:
        raise ResultsError(f"{results_dir}: machine {machine!r} is recorded by several folders: "
                           f"{', '.join(f.name for f in found)}")
    return found[0] if found else None


def machines(results_dir: str | os.PathLike) -> list[str]:
    """Names of the machines with results: sub-folders holding a ``machine.json`` and a result file, sorted.

    A folder with only ``machine.json`` (left by an ``asv run`` that saved nothing) is no machine.
    """
    root = _check_dir(results_dir)
    _, _, _, Machine = _asv()
    folders: dict[str, list[str]] = {}
    for sub in sorted(p for p in root.iterdir() if p.is_dir()):
        machine_json = sub / "machine.json"
        if machine_json.is_file() and any(p.name not in _NOT_RESULT_FILES for p in sub.glob("*.json")):
            data = _load_json(machine_json, Machine.api_version)
            folders.setdefault(str(data.get("machine", sub.name)), []).append(sub.name)
    for name, subs in folders.items():
        if len(subs) > 1:  # one name read twice, or one folder's results lost: neither is said
            raise ResultsError(f"{root}: machine {name!r} is recorded by several folders: {', '.join(subs)} "
                               "(a folder copied by hand keeps the name in its machine.json: rename it there)")
    return list(folders)


def _result_files(results_dir: Path, machine: str) -> list[Path]:
    folder = machine_folder(results_dir, machine)
    if folder is None:
        raise ResultsError(f"{results_dir / machine}: no results for machine {machine!r} (no machine.json)")
    return sorted(p for p in folder.glob("*.json") if p.name not in _NOT_RESULT_FILES)


def _load_result(path: Path, machine: str):
    stat = path.stat()
    # asv checks each file against the name machine.json records, whatever the folder is called.
    return _load_result_cached(str(path), _recorded_name(path.parent), stat.st_mtime_ns, stat.st_size)


# The gate and the CLI look commits up, then load them: each file would be parsed several times.
# Keyed by mtime and size so an edited file is read again.
@functools.lru_cache(maxsize=64)
def _load_result_cached(path_str: str, machine: str, mtime_ns: int, size: int):
    path = Path(path_str)
    asv_results, asv_util, _, _ = _asv()
    try:
        result = asv_results.Results.load(str(path), machine_name=machine)
    except asv_util.UserError as e:
        raise ResultsError(f"{path}: {e}") from None
    except (OSError, ValueError, TypeError, AttributeError, KeyError) as e:
        raise ResultsError(f"{path}: not an asv results file: {e}") from None
    if not isinstance(result.commit_hash, str) or not isinstance(result.date, (int, float)):
        raise ResultsError(f"{path}: not an asv results file (no commit hash or date)")
    return result


def _machines_for(results_dir: Path, machine: str | None) -> list[str]:
    if machine is None:
        return machines(results_dir)
    if machine_folder(results_dir, machine) is None:
        known = ", ".join(machines(results_dir)) or "none"
        raise ResultsError(f"{results_dir}: no results for machine {machine!r} (machines: {known})")
    return [machine]


def _iter_results(results_dir: Path, machine: str | None, prefix: str = "") -> Iterable[tuple[Path, str, Any]]:
    """Loaded result files; ``prefix`` keeps only files named for such a commit (asv names them by hash[:8])."""
    for m in _machines_for(results_dir, machine):
        for path in _result_files(results_dir, m):
            if path.name.startswith(prefix):
                yield path, m, _load_result(path, m)


def commit_dates(results_dir: str | os.PathLike, machine: str | None = None) -> dict[str, int]:
    """Full commit hash -> asv's commit date (JavaScript ms), for commits with results."""
    out: dict[str, int] = {}
    for _, _, result in _iter_results(_check_dir(results_dir), machine):
        out[result.commit_hash] = int(result.date)
    return out


def commits(results_dir: str | os.PathLike, machine: str | None = None) -> list[str]:
    """Full hashes of the commits with results (on ``machine``, or any), oldest first.

    Commits that tie on date (one-second resolution) are ordered by the git graph of the checkout
    that holds ``results_dir``, then by hash: the same order wherever the command runs.
    """
    dates = commit_dates(results_dir, machine)
    order = git.order(dates, git.toplevel(results_dir))
    return sorted(dates, key=lambda h: (dates[h], order.get(h, -1), h))


def resolve_commit(results_dir: str | os.PathLike, ref: str, machine: str | None = None) -> str:
    """The full hash of the one commit with results that ``ref`` names; ResultsError otherwise.

    ``ref`` is a hash or a unique prefix of one, or any git ref (``main~1``, ``HEAD``, a tag or a
    branch) of the checkout that holds ``results_dir``.
    """
    wanted = ref.strip()
    if not wanted:
        raise ResultsError("empty commit")
    known = commits(results_dir, machine)
    matches = [h for h in known if h.lower().startswith(wanted.lower())]
    if len(matches) > 1:
        raise ResultsError(f"commit {wanted!r} is ambiguous: {', '.join(h[:12] for h in matches)}")
    if matches:
        return matches[0]
    full = git.try_resolve(wanted, git.toplevel(results_dir))
    if full in known:
        return full
    where = f"machine {machine!r}" if machine else str(results_dir)
    shown = ", ".join(h[:8] for h in known) or "none"
    named = f" (git: {full[:12]})" if full else ""
    raise ResultsError(f"no results for commit {wanted!r}{named} on {where} (commits with results: {shown})")


def infer_param_names(values: Sequence[Sequence[str]], names: Sequence[str],
                      known_values: Sequence[Sequence[str]]) -> tuple[str, ...]:
    """Names for an older layout's parameter lists: each list takes the first unused name whose known
    values it shares one with; a list matching none is ``param<i>`` (then it matches no cell of today's)."""
    out: list[str] = []
    for i, vals in enumerate(values):
        match = next((n for n, known in zip(names, known_values) if n not in out and set(map(str, vals)) & set(known)),
                     None)
        out.append(match or f"param{i + 1}")
    return tuple(out)


def _unlisted(name: str, param_values: Sequence[Sequence[str]], benchmarks: dict[str, BenchmarkInfo]) -> BenchmarkInfo:
    """What a benchmark no longer in benchmarks.json (renamed or removed) is read as: its suite's
    parameter names when a sibling has as many, its unit from the method's name.  Never dropped: a
    cell at BASE with no counterpart at HEAD is a finding (the gate calls it vanished)."""
    suite = split(name)[0]
    sibling = next((b for b in benchmarks.values() if split(b.name)[0] == suite
                    and len(b.param_names) == len(param_values)), None)
    unit = unit_of(name)
    if sibling is not None:
        return BenchmarkInfo(name, sibling.param_names, unit, None, sibling.param_values)
    return BenchmarkInfo(name, tuple(f"param{i + 1}" for i in range(len(param_values))), unit, None)


def _records_of_result(path: Path, machine: str, result, benchmarks: dict[str, BenchmarkInfo]) -> list[Record]:
    records = []
    for name in sorted(result.get_all_result_keys()):
        raw = getattr(result, "_results", {}).get(name)
        if not isinstance(raw, (list, type(None))):  # asv reads a string row character by character
            raise ResultsError(f"{path}: malformed result for {name}: a {type(raw).__name__} where asv writes "
                               "a list of columns")
        try:
            param_values = result.get_result_params(name) or []
            values = result.get_result_value(name, param_values)
            stats = result.get_result_stats(name, param_values)
            samples = result.get_result_samples(name, param_values)
            if not all(isinstance(p, list) for p in param_values):
                raise ValueError(f"parameters {param_values!r} are not lists of values")
            combos = list(itertools.product(*param_values))
        except (TypeError, ValueError, KeyError, IndexError) as e:
            raise ResultsError(f"{path}: malformed result for {name}: {e}") from None
        info = benchmarks.get(name) or _unlisted(name, param_values, benchmarks)
        if len(info.param_names) != len(param_values):
            # An older layout (a parameter since added or removed): read it under the names its values
            # match, so its cells are matched by what they measured instead of dropped.
            info = replace(info, param_names=infer_param_names(param_values, info.param_names, info.param_values))
        # asv's getters pad a short list with None (which would read as failures): check the raw one.
        if isinstance(raw, list) and len(raw) != len(combos):
            raise ResultsError(f"{path}: malformed result for {name}: {len(raw)} values for {len(combos)} cells")
        if not (len(values) == len(stats) == len(samples) == len(combos)):
            raise ResultsError(f"{path}: malformed result for {name}: {len(values)} values for {len(combos)} cells")
        started_at = int((result.started_at or {}).get(name) or 0)
        for combo, value, st, smp in zip(combos, values, stats, samples):
            params = tuple((k, unquote(v)) for k, v in zip(info.param_names, combo))
            if value is not None and not isinstance(value, (int, float)):
                raise ResultsError(f"{path}: malformed result for {name}{combo}: value {value!r} is not a number")
            if info.unit == "seconds" and value is not None and not (0 < value < math.inf or math.isnan(value)):
                # every reader divides by a time: 0 s or below, or forever, is no figure of a call
                raise ResultsError(f"{path}: malformed result for {name}{combo}: {value!r} s is not a time")
            if not isinstance(st, (dict, type(None))) or not isinstance(smp, (list, type(None))):
                raise ResultsError(f"{path}: malformed statistics or samples for {name}{combo}")
            records.append(Record(
                machine=machine, commit=result.commit_hash, date_ms=int(result.date), env=result.env_name or "",
                started_at=started_at, benchmark=name, params=params, unit=info.unit,
                value=float(value) if value is not None else None, stats=st, samples=smp,
                version=(result.benchmark_version or {}).get(name),
            ))
    return records


def load_records(
    results_dir: str | os.PathLike, machine: str | None = None, commit: str | None = None
) -> list[Record]:
    """Every recorded cell (timing and not) of ``machine`` (default: all) at ``commit`` (a ref; default: all).

    Ordered by commit date, then file, benchmark and parameter order.  Raises ResultsError naming the
    file for anything unreadable.
    """
    root = _check_dir(results_dir)
    benchmarks = load_benchmarks(root)
    full = resolve_commit(root, commit, machine) if commit else None
    loaded = []
    for path, m, result in _iter_results(root, machine, prefix=full[:8] if full else ""):
        if full is None or result.commit_hash == full:
            loaded.append((int(result.date), str(path), m, result))
    loaded.sort(key=lambda t: (t[0], t[1]))
    records: list[Record] = []
    for _, path, m, result in loaded:
        records.extend(_records_of_result(Path(path), m, result, benchmarks))
    return records


def load_measurements(results_dir: str | os.PathLike, machine: str | None = None, commit: str | None = None,
                      box: str | None = None) -> list[Measurement]:
    """The de-duplicated measurements of ``machine`` (default: all) at ``commit`` (a ref; default: all),
    each of box ``box`` (default: ``box_of(results_dir, machine)``).  ResultsError for anything unreadable."""
    records = load_records(results_dir, machine, commit)
    if box is not None:
        return measurements(records, box)
    by_machine: dict[str, list[Record]] = {}
    for r in records:
        by_machine.setdefault(r.machine, []).append(r)
    return [m for name, rs in by_machine.items() for m in measurements(rs, box_of(results_dir, name))]


def load_rows(results_dir: str | os.PathLike, machine: str | None = None, commit: str | None = None) -> list[Row]:
    """Tidy rows of every timing measurement (unit seconds) in an asv results folder: one a measurement,
    as the gate reads them (``rows_of(load_measurements(...))``).

    ``machine`` None means every machine; ``commit`` may be any ref (unknown or ambiguous:
    ResultsError).  Failed cells come back with status "failed", skipped ones "skipped", both with
    NaN times and a reason.
    """
    return rows_of(load_measurements(results_dir, machine, commit))


def export_csv(
    results_dir: str | os.PathLike, out: str | os.PathLike | None = None, machine: str | None = None,
    commit: str | None = None,
) -> int:
    """Write the tidy CSV of ``load_rows`` to ``out`` (atomically), or to stdout when ``out`` is None or "-".

    Returns the number of rows written; ResultsError (nothing written) for a folder with no machine.
    """
    if machine is None and not machines(results_dir):
        raise ResultsError(f"{results_dir}: no machine with results (no <machine>/machine.json beside a result "
                           "file): nothing to export")
    rows = load_rows(results_dir, machine=machine, commit=commit)
    if out is None or str(out) == "-":
        write_stdout(csv_text(rows))
    else:
        write_csv(rows, out)
    return len(rows)


def pick_machine(results_dir: str | os.PathLike, machine: str | None) -> str:
    """``machine`` (its folder's name or the name its machine.json records) if it has results; the
    only machine when None; ResultsError otherwise."""
    known = machines(results_dir)
    if machine is not None:
        machine_info(results_dir, machine)  # finds it by folder or recorded name, or by neither
    if machine is not None:
        folder = machine_folder(Path(results_dir), machine)
        if folder is None or not any(p.name not in ("machine.json",) for p in folder.glob("*.json")):
            raise ResultsError(f"no results for machine {machine!r} in {results_dir} "
                                 f"(machines: {', '.join(known) or 'none'})")
        return machine
    if not known:
        raise ResultsError(f"no asv results in {results_dir} (no <machine>/machine.json with results)")
    if len(known) > 1:
        raise ResultsError(f"several machines in {results_dir}: {', '.join(known)}; choose one with --machine "
                             "(or --base-machine and --head-machine)")
    return known[0]


def read_commit(results_dir: str | os.PathLike, machine: str, ref: str, box: str | None = None
                ) -> tuple[str, str, dict, list[Measurement]]:
    """One commit of one machine, read: its full hash, its date (YYYY-MM-DD), machine.json, its measurements."""
    full = resolve_commit(results_dir, ref, machine)
    return (full, iso_date(commit_dates(results_dir, machine).get(full))[:10], machine_info(results_dir, machine),
            load_measurements(results_dir, machine, full, box=box or box_of(results_dir, machine)))


@dataclass(frozen=True)
class Run:
    """One commit measured on one box."""

    box: str  # "<results folder>:<machine>", or a compare folder's box
    machine: str
    commit: str
    gpu: str
    l2_bytes: int | None
    measurements: tuple[Measurement, ...] = ()
    source: str = ""  # the results folder or compare folder it was read from

    @property
    def name(self) -> str:
        return f"{self.box}@{self.commit[:8]}"


def runs_in(results_dir: str | os.PathLike) -> list[Run]:
    """Every (machine, commit) with results in a results folder, ordered by machine, commit date and
    hash (never the git graph: the model learned is the same in any clone)."""
    out = []
    for m in machines(results_dir):
        info = machine_info(results_dir, m)
        dates = commit_dates(results_dir, m)
        box = box_of(results_dir, m)
        every = load_measurements(results_dir, m, box=box)
        for c in sorted(dates, key=lambda h: (dates[h], h)):
            out.append(Run(box, m, c, str(info.get("gpu", "")), l2_of(info),
                           tuple(x for x in every if x.commit == c), str(results_dir)))
    return out
