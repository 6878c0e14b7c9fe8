"""``relu2 publish``: the dashboard, as asv and asv-tachyon make it, then reshaped for what matters here.

asv stays the engine: ``asv publish`` writes index.json, graphs/ and regressions.json from the
results, and ``asv-tachyon install`` puts its offline UI over them.  asv keys every series by the
whole machine.json and environment (machine, python, torch, cuda, cpu...), and tachyon opens on the
first of those environments and keeps every other key as it was when a machine is chosen, so a
chosen machine found no series and showed "—" until every selector was set by hand.  Then, on the
published folder only (the results are never touched):

* series are keyed by machine and branch alone (one machine's environments merged by revision),
  GPU machines first, so the dashboard opens on the GPU history and choosing a machine is enough;
* fingerprints (``track_kernel``, unit "kernel id") are not drawn: a hash is no quantity, and the
  gate and ``relu2 inspect`` read them from the results;
* the Regressions page lists only what the gate gates: no CPU machine's timings, no launch mode.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from relu2.host import asv_cli
from relu2.host.files import atomic_write_text
from relu2.host.machine import is_cpu_machine
from relu2.host.outputs import claim_replaced_dir
from relu2.records.asv_names import KERNEL, measure_of
from relu2.records.asv_results import load_measurements, machines
from relu2.vocab.errors import ResultsError, UsageError
from relu2.vocab.schema import MODE_NAMES

FINGERPRINT_UNIT = "kernel id"  # the unit of the suites' track_kernel (benchmarks/bench_relu2.py)
KEYS = ("branch", "machine")  # what a series is keyed by on the dashboard


def publish(config: str | os.PathLike = "asv.conf.json", asv_args: list[str] | None = None) -> Path:
    """``asv publish`` (with ``asv_args``), ``asv-tachyon install``, then ``reshape``; the html folder."""
    from asv.config import Config

    try:
        conf = Config.load(str(config))
    except Exception as e:  # asv's own UserError or an unreadable file: one line, exit 2
        raise UsageError(f"cannot read the asv configuration {config}: {e}") from None
    listing = Path(conf.results_dir) / "benchmarks.json"
    if not listing.is_file():
        raise UsageError(f"nothing to publish: {listing} is missing (relu2 asv run writes it with the results)")
    html = html_dir(asv_args or [], conf.html_dir)
    # asv publish empties its html folder before it writes: only a folder of its own, or a new one.
    claim_replaced_dir(html, "the html folder", own=is_published,
                       protect=[Path.cwd(), Path(str(config)).resolve().parent, conf.results_dir,
                                conf.benchmark_dir, conf.env_dir])
    check_results(conf.results_dir)
    for cmd in ([sys.executable, "-m", "asv", "publish", "--config", str(config), *(asv_args or [])],
                [sys.executable, "-m", "asv_tachyon", "install", str(html)]):
        # Progress stays on the terminal; stderr is kept so that a refusal (an unknown option) is one line.
        proc = subprocess.run(cmd, stderr=subprocess.PIPE, text=True)
        said = [line for line in proc.stderr.splitlines() if line.strip()]
        if proc.returncode != 0:
            raise UsageError(f"{' '.join(cmd[2:4])} failed (exit {proc.returncode})"
                             + (f": {said[-1].strip()}" if said else "; its output is above"))
        sys.stderr.write(proc.stderr)
    reshape(html)
    return html


def html_dir(asv_args: list[str], configured: str) -> Path:
    """The folder asv publish will write, read by asv's own parser (it takes ``-oX``, ``-o=X`` and any
    unambiguous prefix of ``--html-dir``: a folder missed here is one asv empties unchecked); else the
    configuration's.  UsageError for arguments asv would refuse, or a ``--config`` of its own (the html
    folder would be another configuration's)."""
    parsed = asv_cli.parse(["publish", *asv_args])
    if parsed.config is not None:
        raise UsageError("give the configuration as relu2 publish --config FILE, not among asv's arguments")
    return Path(parsed.html_dir or configured)


def is_published(folder: Path) -> bool:
    """Whether ``folder`` holds what asv publish writes (and nothing a person keeps there by hand)."""
    return (folder / "index.json").is_file() and (folder / "graphs").is_dir()


