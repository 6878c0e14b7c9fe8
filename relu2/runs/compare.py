"""``relu2 compare BASE HEAD``: both commits measured on this machine, in interleaved rounds.

A pull request asks "is HEAD slower than BASE on this box?".  The answer is only as good as the
pairing: both sides measured on one box, at one time, by one ruler, so what the box does (clocks,
heat, a neighbour's load) falls on both.

* **Sides.**  A git worktree of each commit, its package installed (no dependencies, no network)
  into a folder of its own (``sides``); its implementations are found through interface 1, as asv
  finds them.  The instrument is this checkout's ``relu2`` package, copied once for the run
  (``relu2.runs.asv_run.instrument``), and its ``benchmarks/`` too: both sides are measured by one ruler,
  and an edit of the checkout during the run changes nothing.
* **Rounds.**  ``rounds`` rounds; in each, one fresh process per side measures every cell of the
  chosen suites once (``relu2.measure.rounds.measure`` of one round, the plan the asv suites measure:
  ``bench_relu2.measuring_plan``).  The order alternates, ABBA: round 1 base then head, round 2 head
  then base, and so on, so neither side always runs first on a warm or a cold box, and a drift of
  the box falls on both.  A side's rounds share that side's compiler caches (empty at its first), as
  the rounds of one asv measurement do.
* **Figures.**  A side's rounds are merged as the suites merge theirs (``relu2.measure.rounds.merge``: a cell
  failed in any round failed, with the round named), and written as a plain asv results folder by
  the suites' own ``track_*`` methods (asv_runner's benchmark objects, asv's ``Results``): samples
  are one median per round, in round order, so base round i and head round i were measured side by
  side.  ``relu2 gate``, export, plots and the dashboard read them as any asv result.

Layout of ``--out DIR`` (the contract with the judge): ``DIR/compare.json`` (``COMPARE_FILE``, format
1: box, machine, gpu, base and head ref and sha, rounds, order, suites, instrument, started_at,
finished_at, complete), ``DIR/base/`` and ``DIR/head/`` (asv results folders), and the verdict's
``DIR/report.*``.

``relu2 confirm`` is this mechanism on a list of cells (``measure_sides`` with ``cells``), with more
rounds.  Why not ``asv continuous --interleave-rounds``: docs/compare.md.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib.util
import io
import itertools
import json
import math
import os
import pickle
import shutil
import site
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from relu2.host import busy as quiet
from relu2.host import git
from relu2.host.files import atomic_write_text
from relu2.host.machine import gpu_name_apart, machine_info, resolve_device
from relu2.host.outputs import claim_dir, name_part
from relu2.host.proc import Ended, ProcessFailed, environ, run_child
from relu2.judge import gate, noise
from relu2.measure import counters, rounds, timing
from relu2.measure.isolation import timeout_from_env
from relu2.measure.rounds import ENV_CACHES, ENV_ROUNDS, merge
from relu2.records.asv_names import timed_cell
from relu2.records.compare_folder import (FORMAT, REPORT_FORMATS, ROUNDS_DIR, SIDE_NAMES, check_resumable, folder_of,
                                          incomplete, read_work, write_info, write_work)
from relu2.runs import asv_run
from relu2.runs.asv_run import (ENV_INSTRUMENT, atomic_asv_writes, check_suite_environment, declared_implementations,
                                instrument)
from relu2.vocab.errors import ResultsError, UsageError
from relu2.vocab.interface import ENV_MEASURED, _normal
from relu2.vocab.schema import SKIPPED  # also the key under which a commit says why it has no figures
from relu2.vocab.schema import ADDED_ROUNDS, CHANGED_MAX_ROUNDS, MAX_ROUNDS, MIN_ROUNDS, Cell

ENV_NAME = "relu2-compare"  # the environment part of the result file's name: <sha8>-relu2-compare.json
# The folders of this checkout the ruler copies (``ruler``): compare.json's instrument names their state.
INSTRUMENT_PATHS = ("relu2", "benchmarks")
ROUND_TIMEOUT_S = 4 * 3600  # a whole round's process; RELU2_TIMEOUT bounds each implementation's hang

Say = Callable[[str], None]


def instrument_state() -> str:
    """What the ruler copies, as a record names it: this checkout's commit, ``+dirty-<digest>`` where its
    ``INSTRUMENT_PATHS`` were edited (``relu2.host.git.state``)."""
    return git.state(Path(__file__).resolve().parents[2], INSTRUMENT_PATHS)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def order(rounds: int) -> list[str]:
    """The sides in the order they are measured: base, head, head, base, base, head, ... (ABBA)."""
    return [side for r in range(rounds) for side in (SIDE_NAMES if r % 2 == 0 else SIDE_NAMES[::-1])]


def box_id() -> str:
    """This boot of this machine: the kernel's boot id (a reboot or another box is another id)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="utf-8").strip()
    except OSError:  # not Linux: the host and (about) when it booted
        boot = ""
    return boot or f"{socket.gethostname()}-{int(time.time() - time.monotonic())}"


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# --- checks before anything is built ------------------------------------------------------------------


