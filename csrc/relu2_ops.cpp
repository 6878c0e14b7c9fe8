// The torch binding of relu²: defines relu2::relu_squared and relu2::relu_squared.out, checks every
// input at this boundary, and hands dense, non-overlapping buffers to the CPU loop (relu2_cpu.cpp) or,
// when built with RELU2_WITH_CUDA, the CUDA kernel (relu2_kernel.cu).
//
// It also defines relu2::vllm_relu_squared, a kernel of vLLM's `relu_squared` structure
// (vllm_relu2_kernel.cu: a block per row, NaN -> +0 by design), CUDA only.
//
// Fake (meta) kernels and the autograd formula are registered from Python (relu2/fused.py).

// Python.h first, as Python asks; the module it defines is empty and exists so that
// torch.utils.cpp_extension.load can import the library (which runs the registrations below).
#include <Python.h>

#include <string>

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <torch/library.h>
#include <torch/version.h>

#include "relu2_cpu.h"

#ifdef RELU2_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "relu2_kernel.h"
#include "vllm_relu2_kernel.h"
#endif

namespace relu2 {
namespace {

constexpr const char* kFunctional = "relu2::relu_squared";
constexpr const char* kOut = "relu2::relu_squared.out";
constexpr const char* kVllm = "relu2::vllm_relu_squared";

bool is_supported_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble;
}

void check_input(const at::Tensor& x, const char* op) {
  TORCH_CHECK(is_supported_dtype(x.scalar_type()), op,
              ": expected a floating-point tensor (float32, float16, bfloat16, float64), got ",
              x.scalar_type());
}

// A shape as text, "[2, 3]", built with std::to_string: streaming integers into an error message
// crashed inside this library on the H200 box (see vllm_relu_squared).
std::string shape_text(at::IntArrayRef sizes) {
  std::string text = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(sizes[i]);
  }
  return text + "]";
}

// out= never resizes: an out of the wrong shape is a caller bug worth reporting, not papering over.
void check_out(const at::Tensor& x, const at::Tensor& out) {
  TORCH_CHECK(out.device() == x.device(), kOut, ": out is on ", out.device(), " but x is on ", x.device(),
              "; they must be on the same device");
  TORCH_CHECK(out.scalar_type() == x.scalar_type(), kOut, ": out has dtype ", out.scalar_type(),
              " but x has dtype ", x.scalar_type(), "; they must match");
  TORCH_CHECK(out.sizes() == x.sizes(), kOut, ": out has shape ", shape_text(out.sizes()), " but x has shape ",
              shape_text(x.sizes()),
              "; they must match (out is not resized)");
}

#ifdef RELU2_WITH_CUDA
Relu2DType kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return Relu2DType::kFloat32;
    case at::kHalf:
      return Relu2DType::kFloat16;
    case at::kBFloat16:
      return Relu2DType::kBFloat16;
    case at::kDouble:
      return Relu2DType::kFloat64;
    default:
      TORCH_CHECK(false, kFunctional, ": no CUDA kernel for dtype ", t);
  }
}

void relu_squared_cuda(const at::Tensor& in, at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(in.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const cudaError_t err = relu2_cuda_launch(in.const_data_ptr(), out.mutable_data_ptr(), in.numel(),
                                            kernel_dtype(in.scalar_type()), stream);
  TORCH_CHECK(err == cudaSuccess, kFunctional, ": CUDA kernel launch failed on ", in.device(), " for ",
              std::to_string(in.numel()), " ", in.scalar_type(), " elements: ", cudaGetErrorName(err), ": ",
              cudaGetErrorString(err));
}
#endif

// Both kernels assume what this function guarantees: same device, dtype and numel, `in` and `out`
// contiguous and not overlapping.  They handle any alignment and 64-bit element counts themselves.
void compute(const at::Tensor& in, at::Tensor& out) {
  TORCH_INTERNAL_ASSERT(in.is_contiguous() && out.is_contiguous());
  TORCH_INTERNAL_ASSERT(in.numel() == out.numel() && in.scalar_type() == out.scalar_type());
  if (in.numel() == 0) return;
  if (in.is_cpu()) {
    relu_squared_cpu(in, out);
    return;
  }
#ifdef RELU2_WITH_CUDA
  if (in.is_cuda()) {
    relu_squared_cuda(in, out);
    return;
  }
#endif
  TORCH_CHECK(false, kFunctional, ": no kernel for device ", in.device());
}

// relu²(x) as a new contiguous tensor of x's shape and dtype.
at::Tensor relu_squared(const at::Tensor& x) {
  check_input(x, kFunctional);
  // The kernels need dense row-major input: strided views (transposes, slices, stride-0 expands) are
  // copied here, at the boundary, rather than taught to every kernel.
  const at::Tensor src = x.contiguous();
  at::Tensor out = at::empty(src.sizes(), src.options());
  compute(src, out);
  return out;
}

// relu²(x) written into out, which must match x in shape, dtype and device; returns out.
at::Tensor& relu_squared_out(const at::Tensor& x, at::Tensor& out) {
  check_input(x, kOut);
  check_out(x, out);
  const at::Tensor src = x.contiguous();  // as in relu_squared: dense input at the boundary
  // A strided out, or one sharing memory with x (in place, or a shifted view), goes through a
  // temporary: the kernels write densely and assume their buffers do not alias.
  if (out.is_contiguous() && at::get_overlap_status(src, out) == at::MemOverlapStatus::No) {
    compute(src, out);
    return out;
  }
  at::Tensor tmp = at::empty(src.sizes(), src.options());
  compute(src, tmp);
  out.copy_(tmp);
  return out;
}

// --- relu2::vllm_relu_squared: vLLM's kernel structure, CUDA only ------------------------------

void check_vllm_input(const at::Tensor& x) {
  // vLLM dispatches float, half and bfloat16 (VLLM_DISPATCH_FLOATING_TYPES); no float64 kernel.
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16,
              kVllm, ": expected float32, float16 or bfloat16 (the dtypes vLLM's kernel is built for), got ",
              x.scalar_type());
}

