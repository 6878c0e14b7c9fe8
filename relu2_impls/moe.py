"""relu² as vLLM's routed MoE experts run it in NemotronH: in place, then into a given output.

NemotronH's MoE (vllm/model_executor/models/nemotron_h.py) builds its experts with
``activation=activation_without_mul(config.mlp_hidden_act)``, which maps ``"relu2"`` to
``MoEActivation.RELU2_NO_MUL`` (vllm/model_executor/layers/fused_moe/activation.py).  When the
activation is not fused into a FlashInfer/CUTLASS MoE kernel, ``apply_moe_activation`` in that same
file runs, for ``RELU2_NO_MUL``::

    F.relu(input, inplace=True)
    torch.square(input, out=output)

on the first GEMM's output, ``[tokens x top_k, moe_intermediate_size]``: two eager kernels, the first
of which overwrites its input.  That is this implementation, and why it declares ``writes_input``:
the instrument hands it inputs of its own (relu2.agreement, relu2.measure).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def relu_squared_inplace(x: torch.Tensor) -> torch.Tensor:
    """relu(x)² the routed-expert way; ``x`` is overwritten with relu(x).

    x: any shape and strides (in vLLM, [tokens * top_k, moe_intermediate_size], contiguous);
    returns a new contiguous tensor of x's shape and dtype, as ``output`` is in vLLM (allocated by the
    experts' workspace there, here per call: the allocation is from the caching allocator, not a kernel).
    """
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    F.relu(x, inplace=True)
    torch.square(x, out=out)
    return out
