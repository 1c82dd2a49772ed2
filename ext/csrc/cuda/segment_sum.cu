// CUDA kernels. On ROCm, torch's build hipifies this same file, so it keeps
// to what hipify maps: c10/cuda headers instead of ATen/cuda/CUDAContext.h
// (which would also drag in cuBLAS/cuSPARSE headers), no warp intrinsics
// (warp size differs), shared-memory reductions only.
#include "../segment_ops.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <vector>

namespace segment_ops {
namespace {

constexpr int kThreads = 256;  // a power of two: the block reduction halves it
constexpr int64_t kMaxBlocks = 65535;  // kernels loop over the rest (grid-stride)

int blocks_for(int64_t work_items, int64_t per_block) {
  return static_cast<int>(std::clamp<int64_t>((work_items + per_block - 1) / per_block, 1, kMaxBlocks));
}

// facts = {any decrease, indptr[0], indptr[n-1]}; facts starts zeroed and
// every thread that finds a decrease stores the same 1, so no atomics.
__global__ void indptr_facts_kernel(const int64_t* indptr, int64_t n, int64_t* facts) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (i == 0) {
      facts[1] = indptr[0];
      facts[2] = indptr[n - 1];
    } else if (indptr[i] < indptr[i - 1]) {
      facts[0] = 1;
    }
  }
}

// Validating values costs one small device-to-host copy (a stream sync) per
// call; without it a bad indptr would read out of bounds.
void check_indptr_cuda(const char* op, const at::Tensor& indptr, int64_t rows,
                       const char* rows_name, cudaStream_t stream) {
  at::Tensor facts = indptr.new_zeros({3});
  const int64_t n = indptr.numel();
  indptr_facts_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(
      indptr.const_data_ptr<int64_t>(), n, facts.mutable_data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const at::Tensor host = facts.cpu();
  const int64_t* f = host.const_data_ptr<int64_t>();
  check_indptr_values(op, f[1], f[2], f[0] != 0, rows, rows_name);
}

// One thread per (segment, column). Good for short segments or many columns:
// neighbouring threads read neighbouring columns of the same row.
template <typename scalar_t>
__global__ void segment_sum_thread_kernel(const scalar_t* src, const int64_t* indptr,
                                          scalar_t* out, int64_t segments, int64_t inner) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t total = segments * inner;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t s = i / inner;
    const int64_t k = i - s * inner;
    acc_t acc = 0;
    for (int64_t r = indptr[s]; r < indptr[s + 1]; ++r) acc += static_cast<acc_t>(src[r * inner + k]);
    out[i] = static_cast<scalar_t>(acc);
  }
}

// One block per segment, for long segments with few columns. A segment's rows
// are one contiguous run of memory, which the block reads in order. With
// `inner` a power of two dividing kThreads, thread t always lands on column
// t % inner, so the shared-memory tree stops at stride `inner`.
template <typename scalar_t>
__global__ void segment_sum_block_kernel(const scalar_t* src, const int64_t* indptr,
                                         scalar_t* out, int64_t segments, int inner) {
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ acc_t partial[kThreads];
  for (int64_t s = blockIdx.x; s < segments; s += gridDim.x) {
    acc_t acc = 0;
    const int64_t end = indptr[s + 1] * inner;
    for (int64_t j = indptr[s] * inner + threadIdx.x; j < end; j += kThreads) {
      acc += static_cast<acc_t>(src[j]);
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int stride = kThreads / 2; stride >= inner; stride /= 2) {
      if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
      __syncthreads();
    }
    if (threadIdx.x < inner) out[s * inner + threadIdx.x] = static_cast<scalar_t>(partial[threadIdx.x]);
    __syncthreads();  // partial is reused by this block's next segment
  }
}

// Finds the segment holding `row`: the last s with indptr[s] <= row. Empty
// segments repeat an indptr value; "last" skips past them.
__device__ int64_t segment_of(const int64_t* indptr, int64_t segments, int64_t row) {
  int64_t lo = 0, hi = segments - 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (indptr[mid] <= row) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// One thread per output element: parallel over rows even when a single
// segment holds them all.
template <typename scalar_t>
__global__ void segment_gather_kernel(const scalar_t* src, const int64_t* indptr, scalar_t* out,
                                      int64_t segments, int64_t rows, int64_t inner) {
  const int64_t total = rows * inner;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / inner;
    const int64_t k = i - r * inner;
    out[i] = src[segment_of(indptr, segments, r) * inner + k];
  }
}

bool is_power_of_two(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

at::Tensor segment_sum_cuda(const at::Tensor& src, const at::Tensor& indptr_arg) {
  check_metadata("segment_sum", "src", src, indptr_arg);
  const c10::cuda::CUDAGuard guard(src.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor indptr = indptr_arg.contiguous();
  check_indptr_cuda("segment_sum", indptr, src.size(0), "src.size(0)", stream);

  const int64_t segments = indptr.numel() - 1;
  const int64_t inner = inner_size(src);
  at::Tensor out = new_rows_like(src, segments);
  if (out.numel() == 0) return out;

  const at::Tensor x = src.contiguous();
  // The block kernel pays off once an average segment fills a block.
  const bool per_block = is_power_of_two(inner) && inner <= kThreads &&
                         x.numel() / segments >= kThreads;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "segment_sum_cuda", [&] {
    if (per_block) {
      segment_sum_block_kernel<scalar_t><<<blocks_for(segments, 1), kThreads, 0, stream>>>(
          x.const_data_ptr<scalar_t>(), indptr.const_data_ptr<int64_t>(),
          out.mutable_data_ptr<scalar_t>(), segments, static_cast<int>(inner));
    } else {
      segment_sum_thread_kernel<scalar_t><<<blocks_for(out.numel(), kThreads), kThreads, 0, stream>>>(
          x.const_data_ptr<scalar_t>(), indptr.const_data_ptr<int64_t>(),
          out.mutable_data_ptr<scalar_t>(), segments, inner);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
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
  check_indptr_cuda("segment_gather", indptr, rows, "rows", stream);

  at::Tensor out = new_rows_like(src, rows);
  if (out.numel() == 0) return out;

  const at::Tensor x = src.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "segment_gather_cuda", [&] {
    segment_gather_kernel<scalar_t><<<blocks_for(out.numel(), kThreads), kThreads, 0, stream>>>(
        x.const_data_ptr<scalar_t>(), indptr.const_data_ptr<int64_t>(),
        out.mutable_data_ptr<scalar_t>(), segments, rows, inner_size(x));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace
}  // namespace segment_ops

SEGMENT_OPS_LIBRARY_IMPL(SEGMENT_OPS_NAMESPACE, CUDA, m) {
  m.impl("segment_sum", &segment_ops::segment_sum_cuda);
  m.impl("segment_gather", &segment_ops::segment_gather_cuda);
}
