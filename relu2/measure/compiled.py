"""How the instrument runs a ``torch.compile``'d implementation: guarded, warmed up and fingerprinted.

What is compiled, and how (``relu2.vocab.interface.Compile``: dynamic or not, the options, the warm-up
shape), is the implementation's own definition and comes from the package under test (vLLM's calls
are in ``relu2_impls.vllm``); this module is the instrument's part, the same for every commit:

* **The warm-up.**  A dynamic-shape kernel is generated for the first shape it meets (its size
  hints pick the launch configuration) and then serves every shape.  In vLLM the first forward is
  the memory-profiling run at the maximum number of batched tokens, so before a cell of shape
  (tokens, *rest) is first measured, a dynamic path is called on (warm-up tokens, *rest), untimed.
* **The compiler state.**  The caches are private to each worker process and start empty
  (``relu2.measure.isolation``); inductor's config for a path is what its definition passes as options.
* **The guard.**  Dynamo's recompile limit is raised and hitting it raises CompileFallbackError:
  by default dynamo would silently run eager code under the compiled name.
* **The fingerprint.**  The code inductor generates is kept by compile id as it is compiled; a
  cell's fingerprint is taken from the graph dynamo's own guards pick for its input: the first
  ``relu2.vocab.schema.KERNEL_CODE_DIGITS`` hex digits hash that code, the next ones hash the launch
  configuration each of its Triton kernels runs with (after the first call: the one pointwise
  autotuning picked).  A moved figure can so be traced to new code (the commit's) or only to
  another pick (the box's autotuning: the gate reports it as repicked, never as a slowdown).
"""

from __future__ import annotations

import hashlib
import os
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from relu2.measure.reference import relu_squared_reference
from relu2.vocab.interface import Compile
from relu2.vocab.schema import KERNEL_CODE_DIGITS

WARMUP_NUMEL_1D = 2**24  # a 1-D input's first call: the same order of bytes as a prefill activation
# Static compilation specialises on every shape; a sweep sees dozens.  Dynamo keeps its cache per
# code object and every path compiles a function of its own, so no two share (and exhaust) a limit.
RECOMPILE_LIMIT = 256


class CompileFallbackError(RuntimeError):
    """torch.compile would have silently run eager code (dynamo's recompile limit was hit)."""


def pin_compiler_state() -> None:
    """Process-wide, once: the recompile guard, and the hook that records generated code.

    Process-wide on purpose: set and restored around every call, the guard cost tens of
    microseconds a call, which the `launch` figure charged to torch.compile.
    """
    import torch._dynamo

    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 4 * RECOMPILE_LIMIT)
    config.fail_on_recompile_limit_hit = True
    _GeneratedCode.install()


