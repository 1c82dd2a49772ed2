// Shared by the CPU (.cpp) and CUDA/ROCm (.cu) translation units: the op
// namespace, argument checks and the helpers both kernels need.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdint>
#include <vector>

// Builds that share a process (the wheel, a JIT build, a CMake build) must
// register under different namespaces, so the name is a compile-time knob.
#ifndef SEGMENT_OPS_NAMESPACE
#define SEGMENT_OPS_NAMESPACE segment_ops
#endif

// TORCH_LIBRARY pastes its namespace argument with ##, which would paste the
// macro's name instead of its value; one more level of macro expands it first.
#define SEGMENT_OPS_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
#define SEGMENT_OPS_LIBRARY_IMPL(ns, k, m) TORCH_LIBRARY_IMPL(ns, k, m)

namespace segment_ops {

// Metadata checks shared by every device. `data` is the dense operand
// (src for segment_sum, grad for segment_gather).
inline void check_metadata(const char* op, const char* data_name,
                           const at::Tensor& data, const at::Tensor& indptr) {
  TORCH_CHECK(indptr.device() == data.device(), op,
              ": indptr must be on the same device as ", data_name, " (",
              data.device(), "), got ", indptr.device());
  TORCH_CHECK(indptr.scalar_type() == at::kLong, op,
              ": indptr must be int64, got ", indptr.scalar_type());
  TORCH_CHECK(indptr.dim() == 1 && indptr.numel() >= 1, op,
              ": indptr must be 1-D with at least one element, got shape ",
              indptr.sizes());
  TORCH_CHECK(data.dim() >= 1, op, ": ", data_name,
              " must have at least one dimension");
  const auto t = data.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kDouble || t == at::kHalf ||
                  t == at::kBFloat16,
              op, ": ", data_name,
              " must be float32, float64, float16 or bfloat16, got ", t);
}

// Value checks: the device code computes the three facts, this turns them
// into the same message on every device. `rows` is what indptr[-1] must be.
inline void check_indptr_values(const char* op, int64_t first, int64_t last,
                                bool decreasing, int64_t rows,
                                const char* rows_name) {
  TORCH_CHECK(first == 0, op, ": indptr[0] must be 0, got ", first);
  TORCH_CHECK(last == rows, op, ": indptr[-1] must equal ", rows_name, " (",
              rows, "), got ", last);
  TORCH_CHECK(!decreasing, op, ": indptr must be non-decreasing");
}

// Product of the trailing dimensions: kernels see data as [rows, inner].
inline int64_t inner_size(const at::Tensor& t) {
  int64_t inner = 1;
  for (int64_t d = 1; d < t.dim(); ++d) inner *= t.size(d);
  return inner;
}

// segment_gather's shape rules, the same for every device.
inline void check_gather_shape(const at::Tensor& src, int64_t segments, int64_t rows) {
  TORCH_CHECK(src.size(0) == segments,
              "segment_gather: src.size(0) must equal indptr.numel() - 1 (", segments, "), got ",
              src.size(0));
  TORCH_CHECK(rows >= 0, "segment_gather: rows must be >= 0, got ", rows);
}

// An uninitialised result shaped like `src` but with `rows` leading rows.
inline at::Tensor new_rows_like(const at::Tensor& src, int64_t rows) {
  std::vector<int64_t> sizes = src.sizes().vec();
  sizes[0] = rows;
  return src.new_empty(sizes);
}

}  // namespace segment_ops
