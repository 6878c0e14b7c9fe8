"""vLLM's calls of ``torch.compile`` on relu², as definitions (``relu2.interface.Compile``).

* ``compile_dynamic`` is ``CustomOp.maybe_compile`` for an op without ``dynamic_arg_dims``
  (vllm/model_executor/custom_op.py): ``torch.compile(fn, dynamic=True, backend="inductor",
  options={"graph_partition": False})``, no fullgraph, no mark_dynamic.
* ``compile_dim0`` is the same function for an op registered with ``dynamic_arg_dims={"x": 0}``
  (vLLM PR #34900): ``dynamic=False``, and ``torch._dynamo.mark_dynamic(x, 0)`` on every call.
* ``compile_model`` is relu² as vLLM's own backend compiles it inside a model's graph (the dense
  MLP layers of NemotronH): the token dimension dynamic (``mark_dynamic(x, 0)``: the general-shape
  graph vLLM compiles first) and the inductor config vLLM's ``CompilationConfig.__post_init__``
  (vllm/config/compilation.py) passes to that backend: ``enable_auto_functionalized_v2=False`` on
  torch >= 2.6, and on CUDA with torch >= 2.9 ``combo_kernels`` and ``benchmark_combo_kernel``.
  The piecewise CUDA graphs vLLM adds are what ``hot`` times already.
* All are first called at ``WARMUP_TOKENS`` tokens of each width: in vLLM the first forward is the
  memory-profiling run at the maximum number of batched tokens.  The ``_1tok`` variants are first
  called at one token (decode first), for side-by-side figures.

Inductor's pointwise autotuning stays as vLLM leaves it: on (its default; ``maybe_compile`` passes
only ``graph_partition``).  Which configuration it picked is part of each cell's fingerprint
(``relu2.compiled``), so a different pick on another box shows as a different kernel.
"""

from __future__ import annotations

import re
from typing import Any

from relu2.interface import Compile, Implementation

# vLLM's first forward pass profiles memory at max_num_batched_tokens; 16384 is the top of the
# prefill range (vLLM's chunked-prefill budgets run 2048-16384).
WARMUP_TOKENS = 16384


def _torch_at_least(major: int, minor: int) -> bool:
    import torch

    found = tuple(int(p) for p in re.findall(r"\d+", torch.__version__)[:2])
    return found >= (major, minor)


def vllm_options() -> dict[str, Any]:
    """The inductor options ``CustomOp.maybe_compile`` passes: ``{"graph_partition": False}`` on
    torch >= 2.9, else none."""
    return {"graph_partition": False} if _torch_at_least(2, 9) else {}


def vllm_backend_options() -> dict[str, Any]:
    """The inductor config vLLM's ``CompilationConfig`` gives its model-level backend by default."""
    import torch

    options: dict[str, Any] = {}
    if _torch_at_least(2, 6):
        options["enable_auto_functionalized_v2"] = False
    if _torch_at_least(2, 9) and torch.cuda.is_available():  # "combo kernel does not support cpu yet"
        options.update(combo_kernels=True, benchmark_combo_kernel=True)
    return options


def recipes() -> dict[str, Compile]:
    options = vllm_options()
    return {
        "compile_dynamic": Compile(dynamic=True, options=options, warmup_tokens=WARMUP_TOKENS),
        "compile_dim0": Compile(dynamic=False, mark_dim0=True, options=options, warmup_tokens=WARMUP_TOKENS),
        "compile_model": Compile(dynamic=False, mark_dim0=True, options=vllm_backend_options(),
                                 warmup_tokens=WARMUP_TOKENS),
        "compile_dynamic_1tok": Compile(dynamic=True, options=options, warmup_tokens=1),
        "compile_dim0_1tok": Compile(dynamic=False, mark_dim0=True, options=options, warmup_tokens=1),
    }


def compiled(name: str) -> Implementation:
    """The implementation ``name``: the eager reference compiled as vLLM compiles it."""
    recipe = recipes()[name]
    return Implementation(name, None, compile=recipe, description=recipe.describe())