def _fresh_target(fn: Callable, name: str) -> types.FunctionType:
    """``fn`` as a function with a code object of its own (dynamo caches per code object)."""
    code = fn.__code__
    code = code.replace(co_name=name, co_qualname=name) if hasattr(code, "co_qualname") else code.replace(co_name=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


class _GeneratedCode:
    """The code inductor generates in this process, by dynamo compile id ("0/3")."""

    by_compile_id: dict[str, str] = {}
    _installed = False

    @classmethod
    def install(cls) -> None:
        if cls._installed:
            return
        from torch._inductor.graph import GraphLowering

        previous = GraphLowering.save_output_code  # a test hook: chain to whatever is there

        def save(code: str) -> None:
            from torch._guards import CompileContext

            cls.by_compile_id[str(CompileContext.current_compile_id())] = code
            if previous is not None:
                previous(code)

        GraphLowering.save_output_code = save
        cls._installed = True


def _code_hash(code: str) -> str:
    """sha256 of generated code, less what names this process's cache folder (private, random)."""
    lines = [line for line in code.splitlines() if not line.lstrip().startswith("# kernel path:")]
    text = "\n".join(lines)
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if cache:
        text = text.replace(cache, "<cache>")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Compiled:
    """A compiled path: the guarded call, its warm-up, and the fingerprint of the kernel serving an input.

    ``fn`` is the function compiled (module-level, so the path pickles by reference).
    """

    name: str
    recipe: Compile
    fn: Callable = relu_squared_reference
    _target: Any = field(init=False, repr=False)
    _compiled: Any = field(init=False, repr=False)
    _warmed: set = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        from torch._dynamo.exc import FailOnRecompileLimitHit

        pin_compiler_state()
        self._target = _fresh_target(self.fn, f"relu2_{self.name}")
        options = dict(self.recipe.options) if self.recipe.options else None
        self._compiled = torch.compile(self._target, dynamic=self.recipe.dynamic, fullgraph=self.recipe.fullgraph,
                                       backend="inductor", options=options)
        self._limit_hit = FailOnRecompileLimitHit

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.recipe.mark_dim0 and x.dim() > 0:
            torch._dynamo.mark_dynamic(x, 0)
        try:
            return self._compiled(x)
        except self._limit_hit as e:  # name the situation plainly
            raise CompileFallbackError(
                f"{self.name}: torch.compile hit dynamo's recompile limit at {x.dtype} {tuple(x.shape)}; "
                "refusing to run eager code under a compiled name") from e

    def __reduce__(self):  # a worker rebuilds it by name (the compiled function itself does not pickle)
        return (Compiled, (self.name, self.recipe, self.fn))

    def warmup_shape(self, shape: tuple[int, ...]) -> tuple[int, ...] | None:
        """The first shape this path meets before ``shape``: (warm-up tokens, *rest), or None (static)."""
        tokens = self.recipe.warmup_tokens
        if tokens is None or not shape:
            return None
        if len(shape) == 1:
            return (WARMUP_NUMEL_1D if tokens > 1 else 1,)
        return (tokens, *shape[1:])

    def prepare(self, dtype: torch.dtype, shape: tuple[int, ...], device: str) -> None:
        """Call the path once at its warm-up shape for this (dtype, trailing dims), if not done yet."""
        first = self.warmup_shape(shape)
        key = (device, dtype, first)
        if first is None or key in self._warmed:
            return
        x = torch.randn(first, device=device).to(dtype)
        self(x)
        del x
        self._warmed.add(key)

    def fingerprint(self, x: torch.Tensor) -> str:
        """The hash of the generated code dynamo's guards pick for ``x`` and of the launch configuration
        of each of its Triton kernels ("" if none has been compiled)."""
        code = serving_code(self, x)
        if not code:
            return ""
        # What runs, not how many candidates it was picked from: a pick read from the autotuning cache
        # has one candidate and is the same kernel.
        picks = "".join(f"{name}: {launch.running or 'untuned'}\n" for name, launch in sorted(launch_configs(code).items()))
        code_hash, pick_hash = _code_hash(code), hashlib.sha256(picks.encode()).hexdigest()
        # The layout relu2.vocab.schema.KERNEL_CODE_DIGITS describes: the code's digits, then the pick's.
        digits = KERNEL_CODE_DIGITS
        return (code_hash[:digits] + pick_hash[:digits] + code_hash[digits:])[:len(code_hash)]


def serving_code(path: Compiled, x: torch.Tensor) -> str:
    """The source inductor generated for the graph dynamo's guards pick for ``x`` ("" when unknown).

    Dynamo checks its cache entries in order and runs the first whose guards pass; each entry
    carries the compile id its graph was generated under.
    """
    import torch._dynamo.eval_frame as eval_frame

    try:
        for entry in eval_frame._debug_get_cache_entry_list(path._target.__code__):
            if entry.guard_manager.check({"x": x}):
                return _GeneratedCode.by_compile_id.get(str(entry.compile_id), "")
    except Exception:  # noqa: BLE001  a private API: without it, no fingerprint, never a failure
        return ""
    return ""


def loaded_wrappers(code: str) -> list:
    """Inductor's loaded wrapper modules whose source is ``code`` (the graph that ran)."""
    from torch._inductor.codecache import PyCodeCache

    out = []
    for module in list(PyCodeCache.modules):
        try:
            if Path(module.__file__).read_text() == code:
                out.append(module)
        except (OSError, AttributeError, TypeError):
            continue
    return out


def describe_config(config: Any) -> str:
    """A Triton launch configuration in words: its block sizes, warps and stages."""
    kwargs = ", ".join(f"{k}={v}" for k, v in sorted(getattr(config, "kwargs", {}).items()))
    return f"{kwargs} num_warps={getattr(config, 'num_warps', '?')} num_stages={getattr(config, 'num_stages', '?')}"


@dataclass(frozen=True)
class Launch:
    """How one Triton kernel of a graph launches: the configuration it runs with ("" before its first
    call has tuned it), and how many candidates autotuning had (1 when the pick came from the
    autotuning cache, as in a round after the first: relu2.measure.rounds)."""

    running: str
    candidates: int

    def describe(self) -> str:
        if not self.running:
            return f"{self.candidates} candidates, not yet tuned"
        return f"picked of {self.candidates}: {self.running}" if self.candidates > 1 else self.running


def launch_configs(code: str) -> dict[str, Launch]:
    """Kernel name -> how it launches, for each Triton kernel of the loaded wrapper whose source is
    ``code``.  After the first call of an autotuned kernel, ``running`` is what autotuning picked."""
    out: dict[str, Launch] = {}
    for module in loaded_wrappers(code):
        for name, tuner in vars(module).items():
            launchers = getattr(tuner, "launchers", None)
            configs = getattr(tuner, "configs", None) or []
            if not launchers and not configs:
                continue
            if launchers and len(launchers) == 1:
                out[name] = Launch(describe_config(getattr(launchers[0], "config", None)), max(len(configs), 1))
            else:
                out[name] = Launch("", len(launchers or configs))
    return out