def check_instrument_env() -> None:
    """UsageError for a ``RELU2_INSTRUMENT`` from outside that names no instrument: the run sets its own,
    and a folder that is not one would otherwise be overridden without a word."""
    named = os.environ.get(ENV_INSTRUMENT, "")
    if named and not (Path(named) / "relu2" / "__init__.py").is_file():
        raise UsageError(f"{ENV_INSTRUMENT}={named!r} holds no relu2 package: unset it (relu2 compare measures "
                         "with this checkout's instrument and names it itself)")


def check_judgeable(asked_device: str | None, noise_model: str | os.PathLike | None, resume: bool = False) -> None:
    """UsageError, before anything is built, when the verdict would refuse this GPU for want of a noise
    model of its own (``relu2.judge.gate.pick_model``): the whole compare would be measured to end in
    that refusal.  Figures measured on the CPU are never refused (recorded without a GPU, they are
    reported), nor a GPU whose name its own process cannot read (the verdict then says what it finds)."""
    if resolve_device(asked_device) != "cuda":
        return
    gpu = gpu_name_apart()
    if not gpu:
        return
    try:
        gate.pick_model(gpu, noise.SAME_BOX, noise_model, None, cpu=False)
    except ResultsError as e:
        raise UsageError(f"{e}; nothing {'more ' if resume else ''}measured: --measure-only records the compare unjudged (A/As, BASE BASE, "
                         "are what relu2 noise learn --same-box learns from), --factor R judges by one ratio") from None


def check_declared(repo: Path, commits: dict[str, str]) -> set[str]:
    """The implementations the commits (ref -> sha) declare through interface 1; UsageError naming a commit
    that predates it (its package would not install into a side, with pip's hint as the only word)."""
    declared: set[str] = set()
    for ref, sha in commits.items():
        names, why = declared_implementations(repo, sha)
        if why:
            raise UsageError(f"{ref} ({sha[:8]}) {why}")
        declared |= set(names)
    return declared


def project_name(tree: Path) -> str:
    """The distribution a checkout builds (its pyproject.toml's [project] name)."""
    import tomllib

    try:
        return tomllib.loads((tree / "pyproject.toml").read_text(encoding="utf-8"))["project"]["name"]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as e:
        raise UsageError(f"{tree / 'pyproject.toml'}: no [project] name to measure ({type(e).__name__})") from None


def check_measured_env(names: Sequence[str]) -> None:
    """UsageError when ``RELU2_MEASURED`` names a distribution that neither side builds: its
    implementations would be looked for where there are none, and every cell would read n/a."""
    named = os.environ.get(ENV_MEASURED, "")
    if named and _normal(named) not in {_normal(n) for n in names}:
        raise UsageError(f"{ENV_MEASURED}={named!r}: the commits build {', '.join(sorted(set(names)))}; unset it "
                         "(each side's own distribution is measured)")


NARROWING = ("RELU2_BENCH_QUICK", "RELU2_BENCH_IMPLS", "RELU2_TIMEOUT")  # recorded in compare.json when set


