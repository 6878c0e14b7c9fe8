"""``relu2 asv ARGS...``: asv's own command line, measuring with one instrument, ready to run.

**One instrument for every commit.**  asv builds and installs each commit's package; here only the
implementations come from it (entry points of ``relu2.vocab.interface``, found in the distribution the
config's ``project`` names).  The instrument (timers, contract, isolation, suites' vocabulary) is the
``relu2`` package this command runs from, copied into a folder of its own for the length of the run
(``RELU2_INSTRUMENT``; the suites put it first on ``sys.path``), so every commit in a range is measured
by the same ruler, and an edit to the checkout during a long run changes nothing.

**Every commit measured, or the reason recorded.**  Before ``asv run`` starts (over a range of a
local repository; not with ``--set-commit-hash``, nor for ``continuous``), the commits asv would
measure are listed and each one's ``pyproject.toml`` is read from git: a commit that declares no entry
point of the interface predates it, and is left out, with the reason written to
``<results>/<machine>/unmeasured.tsv`` and printed (with a count).  After asv, a result file it
wrote in which no cell has a figure is removed (``--skip-existing-commits`` would otherwise skip that
commit for good), with the reason the suite gave; the command then exits 1.

Before ``run`` and ``continuous`` it also does what a new user would otherwise trip over, and refuses
with one line (exit 2) before building anything when a prerequisite is missing:

* the machine: asv's machine file (``~/.asv-machine.json``) gets an entry for ``--machine`` (or
  the hostname) with asv's defaults if it has none, and every run refreshes its gpu, driver, cuda,
  torch and triton keys (``relu2.host.machine.machine_info``), which asv copies into every result;
* torch: the environments asv builds see the torch of the Python that runs this command, through
  ``RELU2_TORCH_SITE`` (asv.conf.json's first build step writes it into a ``.pth`` file); asv's
  default Python for them is this one's version;
* ``torch`` importable here, ``virtualenv`` installed (for asv's virtualenv environments), a git
  checkout, and the asv.conf.json asked for.

asv 0.6 writes every JSON file (a commit's results, ``benchmarks.json``, ``machine.json``) with
``asv.util.write_json``, which opens the final path and writes into it.  A run killed during that
write (Ctrl-C, a job time limit, a lost machine) leaves half a file, which every later ``asv run``,
``asv publish``, ``relu2 export`` and ``relu2 gate`` then trips over.  Here that function is
replaced, for the length of the command, by one that writes the same bytes to a temporary file in
the same folder and renames it over the old file: a kill leaves the old file, or none.

The replacement takes effect everywhere because asv's modules call it through the module attribute
(``util.write_json(...)`` in results.py, machine.py, benchmarks.py, environment.py, graph.py,
publish.py and the plugins; a bare ``write_json(...)`` inside util.py itself looks up the same
module global).  None imports the function by name.  Results are saved in the asv process itself,
never in the benchmark subprocesses, so patching this process is enough.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import math
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import relu2
from relu2.host import busy as quiet
from relu2.host import asv_cli, git, lifecycle
from relu2.host.files import atomic_write_text
from relu2.host.machine import check_label, machine_info
from relu2.host.outputs import name_part
from relu2.host.proc import environ
from relu2.measure.isolation import timeout_from_env
from relu2.measure.rounds import rounds_from_env
from relu2.vocab.errors import ResultsError, UsageError
from relu2.vocab.interface import ENTRY_POINT_GROUP, ENV_MEASURED, INTERFACE_VERSION
from relu2.vocab.schema import env_flag


def atomic_write_json(path: str, data: Any, api_version: int | None = None, compact: bool = False) -> None:
    """``asv.util.write_json``, byte for byte, written to a temporary file and then renamed over ``path``."""
    if api_version is not None:
        data = dict(data)
        data["version"] = api_version
    text = json.dumps(data) if compact else json.dumps(data, indent=4, sort_keys=True)
    atomic_write_text(os.path.abspath(path), text)


@contextlib.contextmanager
def atomic_asv_writes() -> Iterator[None]:
    """Within the block, asv writes its JSON files with ``atomic_write_json``; restored after."""
    from asv import util

    original = util.write_json
    util.write_json = atomic_write_json
    try:
        yield
    finally:
        util.write_json = original


ENV_TORCH_SITE = "RELU2_TORCH_SITE"
_PREPARED = ("run", "continuous")


def _option(argv: Sequence[str], name: str) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` in argv, else None."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def torch_site() -> str:
    """The site-packages folder that holds this interpreter's torch; UsageError when there is none."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(f"torch is not importable by {sys.executable}: install it first (on a CPU-only machine "
                         "`pip install torch==2.13.0`, see the README)")
    return os.path.dirname(list(spec.submodule_search_locations)[0])


