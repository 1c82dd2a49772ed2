// Op schemas and CPU kernels. Every build (wheel, JIT, CMake) compiles this
// file; the CUDA/ROCm kernels in cuda/ are added when the build has a GPU
// toolkit.
#include "segment_ops.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace segment_ops {
namespace {

// CPU indptr is read in place, so the checks are a plain loop.
void check_indptr_cpu(const char* op, const at::Tensor& indptr, int64_t rows,
                      const char* rows_name) {
  const int64_t* p = indptr.const_data_ptr<int64_t>();
  const int64_t n = indptr.numel();
  bool decreasing = false;
  for (int64_t i = 1; i < n; ++i) decreasing |= p[i] < p[i - 1];
  check_indptr_values(op, p[0], p[n - 1], decreasing, rows, rows_name);
}

// Segments differ in length, so hand parallel_for chunks of about as many
// elements as ATen's own kernels do (32768) rather than a fixed segment count.
int64_t grain(int64_t segments, int64_t elements) {
  constexpr int64_t kGrainElements = 32768;
  const int64_t per_segment = std::max<int64_t>(1, elements / std::max<int64_t>(1, segments));
  return std::max<int64_t>(1, kGrainElements / per_segment);
}

at::Tensor segment_sum_cpu(const at::Tensor& src, const at::Tensor& indptr_arg) {
  check_metadata("segment_sum", "src", src, indptr_arg);
  const at::Tensor indptr = indptr_arg.contiguous();
  check_indptr_cpu("segment_sum", indptr, src.size(0), "src.size(0)");

  const int64_t segments = indptr.numel() - 1;
  const int64_t inner = inner_size(src);
  at::Tensor out = new_rows_like(src, segments);
  if (out.numel() == 0) return out;

  const at::Tensor x = src.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "segment_sum_cpu", [&] {
    // float16/bfloat16 accumulate in float32 (opmath), float64 in float64.
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* in = x.const_data_ptr<scalar_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    const int64_t* ptr = indptr.const_data_ptr<int64_t>();
    at::parallel_for(0, segments, grain(segments, x.numel()), [&](int64_t begin, int64_t end) {
      std::vector<acc_t> acc(inner);
      for (int64_t s = begin; s < end; ++s) {
        if (inner == 1) {  // 1-D src: keep the sum in a register
          acc_t sum = 0;
          for (int64_t r = ptr[s]; r < ptr[s + 1]; ++r) sum += static_cast<acc_t>(in[r]);
          o[s] = static_cast<scalar_t>(sum);
          continue;
        }
        std::fill(acc.begin(), acc.end(), acc_t(0));
        for (int64_t r = ptr[s]; r < ptr[s + 1]; ++r) {
          const scalar_t* row = in + r * inner;
          for (int64_t k = 0; k < inner; ++k) acc[k] += static_cast<acc_t>(row[k]);
        }
        for (int64_t k = 0; k < inner; ++k) o[s * inner + k] = static_cast<scalar_t>(acc[k]);
      }
    });
  });
  return out;
}

// Backward of segment_sum: out[i] = src[segment containing row i].
// `rows` is passed in because it cannot be derived from shapes alone.
at::Tensor segment_gather_cpu(const at::Tensor& src, const at::Tensor& indptr_arg, int64_t rows) {
  check_metadata("segment_gather", "src", src, indptr_arg);
  const at::Tensor indptr = indptr_arg.contiguous();
  const int64_t segments = indptr.numel() - 1;
  check_gather_shape(src, segments, rows);
  check_indptr_cpu("segment_gather", indptr, rows, "rows");

  at::Tensor out = new_rows_like(src, rows);
  if (out.numel() == 0) return out;

  // A row copy needs no arithmetic, so copy bytes instead of dispatching on dtype.
  const at::Tensor x = src.contiguous();
  const int64_t row_bytes = inner_size(x) * x.element_size();
  const char* in = static_cast<const char*>(x.const_data_ptr());
  char* o = static_cast<char*>(out.mutable_data_ptr());
  const int64_t* ptr = indptr.const_data_ptr<int64_t>();
  at::parallel_for(0, segments, grain(segments, out.numel()), [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      for (int64_t r = ptr[s]; r < ptr[s + 1]; ++r) {
        std::memcpy(o + r * row_bytes, in + s * row_bytes, row_bytes);
      }
    }
  });
  return out;
}

}  // namespace
}  // namespace segment_ops

SEGMENT_OPS_LIBRARY(SEGMENT_OPS_NAMESPACE, m) {
  // pt2_compliant_tag promises torch.compile that the op has a fake
  // implementation and no hidden state; opcheck verifies the promise.
  m.def("segment_sum(Tensor src, Tensor indptr) -> Tensor", {at::Tag::pt2_compliant_tag});
  // SymInt so torch.compile can trace `rows` symbolically.
  m.def("segment_gather(Tensor src, Tensor indptr, SymInt rows) -> Tensor",
        {at::Tag::pt2_compliant_tag});
}

SEGMENT_OPS_LIBRARY_IMPL(SEGMENT_OPS_NAMESPACE, CPU, m) {
  m.impl("segment_sum", &segment_ops::segment_sum_cpu);
  m.impl("segment_gather", &segment_ops::segment_gather_cpu);
}
