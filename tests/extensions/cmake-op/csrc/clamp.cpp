#include <ATen/ATen.h>
#include <torch/library.h>

namespace {

at::Tensor clamp_unit_cpu(const at::Tensor& x) { return x.clamp(0.0, 1.0); }

}  // namespace

TORCH_LIBRARY(cmake_op, m) { m.def("clamp_unit(Tensor x) -> Tensor"); }

TORCH_LIBRARY_IMPL(cmake_op, CPU, m) { m.impl("clamp_unit", &clamp_unit_cpu); }
