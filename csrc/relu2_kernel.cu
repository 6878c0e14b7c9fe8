// relu²(x) = relu(x)² on CUDA: a flat, memory-bound kernel, one 16-byte vector per thread.
//
// CUDA headers only (see relu2_kernel.h for the contract and the assumptions).  Build without
// --use_fast_math / -ftz=true: subnormal inputs and outputs must behave as in torch.
#include "relu2_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace {

// One 16-byte vector per thread, 128 threads per block: the shape of the two kernels that reach the
// copy ceiling on the H200 (torch's elementwise copy and inductor's relu², both 1 vector a thread in
// 128-thread blocks, 253 µs for 2^28 bf16).  v2 moved 4 vectors a thread in 256-thread blocks on large
// tensors and stayed 3.5% slower there (262 µs); see docs/kernel-notes.md.
constexpr int kThreads = 128;
constexpr int kVectorBytes = 16;  // the widest global load/store (LDG.E.128 / STG.E.128)

// Conversion to and from the compute type: fp32 for fp32/fp16/bf16 (what torch's opmath uses),
// fp64 for fp64.  The *_rn intrinsics round to nearest even, once, like torch's conversions.
template <typename T>
struct Convert;

template <>
struct Convert<float> {
  using Acc = float;
  static __device__ __forceinline__ float to_acc(float v) { return v; }
  static __device__ __forceinline__ float from_acc(float v) { return v; }
};

template <>
struct Convert<double> {
  using Acc = double;
  static __device__ __forceinline__ double to_acc(double v) { return v; }
  static __device__ __forceinline__ double from_acc(double v) { return v; }
};

template <>
struct Convert<__half> {
  using Acc = float;
  static __device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half from_acc(float v) { return __float2half_rn(v); }
};

template <>
struct Convert<__nv_bfloat16> {
  using Acc = float;
  static __device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 from_acc(float v) { return __float2bfloat16_rn(v); }
};

// relu(v)² with torch.relu's NaN rule: NaN fails `v > 0` but must come out NaN, not 0 (vLLM's
// kernel returns 0 there, which disagrees with the eager path).  One multiply, so nothing to fuse.
template <typename Acc>
__device__ __forceinline__ Acc relu2_value(Acc v) {
  return v > Acc(0) ? v * v : (isnan(v) ? v : Acc(0));
}

template <typename T>
__device__ __forceinline__ T relu2(T x) {
  using C = Convert<T>;
  return C::from_acc(relu2_value(C::to_acc(x)));
}

// N consecutive elements moved as one access: N * sizeof(T) == 16 gives a 16-byte vector load/store,
// N == 1 a plain scalar one.  The alignment makes the compiler emit the wide instruction.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// One pass, no grid-stride loop: thread i of the grid moves pack i (N elements, one access), so each
// warp's accesses are one contiguous, coalesced span.  The block count is a 32-bit grid dimension,
// up to 2^31 - 1 blocks of kThreads packs: far beyond any tensor.  The numel % N tail (fewer than N
// elements) is done by the last block.  With N > 1 both pointers must be 16-byte aligned (the
// launcher checks); N == 1 needs only element alignment.
template <typename T, int N>
__global__ void __launch_bounds__(kThreads) relu2_kernel(const T* __restrict__ in, T* __restrict__ out,
                                                         int64_t numel) {
  using P = Pack<T, N>;
  const int64_t packs = numel / N;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;  // 64-bit: no overflow
  if (i < packs) {
    P v = reinterpret_cast<const P*>(in)[i];
#pragma unroll
    for (int k = 0; k < N; ++k) v.v[k] = relu2(v.v[k]);
    reinterpret_cast<P*>(out)[i] = v;
  }
  if (N > 1 && blockIdx.x == gridDim.x - 1) {
    const int64_t t = packs * N + threadIdx.x;
    if (t < numel) out[t] = relu2(in[t]);
  }
}

bool aligned_to(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename T, int N>
cudaError_t launch_packs(const T* in, T* out, int64_t numel, cudaStream_t stream) {
  // At least one block, for a tensor smaller than one pack (all tail).
  const int64_t blocks = ceil_div(numel / N, kThreads);
  relu2_kernel<T, N><<<static_cast<unsigned>(blocks > 0 ? blocks : 1), kThreads, 0, stream>>>(in, out, numel);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_typed(const void* in, void* out, int64_t numel, cudaStream_t stream) {
  if (!aligned_to(in, sizeof(T)) || !aligned_to(out, sizeof(T))) return cudaErrorMisalignedAddress;
  const T* src = static_cast<const T*>(in);
  T* dst = static_cast<T*>(out);
  constexpr int kVectorElems = kVectorBytes / static_cast<int>(sizeof(T));
  if (aligned_to(in, kVectorBytes) && aligned_to(out, kVectorBytes)) {
    return launch_packs<T, kVectorElems>(src, dst, numel, stream);
  }
  // A view offset by a few elements (x[1:]) lands here: correct at any element alignment.
  return launch_packs<T, 1>(src, dst, numel, stream);
}

}  // namespace

cudaError_t relu2_cuda_launch(const void* in, void* out, int64_t numel, Relu2DType dtype, cudaStream_t stream) {
  if (numel < 0) return cudaErrorInvalidValue;
  if (numel == 0) return cudaSuccess;  // nothing to do; a zero-block launch would be an error
  if (in == nullptr || out == nullptr) return cudaErrorInvalidValue;
  switch (dtype) {
    case Relu2DType::kFloat32:
      return launch_typed<float>(in, out, numel, stream);
    case Relu2DType::kFloat16:
      return launch_typed<__half>(in, out, numel, stream);
    case Relu2DType::kBFloat16:
      return launch_typed<__nv_bfloat16>(in, out, numel, stream);
    case Relu2DType::kFloat64:
      return launch_typed<double>(in, out, numel, stream);
  }
  return cudaErrorInvalidValue;
}
