"""An asv benchmark name and its parameters <-> a cell, in one place (relu2.records.asv_names), and the
judging wing's shape: torch-free, decoded once, no import cycle."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from relu2.records import asv_names
from relu2.records.asv_names import SUITE_DTYPES, decode, encode
from relu2.vocab.schema import MODE_NAMES, format_shape

ROOT = Path(__file__).resolve().parents[1]


def _suites():
    from benchmarks import bench_relu2 as b

    return b


def test_every_token_suite_s_dtype_is_decoded_from_the_suite_not_assumed():
    b = _suites()
    token_suites = [s for s in b.SUITES if "tokens" in s.param_names]
    assert {s.__name__ for s in token_suites} == set(SUITE_DTYPES)
    for suite in token_suites:
        assert SUITE_DTYPES[suite.__name__] == suite.dtype  # the suite's own, from relu2.vocab.schema
        cell = decode(f"bench_relu2.{suite.__name__}.track_hot", (("impl", "fused"), ("tokens", "8"),
                                                                   ("hidden", "3712")), "seconds")
        assert cell.dtype == suite.dtype


@pytest.mark.parametrize("suite_name", ["Grid", "ModelShapes", "VllmShapes", "Nemotron", "WarmupOrder"])
def test_encode_and_decode_name_each_suite_cell_as_the_suite_does(suite_name):
    b = _suites()
    suite = getattr(b, suite_name)
    for combo in itertools.islice(itertools.product(*suite.params), 40):
        expected = suite.cell(*combo)
        named = dict(zip(suite.param_names, combo))
        kwargs = ({"dtype": named["dtype"], "numel": named["numel"]} if suite_name == "Grid"
                  else {"tokens": named["tokens"], "hidden": named["hidden"]})
        for mode in MODE_NAMES:
            benchmark, params = encode(suite_name, mode, named["impl"], **kwargs)
            assert benchmark == f"bench_relu2.{suite_name}.track_{mode}"  # the names asv history keys by
            assert hasattr(suite, benchmark.rsplit(".", 1)[-1])
            assert [k for k, _ in params] == list(suite.param_names)
            cell = decode(benchmark, params, "seconds")
            assert (cell.impl, cell.dtype, cell.shape, cell.measure) == (
                expected.impl, expected.dtype, format_shape(expected.shape), mode)


def test_a_token_suite_cannot_be_encoded_in_another_dtype():
    with pytest.raises(ValueError, match="bfloat16 only"):
        encode("Nemotron", "hot", "fused", dtype="float16", tokens=8, hidden=3712)


def test_the_summaries_and_the_side_figures_decode():
    assert decode("bench_relu2.Implementations.track_fused", (), "seconds").measure == asv_names.SUMMARY
    assert decode("bench_relu2.Grid.track_kernel", (("impl", "fused"),), "kernel id").measure == asv_names.KERNEL
    assert asv_names.measure_of("bench_relu2.Grid.track_hot(impl=fused)") == "hot"
    assert asv_names.unit_of("bench_relu2.Grid.track_peak_memory") == "bytes"


def test_a_benchmark_name_is_decoded_in_one_place():
    # (Which floor imports which: tests/test_layers.py, by import-linter.)
    sources = {p.stem: p.read_text() for p in (ROOT / "relu2").rglob("*.py")}
    decoders = [name for name, text in sources.items() if 'removeprefix("track_")' in text]
    assert decoders == ["asv_names"]


def test_the_readers_and_help_import_no_torch():
    code = ("import sys; import relu2.judge.gate, relu2.judge.noise, relu2.records.asv_names; from relu2 import cli; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    # relu2 --help reads constants only, and imports no torch to build them
    code = ("import sys, contextlib, io\nfrom relu2 import cli\nwith contextlib.redirect_stdout(io.StringIO()):\n"
            "    try: cli.main(['gate', '--help'])\n    except SystemExit: pass\n"
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
