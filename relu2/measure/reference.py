"""The definition of relu²: the eager native two-op path every implementation must match bitwise."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def relu_squared_reference(x: torch.Tensor) -> torch.Tensor:
    """``torch.square(F.relu(x))``: two kernels in eager mode, the ground truth of the contract.

    relu is exact and the square is one multiply in fp32 (fp16/bf16 are upcast by torch's opmath)
    rounded once to the output dtype, so any implementation that does the same agrees bitwise.
    ``torch.relu`` keeps NaN, so NaN in gives NaN out.
    """
    return torch.square(F.relu(x))
