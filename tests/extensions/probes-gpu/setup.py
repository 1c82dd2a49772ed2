"""Decides CUDA from the machine it builds on: right on a GPU workstation, wrong on a builder."""

import torch
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

if torch.cuda.is_available():
    ext = CUDAExtension("probes_gpu._C", ["csrc/add.cpp", "csrc/add_cuda.cu"])
else:
    ext = CppExtension("probes_gpu._C", ["csrc/add.cpp"])

setup(
    name="probes-gpu",
    version="0.1.0",
    packages=["probes_gpu"],
    install_requires=["torch"],
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExtension},
)
