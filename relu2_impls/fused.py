"""The fused relu² op of ``csrc/``: JIT-built on first use, cached on disk, called through ``torch.ops.relu2``.

The extension defines ``relu2::relu_squared(Tensor x) -> Tensor`` and
``relu2::relu_squared.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)`` with a C++ kernel for CPU
tensors and, when this machine can build one, a CUDA kernel for CUDA tensors.  This module adds the
fake (meta) kernels, so the op traces under ``torch.compile`` and CUDA graph capture, and the
autograd formula.

The same extension defines ``relu2::vllm_relu_squared(Tensor x) -> Tensor``: a kernel of vLLM's
``relu_squared`` structure (csrc/vllm_relu2_kernel.cu; NaN gives +0 by design), CUDA only: on a CPU
tensor it raises.  It has a fake kernel here and no autograd (vLLM's is inference only).

Builds land in ``<cache root>/<key>``: the cache root is ``$RELU2_CACHE_DIR``, else
``$XDG_CACHE_HOME/relu2``, else ``~/.cache/relu2``; the key is a short sha256 of everything that makes
a build different (source contents, flags, torch, CUDA, GPU archs, Python, platform).  A process that
finds a finished build for its key imports it without invoking the compiler.  ``$RELU2_CSRC_DIR``
points the build at another source folder (tests use it to break the build on purpose).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.resources
import importlib.util
import json
import os
import platform
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable

import torch

__all__ = [
    "BuildError",
    "BuildInfo",
    "build",
    "cache_root",
    "has_cuda",
    "load",
    "relu_squared",
    "source_dir",
    "vllm_relu_squared",
]

ENV_CACHE_DIR = "RELU2_CACHE_DIR"
ENV_CSRC_DIR = "RELU2_CSRC_DIR"

_SOURCE_SUFFIXES = (".cpp", ".cu", ".h", ".cuh")
_MARKER = "relu2-build.json"  # written after a successful build; its presence means "ready to import"
_OUTPUT_TAIL_LINES = 40
_LONG_LINE = 400  # ninja echoes whole compiler command lines; they drown the errors in a tail

# Flags shared by every build.  No -ffast-math / --use_fast_math: NaN handling and subnormals must
# match torch bit for bit.  -fno-trapping-math only declares that FP exception flags are never read,
# which lets GCC turn the CPU loop's selects into vector blends (without it the loop stays scalar:
# "control flow in loop"); rounding, NaN, signed zeros and subnormals are unaffected.
_CFLAGS = ("-O3", "-fno-trapping-math")
_CUDA_CFLAGS = ("-O3", "-lineinfo")
_CUDA_DEFINE = "-DRELU2_WITH_CUDA"

_FUNCTIONAL = "relu2::relu_squared"
_OUT = "relu2::relu_squared.out"
_VLLM = "relu2::vllm_relu_squared"
_VLLM_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # what vLLM's kernel is built for
_SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


class BuildError(RuntimeError):
    """The extension did not build or load; ``output_tail`` holds the end of the compiler's output."""

    def __init__(self, message: str, output_tail: str = "") -> None:
        super().__init__(f"{message}\n{output_tail}".rstrip())
        self.summary = message
        self.output_tail = output_tail


@dataclass(frozen=True)
class BuildInfo:
    """Where the loaded extension lives and how it got there.

    ``seconds`` is the wall time of the build (or of the import alone when ``cached``); ``cuda`` says
    whether the CUDA kernel is in it, and ``why_no_cuda`` why not when it is not.
    """

    directory: Path
    seconds: float
    cuda: bool
    cached: bool
    why_no_cuda: str = ""
    code: str = ""  # the plan's code key: what the build runs (``code_key``)


@dataclass(frozen=True)
class _Plan:
    """Everything one build needs, derived from the environment; ``key`` names it."""

    source_dir: Path
    sources: tuple[Path, ...]  # translation units handed to the compiler
    cflags: tuple[str, ...]
    cuda_cflags: tuple[str, ...]
    cuda: bool
    why_no_cuda: str
    key: str  # names the build: every byte of the sources
    code: str  # names what the build runs: the sources less comments and layout (``code_key``)

    @property
    def name(self) -> str:
        return f"relu2_{'cuda' if self.cuda else 'cpu'}_{self.key}"

    @property
    def directory(self) -> Path:
        return cache_root() / self.key