def suite_names(benchmarks: Path) -> list[str]:
    """The suites ``benchmarks/bench_relu2.py`` measures under this environment (RELU2_BENCH_SUITES)."""
    spec = importlib.util.spec_from_file_location("relu2_bench_suites", benchmarks / "bench_relu2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # torch-free: only the vocabulary
    return [suite.__name__ for suite in module._selected()]


def check_suites(benchmarks: Path, suites: Sequence[str]) -> None:
    """UsageError for a suite ``benchmarks/bench_relu2.py`` does not have (``suites``, else
    RELU2_BENCH_SUITES), and for any other suite variable it would refuse."""
    config = benchmarks.parent / "asv.conf.json"
    if not config.is_file():
        raise UsageError(f"{config}: not found (the suites are this checkout's benchmarks/)")
    with environ({"RELU2_BENCH_SUITES": ",".join(suites)} if suites else {}):
        check_suite_environment(str(config))


# --- the sides ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """One commit, ready to measure: its installed package's folder and the distribution it is."""

    name: str  # "base" or "head"
    commit: str
    site: Path
    measured: str = "relu2-bench"


@contextlib.contextmanager
def sides(repo: Path, base: str, head: str, scratch: Path, say: Say = _stderr,
          label: str = "relu2 compare") -> Iterator[tuple[Side, Side]]:
    """A worktree of each commit with its package installed into a folder of its own; removed after."""
    with side(repo, SIDE_NAMES[0], base, scratch, say, label) as b, side(repo, SIDE_NAMES[1], head, scratch, say, label) as h:
        yield b, h


@contextlib.contextmanager
def side(repo: Path, name: str, commit: str, scratch: Path, say: Say = _stderr,
         label: str = "relu2 compare") -> Iterator[Side]:
    """A worktree of one commit with its package installed into ``scratch/site-NAME``; removed after."""
    tree = scratch / f"tree-{name}"
    git.worktree_add(repo, tree, commit)
    try:
        began = time.perf_counter()
        site = _install(tree, scratch / f"site-{name}", f"{name} ({commit[:8]})")
        built = Side(name, commit, site, project_name(tree))
        say(f"{label}: {name} {commit[:8]} built in {time.perf_counter() - began:.0f} s")
        yield built
    finally:  # a tree whose folder went first (an interrupt unwinding the scratch) is pruned
        git.worktree_remove(repo, tree)


def _install(tree: Path, site: Path, what: str) -> Path:
    """``tree``'s package (no dependencies, no network) into ``site``: its code and its entry points."""
    run = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                          "--no-build-isolation", "--target", str(site), str(tree)], capture_output=True, text=True)
    if run.returncode != 0:
        lines = run.stderr.strip().splitlines() or ["?"]
        why = next((ln for ln in lines if ln.lstrip().lower().startswith("error")), lines[-1])
        raise UsageError(f"{what} does not install: {why.strip()}")
    return site


# --- the processes: a round, the record, the check ------------------------------------------------------


@dataclass(frozen=True)
class Ruler:
    """What measures: the instrument's folder (holding relu2/) and the suites' folder (benchmarks/)."""

    instrument: Path
    benchmarks: Path


def _tool_paths() -> list[str]:
    """Folders outside this interpreter's site-packages that hold asv and asv_runner (a PYTHONPATH
    entry, as on a box whose torch is not ours to install into): a child needs them to write its results."""
    own = {os.path.realpath(p) for p in (*site.getsitepackages(), site.getusersitepackages())}
    found: list[str] = []
    for name in ("asv", "asv_runner"):
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        home = os.path.dirname(os.path.realpath(next(iter(spec.submodule_search_locations))))
        if home not in own and home not in found:
            found.append(home)
    return found


def side_env(side: Side, ruler: Ruler, **extra: str) -> dict[str, str]:
    """The environment a child measuring (or counting) ``side`` with ``ruler`` runs in."""
    # The side's own folders first; the tools last, so they never shadow the code under test.
    path = [str(ruler.instrument), str(side.site), *_tool_paths()]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path),
                **{ENV_MEASURED: side.measured, ENV_INSTRUMENT: str(ruler.instrument)}, **extra)


def _child(action: str, request: dict, side: Side, ruler: Ruler, scratch: Path, timeout_s: float,
           log: bool = True, **env: str) -> Ended:
    """``python -m relu2.runs.compare ACTION REQUEST`` for ``side``, to its end (its output in a log
    beside the request, or kept, ``log`` False, for an answer on stdout)."""
    path = scratch / f"{action}-{side.name}-{time.monotonic_ns()}.json"
    path.write_text(json.dumps(request), encoding="utf-8")
    # cwd: `python -m` puts it first on sys.path; the scratch folder shadows neither the instrument
    # nor the side's implementations.
    return run_child([sys.executable, "-m", "relu2.runs.compare", action, str(path)], timeout_s=timeout_s,
                     env=side_env(side, ruler, **env), cwd=scratch, log=path.with_suffix(".log") if log else None)