def check_prerequisites(argv: Sequence[str]) -> None:
    """UsageError naming the first missing prerequisite of ``asv run``/``continuous`` (see module doc)."""
    config = _option(argv, "--config") or "asv.conf.json"
    if not os.path.isfile(config):
        raise UsageError(f"{config} not found: run relu2 asv from the repository root (or pass --config)")
    torch_site()
    try:
        conf = json.loads(Path(config).read_text(encoding="utf-8"))
    except ValueError as e:
        raise UsageError(f"{config}: not JSON: {e}") from None
    same = any(a in ("--python=same", "-E", "--environment") or a.startswith(("--environment=", "-Eexisting"))
               for a in argv) or _option(argv, "--python") == "same"
    if conf.get("environment_type") == "virtualenv" and not same and importlib.util.find_spec("virtualenv") is None:
        raise UsageError("asv's virtualenv environments need the virtualenv package: pip install virtualenv "
                         "(or measure the installed checkout with --python=same --set-commit-hash HASH)")
    repo = str(conf.get("repo", "."))
    if "://" not in repo and git.toplevel(os.path.abspath(repo)) is None:
        raise UsageError(f"{config}: its repo {repo!r} is not a git checkout (from {os.getcwd()}): asv checks "
                         "commits out of one")


def record_machine(name: str | None, path: str | None = None, extra: dict[str, str] | None = None) -> str:
    """Make sure asv's machine file knows ``name`` (default: asv's name for this host) and refresh its
    GPU/driver/CUDA/torch/triton keys, and ``extra`` (whether the machine is quiet); returns the name."""
    from asv.machine import Machine, MachineCollection

    path = path or MachineCollection.get_machine_file_path()
    name = name or Machine.get_unique_machine_name()
    data = read_machine_file(path)
    entry = data.get(name) or {**Machine.get_defaults(), "machine": name}
    entry.update(machine_info())
    entry.update(extra or {})
    data[name] = entry
    data["version"] = MachineCollection.api_version
    atomic_write_text(path, json.dumps(data, indent=4, sort_keys=True))
    return name


def read_machine_file(path: str | None = None) -> dict:
    """asv's machine file (``~/.asv-machine.json``; {} when there is none); UsageError naming it when it
    does not read as one (asv writes it in place: a run killed mid-write leaves it cut short)."""
    from asv.machine import MachineCollection

    path = path or MachineCollection.get_machine_file_path()
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8")) if os.path.isfile(path) else {}
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: asv's machine file does not read ({e}): mend or remove it") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for k, v in data.items() if k != "version"):
        raise UsageError(f"{path}: not asv's machine file (an object of machines by name): mend or remove it")
    return data


ENV_INSTRUMENT = "RELU2_INSTRUMENT"  # the folder holding the instrument's copy (benchmarks/ reads it)
ENV_LOG = "RELU2_ASV_LOG"  # the suites append "commit<TAB>reason" here for a commit they could not measure
UNMEASURED = "unmeasured.tsv"  # per machine, beside asv's result files: commit, instrument, reason


def prepare(argv: Sequence[str], require_idle: bool = False) -> tuple[str, dict[str, str]] | None:
    """What ``run`` and ``continuous`` need before asv starts: prerequisites, whether the machine is
    quiet (``relu2.host.busy``), torch's site; the machine's name and its quiet keys, recorded by ``_record``
    once the range is known to be good."""
    if not argv or argv[0] not in _PREPARED or "-h" in argv or "--help" in argv:
        return None
    check_prerequisites(argv)
    check_suite_environment(_option(argv, "--config") or "asv.conf.json")
    machine = check_asv_arguments(argv)
    seen = quiet.before_measuring("relu2 asv", require_idle)  # UsageError before anything is written
    if narrowing() and _option(argv, "--config") is not None:
        print(f"relu2 asv: warning: {narrowing()} narrows the suites' parameters, and asv publish draws only the "
              "parameters benchmarks.json lists, for every machine of the results folder: give this run a "
              "results folder of its own", file=sys.stderr)
    from asv.machine import Machine

    # Recorded once the input is good, with whether the machine was quiet.
    return machine or Machine.get_unique_machine_name(), seen.machine_keys()


