// relu²(x) with the structure of vLLM's `relu_squared` (PR #39058; vLLM's csrc/activation_kernels.cu,
// `relu_squared_kernel` + `activation_kernel` + `LAUNCH_ACTIVATION_KERNEL`): one block per token row,
// 128-bit vectors along the row, fp32 `f > 0 ? f : 0` squared and rounded once, so NaN gives +0.
//
// Written here, not copied: it exists so the harness can measure and check a kernel of vLLM's shape
// beside this project's flat kernel (relu2_kernel.cu).  The differences from vLLM are the defects its
// reviewers named, fixed at no cost to the structure: 64-bit row offsets and a check of the base
// pointers' alignment before the vector path (see vllm_relu2_kernel.h).
//
// CUDA headers only.  Build without --use_fast_math / -ftz=true: subnormals must behave as in torch.
#include "vllm_relu2_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace {

constexpr int kVectorBytes = 16;  // 128-bit: LDG.E.128 / STG.E.128, vLLM's VecTraits<false>
constexpr int kMaxThreads = 1024;  // vLLM's block is min(work items per row, 1024)

// To and from fp32, explicitly: torch's extension flags (-D__CUDA_NO_HALF_CONVERSIONS__ and friends)
// remove the implicit conversions vLLM's `(float)x` / `(T)v` rely on.  The *_rn conversions round to
// nearest even, once, as vLLM's conversion operators and torch's eager kernels do.
template <typename T>
struct Fp32;

template <>
struct Fp32<float> {
  static __device__ __forceinline__ float from(float v) { return v; }
  static __device__ __forceinline__ float to(float v) { return v; }
};

template <>
struct Fp32<__half> {
  static __device__ __forceinline__ float from(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half to(float v) { return __float2half_rn(v); }
};

template <>
struct Fp32<__nv_bfloat16> {
  static __device__ __forceinline__ float from(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 to(float v) { return __float2bfloat16_rn(v); }
};

// vLLM's value rule, verbatim in meaning: `f > 0` is false for NaN and -0, so both give +0 (the
// declared exception: torch.relu keeps NaN).  One fp32 multiply, nothing to contract into an FMA.
template <typename T>
__device__ __forceinline__ T vllm_relu2(T x) {
  const float f = Fp32<T>::from(x);
  const float val = f > 0.0f ? f : 0.0f;
  return Fp32<T>::to(val * val);
}

// N elements moved as one access; N * sizeof(T) == 16 makes the compiler emit the 128-bit load/store.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// One block per row (blockIdx.x = token), threads striding along the row, as vLLM's activation_kernel.
//   out: [rows, width]   in: [rows, width]   (rows = gridDim.x)
// kVector: the launcher has checked that both bases are 16-byte aligned and width % N == 0, so every
// row starts 16-byte aligned and has no tail; otherwise the scalar loop, correct at any alignment.
template <typename T, bool kVector>
__global__ void __launch_bounds__(kMaxThreads) vllm_relu2_kernel(T* __restrict__ out, const T* __restrict__ in,
                                                                 int64_t width) {
  // 64-bit: rows * width may pass 2^32 elements (vLLM's `blockIdx.x * d` is a 32-bit product).
  const int64_t row_start = static_cast<int64_t>(blockIdx.x) * width;
  const T* in_row = in + row_start;
  T* out_row = out + row_start;
  if constexpr (kVector) {
    constexpr int N = kVectorBytes / static_cast<int>(sizeof(T));
    using P = Pack<T, N>;
    const P* in_vec = reinterpret_cast<const P*>(in_row);
    P* out_vec = reinterpret_cast<P*>(out_row);
    const int64_t packs = width / N;  // exact on this path
    for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
      P v = in_vec[i];  // const __restrict__: the read-only (LDG) path, as vLLM's VLLM_LDG asks for
#pragma unroll
      for (int k = 0; k < N; ++k) v.v[k] = vllm_relu2(v.v[k]);
      out_vec[i] = v;
    }
  } else {
    for (int64_t j = threadIdx.x; j < width; j += blockDim.x) out_row[j] = vllm_relu2(in_row[j]);
  }
}

bool aligned_to(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <typename T>
cudaError_t launch_typed(const void* in, void* out, int64_t rows, int64_t width, cudaStream_t stream) {
  if (!aligned_to(in, sizeof(T)) || !aligned_to(out, sizeof(T))) return cudaErrorMisalignedAddress;
  constexpr int N = kVectorBytes / static_cast<int>(sizeof(T));
  const bool vector = width % N == 0 && aligned_to(in, kVectorBytes) && aligned_to(out, kVectorBytes);
  // vLLM's block size: one thread per work item (vector or element) of a row, at most 1024.
  const int64_t items = vector ? width / N : width;
  const dim3 block(static_cast<unsigned>(items < kMaxThreads ? items : kMaxThreads));
  const dim3 grid(static_cast<unsigned>(rows));  // rows <= 2^31 - 1, checked by the caller below
  T* dst = static_cast<T*>(out);
  const T* src = static_cast<const T*>(in);
  if (vector) {
    vllm_relu2_kernel<T, true><<<grid, block, 0, stream>>>(dst, src, width);
  } else {
    vllm_relu2_kernel<T, false><<<grid, block, 0, stream>>>(dst, src, width);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t vllm_relu2_cuda_launch(const void* in, void* out, int64_t rows, int64_t width, Relu2DType dtype,
                                   cudaStream_t stream) {
  if (rows < 0 || width < 0) return cudaErrorInvalidValue;
  if (rows == 0 || width == 0) return cudaSuccess;  // nothing to do; a zero-size launch is an error
  if (in == nullptr || out == nullptr) return cudaErrorInvalidValue;
  if (rows > INT32_MAX) return cudaErrorInvalidValue;  // one block per row: gridDim.x <= 2^31 - 1
  switch (dtype) {
    case Relu2DType::kFloat32:
      return launch_typed<float>(in, out, rows, width, stream);
    case Relu2DType::kFloat16:
      return launch_typed<__half>(in, out, rows, width, stream);
    case Relu2DType::kBFloat16:
      return launch_typed<__nv_bfloat16>(in, out, rows, width, stream);
    case Relu2DType::kFloat64:  // vLLM dispatches float, half and bfloat16 only
      break;
  }
  return cudaErrorInvalidValue;
}
