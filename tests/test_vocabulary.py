"""One vocabulary (relu2.vocab.schema), derived everywhere, importable without torch.

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
from pathlib import Path

import pytest

from conftest import ROOT
from relu2.measure import registry
from relu2.vocab import schema
from relu2.records.rows import Row, make_row, read_csv, write_csv

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
        import relu2, relu2.cli, relu2.vocab.schema, relu2.records.rows, relu2.show.table, relu2.measure.sweep, relu2.host.machine
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


def _declared() -> dict[str, str]:
    """This repository's implementations: pyproject.toml's entry points of interface 1."""
    import tomllib

    from relu2.vocab.interface import ENTRY_POINT_GROUP

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][ENTRY_POINT_GROUP]


def _literals(path) -> set[str]:
    import ast

    return {node.value for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Constant)
            and isinstance(node.value, str)}


def test_the_instrument_knows_the_measured_package_only_through_interface_1():
    """No implementation of this repository is named in the schema, the command line or relu2 inspect,
    and neither imports relu2_impls (issue 31): they reach it through entry points."""
    import ast

    names = set(_declared()) - {"triton"}  # also the language inductor writes kernels in (relu2 inspect says so)
    for module in ("vocab/schema.py", "cli.py", "show/inspect.py"):
        path = ROOT / "relu2" / module
        assert not names & _literals(path), (module, names & _literals(path))
        imports = {getattr(node, "module", None) or alias.name for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
        assert not {i for i in imports if i and i.startswith("relu2_impls")}, (module, imports)
    assert set(schema.REFERENCES) == set(registry.REFERENCES)


def test_every_implementation_drawn_together_has_a_style_of_its_own():
    names = [*_declared(), *schema.REFERENCES, "vllm", "mykernel", "toy"]
    styles = [schema.impl_style(n, among=names) for n in names]
    assert len(set(styles)) == len(names), dict(zip(names, styles))
    assert schema.impl_style("fused", among=names) == schema.impl_style("fused", among=names)  # stable
    assert schema.impl_style("vllm").colour in schema.IMPL_COLOURS and schema.impl_style("eager").marker == "o"
    assert schema.impl_order(["zeta", "fused", "copy", "alpha", "eager"]) == ["eager", "copy", "alpha", "fused", "zeta"]


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
    def same(a, b) -> bool:  # NaN, no figure, reads back as NaN
        return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))

    assert all(same(getattr(back, c), getattr(row, c)) for c in schema.COLUMN_NAMES if c != "roofline_fraction")


# --- extending the vocabulary: what one change touches ---------------------------------------------

ADD_METRIC = """
    # the whole change: one Column appended in relu2/schema.py
    import relu2.vocab.schema as s
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
        from relu2.records import asv_results
        from relu2.show import table as report
        from relu2.records.rows import read_csv, write_csv
        from relu2.vocab.schema import grid_cells
        from relu2.measure.sweep import run_cells
        from relu2.measure.timing import Budget

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
    import relu2.vocab.schema as s
    s.MODES = s.MODES + (s.Mode("warm2", "warm twice", "-.", "hot, timed again", first_asv_version="1"),)
    s.MODE_NAMES = tuple(m.name for m in s.MODES)
    import relu2.measure.timing as t
    t.TIMERS["cpu"]["warm2"] = t.TIMERS["cpu"]["hot"]
    t.TIMERS["cuda"]["warm2"] = t.TIMERS["cuda"]["hot"]
"""


@pytest.mark.slow
def test_adding_a_mode_touches_the_schema_and_the_timers(tmp_path):
    _python(patch=ADD_MODE, code=f"""
        from pathlib import Path
        from relu2 import cli
        from relu2.measure import sweep
        from relu2.records.rows import read_csv
        from relu2.measure.timing import Budget
        import functools
        sweep.run_resumable = functools.partial(sweep.run_resumable, budget=Budget(samples=2, sample_ms=0.1, max_calls=4))
        from relu2.show import plot
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


ADD_FIGURE = """
    # the whole change (issue 37: a measured figure in at most 3 files): a CellFigure in
    # relu2/vocab/schema.py, and its producer in relu2/measure/figures.py
    import relu2.vocab.schema as s
    figure = s.CellFigure("elements_seen", "elements_seen", "count", "elements the toy producer saw", "1",
                          header="seen", format=str)
    s.CELL_FIGURES = s.CELL_FIGURES + (figure,)
    s.CELL_FIGURE_METHODS[figure.method] = figure
    s.COLUMNS = s.COLUMNS + (s.Column(figure.column, float, figure.doc, unit="count", default=float("nan"),
                                      header=figure.header, format=figure.format),)
    s.COLUMN_NAMES = tuple(c.name for c in s.COLUMNS)
    import relu2.measure.figures as f
    f.PRODUCERS = f.PRODUCERS + (lambda cells, device: ({c: {"elements_seen": float(c.numel)} for c in cells}, ""),)
"""


