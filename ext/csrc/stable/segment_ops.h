// The stable-ABI build's checks and helpers, shared by its CPU (.cpp) and
// CUDA/ROCm (.cu) files. Only torch/csrc/stable and torch/headeronly are
// included: the library then calls libtorch through its C shims alone and
// loads in every torch from TORCH_TARGET_VERSION on (setup.py sets it).
#pragma once

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
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

// Errors are raised with check(), not STD_TORCH_CHECK. That macro formats its
// message with std::ostringstream, and a library linked as torch's extension
// builders link it (libc10 and libtorch before libstdc++) can bind the stream's
// out-of-line members to the copies libc10 exports, built by torch's compiler.
// JIT-built with GCC 13 against torch 2.11, the first failed check crashed the
// process (SIGSEGV) instead of raising; the same source built with GCC 12 did
// not. std::string is the same in every GCC: messages are joined from strings.
inline std::string message_part(const char* text) { return text; }
inline std::string message_part(const std::string& text) { return text; }
template <typename I, typename = std::enable_if_t<std::is_integral_v<I>>>
std::string message_part(I value) {
  return std::to_string(value);
}

// Raises RuntimeError (in Python) with the parts joined, when `ok` is false.
template <typename... Parts>
void check(bool ok, const Parts&... parts) {
  if (ok) return;
  std::string message;
  ((message += message_part(parts)), ...);
  throw std::runtime_error(message);
}

// The classic build's messages, word for word: the tests are shared.
inline void check_metadata(const char* op, const char* data_name, const Tensor& data,
                           const Tensor& indptr) {
  check(indptr.device() == data.device(), op, ": indptr must be on the same device as ",
        data_name);
  check(indptr.scalar_type() == ScalarType::Long, op, ": indptr must be int64, got ",
        torch::headeronly::toString(indptr.scalar_type()));
  check(indptr.dim() == 1 && indptr.numel() >= 1, op,
        ": indptr must be 1-D with at least one element, got ", indptr.dim(), " dimensions");
  check(data.dim() >= 1, op, ": ", data_name, " must have at least one dimension");
  const ScalarType t = data.scalar_type();
  check(t == ScalarType::Float || t == ScalarType::Double || t == ScalarType::Half ||
            t == ScalarType::BFloat16,
        op, ": ", data_name, " must be float32, float64, float16 or bfloat16, got ",
        torch::headeronly::toString(t));
}

inline void check_indptr_values(const char* op, int64_t first, int64_t last, bool decreasing,
                                int64_t rows, const char* rows_name) {
  check(first == 0, op, ": indptr[0] must be 0, got ", first);
  check(last == rows, op, ": indptr[-1] must equal ", rows_name, " (", rows, "), got ", last);
  check(!decreasing, op, ": indptr must be non-decreasing");
}

inline void check_gather_shape(const Tensor& src, int64_t segments, int64_t rows) {
  check(src.size(0) == segments, "segment_gather: src.size(0) must equal indptr.numel() - 1 (",
        segments, "), got ", src.size(0));
  check(rows >= 0, "segment_gather: rows must be >= 0, got ", rows);
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
    default: check(false, "segment_ops: unsupported dtype ", torch::headeronly::toString(t));
  }
}

}  // namespace segment_ops::stable