def check_results(results_dir: str | os.PathLike) -> None:
    """Every result file read as the gate reads it (ResultsError naming the first that is not one):
    asv publish skips a truncated or garbage file without a word, and its commit would vanish from
    the dashboard."""
    if not machines(results_dir):
        raise ResultsError(f"{results_dir}: no machine with results (no <machine>/machine.json beside a result file)")
    load_measurements(results_dir)


def reshape(html: Path) -> None:
    """Rewrite the published ``html`` folder's index.json, graphs/ and regressions.json (see the module)."""
    index = json.loads((html / "index.json").read_text())
    machines = index.get("machines", {})
    order = sorted(machines, key=lambda m: (is_cpu_machine(machines[m]), m))  # GPU machines first
    fingerprints = {name for name, b in index["benchmarks"].items() if b.get("unit") == FINGERPRINT_UNIT}

    moved = _rekey_graphs(html / "graphs", fingerprints)
    for name in fingerprints:
        del index["benchmarks"][name]
        (html / "graphs" / "summary" / f"{name}.json").unlink(missing_ok=True)
    branches = index["params"].get("branch", [])
    index["params"] = {"branch": branches, "machine": order}
    index["graph_param_list"] = [{"branch": b, "machine": m} for m in order for b in branches]
    atomic_write_text(html / "index.json", json.dumps(index))

    path = html / "regressions.json"
    if path.exists():
        data = json.loads(path.read_text())
        kept = []
        for entry in data.get("regressions", []):
            name, graph, params = entry[0], entry[1], entry[2]
            machine = params.get("machine", "")
            if _gated(name, machines.get(machine, {})) and graph in moved:
                kept.append([name, moved[graph], {k: params[k] for k in KEYS if k in params}, *entry[3:]])
        data["regressions"] = kept
        atomic_write_text(path, json.dumps(data))


def _gated(name: str, info: dict[str, Any]) -> bool:
    """Whether ``relu2 gate`` judges the benchmark ``name`` ("bench_relu2.Grid.track_hot(...)") on this
    machine: never a CPU machine's figures, never launch (host wall clock), never a fingerprint."""
    what = measure_of(name)
    if is_cpu_machine(info) or what == KERNEL:
        return False
    return what != "launch" if what in MODE_NAMES else True  # peak memory, per-implementation summaries


def _rekey_graphs(graphs: Path, drop: set[str]) -> dict[str, str]:
    """Move every series to graphs/branch-B/machine-M/NAME.json, merging one machine's environments
    by revision (the later environment wins a revision both hold); ``drop`` are removed.  Returns
    old path -> new path, relative to the html folder, as regressions.json writes them."""
    merged: dict[str, dict[int, Any]] = {}
    moved: dict[str, str] = {}
    old_dirs: set[Path] = set()
    for path in sorted(graphs.rglob("*.json")):
        rel = path.relative_to(graphs)
        if rel.parts[0] == "summary":
            continue
        keys = dict(part.split("-", 1) for part in rel.parts[:-1] if "-" in part)
        old_dirs.add(graphs / rel.parts[0])
        name = path.stem
        if name in drop:
            continue
        new = "/".join(["graphs", *(f"{k}-{keys.get(k, 'null')}" for k in KEYS), path.name])
        moved[f"graphs/{rel.as_posix()}"] = new
        series = merged.setdefault(new, {})
        for point in json.loads(path.read_text()):
            if name == "summary":  # asv's per-environment list (its own page's): one entry per cell
                if point["name"] not in drop:
                    key = (point["name"], point.get("idx"))
                    if key not in series or (point.get("last_rev") or 0) >= (series[key].get("last_rev") or 0):
                        series[key] = point
            else:  # [revision, value(s), ...]
                series[point[0]] = point
    for old in old_dirs:
        shutil.rmtree(old)
    for new, series in merged.items():
        atomic_write_text(graphs.parent / new, json.dumps([series[k] for k in sorted(series, key=_order)]))
    return moved


def _order(key: Any) -> tuple:
    """A series' order as asv writes it: by revision, a number (tachyon draws the points in file order
    and reads the last as the current value); a summary's entries by cell name and index."""
    return (0, key, "") if isinstance(key, (int, float)) else (1, 0, str(key))
