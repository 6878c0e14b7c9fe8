// relu²(x) = relu(x)² on the CPU: the C++ twin of the CUDA kernel, so the fused op runs everywhere.
#pragma once

#include <ATen/core/Tensor.h>

namespace relu2 {

// Writes relu(in)² into out, element by element, computing in fp32 (fp64 for double) and rounding
// once, which agrees bitwise with eager torch on the CPU.  NaN gives NaN, like torch.relu.
//
// Assumptions (checked by the binding in relu2_ops.cpp, not here): `in` and `out` are CPU tensors of
// the same floating dtype (float32, float16, bfloat16, float64) and numel, both contiguous, and they
// do not overlap.
void relu_squared_cpu(const at::Tensor& in, at::Tensor& out);

}  // namespace relu2
