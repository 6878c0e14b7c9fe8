"""Shared test helpers: the repository on sys.path, the CUDA skip marker, temporary implementations.

Tests that need a GPU use ``@requires_cuda`` (``from conftest import requires_cuda``) or the
``cuda`` marker declared in pyproject.toml; both skip without CUDA.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
# Plain `pytest` (unlike `python -m pytest`) does not put the repository on sys.path.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

HAS_CUDA = torch.cuda.is_available()


def requires_cuda(test):
    """A GPU test: the ``cuda`` marker, which ``-m cuda`` on a GPU box selects, and skipped without CUDA.
    (A skipif alone left the timers' CUDA tests out of every GPU run.)"""
    return pytest.mark.cuda(pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")(test))


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], *expected: str) -> str:
    """Run the CLI in-process (argparse errors exit by SystemExit, ours by return): expect exit 2, the
    ``expected`` texts in its last line, and no ``RELU2_`` variable changed (a refused run leaves none of
    its own behind for the next command in the same process; torch's imports set their own)."""
    from relu2 import cli

    def ours() -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if k.startswith("RELU2_")}

    before = ours()
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert ours() == before, sorted(set(ours().items()) ^ set(before.items()))
    last = err.splitlines()[-1]
    for text in expected:
        assert text in last, last
    return last


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject's addopts): a worker per core for the fast tier, none for anything else. Tests
    that measure (slow) or use the GPU (cuda) run one at a time in one process: side by side they would
    time each other."""
    fast = (config.getoption("markexpr") or "").replace(" ", "") == "notslow"
    return max(1, min(os.cpu_count() or 1, 4)) if fast else 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_CUDA:
        return
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


FIXTURE_GPU = "synthetic H200-like model (not a measurement)"  # tests/fixtures/asv_fixture.GPU


@pytest.fixture(autouse=True, scope="session")
def fixture_noise_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The synthetic fixture's GPU has no noise model of its own, and the gate never judges one GPU with
    another's: for the tests, the shipped models plus the H200's relabelled for the fixture's GPU,
    made default through $RELU2_NOISE_MODEL (subprocesses inherit it)."""
    import os
    from dataclasses import replace

    from relu2.judge import noise

    shipped = noise.load_models(noise.DEFAULT_MODEL_PATH)
    h200 = noise.model_for(shipped, "NVIDIA H200", noise.CROSS_BOX)
    path = tmp_path_factory.mktemp("noise") / "noise_model.json"
    noise.save_models([*shipped, replace(h200, gpu=FIXTURE_GPU)], path)
    before = os.environ.get(noise.MODEL_ENV)
    os.environ[noise.MODEL_ENV] = str(path)
    yield path
    if before is None:
        os.environ.pop(noise.MODEL_ENV, None)
    else:
        os.environ[noise.MODEL_ENV] = before


@pytest.fixture
def temporary_impl() -> Iterator[Callable[..., object]]:
    """Register implementations for one test: ``temporary_impl(name, fn, **kw)``; all are removed after."""
    import relu2

    names: list[str] = []

    def register(name: str, fn: Callable, **kw: object) -> object:
        impl = relu2.register(name, fn, replace=True, **kw)
        names.append(name)
        return impl

    yield register
    for name in names:
        relu2.unregister(name)