# The one loaded extension of this process (a TORCH_LIBRARY namespace can be registered only once).
_module: ModuleType | None = None
_info: BuildInfo | None = None
_ops: tuple[torch._ops.OpOverload, torch._ops.OpOverload] | None = None
_vllm_op: torch._ops.OpOverload | None = None
_python_side_registered = False
# Builds that failed in this process, by key.  Retrying one is pointless (same inputs) and would
# mislead: cpp_extension skips a second build of an unchanged extension and only tries to import it.
_failures: dict[str, tuple[str, str]] = {}


# --- where things are ---------------------------------------------------------------------------


def source_dir() -> Path:
    """The folder holding the kernel sources: ``$RELU2_CSRC_DIR``, the installed ``relu2_impls.csrc``, or the repo's ``csrc/``."""
    override = os.environ.get(ENV_CSRC_DIR)
    if override:
        return Path(override).expanduser().resolve()
    try:  # an installed wheel ships csrc/ as the data package relu2_impls.csrc
        candidate = importlib.resources.files("relu2_impls.csrc").joinpath("relu2_ops.cpp")
        if isinstance(candidate, Path) and candidate.is_file():
            return candidate.parent
    except ModuleNotFoundError:
        pass
    repo = Path(__file__).resolve().parent.parent / "csrc"  # a source checkout
    if (repo / "relu2_ops.cpp").is_file():
        return repo
    raise BuildError(f"cannot find the relu2 kernel sources: no relu2_impls.csrc package and no {repo}")


def cache_root() -> Path:
    """The folder under which each build gets its own ``<key>`` subfolder."""
    override = os.environ.get(ENV_CACHE_DIR)
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "relu2"


# --- what to build ------------------------------------------------------------------------------


def _cuda_home() -> str | None:
    """The CUDA toolkit torch.utils.cpp_extension would build with ($CUDA_HOME, nvcc on PATH, /usr/local/cuda)."""
    from torch.utils.cpp_extension import CUDA_HOME

    return CUDA_HOME