def check_asv_arguments(argv: Sequence[str]) -> str | None:
    """UsageError (one line, before anything is written) for what asv itself would refuse only after the
    machine file, the narrowed configuration and a results folder exist: options asv's parser rejects,
    a machine name that is a path (or names another GPU), a --python that names no interpreter, a
    --bench that matches no benchmark of the suites, a range that holds no commit.  Returns the machine
    name asked for, as asv's parser read it (``--machine``, ``-m`` or an abbreviation), or None."""
    from asv.config import Config

    args = asv_cli.parse(argv)
    machine = getattr(args, "machine", None)
    if machine is not None:
        name_part(machine)
        check_label(machine)
    if argv[0] == "run":
        read_machine_file()  # the run records its machine there once measured: refused now, not then
    python = _option(argv, "--python")
    if python and python != "same" and not (os.path.isfile(python) or shutil.which(python)
                                            or shutil.which(f"python{python}")):
        raise UsageError(f"--python {python}: no such interpreter here (give a version with an installed "
                         "python3.X, a path, or same)")
    config = _option(argv, "--config") or "asv.conf.json"
    conf = Config.load(config)
    bench = _option(argv, "--bench") or _option(argv, "-b")
    if bench:
        names = suite_benchmarks(Path(conf.benchmark_dir))
        try:
            pattern = re.compile(bench)
        except re.error as e:
            raise UsageError(f"--bench {bench!r}: not a regular expression ({e})") from None
        if names and not any(pattern.search(n) for n in names):
            raise UsageError(f"--bench {bench!r} matches no benchmark of {conf.benchmark_dir} (e.g. "
                             f"{', '.join(names[:3])})")
    range_spec = getattr(args, "range", None)
    if argv[0] == "run" and range_spec and ".." in range_spec and os.path.isdir(conf.repo):
        _check_range(conf.repo, range_spec)
        listed = git.run(conf.repo, "rev-list", "--first-parent", range_spec, "--", check=False)
        if listed.returncode == 0 and not listed.stdout.strip():
            raise UsageError(f"the range {range_spec} holds no commit (A..B is what B has and A has not)")
    return machine


def suite_benchmarks(bench_dir: Path) -> list[str]:
    """The names asv gives the suites' benchmarks ("bench_relu2.Grid.track_hot"), read torch-free."""
    path = bench_dir / "bench_relu2.py"
    if not path.is_file():
        return []
    spec = importlib.util.spec_from_file_location("relu2_bench_names", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    names = []
    for name, suite in vars(module).items():
        if isinstance(suite, type) and not name.startswith("_") and suite.__module__ == module.__name__:
            names += [f"bench_relu2.{name}.{m}" for m in dir(suite) if m.startswith(("track_", "time_"))]
    return names


def _record(name: str, extra: dict[str, str]) -> None:
    record_machine(name, extra=extra)
    print(f"relu2 asv: machine {name!r} recorded with its GPU/driver/CUDA/torch/triton; environments see torch "
          f"from {os.environ[ENV_TORCH_SITE]}", file=sys.stderr)


def check_suite_environment(config: str) -> None:
    """UsageError for a suite variable the suites would reject inside asv (where it costs a whole commit
    and says only "Setting up ... failed"): RELU2_TIMEOUT, RELU2_ROUNDS, RELU2_BENCH_SUITES.
    RELU2_BENCH_IMPLS is checked against the commits to be measured (``check_impls``)."""
    try:
        timeout_from_env()
        rounds_from_env()
        env_flag("RELU2_BENCH_QUICK")
    except ValueError as e:
        raise UsageError(str(e)) from None
    conf = json.loads(Path(config).read_text(encoding="utf-8"))
    bench_dir = Path(config).resolve().parent / conf.get("benchmark_dir", "benchmarks")
    if not os.environ.get("RELU2_BENCH_SUITES", "").strip() or not (bench_dir / "bench_relu2.py").is_file():
        return
    spec = importlib.util.spec_from_file_location("relu2_bench_suites", bench_dir / "bench_relu2.py")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)  # torch-free: only the vocabulary
        module._selected()  # the suite's own refusal of RELU2_BENCH_SUITES naming no suite
    except ValueError as e:
        raise UsageError(f"{bench_dir / 'bench_relu2.py'}: {e}") from None


