// Op schemas and CPU kernels. Every build (wheel, JIT, CMake) compiles this
// file; the CUDA/ROCm kernels in cuda/ are added when the build has a GPU
// toolkit.
#include "segment_ops.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include "cpu/segment_kernels.h"

namespace segment_ops {
namespace {

// at::parallel_for, as the shared kernels call it.
constexpr auto aten_parallel_for = [](int64_t begin, int64_t end, int64_t grain,
                                      const auto& body) {
  at::parallel_for(begin, end, grain, body);
};

void check_indptr_cpu(const char* op, const at::Tensor& indptr, int64_t rows,
                      const char* rows_name) {
  const auto facts = cpu::indptr_facts(indptr.const_data_ptr<int64_t>(), indptr.numel());
  check_indptr_values(op, facts.first, facts.last, facts.decreasing, rows, rows_name);
}

at::Tensor segment_sum_cpu(const at::Tensor& src, const at::Tensor& indptr_arg) {
  check_metadata("segment_sum", "src", src, indptr_arg);
  const at::Tensor indptr = indptr_arg.contiguous();
  check_indptr_cpu("segment_sum", indptr, src.size(0), "src.size(0)");

  const int64_t segments = indptr.numel() - 1;
  at::Tensor out = new_rows_like(src, segments);
  if (out.numel() == 0) return out;

  const at::Tensor x = src.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "segment_sum_cpu", [&] {
    cpu::segment_sum(x.const_data_ptr<scalar_t>(), indptr.const_data_ptr<int64_t>(),
                     out.mutable_data_ptr<scalar_t>(), segments, inner_size(x),
                     aten_parallel_for);
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

  const at::Tensor x = src.contiguous();
  cpu::segment_gather(static_cast<const char*>(x.const_data_ptr()),
                      indptr.const_data_ptr<int64_t>(), static_cast<char*>(out.mutable_data_ptr()),
                      segments, inner_size(x) * x.element_size(), aten_parallel_for);
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
