#include <torch/extension.h>

at::Tensor add_one(const at::Tensor& x) { return x + 1; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("add_one", &add_one); }
