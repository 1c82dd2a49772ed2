// CUDA/ROCm kernels of the classic build: the shared kernels in
// segment_kernels.cuh behind at::Tensor. On ROCm, torch's build hipifies this
// file; it keeps to what hipify maps (c10/cuda headers rather than
// ATen/cuda/CUDAContext.h, which would also pull in cuBLAS/cuSPARSE headers).
#include "../segment_ops.h"

#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "segment_kernels.cuh"

namespace segment_ops {
namespace {

// The kernels' element types for ATen's half types (same bits).
template <typename T> struct Device { using type = T; };
template <> struct Device<at::Half> { using type = __half; };
template <> struct Device<at::BFloat16> { using type = __nv_bfloat16; };

// indptr values are not checked here: that needs a device-to-host copy, which
// would block the host and break CUDA graph capture. segment_ops.ops checks
// them when asked (SEGMENT_OPS_CHECK_INDPTR=1); the kernels clamp every offset,
// so a bad indptr gives wrong sums, never an out-of-bounds access.
at::Tensor segment_sum_cuda(const at::Tensor& src, const at::Tensor& indptr_arg) {
  check_metadata("segment_sum", "src", src, indptr_arg);
  const c10::cuda::CUDAGuard guard(src.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor indptr = indptr_arg.contiguous();
  const int64_t segments = indptr.numel() - 1;
  const int64_t rows = src.size(0);
  at::Tensor out = new_rows_like(src, segments);
  if (out.numel() == 0) return out;

  const at::Tensor x = src.contiguous();
  const int64_t inner = inner_size(x);
  // Scratch from the caching allocator: no cudaMalloc, so graph capture works.
  const int64_t bytes = cuda::segment_sum_workspace_bytes(
      rows, segments, inner, static_cast<int>(x.element_size()));
  at::Tensor workspace = x.new_empty({std::max<int64_t>(bytes, 1)}, x.options().dtype(at::kByte));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "segment_sum_cuda", [&] {
    using T = typename Device<scalar_t>::type;
    C10_CUDA_CHECK(cuda::segment_sum<T>(
        reinterpret_cast<const T*>(x.const_data_ptr<scalar_t>()), indptr.const_data_ptr<int64_t>(),
        reinterpret_cast<T*>(out.mutable_data_ptr<scalar_t>()), rows, segments, inner,
        workspace.mutable_data_ptr(), stream));
  });
  return out;
}

at::Tensor segment_gather_cuda(const at::Tensor& src, const at::Tensor& indptr_arg, int64_t rows) {
  check_metadata("segment_gather", "src", src, indptr_arg);
  const c10::cuda::CUDAGuard guard(src.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor indptr = indptr_arg.contiguous();
  const int64_t segments = indptr.numel() - 1;
  check_gather_shape(src, segments, rows);
  at::Tensor out = new_rows_like(src, rows);
  if (out.numel() == 0) return out;

  const at::Tensor x = src.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "segment_gather_cuda", [&] {
    using T = typename Device<scalar_t>::type;
    C10_CUDA_CHECK(cuda::segment_gather<T>(
        reinterpret_cast<const T*>(x.const_data_ptr<scalar_t>()), indptr.const_data_ptr<int64_t>(),
        reinterpret_cast<T*>(out.mutable_data_ptr<scalar_t>()), rows, segments, inner_size(x),
        stream));
  });
  return out;
}

}  // namespace
}  // namespace segment_ops

SEGMENT_OPS_LIBRARY_IMPL(SEGMENT_OPS_NAMESPACE, CUDA, m) {
  m.impl("segment_sum", &segment_ops::segment_sum_cuda);
  m.impl("segment_gather", &segment_ops::segment_gather_cuda);
}
