"""Where a measurement runs and what it was measured with: device, machine name, git, versions.

``machine_info()`` feeds the extra keys of ``~/.asv-machine.json`` (asv copies them into every
result) and ``relu2 info``.  Every value is a string; "none" means absent, "unknown" unreadable.
torch is imported inside the functions that need it: this module is on ``relu2 --help``'s path.
"""

from __future__ import annotations

import functools
import os
import re
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

from relu2.host.proc import run_child
from relu2.vocab.errors import DeviceError, UsageError

_DRIVER_FILE = Path("/proc/driver/nvidia/version")


# --- the device -----------------------------------------------------------------------------------


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def default_device() -> str:
    """"cuda" when a GPU is visible, else "cpu"."""
    return "cuda" if cuda_available() else "cpu"


def is_cpu_machine(info: Mapping[str, Any]) -> bool:
    """A machine measured without a GPU: its machine.json records ``gpu`` "none" (``machine_info``).
    An unrecorded GPU is not a CPU: the gate and the dashboard share this rule."""
    return str(info.get("gpu", "")).strip().lower() == "none"


def resolve_device(asked: str | None) -> str:
    """``asked`` ("cpu", "cuda") or the default; DeviceError when CUDA is asked for and absent."""
    if asked is None:
        return default_device()
    if asked == "cuda" and not cuda_available():
        raise DeviceError("--device cuda asked for, but torch.cuda.is_available() is False on this machine")
    return asked


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0)


@functools.lru_cache(maxsize=1)  # a process asks once: a compare's label check and its model check share it
def gpu_name_apart(timeout_s: float = 120) -> str:
    """``gpu_name()`` read in a process of its own, so the caller holds no CUDA context beside the
    processes that measure; "" when that process cannot say."""
    here = str(Path(__file__).resolve().parents[2])
    code = f"import sys; sys.path.insert(0, {here!r}); from relu2.host.machine import gpu_name; print(gpu_name())"
    ended = run_child([sys.executable, "-c", code], timeout_s=timeout_s)
    lines = ended.stdout.strip().splitlines()
    return lines[-1].strip() if ended.ok and lines else ""


# GPU models a machine name may name (a token of it: "h200-spare", "ci_a100"); a rack or node name
# such as "b12" or "node-h01" names none.  Others are anyone's names until added here.
GPU_MODELS = frozenset({
    "v100", "t4", "a10", "a10g", "a30", "a40", "a100", "a800", "l4", "l40", "l40s", "h20", "h100", "h200",
    "h800", "gh200", "b100", "b200", "gb200", "b300", "gb300", "mi210", "mi250", "mi250x", "mi300a", "mi300x",
    "mi325x", "mi355x",
})


def _tokens(text: str) -> list[str]:
    return re.split(r"[^a-z0-9]+", text.lower())


def check_label(name: str | None) -> None:
    """UsageError when ``name`` (a --machine for figures about to be measured) names a GPU model
    (GPU_MODELS) that is not this box's GPU (``h200-spare`` on an H100): figures filed under another
    GPU's name are read, on the dashboard and by the cross-box gate, as that GPU's.  The GPU is read
    apart only when the name names a model; where it cannot be read (no GPU, or no answer) nothing is
    refused, since nothing contradicts the name."""
    named = [t for t in _tokens(name or "") if t in GPU_MODELS]
    gpu = gpu_name_apart() if named else ""
    wrong = [t for t in named if gpu and t not in _tokens(gpu)]
    if wrong:
        raise UsageError(f"--machine {name!r} names {wrong[0].upper()}, and this box's GPU is {gpu}: figures "
                         "filed under another GPU's name read as that GPU's (name the box after its own GPU, or "
                         "leave --machine out)")


def machine_name(device: str) -> str:
    """The name results are recorded under: the GPU's name on CUDA ("nvidia-h200"), else the hostname."""
    if device == "cuda":
        return gpu_name().replace(" ", "-").lower()
    return socket.gethostname()


def device_memory_bytes(device: str) -> int:
    """Memory a tensor can live in: the GPU's total memory, or the host's physical memory."""
    if device == "cuda":
        import torch

        return int(torch.cuda.get_device_properties(0).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


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


def machine_info(device: str | None = None) -> dict[str, str]:
    """gpu, driver, cuda, torch, triton and the GPU's L2 in bytes of this machine, as strings; ``device``
    "cpu" (figures measured on the CPU of a GPU box) records no GPU, as the verdict must judge them."""
    import torch

    cuda = torch.cuda.is_available() and device != "cpu"
    return {
        "gpu": gpu_name() if cuda else "none",
        "driver": nvidia_driver_version() if cuda else "none",
        "cuda": torch.version.cuda or "none",
        "torch": torch.__version__,
        # nightly and ROCm builds ship triton under another distribution name
        "triton": _distribution_version("triton", "pytorch-triton", "pytorch-triton-rocm"),
        # the gate's noise bands are in multiples of the L2 (relu2.judge.noise): recorded so no table is needed
        "l2_bytes": str(torch.cuda.get_device_properties(0).L2_cache_size) if cuda else "none",
    }
