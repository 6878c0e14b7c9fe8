"""Shared test helpers: the repository on sys.path, the CUDA skip marker, temporary implementations.

Tests that need a GPU use ``@requires_cuda`` (``from conftest import requires_cuda``) or the
``cuda`` marker declared in pyproject.toml; both skip without CUDA.
"""

from __future__ import annotations

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
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_CUDA:
        return
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


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
