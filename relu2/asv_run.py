"""``relu2 asv ARGS...``: asv's own command line, with its JSON files written atomically.

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


def main(argv: Sequence[str]) -> int:
    """Run ``asv ARGV...`` in this process with atomic result writes; asv's exit status."""
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
