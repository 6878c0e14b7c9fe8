"""``relu2 asv ARGS...``: asv's own command line, with its JSON files written atomically, ready to run.

Before ``run`` and ``continuous`` it does what a new user would otherwise trip over, and refuses with
one line (exit 2) before building anything when a prerequisite is missing:

* the machine: asv's machine file (``~/.asv-machine.json``) gets an entry for ``--machine`` (or
  the hostname) with asv's defaults if it has none, and every run refreshes its gpu, driver, cuda,
  torch and triton keys (``relu2.machine.machine_info``), which asv copies into every result;
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
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

from relu2.results import atomic_write_text


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
    import importlib.util

    from relu2.machine import UsageError

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(f"torch is not importable by {sys.executable}: install it first (on a CPU-only machine "
                         "`pip install torch==2.13.0`, see the README)")
    return os.path.dirname(list(spec.submodule_search_locations)[0])


def check_prerequisites(argv: Sequence[str]) -> None:
    """UsageError naming the first missing prerequisite of ``asv run``/``continuous`` (see module doc)."""
    import importlib.util

    from relu2.machine import UsageError, repo_of

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
    if repo_of(os.path.dirname(os.path.abspath(config))) is None:
        raise UsageError(f"{config} is not inside a git checkout: asv checks commits out of one")


def record_machine(name: str | None, path: str | None = None) -> str:
    """Make sure asv's machine file knows ``name`` (default: asv's name for this host) and refresh its
    GPU/driver/CUDA/torch/triton keys; returns the name."""
    from asv.machine import Machine, MachineCollection

    from relu2.machine import machine_info

    path = path or MachineCollection.get_machine_file_path()
    name = name or Machine.get_unique_machine_name()
    data = json.loads(Path(path).read_text(encoding="utf-8")) if os.path.isfile(path) else {}
    entry = data.get(name) or {**Machine.get_defaults(), "machine": name}
    entry.update(machine_info())
    data[name] = entry
    data["version"] = MachineCollection.api_version
    atomic_write_text(path, json.dumps(data, indent=4, sort_keys=True))
    return name


def prepare(argv: Sequence[str]) -> None:
    """What ``run`` and ``continuous`` need before asv starts: prerequisites, the machine, torch's site."""
    if not argv or argv[0] not in _PREPARED or "-h" in argv or "--help" in argv:
        return
    check_prerequisites(argv)
    if os.environ.get("RELU2_BENCH_IMPLS", "").strip():
        print("relu2 asv: warning: RELU2_BENCH_IMPLS narrows the suites' parameters, and asv publish draws only "
              "the parameters benchmarks.json lists, for every machine of the results folder: give this run a "
              "results folder of its own (--config with another results_dir)", file=sys.stderr)
    name = record_machine(_option(argv, "--machine"))
    os.environ.setdefault(ENV_TORCH_SITE, torch_site())
    print(f"relu2 asv: machine {name!r} recorded with its GPU/driver/CUDA/torch/triton; environments see torch "
          f"from {os.environ[ENV_TORCH_SITE]}", file=sys.stderr)


def main(argv: Sequence[str]) -> int:
    """Run ``asv ARGV...`` in this process with atomic result writes; asv's exit status."""
    from asv import main as asv_main

    prepare(argv)  # UsageError (exit 2) before anything is built

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
