// `segment_ops._C`: an empty Python module. Importing it loads this shared
// library, whose static initialisers run the TORCH_LIBRARY registrations; the
// ops are then reached through torch.ops. Only the wheel build compiles this
// file. It uses nothing but the limited C API, so one abi3 wheel serves every
// CPython the torch release supports.
#include <Python.h>

static struct PyModuleDef segment_ops_module = {
    PyModuleDef_HEAD_INIT, "segment_ops._C", nullptr, -1, nullptr,
};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&segment_ops_module); }