def _measured(conf: dict) -> str:
    """The distribution under test: the config's ``project``."""
    return str(conf.get("project", ""))


# --- the instrument --------------------------------------------------------------------------------


@contextlib.contextmanager
def instrument() -> Iterator[Path]:
    """The running ``relu2`` package copied into a temporary folder, named by ``RELU2_INSTRUMENT`` for
    the block (the suites import it from there; docs/tracking.md says why a copy)."""
    source = Path(relu2.__file__).resolve().parent
    root = Path(tempfile.mkdtemp(prefix="relu2-instrument-"))
    try:
        shutil.copytree(source, root / "relu2", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        with environ({ENV_INSTRUMENT: str(root)}):
            yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --- which commits can be measured -----------------------------------------------------------------


@dataclass(frozen=True)
class Unmeasured:
    """A commit this instrument does not measure, and why."""

    commit: str
    reason: str


def declared_implementations(repo: str | os.PathLike, commit: str) -> tuple[list[str], str]:
    """The implementations ``commit`` of the git checkout ``repo`` declares through interface 1 (its
    pyproject.toml's entry points), and why it cannot be measured ("" when it can)."""
    import tomllib

    shown = git.show(repo, commit, "pyproject.toml")
    if shown is None:
        return [], f"predates the implementations interface {INTERFACE_VERSION}: no pyproject.toml"
    try:
        declared = tomllib.loads(shown).get("project", {}).get("entry-points", {}).get(ENTRY_POINT_GROUP)
    except tomllib.TOMLDecodeError as e:
        return [], f"its pyproject.toml does not parse: {e}"
    if not declared:
        return [], (f"predates the implementations interface {INTERFACE_VERSION}: its pyproject.toml declares no "
                    f"entry points in the group {ENTRY_POINT_GROUP}")
    return sorted(declared), ""


def check_impls(declared: set[str]) -> None:
    """UsageError when RELU2_BENCH_IMPLS names an implementation that is neither one of the instrument's
    references nor declared by any commit to be measured."""
    from relu2.measure.registry import REFERENCES

    chosen = [n.strip() for n in os.environ.get("RELU2_BENCH_IMPLS", "").split(",") if n.strip()]
    known = set(REFERENCES) | declared
    unknown = [n for n in chosen if n not in known]
    if unknown:
        raise UsageError(f"RELU2_BENCH_IMPLS names no implementation {unknown}: the references are "
                         f"{', '.join(REFERENCES)}, and the commits to be measured declare "
                         f"{', '.join(sorted(declared)) or 'none'}")


def selected_commits(conf, range_spec: str | None) -> list[str] | None:
    """The commits ``asv run RANGE`` would measure (asv's own selection), or None when asv decides
    later (no git checkout here)."""
    from asv.repo import get_repo

    repo = get_repo(conf)
    if range_spec is None:
        return list({repo.get_hash_from_name(branch) for branch in conf.branches})
    if range_spec == "EXISTING":
        from asv.results import get_existing_hashes

        return list(get_existing_hashes(conf.results_dir))
    if range_spec == "NEW":
        from asv.results import get_existing_hashes

        return repo.get_new_branch_commits(conf.branches, get_existing_hashes(conf.results_dir))
    if range_spec == "TAGS":
        return list(reversed(list(repo.get_tags().keys())))
    if range_spec == "ALL":
        return repo.get_new_branch_commits(conf.branches, [])
    if range_spec == "HEAD":
        return [repo.get_hash_from_name("HEAD")]
    if range_spec.startswith("HASHFILE:"):
        try:
            text = sys.stdin.read() if range_spec == "HASHFILE:-" else Path(range_spec[9:]).read_text()
        except OSError as e:
            raise ResultsError(f"{range_spec[9:]}: {e.strerror or e}") from None
        return [repo.get_hash_from_name(h.strip()) for h in text.splitlines() if h.strip()]
    return repo.get_hashes_from_range(range_spec)


def record_unmeasured(results_dir: str | os.PathLike, machine: str, skipped: Sequence[Unmeasured]) -> Path:
    """Add ``skipped`` to ``<results>/<machine>/unmeasured.tsv`` (one line a commit, newest reason wins)."""
    path = Path(results_dir) / machine / UNMEASURED
    rows = read_unmeasured(results_dir, machine)
    for u in skipped:
        rows[u.commit] = u.reason
    text = "".join(f"{commit}\t{reason}\n" for commit, reason in sorted(rows.items()))
    atomic_write_text(path, "commit\treason\n" + text)
    return path


def read_unmeasured(results_dir: str | os.PathLike, machine: str) -> dict[str, str]:
    """Commit -> why it was not measured on ``machine`` (``relu2 asv run``'s record)."""
    path = Path(results_dir) / machine / UNMEASURED
    if not path.is_file():
        return {}
    rows = {}
    for line in path.read_text(encoding="utf-8").splitlines()[1:]:
        commit, _, reason = line.partition("\t")
        if commit:
            rows[commit] = reason
    return rows


# --- after asv -----------------------------------------------------------------------------------


def has_figure(path: Path) -> bool:
    """Whether an asv result file holds at least one number (asv stores failed cells as null, skipped as NaN)."""
    data = json.loads(path.read_text(encoding="utf-8"))

    def numbers(value) -> bool:
        if isinstance(value, list):
            return any(numbers(v) for v in value)
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    return any(numbers(entry[0] if isinstance(entry, list) else entry) for entry in data.get("results", {}).values())


def reached(results_dir: Path, machine: str, since: float) -> dict[str, bool]:
    """Implementation -> whether any of its cells is other than n/a (skipped: NaN) in the result files
    written since ``since``; an implementation mapped to False could not be measured at all."""
    try:
        listed = json.loads((results_dir / "benchmarks.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    found: dict[str, bool] = {}
    folder = results_dir / machine
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        if path.name in ("machine.json", "benchmarks.json") or path.stat().st_mtime < since:
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"), parse_constant=float)
        except (OSError, ValueError):
            continue
        for bench, row in data.get("results", {}).items():
            entry = dict(zip(data.get("result_columns", []), row))
            params, values = entry.get("params") or [], entry.get("result") or []
            if not params or ((listed.get(bench) or {}).get("param_names") or [""])[0] != "impl":
                continue
            for combo, value in zip(itertools.product(*params), values):
                impl = str(combo[0]).strip("'\"")
                found[impl] = found.get(impl, False) or not (isinstance(value, float) and math.isnan(value))
    return found


def say_never_measured(results_dir: Path, machine: str, since: float, declared: set[str]) -> bool:
    """Name the implementations the run could not measure at all; True when that leaves it without what
    it was asked for: an implementation named in RELU2_BENCH_IMPLS, or every one of the measured
    package's that the suites hold."""
    found = reached(results_dir, machine, since)
    never = {impl for impl, was in found.items() if not was}
    for impl in sorted(never):
        print(f"relu2 asv: {impl}: every cell n/a (skipped) on this machine, so it was not measured "
              "(asv run --show-stderr says why; relu2 info lists what can run here)", file=sys.stderr)
    named = {n.strip() for n in os.environ.get("RELU2_BENCH_IMPLS", "").split(",") if n.strip()}
    mine = declared & set(found)
    return bool(named & never) or bool(mine) and mine <= never


def _suite_reasons(log: Path) -> dict[str, str]:
    if not log.is_file():
        return {}
    reasons = {}
    for line in log.read_text(encoding="utf-8").splitlines():
        commit, _, reason = line.partition("\t")
        reasons[commit] = reason
    return reasons


def remove_empty_results(results_dir: Path, machine: str, since: float, log: Path) -> list[Unmeasured]:
    """Remove result files written since ``since`` that hold no figure; what they were, and why."""
    folder = results_dir / machine
    removed = []
    reasons = _suite_reasons(log)
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        if path.name in ("machine.json", "benchmarks.json") or path.stat().st_mtime < since:
            continue
        try:
            if has_figure(path):
                continue
            commit = json.loads(path.read_text(encoding="utf-8")).get("commit_hash", path.stem)
        except (OSError, ValueError):
            continue
        path.unlink()
        reason = next((r for c, r in reasons.items() if c and commit.startswith(c)), "") or \
            "no cell has a figure (every cell failed or was skipped; asv's log above says why)"
        removed.append(Unmeasured(commit, reason))
    return removed


def saved_results(results_dir: Path, machine: str, since: float) -> str:
    """What an interrupted run saved: the commits whose results asv wrote since ``since``."""
    folder = results_dir / machine
    written = [p for p in folder.glob("*.json") if p.name not in ("machine.json", "benchmarks.json")
               and p.stat().st_mtime >= since] if folder.is_dir() else []
    kept = (f"the results of {len(written)} commit(s) are saved in {folder}" if written else
            "no commit's results were saved (asv saves a commit's once all its benchmarks have run)")
    return f"{kept}; run it again with --skip-existing-commits to measure the rest"


# --- another repository's kernel ------------------------------------------------------------------

OPT_REPO = "--repo"  # relu2's own option of `relu2 asv run`: measure the package of another git checkout
OPT_REQUIRE_IDLE = "--require-idle"  # relu2's own: refuse to measure on a machine that is not quiet


def external_config(repo: str | os.PathLike, base_config: str = "asv.conf.json") -> Path:
    """An asv config that measures the package in the git checkout ``repo`` with this instrument.

    It is ``base_config`` (this checkout's) with ``repo``, ``project`` (the distribution's name, from
    the checkout's pyproject.toml) and ``branches`` (its current branch) of that checkout; the suites
    stay this checkout's, and results, environments and the dashboard go under ``.asv/<project>/``
    here.  Written to ``.asv/<project>/asv.conf.json`` so ``asv publish --config`` finds it later.
    """
    import tomllib

    root = git.checkout(Path(repo).expanduser().resolve())
    try:
        project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]["name"]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as e:
        raise UsageError(f"{root / 'pyproject.toml'}: no [project] name to measure ({type(e).__name__})") from None
    name_part(str(project), f"{root / 'pyproject.toml'}'s [project] name")  # it names a folder under .asv/
    branch = git.try_output(root, "rev-parse", "--abbrev-ref", "HEAD") or "main"
    here = Path(base_config).resolve().parent
    conf = json.loads(Path(base_config).read_text(encoding="utf-8"))
    folder = here / ".asv" / project
    conf.update(repo=str(root), project=project, branches=[branch],
                benchmark_dir=str(here / conf.get("benchmark_dir", "benchmarks")),
                env_dir=str(folder / "env"), results_dir=str(folder / "results"), html_dir=str(folder / "html"))
    path = folder / "asv.conf.json"
    atomic_write_text(path, json.dumps(conf, indent=4))
    return path


NARROWED = "narrowed"  # .asv/narrowed/: where a narrowed run of this checkout's config keeps its results


def narrowing() -> str:
    """The suite variable that narrows the suites' parameters ("" when none): a run with it lists fewer
    parameters in benchmarks.json than the results folder's history holds."""
    if env_flag("RELU2_BENCH_QUICK"):
        return "RELU2_BENCH_QUICK"
    return "RELU2_BENCH_IMPLS" if os.environ.get("RELU2_BENCH_IMPLS", "").strip() else ""


def _narrowed(argv: list[str], base_config: str = "asv.conf.json") -> list[str]:
    """argv with ``--config`` of a copy of ``base_config`` whose results and dashboard are under
    .asv/narrowed/ when a suite variable narrows the run and no --config was given: asv rewrites
    benchmarks.json with the parameters it ran, and the tracked results/ would be drawn with those."""
    if argv[0] not in _PREPARED or not narrowing() or _option(argv, "--config") is not None \
            or not os.path.isfile(base_config):
        return argv
    here = Path(base_config).resolve().parent
    conf = json.loads(Path(base_config).read_text(encoding="utf-8"))
    tracked = conf.get("results_dir", "results")
    folder = here / ".asv" / NARROWED
    conf.update(repo=str(here / conf.get("repo", ".")), benchmark_dir=str(here / conf.get("benchmark_dir", "benchmarks")),
                env_dir=str(here / conf.get("env_dir", ".asv/env")), results_dir=str(folder / "results"),
                html_dir=str(folder / "html"))
    path = folder / "asv.conf.json"
    atomic_write_text(path, json.dumps(conf, indent=4))
    print(f"relu2 asv: {narrowing()} narrows the suites, so this run's results go to {folder / 'results'}, not "
          f"{tracked} (gate: --results {folder / 'results'}; publish: --config {path})",
          file=sys.stderr)
    return [argv[0], "--config", str(path), *argv[1:]]


def _with_repo(argv: list[str]) -> list[str]:
    """argv with ``--repo DIR`` replaced by ``--config`` of ``external_config(DIR)``."""
    repo = _option(argv, OPT_REPO)
    if repo is None:
        if OPT_REPO in argv:
            raise UsageError(f"{OPT_REPO} needs a folder: the git checkout whose commits are measured")
        return argv
    if _option(argv, "--config") is not None:
        raise UsageError(f"{OPT_REPO} writes the config itself: drop --config")
    i = next(i for i, a in enumerate(argv) if a == OPT_REPO or a.startswith(OPT_REPO + "="))
    rest = argv[:i] + argv[i + (1 if "=" in argv[i] else 2):]
    config = external_config(repo)
    print(f"relu2 asv: measuring {repo} with this instrument; config {config}, results "
          f"{json.loads(config.read_text())['results_dir']}", file=sys.stderr)
    return [rest[0], "--config", str(config), *rest[1:]]


def main(argv: Sequence[str]) -> int:
    """Run ``asv ARGV...`` in this process with one instrument and atomic result writes; asv's exit status."""
    if not argv:
        raise UsageError("relu2 asv needs an asv command, e.g. relu2 asv run --machine mybox main~2..main "
                         "(relu2 asv run --help lists asv's options)")
    argv = _with_repo(list(argv))
    require_idle = OPT_REQUIRE_IDLE in argv
    argv = [a for a in argv if a != OPT_REQUIRE_IDLE]
    prepared = prepare(argv, require_idle)  # UsageError (exit 2) before anything is built
    if prepared is None:
        return _run_asv(argv)
    return _measure(_narrowed(argv), *prepared)


def _measure(argv: list[str], machine: str, machine_keys: dict[str, str]) -> int:
    from asv.config import Config

    config = _option(argv, "--config") or "asv.conf.json"
    conf = Config.load(config)
    since = time.time() - 1
    lifecycle.say_saved(lambda: saved_results(Path(conf.results_dir), machine, since))
    measured = _measured(json.loads(Path(config).read_text(encoding="utf-8")))
    skipped: list[Unmeasured] = []
    declared: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="relu2-asv-") as scratch, instrument(), \
            environ({ENV_MEASURED: measured, ENV_LOG: str(Path(scratch) / "suite.log"),
                     ENV_TORCH_SITE: os.environ.get(ENV_TORCH_SITE) or torch_site()}):
        log = Path(scratch) / "suite.log"
        log.touch()
        if argv[0] == "run" and _option(argv, "--set-commit-hash") is None:
            argv, skipped, declared = _only_measurable(argv, conf, Path(scratch) / "commits.txt")  # UsageError first
            if skipped:
                path = record_unmeasured(conf.results_dir, machine, skipped)
                print(f"relu2 asv: {len(skipped)} commit(s) not measured, recorded in {path}:", file=sys.stderr)
                for u in skipped:
                    print(f"  {u.commit[:8]}  {u.reason}", file=sys.stderr)
            if argv is None:
                raise UsageError(f"no commit of the range can be measured by this instrument "
                                 f"({len(skipped)} predate the implementations interface {INTERFACE_VERSION})")
        _record(machine, machine_keys)
        started = time.time() - 1  # mtimes have coarse resolution on some file systems
        status = _run_asv(argv)
        empty = remove_empty_results(Path(conf.results_dir), machine, started, log)
        if say_never_measured(Path(conf.results_dir), machine, started, declared):
            status = status or 1  # it ran, and measured nothing of what it was asked for
        cost = Path(str(log) + ".cost")
        if cost.is_file():  # where each commit's measuring time went (the suites' setup writes it)
            print(cost.read_text(encoding="utf-8").rstrip(), file=sys.stderr)
    if empty:
        path = record_unmeasured(conf.results_dir, machine, empty)
        for u in empty:
            print(f"relu2 asv: removed the result of {u.commit[:8]}, which holds no figure: {u.reason} "
                  f"(recorded in {path})", file=sys.stderr)
        status = status or 1
    return status


def _only_measurable(argv: list[str], conf, hashfile: Path) -> tuple[list[str] | None, list[Unmeasured], set[str]]:
    """argv with its range replaced by the commits this instrument can measure (a HASHFILE), and the
    commits left out, and the implementations the measured commits declare; (None, left out, ...) when none
    can be measured."""
    from asv.commands import make_argparser

    parser, _ = make_argparser()
    try:
        args = parser.parse_args(argv)
    except SystemExit:
        return argv, [], set()  # asv prints its own usage error
    range_spec = getattr(args, "range", None)
    repo_dir = conf.repo if os.path.isdir(conf.repo) else None  # a path (relative: to here, as for asv)
    if repo_dir is None:
        return argv, [], set()  # a remote repository: asv clones it; the result check afterwards still applies
    _check_range(repo_dir, range_spec)
    try:
        commits = selected_commits(conf, range_spec)
    except ResultsError as e:
        raise UsageError(str(e)) from None
    except Exception as e:  # noqa: BLE001  asv's own errors for an unknown range
        raise UsageError(f"cannot list the commits of {range_spec or 'the configured branches'}: {e}") from None
    skipped, keep, declared = [], [], set()
    for commit in commits:
        names, reason = declared_implementations(repo_dir, commit)
        if reason:
            skipped.append(Unmeasured(commit, reason))
        else:
            keep.append(commit)
            declared.update(names)
    check_impls(declared)
    if not skipped:
        return argv, [], declared
    if not keep:
        return None, skipped, declared
    hashfile.write_text("".join(f"{c}\n" for c in keep))
    rewritten = list(argv)
    if range_spec is None:
        rewritten.append(f"HASHFILE:{hashfile}")
    else:
        rewritten[len(rewritten) - 1 - rewritten[::-1].index(range_spec)] = f"HASHFILE:{hashfile}"
    return rewritten, skipped, declared


_RANGE_WORDS = ("EXISTING", "NEW", "TAGS", "ALL", "HEAD")


def _check_range(repo_dir: str, range_spec: str | None) -> None:
    """UsageError in one line, git's own, for a range git cannot read (asv would print the whole
    failed ``git rev-list`` call, then raise)."""
    if range_spec is None or range_spec in _RANGE_WORDS or range_spec.startswith("HASHFILE:"):
        return
    try:
        words = shlex.split(range_spec)  # as asv splits it for git rev-list
    except ValueError as e:
        raise UsageError(f"{range_spec!r} is not a range of commits ({e})") from None
    proc = git.run(repo_dir, "rev-list", "--first-parent", *words, "--", check=False)
    if proc.returncode not in (0, 1):  # asv's own accepted codes
        said = [line for line in proc.stderr.splitlines() if line.strip()]
        raise UsageError(f"{range_spec!r} is not a range of commits of {os.path.abspath(repo_dir)}"
                         + (f" ({said[-1].strip()})" if said else ""))


def _run_asv(argv: Sequence[str]) -> int:
    from asv import main as asv_main

    saved_argv = sys.argv
    sys.argv = ["asv", *argv]  # asv's main() parses sys.argv and reports itself as "asv"
    try:
        with atomic_asv_writes():
            asv_main.main()
    except SystemExit as e:  # asv's main() always ends in sys.exit
        return _exit_status(e.code)
    finally:
        sys.argv = saved_argv
    return 0


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message"): printed, status 1, as the interpreter does
    return 1