@dataclass
class Measured:
    """Both sides' rounds: per side, the files of its rounds (pickled ``rounds.measure`` results)."""

    base: Side
    head: Side
    order: list[str]
    rounds: dict[str, list[Path]]
    seconds: dict[str, list[float]]


def measure_sides(b: Side, h: Side, ruler: Ruler, scratch: Path, rounds: int, device: str, *,
                  cells: Sequence | None = None, say: Say = _stderr, label: str = "relu2 compare",
                  keep: Path | None = None, first: int = 1) -> Measured:
    """``rounds`` rounds of each side in ABBA order (``order``), each a fresh process measuring the
    suites' plan (or ``cells``, relu2.vocab.schema.Cell objects) once.  A cell that fails fails in its round
    and is recorded so; a round's process that dies raises RuntimeError naming the round.

    ``keep``: the folder the rounds' files are written to as they end (else ``scratch``), so a run
    that dies keeps what it measured; a round whose file is already there is not measured again.
    ``first``: the number of the first round (more rounds of a compare go on its ABBA order)."""
    by_name = {"base": b, "head": h}
    last = first - 1 + rounds
    out = Measured(b, h, order(last)[2 * (first - 1):], {"base": [], "head": []}, {"base": [], "head": []})
    started = time.perf_counter()
    caches = {name: scratch / f"caches-{name}" for name in SIDE_NAMES}
    for i, name in enumerate(out.order):
        side, r = by_name[name], first + i // 2
        result = (keep or scratch) / f"round-{r}-{name}.pickle"
        if result.is_file():
            out.rounds[name].append(result)
            out.seconds[name].append(0.0)
            say(f"{label}: round {r}/{last} {name} ({side.commit[:8]}) kept from the earlier run")
            continue
        caches[name].mkdir(exist_ok=True)
        partial = result.with_suffix(".partial")
        request = {"device": device, "benchmarks": str(ruler.benchmarks), "out": str(partial),
                   "cells": [c.to_json() for c in cells] if cells is not None else None}

        began = time.perf_counter()
        ended = _child("round", request, side, ruler, scratch, ROUND_TIMEOUT_S,
                       **{ENV_CACHES: str(caches[name]), ENV_ROUNDS: "1"})
        if not ended.ok or not partial.is_file():
            raise ProcessFailed(f"round {r} of {name} ({side.commit[:8]}): its process {ended.why()}")
        partial.replace(result)  # a round is kept whole or not at all
        out.rounds[name].append(result)
        out.seconds[name].append(time.perf_counter() - began)
        for note in timer_notes(ended.log):
            say(f"{label}: round {r}/{last} {name}: {note}")
        say(f"{label}: round {r}/{last} {name} ({side.commit[:8]}) in {out.seconds[name][-1]:.0f} s, "
            f"{time.perf_counter() - started:.0f} s in all")
    return out


def timer_notes(log: str) -> list[str]:
    """What the hot timer said in a round's output (a graph too short, measured again or kept after its
    last try): otherwise lost with the round's log, and the only sign in a compare that some hot figure
    of the round needed more than one graph (the note names the graph's calls, not its cell)."""
    if not log or not os.path.isfile(log):
        return []
    with open(log, encoding="utf-8", errors="replace") as f:
        return [line.strip() for line in f if line.startswith(timing.HOT_NOTE)]


def kernels_of(paths: Sequence[Path]) -> dict:
    """Cell -> the kernel fingerprint a side's first round recorded for it ("" none: torch's own)."""
    found: dict = {}
    for path in paths:
        for result in pickle.loads(path.read_bytes()).get("results", ()):
            found.setdefault(result.cell, result.kernel)
    return found


