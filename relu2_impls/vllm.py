"""vLLM's calls of ``torch.compile`` on relu², as definitions (``relu2.interface.Compile``).

* ``compile_dynamic`` is ``CustomOp.maybe_compile`` for an op without ``dynamic_arg_dims``
  (vllm/model_executor/custom_op.py): ``torch.compile(fn, dynamic=True, backend="inductor",
  options={"graph_partition": False})``, no fullgraph, no mark_dynamic.
* ``compile_dim0`` is the same function for an op registered with ``dynamic_arg_dims={"x": 0}``
  (vLLM PR #34900): ``dynamic=False``, and ``torch._dynamo.mark_dynamic(x, 0)`` on every call.
* Both are first called at ``WARMUP_TOKENS`` tokens of each width: in vLLM the first forward is the
  memory-profiling run at the maximum number of batched tokens.  The ``_1tok`` variants are first
  called at one token (decode first), for side-by-side figures.

Inductor's pointwise autotuning is off in these definitions (a timing coin toss at L2-resident
sizes generated different kernels in identical runs; docs/methodology.md).
"""

from __future__ import annotations

import re
from typing import Any

from relu2.interface import Compile, Implementation

# vLLM's first forward pass profiles memory at max_num_batched_tokens; 16384 is the top of the
# prefill range (vLLM's chunked-prefill budgets run 2048-16384).
WARMUP_TOKENS = 16384
_NO_AUTOTUNE = {"triton.autotune_pointwise": False}


def vllm_options() -> dict[str, Any]:
    """The inductor options vLLM passes: ``{"graph_partition": False}`` on torch >= 2.9, else none."""
    import torch

    major, minor = (int(p) for p in re.findall(r"\d+", torch.__version__)[:2])
    return {"graph_partition": False} if (major, minor) >= (2, 9) else {}


def recipes() -> dict[str, Compile]:
    options = {**vllm_options(), **_NO_AUTOTUNE}
    return {
        "compile_dynamic": Compile(dynamic=True, options=options, warmup_tokens=WARMUP_TOKENS),
        "compile_dim0": Compile(dynamic=False, mark_dim0=True, options=options, warmup_tokens=WARMUP_TOKENS),
        "compile_dynamic_1tok": Compile(dynamic=True, options=options, warmup_tokens=1),
        "compile_dim0_1tok": Compile(dynamic=False, mark_dim0=True, options=options, warmup_tokens=1),
    }


def compiled(name: str) -> Implementation:
    """The implementation ``name``: the eager reference compiled as vLLM compiles it."""
    recipe = recipes()[name]
    return Implementation(name, None, compile=recipe, description=recipe.describe())
