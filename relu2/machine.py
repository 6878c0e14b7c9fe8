"""What a result was measured with: GPU, driver, CUDA, torch and triton versions.

``machine_info()`` feeds the extra keys of ``~/.asv-machine.json`` (asv copies them into every
result) and ``relu2 info``.  Every value is a string; "none" means absent, "unknown" unreadable.
"""

from __future__ import annotations

import re
import subprocess
from importlib import metadata
from pathlib import Path

import torch

_DRIVER_FILE = Path("/proc/driver/nvidia/version")


def nvidia_driver_version() -> str:
    """The NVIDIA kernel driver version ("550.54.15"), "none" without one, "unknown" if unreadable."""
    try:
        text = _DRIVER_FILE.read_text()
    except OSError:
        text = ""
    match = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+(?:\.\d+)+)", text)
    if match:
        return match.group(1)
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout.strip()
    except FileNotFoundError:
        return "none"
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.splitlines()[0].strip() if out else "unknown"


def _distribution_version(*names: str) -> str:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "none"


def machine_info() -> dict[str, str]:
    """gpu, driver, cuda, torch and triton of this machine, as strings."""
    cuda = torch.cuda.is_available()
    return {
        "gpu": torch.cuda.get_device_name(0) if cuda else "none",
        "driver": nvidia_driver_version() if cuda else "none",
        "cuda": torch.version.cuda or "none",
        "torch": torch.__version__,
        # nightly and ROCm builds ship triton under another distribution name
        "triton": _distribution_version("triton", "pytorch-triton", "pytorch-triton-rocm"),
    }
