"""A hand-written Triton relu², the Liger-Kernel-style alternative to the CUDA kernel in csrc/.

Flat over a contiguous buffer: one program per BLOCK elements, 64-bit offsets (tensors past 2^31
elements), fp32 compute (fp64 for float64) rounded once to the output dtype, and NaN kept as
torch.relu keeps it, so it agrees bitwise with the eager path.  Importing this module imports triton;
the registry catches the ImportError where triton is missing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["relu_squared_triton"]

_SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)

# 4096 elements over 8 warps is 16 per thread: two 16-byte vectors of bf16/fp16, four of fp32, in
# flight per thread, with few enough programs that launch and scheduling costs stay small; the same
# shape as Liger's elementwise kernels.  Triton vectorises only when it sees 16-byte aligned pointers
# (it specialises on that), so a view offset by one element gets a correct, narrower load.
BLOCK = 4096
NUM_WARPS = 8


@triton.jit
def _relu_squared_kernel(x_ptr, y_ptr, n_elements, BLOCK: tl.constexpr, IS_FP64: tl.constexpr):
    # int64 before the multiply: pid * BLOCK passes 2^31 for tensors past 2^31 elements.
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offsets = start + tl.arange(0, BLOCK).to(tl.int64)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    if IS_FP64:
        v = x
    else:
        v = x.to(tl.float32)  # torch's opmath for fp16/bf16; rounding happens once, at the store
    # NaN fails v > 0 but must stay NaN like torch.relu (vLLM's CUDA kernel turns it into 0).
    y = tl.where(v > 0, v * v, tl.where(v != v, v, 0.0))
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


def relu_squared_triton(x: torch.Tensor) -> torch.Tensor:
    """relu(x)² by the Triton kernel: a new contiguous tensor of ``x``'s shape and dtype (CUDA tensors only)."""
    if x.dtype not in _SUPPORTED_DTYPES:
        raise RuntimeError(
            f"relu_squared_triton: expected a floating-point tensor (float32, float16, bfloat16, float64), got {x.dtype}"
        )
    if x.device.type != "cuda":
        raise RuntimeError(f"relu_squared_triton: expected a CUDA tensor, got one on {x.device}")
    # The kernel indexes a flat buffer: strided views are copied here, at the boundary.
    src = x.contiguous()
    out = torch.empty_like(src)
    with torch.cuda.device(src.device):  # launch on x's GPU, not whichever is current
        _launch(src, out)
    return out


def _launch(src: torch.Tensor, out: torch.Tensor) -> None:
    """Run the kernel over contiguous ``src`` into contiguous ``out`` (same dtype and numel); nothing when empty."""
    numel = src.numel()
    if numel == 0:
        return
    grid = (triton.cdiv(numel, BLOCK),)
    _relu_squared_kernel[grid](src, out, numel, BLOCK=BLOCK, IS_FP64=src.dtype == torch.float64,
                               num_warps=NUM_WARPS)