def count_changed_work(b: Side, h: Side, ruler: Ruler, scratch: Path, done: "Measured", device: str, folder: Path,
                       say: Say = _stderr) -> None:
    """The work counters (``relu2.measure.counters``) of the cells whose kernel differs between the sides,
    counted once per side, not per round (they are exact), into DIR/work.json; where they cannot be
    counted (no CUDA, no ncu, ncu refused), why, in the same file.  A cell whose kernel is the same on
    both sides did the same work: it is not counted (docs/methodology.md, "Work counters").  The
    work.json an earlier run of this compare counted for these very cells is kept, not counted again (only
    a resumed compare's folder can hold one, a new one starts empty; the same commits on the same box:
    exact counts would come out the same)."""
    why = counters.unavailable(device)
    if why:
        write_work(folder, why)
        return
    base, head = kernels_of(done.rounds["base"]), kernels_of(done.rounds["head"])
    changed = sorted((c for c in base if c in head and base[c] != head[c]), key=lambda c: c.name("hot"))
    if not changed:  # every kernel the same: every cell did the same work, nothing to count
        write_work(folder, "", counters.Counted(), counters.Counted())
        return
    if _counted_before(folder, changed):
        say(f"relu2 compare: work of the {len(changed)} cells whose kernel differs kept from the earlier run")
        return
    began = time.perf_counter()
    try:
        sides = [counters.count(changed, env=side_env(side, ruler), cwd=scratch) for side in (b, h)]
    except RuntimeError as e:
        write_work(folder, f"not counted: {e}")
        return
    write_work(folder, "", *sides)
    say(f"relu2 compare: work counted for the {len(changed)} cells whose kernel differs, in "
        f"{time.perf_counter() - began:.0f} s")


def _counted_before(folder: Path, cells: Sequence[Cell]) -> bool:
    """Whether DIR/work.json holds both sides' counts of exactly ``cells`` (no file, or a reason none were
    counted, holds none)."""
    try:
        kept = read_work(folder)
    except ResultsError:  # a foreign file: count again
        return False
    return set(kept.base) == set(kept.head) == set(cells)


def record_sides(b: Side, h: Side, ruler: Ruler, scratch: Path, done: Measured, folder: Path, machine: str,
                 date_ms: dict[str, int]) -> str:
    """Both sides' rounds written as asv results into ``folder/base`` and ``folder/head`` (``_record``),
    the two processes side by side: nothing is measured while results are written, and a compare whose
    work changed writes them again after every added batch of rounds.  Returns the GPU they recorded;
    RuntimeError naming the side whose process failed."""
    def one(side: Side) -> Ended:
        return _child("record", {"benchmarks": str(ruler.benchmarks), "folder": str(folder / side.name),
                                 "rounds": [str(p) for p in done.rounds[side.name]], "machine": machine,
                                 "sha": side.commit, "date_ms": date_ms[side.name]}, side, ruler, scratch, 600)

    with ThreadPoolExecutor(len(SIDE_NAMES)) as pool:
        ended = dict(zip(SIDE_NAMES, pool.map(one, (b, h))))
    for name, e in ended.items():
        if not e.ok:
            raise ProcessFailed(f"writing the {name}'s results failed: its process {e.why()}")
    return json.loads(ended[SIDE_NAMES[-1]].tail).get("gpu", "")


def merged_cells(paths: Sequence[Path]) -> dict:
    """A side's rounds merged, as the suites' cache: ``{"device", "cells": {(impl, dtype, shape): entry}}``
    (entries as ``bench_relu2._entry`` writes them; samples one median a round, in round order)."""
    got = [pickle.loads(p.read_bytes()) for p in paths]
    skipped = next((g[SKIPPED] for g in got if g.get(SKIPPED)), "")
    if skipped:
        return {"device": got[0]["device"], "cells": {}, SKIPPED: skipped}
    per_cell: dict = {}
    for g in got:
        for result in g["results"]:
            per_cell.setdefault(result.cell, []).append(result)
    from bench_relu2 import _entry, _key  # the suites' own plain-data form (sys.path: the suites' folder)

    return {"device": got[0]["device"],
            "cells": {_key(cell): _entry(merge(results)) for cell, results in per_cell.items()
                      if cell in got[0]["wanted"]}}


def _suites(benchmarks: str):
    sys.path.insert(0, benchmarks)
    import bench_relu2

    return bench_relu2