def _toolkit_version(cuda_home: str) -> str | None:
    """The toolkit's version (version.json, else CUDA_VERSION in cuda.h), so an upgrade in place rebuilds."""
    root = Path(cuda_home)
    try:
        return json.loads((root / "version.json").read_text())["cuda"]["version"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:  # toolkits installed from wheels or trimmed images often lack version.json
        match = re.search(r"#define\s+CUDA_VERSION\s+(\d+)", (root / "include" / "cuda.h").read_text())
    except OSError:
        return None
    return match.group(1) if match else None


def _why_no_cuda() -> str:
    """"" when a CUDA build is possible here, else the reason it is not."""
    if torch.version.cuda is None:
        return "this torch was built without CUDA"
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False"
    if _cuda_home() is None:
        return "no CUDA toolkit found (set CUDA_HOME to the folder holding bin/nvcc)"
    return ""


def _gencode_flags() -> tuple[str, ...]:
    """One -gencode per distinct compute capability among the visible GPUs (only what is present)."""
    capabilities = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    return tuple(f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}" for major, minor in capabilities)


def _cache_key(files: list[Path], settings: dict, read: Callable[[Path], bytes] = Path.read_bytes) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        digest.update(b"\0")
        digest.update(read(path))
        digest.update(b"\0")
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()[:16]


# A C++/CUDA comment, a string or character literal (kept whole: "//" inside one is no comment), or a
# run of whitespace.  A line comment ending in a backslash goes on to the next line (lines are spliced
# before comments are removed; GCC allows blanks after the backslash).  No raw strings in csrc/; a
# digit separator (1'000) at worst keeps text as it is.
_C_TOKEN = re.compile(r"""//(?:\\[ \t]*\n|[^\n])*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'|\s+""", re.S)


def _without_comments(text: str) -> str:
    """C++ source less its comments and layout: whitespace runs become one space, or one newline where
    they hold one (so preprocessor lines stay lines); literals stay as written."""
    def strip(m: re.Match) -> str:
        token = m.group(0)
        return " " if token.startswith(("//", "/*")) else token
    def squeeze(m: re.Match) -> str:
        token = m.group(0)
        return token if token[0] in "\"'" else "\n" if "\n" in token else " "
    return _C_TOKEN.sub(squeeze, _C_TOKEN.sub(strip, text)).strip()


def _code(path: Path) -> bytes:
    return _without_comments(path.read_text(encoding="utf-8")).encode()


def _plan() -> _Plan:
    root = source_dir()
    files = sorted(p for p in root.iterdir() if p.is_file() and p.suffix in _SOURCE_SUFFIXES)
    why_no_cuda = _why_no_cuda()
    cuda = not why_no_cuda
    suffixes = (".cpp", ".cu") if cuda else (".cpp",)
    sources = tuple(p for p in files if p.suffix in suffixes)
    if not any(p.suffix == ".cpp" for p in sources):
        raise BuildError(f"no C++ sources (*.cpp) in {root}")
    cflags = _CFLAGS + ((_CUDA_DEFINE,) if cuda else ())
    cuda_cflags = (_CUDA_CFLAGS + (_CUDA_DEFINE,) + _gencode_flags()) if cuda else ()
    settings = {
        "cflags": cflags,
        "cuda_cflags": cuda_cflags,
        "sources": [p.name for p in sources],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_home": _cuda_home() if cuda else None,
        "cuda_toolkit": _toolkit_version(_cuda_home()) if cuda else None,
        "python": sys.version,
        "platform": [sys.platform, platform.machine()],
    }
    return _Plan(root, sources, cflags, cuda_cflags, cuda, why_no_cuda, _cache_key(files, settings),
                 _cache_key(files, settings, read=_code))


# --- building and importing ---------------------------------------------------------------------


def _output_tail(text: str) -> str:
    """The last lines of a build log, with ninja's echoed command lines shortened so errors stay visible."""
    lines = text.strip().splitlines()[-_OUTPUT_TAIL_LINES:]
    return "\n".join(line if len(line) <= _LONG_LINE else line[:120] + " ... [command line shortened]" for line in lines)


def _import_built(plan: _Plan) -> ModuleType:
    """Import the built library directly, as cpp_extension would after a no-op ninja run."""
    path = plan.directory / f"{plan.name}.so"
    spec = importlib.util.spec_from_file_location(
        plan.name, path, loader=importlib.machinery.ExtensionFileLoader(plan.name, str(path))
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compile(plan: _Plan, verbose: bool) -> ModuleType:
    """Build with ninja through torch.utils.cpp_extension (which locks the folder against a concurrent build)."""
    from torch.utils.cpp_extension import load as cpp_load

    try:
        plan.directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # not a compiler failure and not a load failure: say which folder, and how to move it
        raise BuildError(f"cannot create the build folder {plan.directory} ({type(e).__name__}: {e.strerror or e}); "
                         f"set {ENV_CACHE_DIR} to a writable folder") from e
    try:
        module = cpp_load(
            name=plan.name,
            sources=[str(p) for p in plan.sources],
            extra_cflags=list(plan.cflags),
            extra_cuda_cflags=list(plan.cuda_cflags),
            build_directory=str(plan.directory),
            with_cuda=plan.cuda,
            is_python_module=True,
            verbose=verbose,
        )
    except Exception as e:  # cpp_extension raises RuntimeError carrying ninja's output
        raise BuildError(f"building the relu2 extension in {plan.directory} failed ({type(e).__name__}); "
                         f"compiler output (tail):", _output_tail(str(e))) from e
    marker = {"name": plan.name, "cuda": plan.cuda, "sources": [str(p) for p in plan.sources],
              "cflags": plan.cflags, "cuda_cflags": plan.cuda_cflags, "torch": torch.__version__}
    (plan.directory / _MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return module


def _build_and_import(verbose: bool) -> tuple[ModuleType, BuildInfo]:
    plan = _plan()
    if plan.key in _failures:
        message, tail = _failures[plan.key]
        raise BuildError(f"{message} (failed earlier in this process; not retried)", tail)
    start = time.perf_counter()
    cached = (plan.directory / _MARKER).is_file() and (plan.directory / f"{plan.name}.so").is_file()
    try:
        module = _import_built(plan) if cached else _compile(plan, verbose)
    except BuildError as e:
        _failures[plan.key] = (e.summary, e.output_tail)
        raise
    except Exception as e:  # built, but the library does not load (missing symbol, wrong ABI, ...)
        message = f"the relu2 extension in {plan.directory} did not load: {type(e).__name__}: {e}"
        _failures[plan.key] = (message, "")
        raise BuildError(message) from e
    info = BuildInfo(plan.directory, time.perf_counter() - start, plan.cuda, cached, plan.why_no_cuda, plan.code)
    return module, info


def build(verbose: bool = False) -> BuildInfo:
    """Build (or find in the cache) and load the extension; what ``relu2 build`` runs.

    Idempotent within a process: once loaded, returns the first load's BuildInfo.  Raises BuildError
    with the compiler output's tail when the build fails.
    """
    global _module, _info
    if _module is None or _info is None:
        module, info = _build_and_import(verbose)
        _register_python_side()
        _module, _info = module, info
    return _info


def load() -> ModuleType:
    """The loaded extension module, building it on first use; raises BuildError when it cannot be built."""
    if _module is None:
        build()
    assert _module is not None
    return _module


def code_key() -> str:
    """What the loaded build runs, as a hash: the cache key's inputs with the sources' comments and
    layout left out (loads it if needed).  A comment or a re-indent in csrc/ is a new build of the same
    kernels (the host code's TORCH_CHECK line numbers and -lineinfo's line table aside), so it keeps the
    fingerprint a compare reads to decide whose work to count."""
    load()
    assert _info is not None
    return _info.code


def has_cuda() -> bool:
    """True when the loaded build contains the CUDA kernel (loads it if needed)."""
    load()
    assert _info is not None
    return _info.cuda


# --- torch.library registrations made from Python ------------------------------------------------


def _check_like_the_kernel(x: torch.Tensor, op: str, out: torch.Tensor | None = None) -> None:
    """The boundary checks of relu2_ops.cpp, with its messages, for the fake kernels."""
    torch._check(
        x.dtype in _SUPPORTED_DTYPES,
        lambda: f"{op}: expected a floating-point tensor (float32, float16, bfloat16, float64), got {x.dtype}",
    )
    if out is None:
        return
    torch._check(out.device == x.device,
                 lambda: f"{op}: out is on {out.device} but x is on {x.device}; they must be on the same device")
    torch._check(out.dtype == x.dtype,
                 lambda: f"{op}: out has dtype {out.dtype} but x has dtype {x.dtype}; they must match")
    torch._check(out.shape == x.shape,
                 lambda: f"{op}: out has shape {list(out.shape)} but x has shape {list(x.shape)}; "
                         "they must match (out is not resized)")


def _fake_relu_squared(x: torch.Tensor) -> torch.Tensor:
    _check_like_the_kernel(x, _FUNCTIONAL)
    return x.new_empty(x.shape)  # contiguous, like the real kernel's output


def _fake_relu_squared_out(x: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    _check_like_the_kernel(x, _OUT, out)
    return out


def _fake_vllm_relu_squared(x: torch.Tensor) -> torch.Tensor:
    # The checks of relu2_ops.cpp's check_vllm_input, with its message.
    torch._check(x.dtype in _VLLM_DTYPES,
                 lambda: f"{_VLLM}: expected float32, float16 or bfloat16 (the dtypes vLLM's kernel is built for), "
                         f"got {x.dtype}")
    return x.new_empty(x.shape)  # contiguous, like the real kernel's output


def _setup_context(ctx, inputs: tuple[torch.Tensor], output: torch.Tensor) -> None:
    (x,) = inputs
    ctx.save_for_backward(x)


def _backward(ctx, grad: torch.Tensor) -> torch.Tensor:
    # d/dx relu(x)² = 2 relu(x): 0 for x <= 0, NaN where x is NaN (as the forward propagates it).
    (x,) = ctx.saved_tensors
    return grad * 2 * torch.relu(x)


def _register_python_side() -> None:
    """Fake kernels and autograd for the ops the library just defined; once per process."""
    global _python_side_registered, _ops, _vllm_op
    if _python_side_registered:
        return
    torch.library.register_fake(_FUNCTIONAL)(_fake_relu_squared)
    torch.library.register_fake(_OUT)(_fake_relu_squared_out)
    torch.library.register_autograd(_FUNCTIONAL, _backward, setup_context=_setup_context)
    torch.library.register_fake(_VLLM)(_fake_vllm_relu_squared)
    _ops = (torch.ops.relu2.relu_squared.default, torch.ops.relu2.relu_squared.out)
    _vllm_op = torch.ops.relu2.vllm_relu_squared.default
    _python_side_registered = True


# --- the op -------------------------------------------------------------------------------------


def relu_squared(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """relu(x)² by the fused kernel: a new contiguous tensor, or written into ``out`` (returned).

    Any strides are accepted (the input is made contiguous at the op's boundary); ``out`` must match
    ``x`` in shape, dtype and device.  Builds the extension on first use.
    """
    if _ops is None:
        load()
    assert _ops is not None
    functional, out_variant = _ops
    if out is None:
        return functional(x)
    return out_variant(x, out=out)


def vllm_relu_squared(x: torch.Tensor) -> torch.Tensor:
    """relu(x)² by the kernel of vLLM's structure (csrc/vllm_relu2_kernel.cu): NaN gives +0, not NaN.

    CUDA tensors of float32, float16 or bfloat16 only (the op raises on a CPU tensor); any strides
    (made contiguous at the op's boundary).  Builds the extension on first use.
    """
    if _vllm_op is None:
        load()
    assert _vllm_op is not None
    return _vllm_op(x)
