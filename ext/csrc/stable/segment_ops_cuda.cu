// CUDA/ROCm kernels of the stable-ABI build: the shared kernels in
// csrc/cuda/segment_kernels.cuh, reached through torch::stable::Tensor. The
// current stream comes from torch's C shim, scratch memory from torch's caching
// allocator (new_empty), so the ops never synchronise and can be captured in a
// CUDA graph.
#ifndef USE_CUDA
#define USE_CUDA  // torch's C shim header declares its CUDA functions only then
#endif

#include "segment_ops.h"

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>

#include "../cuda/segment_kernels.cuh"

namespace segment_ops::stable {
namespace {

// The kernels' element types for torch's header-only half types (same bits).
template <typename T> struct Device { using type = T; };
template <> struct Device<c10::Half> { using type = __half; };
template <> struct Device<c10::BFloat16> { using type = __nv_bfloat16; };

cudaStream_t current_stream(int32_t device) {
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(device, &stream));
  return static_cast<cudaStream_t>(stream);
}

void check_launch(const char* op, cudaError_t status) {
  check(status == cudaSuccess, op, ": kernel launch failed: ", cudaGetErrorString(status));
}

Tensor scratch(const Tensor& like, int64_t bytes) {
  std::vector<int64_t> size{bytes > 0 ? bytes : 1};
  return torch::stable::new_empty(like, size, ScalarType::Byte);
}

// indptr values are not checked here: that needs a device-to-host copy.
// segment_ops.ops checks them when asked (SEGMENT_OPS_CHECK_INDPTR=1); the
// kernels clamp every offset, so a bad indptr gives wrong sums, never a fault.
Tensor segment_sum_cuda(Tensor src, Tensor indptr_arg) {
  check_metadata("segment_sum", "src", src, indptr_arg);
  const torch::stable::accelerator::DeviceGuard guard(src.get_device_index());
  const cudaStream_t stream = current_stream(src.get_device_index());
  const Tensor indptr = torch::stable::contiguous(indptr_arg);
  const int64_t segments = indptr.numel() - 1;
  const int64_t rows = src.size(0);
  Tensor out = new_rows_like(src, segments);
  if (out.numel() == 0) return out;

  const Tensor x = torch::stable::contiguous(src);
  const int64_t inner = inner_size(x);
  Tensor workspace = scratch(x, cuda::segment_sum_workspace_bytes(
                                    rows, segments, inner, static_cast<int>(x.element_size())));
  dispatch_floating(x.scalar_type(), [&](auto zero) {
    using T = typename Device<decltype(zero)>::type;
    check_launch("segment_sum", cuda::segment_sum<T>(
        static_cast<const T*>(x.const_data_ptr()), indptr.const_data_ptr<int64_t>(),
        static_cast<T*>(out.mutable_data_ptr()), rows, segments, inner,
        workspace.mutable_data_ptr(), stream));
  });
  return out;
}

Tensor segment_gather_cuda(Tensor src, Tensor indptr_arg, int64_t rows) {
  check_metadata("segment_gather", "src", src, indptr_arg);
  const torch::stable::accelerator::DeviceGuard guard(src.get_device_index());
  const cudaStream_t stream = current_stream(src.get_device_index());
  const Tensor indptr = torch::stable::contiguous(indptr_arg);
  const int64_t segments = indptr.numel() - 1;
  check_gather_shape(src, segments, rows);
  Tensor out = new_rows_like(src, rows);
  if (out.numel() == 0) return out;

  const Tensor x = torch::stable::contiguous(src);
  dispatch_floating(x.scalar_type(), [&](auto zero) {
    using T = typename Device<decltype(zero)>::type;
    check_launch("segment_gather", cuda::segment_gather<T>(
        static_cast<const T*>(x.const_data_ptr()), indptr.const_data_ptr<int64_t>(),
        static_cast<T*>(out.mutable_data_ptr()), rows, segments, inner_size(x), stream));
  });
  return out;
}

}  // namespace
}  // namespace segment_ops::stable

SEGMENT_OPS_STABLE_LIBRARY_IMPL(SEGMENT_OPS_NAMESPACE, CUDA, m) {
  m.impl("segment_sum", TORCH_BOX(&segment_ops::stable::segment_sum_cuda));
  m.impl("segment_gather", TORCH_BOX(&segment_ops::stable::segment_gather_cuda));
}