def _round(request: dict) -> int:
    """A round's process: measure the plan (or the cells asked for) once; pickle the results."""
    bench = _suites(request["benchmarks"])
    device = request["device"]
    skipped = bench._predates_interface()
    if skipped:
        data = {"device": device, SKIPPED: skipped}
    else:
        if request["cells"] is None:
            plan = bench.measuring_plan(device)
        else:
            plan = [("cells", [Cell.from_json(c) for c in request["cells"]])]
        done = rounds.measure(plan, device, 1, budget=bench.budget(), timeout_s=timeout_from_env())
        data = {"device": device, "results": done.results, "wanted": {c for _, cells in plan for c in cells}}
    Path(request["out"]).write_bytes(pickle.dumps(data))
    return 0


def _record(request: dict) -> int:
    """The record process: a side's rounds merged and written as an asv results folder, by the suites'
    own track methods run on the merged cache (asv_runner's benchmark objects, asv's Results)."""
    from asv.machine import Machine
    from asv.results import Results
    from asv.runner import BenchmarkResult
    from asv_runner.benchmarks.mark import SkipNotImplemented
    from asv_runner.discovery import disc_benchmarks, list_benchmarks

    root, folder = request["benchmarks"], Path(request["folder"])
    _suites(root)
    cache = merged_cells([Path(p) for p in request["rounds"]])
    listed = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()):
        list_benchmarks(root, listed)
    described = {b["name"]: b for b in json.loads(listed.getvalue())}
    machine = {**Machine.get_defaults(), "machine": request["machine"], **machine_info(cache["device"])}
    if machine.get("l2_bytes") in (None, "", "none"):
        # A CPU: the cache the noise model's bands are against is its last-level cache
        # (relu2.measure.timing.l2_bytes), which a same-box model learned from CPU compares needs.
        from relu2.measure.timing import l2_bytes

        machine["l2_bytes"] = str(l2_bytes("cpu"))
    params = {**machine, "python": f"{sys.version_info.major}.{sys.version_info.minor}"}
    results = Results(params, {}, request["sha"], request["date_ms"], params["python"], ENV_NAME, {})
    started = _dt.datetime.now(_dt.timezone.utc)

    for bench in disc_benchmarks(root):
        description = described[bench.name]
        values, samples, numbers = [], [], []
        combos = list(itertools.product(*description["params"]))  # one empty combination without params
        for idx in range(len(combos)):
            if description["params"]:
                bench.set_param_idx(idx)
            bench.set_cache(cache)
            value, sample, number = _run_one(bench, SkipNotImplemented, math.nan)
            values.append(value)
            samples.append(sample)
            numbers.append(number)
        results.add_result(description, BenchmarkResult(result=values, samples=samples, number=numbers, errcode=0,
                                                        stderr="", profile=None),
                           started_at=started, duration=0.0, record_samples=True)
    from asv import util

    folder.mkdir(parents=True, exist_ok=True)
    with atomic_asv_writes():
        util.write_json(str(folder / "benchmarks.json"), described, api_version=2)
        (folder / request["machine"]).mkdir(exist_ok=True)
        util.write_json(str(folder / request["machine"] / "machine.json"), machine, api_version=Machine.api_version)
        results.save(str(folder))
    print(json.dumps({"gpu": machine.get("gpu", ""), "cells": len(cache["cells"]), SKIPPED: cache.get(SKIPPED, "")}))
    return 0


