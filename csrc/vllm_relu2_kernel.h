// relu²(x) with the structure of vLLM's `relu_squared` CUDA kernel: the launcher of
// vllm_relu2_kernel.cu.
//
// What is copied from vLLM (read from vllm-project/vllm, PR #39058):
//  * csrc/activation_kernels.cu (later csrc/libtorch_stable/activation_kernels.cu):
//    `relu_squared_kernel<T>` computes `f = (float)x; val = f > 0.0f ? f : 0.0f; return (T)(val * val);`
//    and runs through the generic `activation_kernel` launched by `LAUNCH_ACTIVATION_KERNEL`:
//    one block per token row (grid = numel / d, d = size(-1)), block = min(d / vec, 1024) threads,
//    a 128-bit vector loop over the row when d % vec == 0 (vec = 16 / sizeof(T)), a scalar
//    grid-of-rows loop otherwise.  (vLLM also has a 256-bit path for compute capability >= 10 with
//    CUDA >= 12.9 and more than 128 tokens; the H200 is 9.0, so the 128-bit path is what runs there,
//    and the only one written here.)
//
// The value rule, and why it is a declared exception to this project's contract: NaN fails `f > 0`,
// so NaN gives +0 (torch.relu keeps NaN); -0 gives +0 as in torch.  Everything else is one fp32
// multiply rounded once to T, which is what torch's eager `torch.square(torch.relu(x))` does, so the
// kernel agrees with eager bitwise everywhere except where the input is NaN.
//
// CUDA headers only (no torch, c10 or ATen), like relu2_kernel.h, so CI compile-checks it with nvcc.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "relu2_kernel.h"  // Relu2DType

// Computes out[r, j] = relu(in[r, j])² (NaN -> +0) for r < rows, j < width, on `stream`, asynchronously.
//   in:  [rows, width], row-major, dense   (vLLM: input [..., d] flattened to [num_tokens, d])
//   out: [rows, width], row-major, dense
//
// Assumptions (the caller checks them; the torch binding in relu2_ops.cpp does):
//  * `in` and `out` are dense and contiguous, row r at base + r * width: vLLM's kernel assumes this
//    too (its reviewers flagged it); strided views must be made contiguous first.
//  * `in` and `out` do not overlap (`__restrict__` in the kernel).
//  * rows <= 2^31 - 1: one block per row, and gridDim.x is at most 2^31 - 1.
//  * dtype is kFloat32, kFloat16 or kBFloat16: vLLM dispatches only those (VLLM_DISPATCH_FLOATING_TYPES).
// Handled here:
//  * alignment: the 128-bit vector path needs both base pointers 16-byte aligned *and* width a
//    multiple of the vector length (so every row starts aligned); anything else (an offset view such
//    as x[1:], hidden not a multiple of 8 in bf16) takes the scalar path, correct at any element
//    alignment.  vLLM checks only d % vec and would fault on a misaligned base.
//  * 64-bit row offsets: row * width is computed in int64 (vLLM computes `blockIdx.x * d` in 32 bits,
//    which wraps past 2^32 elements; the reason its benchmark dropped its largest shape).
//  * rows == 0 or width == 0 launches nothing.
//
// Returns cudaSuccess; cudaErrorInvalidValue for negative sizes, rows > 2^31 - 1, a null pointer or an
// unsupported dtype; cudaErrorMisalignedAddress for a pointer not aligned to the element size; or
// cudaGetLastError() after the launch.
cudaError_t vllm_relu2_cuda_launch(const void* in, void* out, int64_t rows, int64_t width, Relu2DType dtype,
                                   cudaStream_t stream);
