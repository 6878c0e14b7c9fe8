// relu²(x) = relu(x)² on the CPU (see relu2_cpu.h for the contract).
#include "relu2_cpu.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <cstdint>

namespace relu2 {
namespace {

// Elements per parallel chunk: ATen's own grain size (at::internal::GRAIN_SIZE) for elementwise ops,
// below which threading costs more than it saves.
constexpr int64_t kGrainSize = 32768;

// A plain loop that GCC vectorises at -O3 with -fno-trapping-math (see relu2/fused.py): the
// ternaries become compare-and-select.  `v != v` is isnan() in a form that vectorises; the build must
// not use -ffast-math, which would fold it away.  NaN fails `v > 0` but must come out NaN like
// torch.relu (vLLM's kernel returns 0 there).  Converting through acc_t (float for Half/BFloat16) and
// back rounds once, to nearest even, as eager torch does; one multiply, nothing to contract into an FMA.
template <typename scalar_t, typename acc_t>
void relu2_loop(const scalar_t* __restrict__ in, scalar_t* __restrict__ out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const acc_t v = static_cast<acc_t>(in[i]);
    const acc_t r = v > acc_t(0) ? v * v : (v != v ? v : acc_t(0));
    out[i] = static_cast<scalar_t>(r);
  }
}

}  // namespace

void relu_squared_cpu(const at::Tensor& in, at::Tensor& out) {
  const int64_t numel = in.numel();
  if (numel == 0) return;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, in.scalar_type(), "relu2_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* src = in.const_data_ptr<scalar_t>();
    scalar_t* dst = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, numel, kGrainSize, [&](int64_t begin, int64_t end) {
      relu2_loop<scalar_t, acc_t>(src + begin, dst + begin, end - begin);
    });
  });
}

}  // namespace relu2
