"""The package's floors (issue 37): the contracts of pyproject.toml's [tool.importlinter], checked by
import-linter, and every floor shipped by the wheel."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_floors_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    run = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "Contracts: 4 kept, 0 broken." in run.stdout


def test_every_floor_is_a_package_the_wheel_ships():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    floors = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "relu2").rglob("__init__.py")}
    assert floors <= listed, floors - listed
