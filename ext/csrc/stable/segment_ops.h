// The stable-ABI build's checks and helpers, shared by its CPU (.cpp) and
// CUDA/ROCm (.cu) files. Only torch/csrc/stable and torch/headeronly are
// included: the library then calls libtorch through its C shims alone and
// loads in every torch from TORCH_TARGET_VERSION on (setup.py sets it).
#pragma once

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cstdint>
#include <vector>

// Builds that share a process (the wheel, a JIT build) must register under
// different namespaces; the extra macro level expands the name before the
// registration macros paste it.
#ifndef SEGMENT_OPS_NAMESPACE
#define SEGMENT_OPS_NAMESPACE segment_ops
#endif
#define SEGMENT_OPS_STABLE_LIBRARY(ns, m) STABLE_TORCH_LIBRARY(ns, m)
#define SEGMENT_OPS_STABLE_LIBRARY_IMPL(ns, k, m) STABLE_TORCH_LIBRARY_IMPL(ns, k, m)

namespace segment_ops::stable {

using torch::headeronly::ScalarType;
using Tensor = torch::stable::Tensor;

// The classic build's messages, word for word: the tests are shared.
inline void check_metadata(const char* op, const char* data_name, const Tensor& data,
                           const Tensor& indptr) {
  STD_TORCH_CHECK(indptr.device() == data.device(), op, ": indptr must be on the same device as ",
                  data_name);
  STD_TORCH_CHECK(indptr.scalar_type() == ScalarType::Long, op, ": indptr must be int64, got ",
                  torch::headeronly::toString(indptr.scalar_type()));
  STD_TORCH_CHECK(indptr.dim() == 1 && indptr.numel() >= 1, op,
                  ": indptr must be 1-D with at least one element, got ", indptr.dim(),
                  " dimensions");
  STD_TORCH_CHECK(data.dim() >= 1, op, ": ", data_name, " must have at least one dimension");
  const ScalarType t = data.scalar_type();
  STD_TORCH_CHECK(t == ScalarType::Float || t == ScalarType::Double || t == ScalarType::Half ||
                      t == ScalarType::BFloat16,
                  op, ": ", data_name, " must be float32, float64, float16 or bfloat16, got ",
                  torch::headeronly::toString(t));
}

inline void check_indptr_values(const char* op, int64_t first, int64_t last, bool decreasing,
                                int64_t rows, const char* rows_name) {
  STD_TORCH_CHECK(first == 0, op, ": indptr[0] must be 0, got ", first);
  STD_TORCH_CHECK(last == rows, op, ": indptr[-1] must equal ", rows_name, " (", rows,
                  "), got ", last);
  STD_TORCH_CHECK(!decreasing, op, ": indptr must be non-decreasing");
}

inline void check_gather_shape(const Tensor& src, int64_t segments, int64_t rows) {
  STD_TORCH_CHECK(src.size(0) == segments,
                  "segment_gather: src.size(0) must equal indptr.numel() - 1 (", segments,
                  "), got ", src.size(0));
  STD_TORCH_CHECK(rows >= 0, "segment_gather: rows must be >= 0, got ", rows);
}

// Kernels see data as [rows, inner].
inline int64_t inner_size(const Tensor& t) {
  int64_t inner = 1;
  for (int64_t d = 1; d < t.dim(); ++d) inner *= t.size(d);
  return inner;
}

// An uninitialised result shaped like `src` but with `rows` leading rows.
inline Tensor new_rows_like(const Tensor& src, int64_t rows) {
  std::vector<int64_t> sizes(static_cast<size_t>(src.dim()));
  for (int64_t d = 0; d < src.dim(); ++d) sizes[d] = src.size(d);
  sizes[0] = rows;
  return torch::stable::new_empty(src, sizes);
}

// Calls `body` with a value of the tensor's element type (as dtype-dispatch
// macros do); c10::Half and c10::BFloat16 are header-only types.
template <typename Body>
void dispatch_floating(ScalarType t, const Body& body) {
  switch (t) {
    case ScalarType::Float: return body(float{});
    case ScalarType::Double: return body(double{});
    case ScalarType::Half: return body(c10::Half{});
    case ScalarType::BFloat16: return body(c10::BFloat16{});
    default: STD_TORCH_CHECK(false, "segment_ops: unsupported dtype ", torch::headeronly::toString(t));
  }
}

}  // namespace segment_ops::stable