// A CPU (or other non-CUDA) tensor: vLLM's kernel has no CPU twin, and silently running another
// kernel would measure the wrong thing.
at::Tensor vllm_relu_squared_refuse(const at::Tensor& x) {
  check_vllm_input(x);
  TORCH_CHECK(false, kVllm, ": CUDA only (a kernel of vLLM's relu_squared structure has no CPU version); got a "
              "tensor on ", x.device());
  return {};  // not reached: TORCH_CHECK(false, ...) throws
}

#ifdef RELU2_WITH_CUDA
// relu²(x) with NaN -> +0, as a new contiguous tensor of x's shape and dtype.
//   x: [..., d] (any strides)  ->  out: [..., d], computed as [numel / d, d] rows, one block per row.
at::Tensor vllm_relu_squared(const at::Tensor& x) {
  check_vllm_input(x);
  TORCH_CHECK(x.is_cuda(), kVllm, ": expected a CUDA tensor, got one on ", x.device());
  // The kernel's assumptions, made true or checked here (vllm_relu2_kernel.h):
  //  * dense rows: vLLM's kernel assumes a contiguous [..., d]; a strided view is copied here, at the
  //    boundary, so the kernel (and the timing) sees what vLLM's caller would have to provide;
  //  * no overlap: `out` is fresh;
  //  * alignment: any element alignment is accepted; the launcher picks the 128-bit path only when
  //    both bases are 16-byte aligned and d is a multiple of the vector length;
  //  * rows fit one grid dimension (below).
  // A 0-d tensor is one row of one element (vLLM would reject it: it reads size(-1)).
  const int64_t width = x.dim() == 0 ? 1 : x.size(-1);
  const int64_t rows = width == 0 ? 0 : x.numel() / width;
  // Numbers go into messages as std::string: streaming an int64 into TORCH_CHECK's message crashed
  // (SIGSEGV in std::ostream::_M_insert<long> inside this library) in the H200 box's CUDA build.
  TORCH_CHECK(rows <= INT32_MAX, kVllm, ": ", std::to_string(rows), " rows of ", std::to_string(width),
              " elements; one block per row allows at most 2^31 - 1 rows");
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor src = x.contiguous();
  at::Tensor out = at::empty(src.sizes(), src.options());
  if (src.numel() == 0) return out;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const cudaError_t err = vllm_relu2_cuda_launch(src.const_data_ptr(), out.mutable_data_ptr(), rows, width,
                                                 kernel_dtype(src.scalar_type()), stream);
  TORCH_CHECK(err == cudaSuccess, kVllm, ": CUDA kernel launch failed on ", src.device(), " for ",
              std::to_string(rows), " x ", std::to_string(width), " ", src.scalar_type(), ": ", cudaGetErrorName(err),
              ": ", cudaGetErrorString(err));
  return out;
}
#endif

}  // namespace
}  // namespace relu2

TORCH_LIBRARY(relu2, m) {
  m.def("relu_squared(Tensor x) -> Tensor");
  // torch.Tag.out (torch >= 2.13) tells torch.compile that out is a write-only buffer, which lets
  // functionalization handle the out= overload; older torch has no such tag.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 13)
  m.def("relu_squared.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)", {at::Tag::out});
#else
  m.def("relu_squared.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)");
#endif
  // Defined in every build (so its fake kernel registers everywhere); only the CUDA build computes.
  m.def("vllm_relu_squared(Tensor x) -> Tensor");
}

TORCH_LIBRARY_IMPL(relu2, CPU, m) {
  m.impl("relu_squared", &relu2::relu_squared);
  m.impl("relu_squared.out", &relu2::relu_squared_out);
  m.impl("vllm_relu_squared", &relu2::vllm_relu_squared_refuse);
}

#ifdef RELU2_WITH_CUDA
TORCH_LIBRARY_IMPL(relu2, CUDA, m) {
  m.impl("relu_squared", &relu2::relu_squared);
  m.impl("relu_squared.out", &relu2::relu_squared_out);
  m.impl("vllm_relu_squared", &relu2::vllm_relu_squared);
}
#endif

// The extension is imported as a Python module named TORCH_EXTENSION_NAME (set by cpp_extension);
// importing it loads the library and runs the TORCH_LIBRARY registrations above.
#define RELU2_CONCAT_(a, b) a##b
#define RELU2_CONCAT(a, b) RELU2_CONCAT_(a, b)
#define RELU2_STR_(a) #a
#define RELU2_STR(a) RELU2_STR_(a)

PyMODINIT_FUNC RELU2_CONCAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  static struct PyModuleDef module = {
      PyModuleDef_HEAD_INIT,
      RELU2_STR(TORCH_EXTENSION_NAME),
      "relu2 fused kernels; the ops live in torch.ops.relu2",
      -1,       // m_size: no per-module state
      nullptr,  // m_methods
      nullptr,  // m_slots
      nullptr,  // m_traverse
      nullptr,  // m_clear
      nullptr,  // m_free
  };
  return PyModule_Create(&module);
}
