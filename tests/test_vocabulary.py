"""One vocabulary (relu2.schema), derived everywhere, importable without torch.

The extension tests run in a fresh interpreter that edits only the files the design says a change
touches (schema.py for a derived metric; schema.py and timing.py for a mode; registry.py and
schema.py for a built-in), then checks the change reaches the sweep, the CSV, the table, the plots
and the asv reader or suites.
"""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

from conftest import ROOT
from relu2 import registry, schema
from relu2.results import Row, make_row, read_csv, write_csv

# Makes `import torch` fail, as on a machine where torch is broken or absent.
NO_TORCH = "import sys; sys.modules['torch'] = None\n"


def _python(code: str, patch: str = "", timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter; ``patch`` runs first in it and in every process it starts
    (a sitecustomize module), as if the files it edits had been edited."""
    with tempfile.TemporaryDirectory() as site:
        env = dict(os.environ)
        if patch:
            with open(os.path.join(site, "sitecustomize.py"), "w") as f:
                f.write(textwrap.dedent(patch))
            env["PYTHONPATH"] = os.pathsep.join([site, str(ROOT), env.get("PYTHONPATH", "")])
        run = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True,
                             text=True, timeout=timeout, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    return run


def test_package_cli_and_suites_import_without_torch():
    _python(patch=NO_TORCH, code="""
        import relu2, relu2.cli, relu2.schema, relu2.results, relu2.report, relu2.sweep, relu2.machine
        import benchmarks.bench_relu2
        assert relu2.__version__
        for argv in (["--help"], ["sweep", "--help"], ["gate", "--help"], ["export", "--help"]):
            try:
                relu2.cli.main(argv)
            except SystemExit as e:
                assert e.code == 0
    """)


def test_public_names_load_on_first_use():
    run = _python("""
        import sys, relu2
        assert "torch" not in sys.modules
        assert callable(relu2.implementations) and callable(relu2.relu_squared)
        assert "torch" in sys.modules
        assert sorted(relu2.__all__) == relu2.__all__ and "check_agreement" in dir(relu2)
        try:
            relu2.no_such_name
        except AttributeError as e:
            print(e)
    """)
    assert "no attribute 'no_such_name'" in run.stdout


def test_schema_builtins_are_the_registry_builtins():
    """BUILTIN_STYLES names exactly the instrument's references and this repository's entry points
    (pyproject.toml's interface-1 group): a new implementation gets its display style with it."""
    import tomllib

    from relu2.interface import ENTRY_POINT_GROUP

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][ENTRY_POINT_GROUP]
    assert set(schema.BUILTIN_IMPLS) == set(registry.REFERENCES) | set(declared)
    assert len(schema.BUILTIN_IMPLS) == len(set(schema.BUILTIN_IMPLS))
    assert schema.BASELINE in schema.BUILTIN_IMPLS and schema.ROOFLINE in schema.BUILTIN_IMPLS


def test_plugins_get_a_stable_style_of_their_own():
    style = schema.impl_style("vllm")
    assert style == schema.impl_style("vllm")
    assert style.colour in schema.PLUGIN_COLOURS and style.marker in schema.PLUGIN_MARKERS
    assert schema.impl_order(["zeta", "fused", "alpha", "eager"]) == ["eager", "fused", "alpha", "zeta"]


def test_row_is_the_schema_columns_and_derives_its_metrics():
    assert tuple(Row.__dataclass_fields__) == schema.COLUMN_NAMES
    row = make_row(machine="m", commit="c", date="d", impl="fused", dtype="bfloat16", numel=1024, shape="1024",
                   mode="hot", status="ok", median_s=2e-6, q25_s=1.9e-6, q75_s=2.1e-6, copy_median_s=1e-6)
    assert row.bytes == 4096 and math.isclose(row.gbps, 4096 / 2e-6 / 1e9)
    assert math.isclose(row.roofline_fraction, 0.5) and row.flags == "" and math.isnan(row.peak_bytes)
    failed = make_row(machine="m", commit="c", date="d", impl="fused", dtype="bfloat16", numel=1024, shape="1024",
                      mode="hot", status="failed", reason="boom", median_s=1.0)
    assert math.isnan(failed.median_s) and math.isnan(failed.gbps) and failed.bytes == 4096


def test_an_older_csv_without_the_newer_columns_still_loads(tmp_path):
    old = ROOT / "docs" / "data" / "h200-sweep-large-db3000d.csv"
    with open(old) as f:
        header = next(csv.reader(f))
    assert "peak_bytes" not in header and "flags" not in header  # written before those columns existed
    rows = read_csv(old)
    assert rows and all(math.isnan(r.peak_bytes) for r in rows)
    # a CSV without a derived column gets it derived again, roofline from its own copy rows
    trimmed = tmp_path / "trimmed.csv"
    with open(old) as f, open(trimmed, "w", newline="") as g:
        reader = csv.DictReader(f)
        kept = [c for c in reader.fieldnames if c not in ("gbps", "roofline_fraction")]
        writer = csv.DictWriter(g, kept, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(reader)
    again = read_csv(trimmed)
    for a, b in zip(rows, again):
        assert (a.gbps == b.gbps or math.isnan(a.gbps) and math.isnan(b.gbps))
        assert (math.isclose(a.roofline_fraction, b.roofline_fraction) or
                math.isnan(a.roofline_fraction) and math.isnan(b.roofline_fraction))


def test_a_csv_missing_a_measured_column_is_refused_by_name(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("machine,commit\nbox,abc\n")
    with pytest.raises(ValueError, match="missing columns: date, impl"):
        read_csv(bad)
    binary = tmp_path / "garbage.csv"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ValueError, match="garbage.csv"):
        read_csv(binary)


def test_write_then_read_round_trips(tmp_path):
    row = make_row(machine="m", commit="c", date="d", impl="fused", dtype="float32", numel=8, shape="2x4",
                   mode="cold", status="ok", median_s=1e-6, q25_s=1e-6, q75_s=3e-6, peak_bytes=64.0)
    write_csv([row], tmp_path / "r.csv")
    (back,) = read_csv(tmp_path / "r.csv")
    assert back.flags == row.flags == "wide-iqr" and back.peak_bytes == 64.0
    assert [getattr(back, c) for c in schema.COLUMN_NAMES if c != "roofline_fraction"] == \
        [getattr(row, c) for c in schema.COLUMN_NAMES if c != "roofline_fraction"]


# --- extending the vocabulary: what one change touches ---------------------------------------------

ADD_METRIC = """
    # the whole change: one Column appended in relu2/schema.py
    import relu2.schema as s
    s.COLUMNS = s.COLUMNS + (s.Column("ns_per_element", float, "median per element", unit="ns",
        derive=lambda v: v["median_s"] / v["numel"] * 1e9, default=float("nan"), header="ns/elt",
        format=lambda x: f"{x:.3f}"),)
    s.COLUMN_NAMES = tuple(c.name for c in s.COLUMNS)
"""


def test_adding_a_derived_metric_touches_only_the_schema(tmp_path):
    fixtures = ROOT / "tests" / "fixtures"
    _python(patch=ADD_METRIC, code=f"""
        import math, sys
        sys.path.insert(0, {str(fixtures)!r})
        import asv_fixture as fx
        from relu2 import asv_results, report
        from relu2.results import read_csv, write_csv
        from relu2.schema import grid_cells
        from relu2.sweep import run_cells
        from relu2.timing import Budget

        rows = run_cells(grid_cells(["eager"], ["float32"], [1024]), ["hot"], "cpu",
                         budget=Budget(samples=2, sample_ms=0.1, max_calls=4))
        assert all(math.isclose(r.ns_per_element, r.median_s / 1024 * 1e9) for r in rows)
        assert "ns/elt" in report.format_table(rows)
        write_csv(rows, {str(tmp_path / 'm.csv')!r})
        assert "ns_per_element" in open({str(tmp_path / 'm.csv')!r}).readline()
        asv_rows = asv_results.load_rows(fx.RESULTS)
        ok = [r for r in asv_rows if r.status == "ok"]
        assert ok and all(math.isclose(r.ns_per_element, r.median_s / r.numel * 1e9) for r in ok)
    """)


ADD_MODE = """
    # the whole change: a Mode in relu2/schema.py, its timers in relu2/timing.py
    import relu2.schema as s
    s.MODES = s.MODES + (s.Mode("warm2", "warm twice", "-.", "hot, timed again", first_asv_version="1"),)
    s.MODE_NAMES = tuple(m.name for m in s.MODES)
    import relu2.timing as t
    t.TIMERS["cpu"]["warm2"] = t.TIMERS["cpu"]["hot"]
    t.TIMERS["cuda"]["warm2"] = t.TIMERS["cuda"]["hot"]
"""


def test_adding_a_mode_touches_the_schema_and_the_timers(tmp_path):
    _python(patch=ADD_MODE, code=f"""
        from pathlib import Path
        from relu2 import cli, sweep
        from relu2.results import read_csv
        from relu2.timing import Budget
        import functools
        sweep.run_resumable = functools.partial(sweep.run_resumable, budget=Budget(samples=2, sample_ms=0.1, max_calls=4))
        from relu2 import plot
        drawn, legend = [], plot._legend
        plot._legend = lambda fig, impls, modes, *extra: (drawn.append(list(modes)), legend(fig, impls, modes, *extra))[1]
        out = Path({str(tmp_path / 'out')!r})
        code = cli.main(["sweep", "--device", "cpu", "--impl", "eager", "--dtype", "float32", "--sizes", "1024,4096",
                         "--modes", "hot,warm2", "--no-progress", "--out", str(out)])
        assert code == 0, code
        assert {{r.mode for r in read_csv(out / "sweep.csv")}} == {{"hot", "warm2"}}
        assert (out / "latency.png").exists()
        # the new mode is a line of the latency and bandwidth plots (drawn first and second), beside hot
        assert drawn[:2] == [["hot", "warm2"], ["hot", "warm2"]], drawn
        import benchmarks.bench_relu2 as b
        assert b.Grid.track_warm2.version == "1"
    """)


ADD_IMPL = """
    # the whole change: a factory in relu2_impls/entry_points.py with its line in pyproject.toml (an
    # entry point; simulated here by the registry entry it becomes), a style in relu2/schema.py
    import torch
    import relu2.schema as s
    from relu2 import registry
    s.BUILTIN_STYLES = {**s.BUILTIN_STYLES, "clamp": s.Style("#F0E442", "h")}
    s.BUILTIN_IMPLS = tuple(s.BUILTIN_STYLES)
    registry._registry["clamp"] = lambda: registry.Implementation("clamp", lambda x: torch.clamp(x, min=0).square())
"""


def test_adding_a_builtin_touches_the_implementations_and_the_schema(tmp_path):
    _python(patch=ADD_IMPL, code=f"""
        from pathlib import Path
        import functools
        from relu2 import cli, sweep, schema
        from relu2.results import read_csv
        from relu2.timing import Budget
        sweep.run_resumable = functools.partial(sweep.run_resumable, budget=Budget(samples=2, sample_ms=0.1, max_calls=4))
        assert cli.main(["check", "--device", "cpu", "--impl", "clamp", "--dtype", "float32"]) == 0
        out = Path({str(tmp_path / 'out')!r})
        assert cli.main(["sweep", "--device", "cpu", "--impl", "eager,clamp", "--dtype", "float32",
                         "--sizes", "1024", "--modes", "hot", "--no-progress", "--out", str(out)]) == 0
        assert {{r.impl for r in read_csv(out / "sweep.csv")}} == {{"eager", "clamp", "copy"}}
        assert schema.impl_style("clamp").marker == "h"
    """)


def test_the_status_words_are_literals_only_in_the_schema():
    """ok/failed/skipped are relu2.schema.OK/FAILED/SKIPPED everywhere else (issue 19)."""
    import io
    import tokenize

    pending: set[str] = set()
    words = {repr(s) for s in schema.STATUSES} | {f'"{s}"' for s in schema.STATUSES}
    found = []
    for path in sorted((ROOT / "relu2").glob("*.py")):
        if path.name == "schema.py" or path.name in pending:
            continue
        tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        found += [f"{path.name}:{t.start[0]} {t.string}" for t in tokens
                  if t.type == tokenize.STRING and t.string in words]
    assert not found, found