def test_a_measured_figure_is_a_line_in_the_schema_and_its_producer(tmp_path):
    _python(patch=ADD_FIGURE, code=f"""
        from pathlib import Path
        from relu2 import cli
        from relu2.measure import sweep
        from relu2.records.rows import read_csv
        from relu2.records.asv_names import decode, unit_of
        from relu2.measure.timing import Budget
        import functools
        sweep.run_resumable = functools.partial(sweep.run_resumable, budget=Budget(samples=2, sample_ms=0.1, max_calls=4))
        out = Path({str(tmp_path / 'out')!r})
        code = cli.main(["sweep", "--device", "cpu", "--impl", "eager", "--dtype", "float32", "--sizes", "1024,4096",
                         "--modes", "hot", "--no-progress", "--in-process", "--out", str(out)])
        assert code == 0, code
        rows = read_csv(out / "sweep.csv")
        assert {{(r.impl, r.elements_seen) for r in rows}} == {{("eager", 1024.0), ("eager", 4096.0),
                                                               ("copy", 1024.0), ("copy", 4096.0)}}
        import benchmarks.bench_relu2 as b
        assert b.Grid.track_elements_seen.version == "1" and b.Grid.track_elements_seen.unit == "count"
        assert unit_of("bench_relu2.Grid.track_elements_seen") == "count"
        assert decode("bench_relu2.Grid.track_elements_seen", (("impl", "eager"),), "count").measure == "elements_seen"
    """)


CLAMP = '''"""relu² as a clamp: max(x, 0)², a new built-in: this module and its line in pyproject.toml."""

from relu2.vocab.interface import Implementation


def relu_squared_clamp(x):
    import torch

    return torch.square(torch.clamp(x, min=0))


def clamp():
    return Implementation("clamp", relu_squared_clamp, description="torch.clamp(x, min=0) squared")
'''


def _reinstalled(checkout, site) -> None:
    """What ``pip install -e .`` does for the entry points: the installed metadata of ``checkout``'s
    pyproject.toml, in ``site`` (first on the path, so it is the distribution found)."""
    import tomllib

    project = tomllib.loads((checkout / "pyproject.toml").read_text())["project"]
    info = site / "relu2_bench-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for group, eps in project["entry-points"].items()))


@pytest.mark.slow
def test_a_builtin_is_added_in_two_files(tmp_path):
    """A new built-in: its module in relu2_impls/ and one line in pyproject.toml, then the reinstall
    (entry points are read from installed metadata).  It is then registered, checked, swept by default,
    drawn in a style of its own and measured by every asv suite; no other file changes (issue 31)."""
    import shutil

    checkout = tmp_path / "checkout"
    for part in ("relu2", "relu2_impls", "benchmarks", "csrc", "pyproject.toml"):
        (shutil.copytree if (ROOT / part).is_dir() else shutil.copy)(ROOT / part, checkout / part)
    before = {p.relative_to(checkout): p.read_bytes() for p in checkout.rglob("*") if p.is_file()}
    (checkout / "relu2_impls" / "clamp.py").write_text(CLAMP)
    pyproject = checkout / "pyproject.toml"
    group = '[project.entry-points."relu2.implementations"]\n'
    pyproject.write_text(pyproject.read_text().replace(group, group + 'clamp = "relu2_impls.clamp:clamp"\n'))
    after = {p.relative_to(checkout): p.read_bytes() for p in checkout.rglob("*") if p.is_file()}
    assert {p for p in after if before.get(p) != after[p]} == {Path("relu2_impls/clamp.py"), Path("pyproject.toml")}
    _reinstalled(checkout, tmp_path / "site")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(checkout)])}
    code = f"""
        import functools, relu2
        from pathlib import Path
        assert Path(relu2.__file__).is_relative_to({str(checkout)!r})
        from relu2 import cli
        from relu2.measure import sweep
        from relu2.vocab import schema
        from relu2.records.rows import read_csv
        from relu2.measure.timing import Budget
        sweep.run_resumable = functools.partial(sweep.run_resumable, budget=Budget(samples=2, sample_ms=0.1, max_calls=4))
        assert cli.main(["check", "--device", "cpu", "--impl", "clamp", "--dtype", "float32"]) == 0
        assert "clamp" in sweep.default_names()
        assert cli.main(["sweep", "--device", "cpu", "--impl", "eager,clamp", "--dtype", "float32",
                         "--sizes", "1024", "--modes", "hot", "--no-progress", "--out", {str(out)!r}]) == 0
        assert {{r.impl for r in read_csv(Path({str(out)!r}) / "sweep.csv")}} == {{"eager", "clamp", "copy"}}
        import benchmarks.bench_relu2 as b
        assert "clamp" in b.Grid.params[0] and "clamp" in b.WarmupOrder.params[0]
    """
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=checkout, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (out / "latency.png").exists()


def test_the_status_words_are_literals_only_in_the_schema():
    """ok/failed/skipped are relu2.vocab.schema.OK/FAILED/SKIPPED everywhere else (issue 19)."""
    import io
    import tokenize

    pending: set[str] = set()
    words = {repr(s) for s in schema.STATUSES} | {f'"{s}"' for s in schema.STATUSES}
    found = []
    for path in sorted((ROOT / "relu2").rglob("*.py")):
        if path.name == "schema.py" or path.name in pending:
            continue
        tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        found += [f"{path.name}:{t.start[0]} {t.string}" for t in tokens
                  if t.type == tokenize.STRING and t.string in words]
    assert not found, found
