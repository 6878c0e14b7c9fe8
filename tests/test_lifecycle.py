"""The exit status when a signal lands inside string-``exec``'d code, in a guarded run and under
``relu2.cli``'s hold of Ctrl-C outside one (fast; the whole commands' interrupts are tests/test_interrupt.py).

``python -m`` is how the tests, asv and CI start relu2, and CPython's ``-m`` path turns a caught plain
``KeyboardInterrupt`` that left string-``exec``'d code into a death by SIGINT: exit -2 where 130 is
said.  A sweep's SIGTERM landing while a module made a dataclass did that in CI.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from conftest import ROOT

RUN = """\
import os, signal, sys, time
from relu2.host.lifecycle import guard, interrupts
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a shell, whatever the test runner ignores
try:
    with {block}:
        exec("os.kill(os.getpid(), signal.SIG{name})\\nfor _ in range(500):\\n    time.sleep(0.01)")
    sys.exit(0)
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.mark.parametrize("name, block", [("INT", 'guard("probe")'), ("TERM", 'guard("probe")'), ("INT", "interrupts()")])
def test_a_signal_inside_exec_d_code_still_exits_130_under_python_m(tmp_path, name, block):
    """In a guarded run, and outside one where relu2.cli's ``interrupts`` holds Ctrl-C."""
    (tmp_path / "probe_run.py").write_text(RUN.format(name=name, block=block))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", "probe_run"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 130, (done.returncode, done.stderr[-2000:])
    if block.startswith("guard"):
        assert f"probe: interrupted (SIG{name})" in done.stderr, done.stderr
