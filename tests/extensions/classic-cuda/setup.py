"""classic-ops: built the way many extensions are, with setuptools and torch's helpers."""

import glob
import os

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

__version__ = "1.2.0"

WITH_CUDA = (torch.cuda.is_available() and CUDA_HOME is not None) or os.getenv("FORCE_CUDA", "0") == "1"
if os.getenv("FORCE_ONLY_CPU", "0") == "1":
    WITH_CUDA = False


def get_extensions():
    sources = glob.glob("csrc/*.cpp")
    define_macros = []
    extension = CppExtension
    if WITH_CUDA:
        extension = CUDAExtension
        sources += glob.glob("csrc/*.cu")
        define_macros += [("WITH_CUDA", None)]
    return [extension("classic_ops._C", sources, define_macros=define_macros,
                      extra_compile_args={"cxx": ["-O2"], "nvcc": ["-O2"]})]


setup(
    name="classic-ops",
    version=__version__,
    description="Scale a tensor, on CPU or CUDA",
    packages=find_packages(exclude=["test"]),
    install_requires=["torch"],
    extras_require={"test": ["pytest"]},
    ext_modules=get_extensions(),
    cmdclass={"build_ext": BuildExtension},
)