def _run_one(bench, skip_error, nan) -> tuple:
    """One parameter combination as asv runs it: (value, samples, number); NaN skipped, None failed."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            if bench.do_setup():
                return nan, None, None
            try:
                data = bench.do_run()
            except skip_error:
                return nan, None, None
            finally:
                bench.do_teardown()
        except Exception:  # noqa: BLE001  asv records a benchmark that raised as failed (null)
            return None, None, None
    if isinstance(data, dict) and "samples" in data and "number" in data:
        return True, data["samples"], data["number"]
    return data, None, None


def _check(request: dict) -> int:
    """The check process: each implementation asked for, with the side's implementations, runs on the
    device ("" when it does), as JSON {name: reason}."""
    from relu2.measure import registry

    out = {}
    for name in request["impls"]:
        try:
            impl = registry.get(name)
        except (KeyError, ValueError) as e:  # KeyError's text is its repr: its argument is the sentence
            out[name] = str(e.args[0] if e.args else e)
            continue
        out[name] = "" if impl.supports(request["device"]) else impl.why_not(request["device"])
    print(json.dumps(out))
    return 0


def unsupported(side: Side, ruler: Ruler, scratch: Path, impls: Sequence[str], device: str) -> dict[str, str]:
    """Implementation -> why ``side`` cannot run it on ``device`` (absent when it can)."""
    ended = _child("check", {"impls": list(impls), "device": device}, side, ruler, scratch, 600, log=False)
    try:
        answer = json.loads(ended.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise ProcessFailed(f"{side.name} ({side.commit[:8]}): cannot list its implementations: its process "
                           f"{ended.why()}") from None
    return {name: why for name, why in answer.items() if why}


# --- the whole compare ---------------------------------------------------------------------------------


@contextlib.contextmanager
def ruler(scratch: Path) -> Iterator[Ruler]:
    """This checkout's instrument and suites, copied for the length of the run."""
    here = Path(__file__).resolve().parents[2] / "benchmarks"
    if not (here / "bench_relu2.py").is_file():
        raise UsageError(f"{here}: no bench_relu2.py (relu2 compare measures with a checkout's suites)")
    suites = scratch / "suites"
    shutil.copytree(here, suites, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    with instrument() as copy:
        yield Ruler(copy, suites)


def measure(base: str, head: str, out: str | os.PathLike, *, repo: str | os.PathLike | None = None,
            suites: Sequence[str] = (), rounds: int = MIN_ROUNDS, machine: str | None = None,
            device: str | None = None, cells: Sequence | None = None, say: Say = _stderr,
            require_idle: bool = False, resume: bool = False) -> Path:
    """Measure the commits ``base`` and ``head`` (git refs of ``repo``, default: the checkout around
    the current folder) on this machine in ``rounds`` interleaved rounds, every cell of ``suites``
    (default: all; ``RELU2_BENCH_QUICK``/``RELU2_BENCH_IMPLS`` narrow them as for asv), and write the
    compare layout into the folder ``out`` (new or empty).  Returns ``out``.  ``cells``
    (relu2.vocab.schema.Cell objects of the chosen suites) measures only those: the folders then hold them,
    and every other cell of the suites as skipped (n/a).

    UsageError (one line, nothing written) for bad input; RuntimeError when a round's process failed
    (``out`` then holds compare.json with ``complete: false``).  ``require_idle``: UsageError, before
    anything is written, when the machine is not quiet (``relu2.host.busy``); else that is said.

    Each round's file is kept in ``out/rounds/`` as it ends (removed once the results are written).
    ``resume``: ``out`` holds an incomplete compare of the same commits, rounds, cells and box; its
    rounds are kept, the others measured, then the results written.  The folder is trusted as this
    tool's own (its rounds are pickles): resume only what you measured."""
    from asv.machine import Machine

    if not 1 <= rounds <= MAX_ROUNDS:
        raise UsageError(f"--rounds {rounds}: expected 1 to {MAX_ROUNDS}")
    machine = name_part(machine) if machine else Machine.get_unique_machine_name()
    root = git.checkout(repo)
    shas = {"base": git.resolve(root, base), "head": git.resolve(root, head)}
    folder = Path(out)
    earlier = incomplete(folder) if resume else None
    if not resume:
        claim_dir(folder)
    check_instrument_env()
    benchmarks = Path(__file__).resolve().parents[2] / "benchmarks"
    check_suites(benchmarks, suites)
    asv_run.check_impls(check_declared(root, {base: shas["base"], head: shas["head"]}))
    device = resolve_device(device)
    info = {"format": FORMAT, "box": box_id(), "machine": machine, "gpu": "", "device": device,
            "base": {"ref": base, "sha": shas["base"]}, "head": {"ref": head, "sha": shas["head"]},
            "rounds": rounds, "order": order(rounds), "suites": [],
            "narrowed": {k: os.environ[k] for k in NARROWING if os.environ.get(k, "").strip()},
            "cells": None if cells is None else [c.describe() for c in cells],
            "instrument": instrument_state(), "started_at": _now(),
            "finished_at": None, "complete": False, "added_rounds": 0}
    env_suites = {"RELU2_BENCH_SUITES": ",".join(suites)} if suites else {}
    with environ(env_suites):
        info["suites"] = suite_names(benchmarks)
    if earlier is not None:
        check_resumable(folder, earlier, info)
        info["started_at"] = earlier["started_at"]
    # Said, not refused, unless asked (--require-idle): interleaving spreads a busy box over both sides.
    # After every refusal: a refused command says only why it refused.
    quiet.before_measuring("relu2 compare", require_idle, gpu=device == "cuda")
    with tempfile.TemporaryDirectory(prefix="relu2-compare-") as tmp, environ(env_suites):
        scratch = Path(tmp)
        with ruler(scratch) as r, sides(root, shas["base"], shas["head"], scratch, say) as (b, h):
            check_measured_env([b.measured, h.measured])
            (folder / ROUNDS_DIR).mkdir(parents=True, exist_ok=True)
            write_info(folder, info)
            done = measure_sides(b, h, r, scratch, rounds, device, cells=cells, say=say, keep=folder / ROUNDS_DIR)
            count_changed_work(b, h, r, scratch, done, device, folder, say)

            dates = {s.name: git.commit_time(root, s.commit) * 1000 for s in (b, h)}
            info["gpu"] = record_sides(b, h, r, scratch, done, folder, machine, dates)
            measured = rounds
            while measured < CHANGED_MAX_ROUNDS and (again := unsettled(folder, info)):
                more = min(ADDED_ROUNDS, CHANGED_MAX_ROUNDS - measured)
                say(f"relu2 compare: {len(again)} cells whose work changed are not settled by {measured} rounds: "
                    f"{more} more rounds of them")
                added = measure_sides(b, h, r, scratch, more, device, cells=again, say=say, keep=folder / ROUNDS_DIR,
                                      first=measured + 1)
                for name in SIDE_NAMES:
                    done.rounds[name] += added.rounds[name]
                measured += more
                info["added_rounds"] = measured - rounds
                write_info(folder, info)
                record_sides(b, h, r, scratch, done, folder, machine, dates)
        info.update(finished_at=_now(), complete=True)
        write_info(folder, info)
        shutil.rmtree(folder / ROUNDS_DIR)  # the results hold every round's figures now
    say(f"relu2 compare: wrote {folder} (base {shas['base'][:8]}, head {shas['head'][:8]}, {rounds} rounds, "
        f"order {' '.join(s[0].upper() for s in info['order'])})")
    return folder


# --- the verdict -------------------------------------------------------------------------------------


def unsettled(folder: Path, info: dict) -> list[Cell]:
    """The cells of a compare being measured (its sides' results written, its work counted) whose work
    changed and whose rounds do not settle them yet (``relu2.judge.rule.settled``), by the verdict
    ``relu2 gate --compare`` gives: relu2 compare measures them in more rounds."""
    try:
        report = gate.judge_compare(folder_of(folder, info))
    except (ResultsError, UsageError):  # no model for this machine, or none readable: the verdict says so
        return []
    found = (timed_cell(c.benchmark, dict(c.params), c.unit) for c in report.undecided)
    return list(dict.fromkeys(f[0] for f in found if f is not None))



def judge(folder: str | os.PathLike, fmt: str = "text", *, factor: float | None = None,
          noise_model: str | os.PathLike | None = None) -> tuple[str, int]:
    """The verdict on a compare folder (``relu2 gate --compare``: the paired rule, the same-box model
    of this GPU, or ``factor``) in ``fmt``, and its exit status (relu2 gate's); every format is written
    to ``folder/report.*``."""
    report = gate.gate_compare(folder, factor=factor, noise_model=noise_model)
    rendered = {f: report.render(f) for f in REPORT_FORMATS}
    for f, name in REPORT_FORMATS.items():
        atomic_write_text(Path(folder) / name, rendered[f] + "\n")
    return rendered[fmt], report.exit_code


def main(argv: Sequence[str]) -> int:
    actions = {"round": _round, "record": _record, "check": _check}
    if len(argv) != 2 or argv[0] not in actions:
        print("usage: python -m relu2.runs.compare round|record|check REQUEST.json (relu2 compare's own processes)",
              file=sys.stderr)
        return 2
    return actions[argv[0]](json.loads(Path(argv[1]).read_text(encoding="utf-8")))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
