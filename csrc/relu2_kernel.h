// relu²(x) = relu(x)² on CUDA: the launcher of the kernel in relu2_kernel.cu.
//
// This header and relu2_kernel.cu include CUDA headers only (no torch, c10 or ATen), so CI can
// compile-check the kernel with a bare `nvcc -c` against a CPU build of torch.  The torch binding
// (relu2_ops.cpp) includes this header only when built with RELU2_WITH_CUDA.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

// Element types the kernel accepts.  Values are fixed: the binding converts torch dtypes to these.
enum class Relu2DType : int {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kFloat64 = 3,
};

// Computes out[i] = relu(in[i])² for i in [0, numel) on `stream`, asynchronously.
//
// Every element is computed in fp32 (fp64 for kFloat64) and rounded once to the element type, the
// way torch's eager `torch.square(torch.relu(x))` does, so the two agree bitwise.  NaN gives NaN
// (as torch.relu does), -0 and negatives give +0, overflow gives +inf, subnormals are kept (no
// flush-to-zero).
//
// Assumptions (the caller checks them; the torch binding does):
//  * `in` and `out` are dense and contiguous: element i lives at base + i.  Views with strides must be
//    made contiguous first.
//  * `in` and `out` do not overlap (they are `__restrict__` in the kernel).
//  * both are on the device current for `stream`, aligned at least to the element size.
// Handled here:
//  * any alignment to the element size: when both pointers are 16-byte aligned the kernel moves
//    16-byte vectors, otherwise it takes a scalar path that is correct at any element offset;
//  * any numel, odd tails included; numel == 0 launches nothing;
//  * indices are 64-bit throughout, so tensors past 2^31 (and 2^32) elements work.
//
// Returns cudaSuccess, cudaErrorInvalidValue for a negative numel, a null pointer or an unknown
// dtype, cudaErrorMisalignedAddress for a pointer not aligned to the element size, or
// cudaGetLastError() after the launch.
cudaError_t relu2_cuda_launch(const void* in, void* out, int64_t numel, Relu2DType dtype, cudaStream_t stream);
