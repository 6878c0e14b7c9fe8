"""The quiet-machine check before measuring (relu2.host.busy): GPU compute processes and CPU load."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from relu2 import cli
from relu2.host import busy as quiet

LISTING = Path(__file__).parent / "fixtures" / "nvidia-smi-compute-apps.csv"


def test_a_recorded_nvidia_smi_listing_is_read_app_by_app():
    apps = quiet.parse_compute_apps(LISTING.read_text())
    assert [(a.pid, a.name, a.used_mib) for a in apps] == [
        (2417033, "/usr/bin/python3.12", 81920.0), (2417950, "/opt/venv/bin/python", 1536.0), (1999, "[N/A]", None)]
    assert quiet.parse_compute_apps("2417033, python, 10\n") == [quiet.GpuApp(2417033, "python", 10.0)]  # nounits
    assert quiet.parse_compute_apps("No running processes found\n\n") == []


def test_another_process_on_the_gpu_makes_the_machine_not_quiet(monkeypatch):
    monkeypatch.setattr(quiet, "gpu_apps", lambda: quiet.parse_compute_apps(LISTING.read_text()))
    seen = quiet.check(window_s=0.0, own={2417950})  # one of them is this run's
    assert [a.pid for a in seen.gpu] == [2417033, 1999]
    assert seen.quiet is False
    keys = seen.machine_keys()
    assert keys["quiet"] == "no" and "2 other processes on the GPU (pid 2417033 python3.12, 81920 MiB" in keys["busy"]


def test_cpu_use_is_counted_per_process_between_two_samples():
    before = {1: ("busy", 100), 2: ("idle", 50), 3: ("ours", 0), 4: ("reused", 0)}
    after = {1: ("busy", 190), 2: ("idle", 51), 3: ("ours", 100), 4: ("other", 100), 5: ("new", 100)}
    found = quiet.busy_between(before, after, seconds=1.0, hz=100, own={3})
    assert [(b.pid, round(b.cores, 2)) for b in found] == [(1, 0.9)]  # idle below the line; new and reused unknown


@pytest.fixture
def busy():
    """Two processes already spinning (their interpreters' start-up stays out of the check's window):
    one spinner counted from its start got 0.37 of a core in the window on a 2-core box under the
    suite's own two workers, below QUIET_CORES, and the machine read quiet."""
    spinners = [subprocess.Popen([sys.executable, "-c", "print(flush=True)\nwhile True: pass"], stdout=subprocess.PIPE)
                for _ in range(2)]
    for p in spinners:
        p.stdout.readline()
    yield spinners[0]
    for p in spinners:
        p.kill()
        p.wait()
        p.stdout.close()


def test_a_busy_process_is_reported(busy):
    seen = quiet.check(gpu=False, window_s=1.0)
    assert busy.pid in [b.pid for b in seen.cpu], seen.cpu
    assert seen.quiet is False and "other processes used" in seen.busy()  # names the busiest (on a shared box,
    # maybe not this one)


def test_require_idle_refuses_to_start_and_writes_nothing(tmp_path, busy, capsys):
    out = tmp_path / "out"
    code = cli.main(["sweep", "--sizes", "1024", "--impl", "eager", "--dtype", "float32", "--modes", "hot",
                     "--out", str(out), "--no-progress", "--require-idle"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "--require-idle" in err and "other processes used" in err
    assert not out.exists()


def test_asv_run_require_idle_refuses_before_the_machine_is_recorded(tmp_path, busy):
    from conftest import ROOT

    run = subprocess.run([sys.executable, "-m", "relu2", "asv", "run", "--require-idle", "--machine", "idle",
                          "--bench", "Grid.track_hot", "HEAD^!"], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, HOME=str(tmp_path)), timeout=300)
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "--require-idle" in run.stderr and "other processes used" in run.stderr
    assert not (tmp_path / ".asv-machine.json").exists()
