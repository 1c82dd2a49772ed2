// Op schemas and CPU kernels of the stable-ABI build: the same ops and the same
// kernels (csrc/cpu/) as the classic build in csrc/segment_sum.cpp, reached
// through torch::stable::Tensor and registered with STABLE_TORCH_LIBRARY.
#include "segment_ops.h"

#include "../cpu/segment_kernels.h"

namespace segment_ops::stable {
namespace {

constexpr auto stable_parallel_for = [](int64_t begin, int64_t end, int64_t grain,
                                        const auto& body) {
  torch::stable::parallel_for(begin, end, grain, body);
};

void check_indptr_cpu(const char* op, const Tensor& indptr, int64_t rows, const char* rows_name) {
  const auto facts = cpu::indptr_facts(indptr.const_data_ptr<int64_t>(), indptr.numel());
  check_indptr_values(op, facts.first, facts.last, facts.decreasing, rows, rows_name);
}

Tensor segment_sum_cpu(Tensor src, Tensor indptr_arg) {
  check_metadata("segment_sum", "src", src, indptr_arg);
  const Tensor indptr = torch::stable::contiguous(indptr_arg);
  check_indptr_cpu("segment_sum", indptr, src.size(0), "src.size(0)");

  const int64_t segments = indptr.numel() - 1;
  Tensor out = new_rows_like(src, segments);
  if (out.numel() == 0) return out;

  const Tensor x = torch::stable::contiguous(src);
  dispatch_floating(x.scalar_type(), [&](auto zero) {
    using T = decltype(zero);
    cpu::segment_sum(x.const_data_ptr<T>(), indptr.const_data_ptr<int64_t>(),
                     out.mutable_data_ptr<T>(), segments, inner_size(x), stable_parallel_for);
  });
  return out;
}

Tensor segment_gather_cpu(Tensor src, Tensor indptr_arg, int64_t rows) {
  check_metadata("segment_gather", "src", src, indptr_arg);
  const Tensor indptr = torch::stable::contiguous(indptr_arg);
  const int64_t segments = indptr.numel() - 1;
  check_gather_shape(src, segments, rows);
  check_indptr_cpu("segment_gather", indptr, rows, "rows");

  Tensor out = new_rows_like(src, rows);
  if (out.numel() == 0) return out;

  const Tensor x = torch::stable::contiguous(src);
  cpu::segment_gather(static_cast<const char*>(x.const_data_ptr()),
                      indptr.const_data_ptr<int64_t>(), static_cast<char*>(out.mutable_data_ptr()),
                      segments, inner_size(x) * static_cast<int64_t>(x.element_size()),
                      stable_parallel_for);
  return out;
}

}  // namespace
}  // namespace segment_ops::stable

// Schema tags (pt2_compliant_tag) reach the stable API in torch 2.12; built for
// 2.11 the ops go without, which opcheck does not need.
SEGMENT_OPS_STABLE_LIBRARY(SEGMENT_OPS_NAMESPACE, m) {
  m.def("segment_sum(Tensor src, Tensor indptr) -> Tensor");
  m.def("segment_gather(Tensor src, Tensor indptr, SymInt rows) -> Tensor");
}

SEGMENT_OPS_STABLE_LIBRARY_IMPL(SEGMENT_OPS_NAMESPACE, CPU, m) {
  m.impl("segment_sum", TORCH_BOX(&segment_ops::stable::segment_sum_cpu));
  m.impl("segment_gather", TORCH_BOX(&segment_ops::stable::segment_gather_cpu));
}
