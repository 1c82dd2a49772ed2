"""Build script for segment-ops: one abi3 wheel per (torch minor, CPU/CUDA/ROCm), or, with
TORCH_TARGET_VERSION set, one stable-ABI wheel per CPU/CUDA/ROCm for every torch from that
release on.

Build with the target torch already installed:
    pip wheel --no-build-isolation --no-deps . -w dist/
    TORCH_TARGET_VERSION=0x020b000000000000 pip wheel ...   # stable ABI, torch >= 2.11
The environment variables it reads are the ones most extensions honour; README.md lists them.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from setuptools import setup

try:
    import torch
    from torch.utils import cpp_extension
except ModuleNotFoundError:  # an isolated build: pip's fresh environment has no torch
    sys.exit("segment-ops: no torch where this build runs: install the torch the wheel is "
             "for, then build with --no-build-isolation (pip wheel --no-build-isolation "
             "--no-deps .)")

VERSION = "0.1.0"
PACKAGE = "segment_ops"  # the import package; its compiled module is PACKAGE._C
# torch >= 2.9 supports CPython >= 3.10, so the wheel is tagged cp310-abi3.
LIMITED_API_TAG, LIMITED_API_HEX = "cp310", "0x030A0000"
TORCH_MAJOR, TORCH_MINOR = (int(p) for p in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())
# GPU archs come only from these variables; the build never probes a GPU.
ARCH_VARIABLE = {"cuda": "TORCH_CUDA_ARCH_LIST", "rocm": "PYTORCH_ROCM_ARCH"}
ARCH_EXAMPLE = {"cuda": "8.0;9.0+PTX", "rocm": "gfx90a;gfx942"}


def stable_target():
    """(major, minor) from TORCH_TARGET_VERSION (torch's encoding, 0x020b000000000000 for
    2.11), or None for the classic build. The stable build compiles csrc/stable/ against
    the oldest torch it serves; it loads in every later one."""
    raw = os.environ.get("TORCH_TARGET_VERSION", "").strip()
    if not raw:
        return None
    try:
        value = int(raw, 0)
    except ValueError:
        sys.exit(f"segment-ops: TORCH_TARGET_VERSION={raw!r} is not a number; "
                 "write it as torch does, e.g. 0x020b000000000000 for torch 2.11")
    target = (value >> 56, (value >> 48) & 0xFF)
    if target > (TORCH_MAJOR, TORCH_MINOR) or target < (2, 10):
        sys.exit(f"segment-ops: TORCH_TARGET_VERSION={raw} means torch {target[0]}.{target[1]}; "
                 f"it must lie between 2.10 and the torch building it ({torch.__version__})")
    return target


STABLE = stable_target()


def env_flag(name):
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def toolkit_found(home, *markers):
    # Checks headers too: torch's guess from a wrapper nvcc on PATH can be a
    # prefix like /usr/local that holds no toolkit.
    return bool(home) and all(Path(home, m).exists() for m in markers)


def choose_variant():
    """'cpu', 'cuda' or 'rocm' from how torch was built and which toolkit is
    present; never from the GPUs of the build machine, which usually has none.
    FORCE_CUDA=1 insists on GPU kernels, FORCE_ONLY_CPU=1 on CPU kernels only."""
    if env_flag("FORCE_ONLY_CPU"):
        return "cpu"
    gpu = "cuda" if torch.version.cuda else "rocm" if torch.version.hip else None
    if gpu is None:
        if env_flag("FORCE_CUDA"):
            sys.exit(f"segment-ops: FORCE_CUDA=1, but torch {torch.__version__} is CPU-only")
        return "cpu"
    home, markers = ((cpp_extension.CUDA_HOME, ("bin/nvcc", "include/cuda_runtime_api.h"))
                     if gpu == "cuda" else (cpp_extension.ROCM_HOME, ("bin/hipcc",)))
    if toolkit_found(home, *markers):
        return gpu
    where = f"{'CUDA' if gpu == 'cuda' else 'ROCM'}_HOME={home}"
    if env_flag("FORCE_CUDA"):
        sys.exit(f"segment-ops: FORCE_CUDA=1, but no {gpu} toolkit was found ({where})")
    print(f"segment-ops: torch {torch.__version__} supports {gpu} but no toolkit was found "
          f"({where}); building CPU kernels only", file=sys.stderr)
    return "cpu"


def local_label(variant):
    """What this build is, as a PEP 440 local label (recorded in the build facts; CI
    tools that publish one wheel per torch x flavor add it to the version). A stable
    build serves many torch releases: the flavor alone."""
    torch_tag = "" if STABLE else f"pt{TORCH_MAJOR}{TORCH_MINOR}"
    if variant == "cuda":
        return torch_tag + "cu" + "".join(torch.version.cuda.split(".")[:2])
    if variant == "rocm":
        return torch_tag + "rocm" + ".".join(torch.version.hip.split(".")[:2])
    return torch_tag + "cpu"


def runtime_deps(variant):
    # The Triton backend needs triton; torch's GPU wheels name it this way.
    return {"cuda": ["triton"], "rocm": ["pytorch-triton-rocm"]}.get(variant, [])


def first_line(*cmd, containing=""):
    """First line of a tool's output that contains `containing`, or None."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return next((line.strip() for line in out.splitlines() if containing in line), None)


def build_facts(variant):
    """What the import-time check compares (see src/segment_ops/_compat.py)."""
    cxx = os.environ.get("CXX", "c++")
    nvcc = str(Path(cpp_extension.CUDA_HOME or "", "bin", "nvcc"))
    return {
        "version": VERSION,
        "label": local_label(variant),
        "variant": variant,
        "torch": torch.__version__,
        "torch_git": torch.version.git_version,
        "cuda": torch.version.cuda if variant == "cuda" else None,
        "hip": torch.version.hip if variant == "rocm" else None,
        "arch_list": os.environ.get(ARCH_VARIABLE[variant]) if variant in ARCH_VARIABLE else None,
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "compiler": first_line(cxx, "--version") or cxx,
        "nvcc": first_line(nvcc, "--version", containing="release") if variant == "cuda" else None,
        "python_abi": f"{LIMITED_API_TAG}-abi3",
        "stable_abi": f"{STABLE[0]}.{STABLE[1]}" if STABLE else None,
    }


class BuildExt(cpp_extension.BuildExtension):
    def finalize_options(self):
        super().finalize_options()
        # setuptools skips an extension whose .so is newer than its sources,
        # even if that .so was built against another torch; ninja's own
        # command-line and header tracking decides what to rebuild instead.
        self.force = True

    def run(self):
        # torch would otherwise ask the local GPU for its arch: a CPU builder has none.
        if VARIANT in ARCH_VARIABLE and not os.environ.get(ARCH_VARIABLE[VARIANT], "").strip():
            sys.exit(
                f"segment-ops: a {VARIANT} build needs {ARCH_VARIABLE[VARIANT]} "
                f"(e.g. {ARCH_EXAMPLE[VARIANT]!r}); it never detects GPUs"
            )
        super().run()
        facts = Path(self.get_ext_fullpath(f"{PACKAGE}._C")).with_name("_build_info.json")
        facts.write_text(json.dumps(build_facts(VARIANT), indent=2) + "\n")


def extension(variant):
    if STABLE:
        sources = ["csrc/stable/segment_ops.cpp", "csrc/python_module.cpp"]
        gpu_sources = ["csrc/stable/segment_ops_cuda.cu"]
        target = f"-DTORCH_TARGET_VERSION=0x{STABLE[0]:02x}{STABLE[1]:02x}000000000000"
        cxx_flags, nvcc_flags = ["-O3", target], ["-O3", target]
    else:
        sources = ["csrc/segment_sum.cpp", "csrc/python_module.cpp"]
        gpu_sources = ["csrc/cuda/segment_sum.cu"]
        cxx_flags, nvcc_flags = ["-O3"], ["-O3"]
    # torch >= 2.7 defines Py_LIMITED_API itself for py_limited_api=True
    # (pytorch/pytorch#145764); older ones need it here or abi3 is a false claim.
    if (TORCH_MAJOR, TORCH_MINOR) < (2, 7):
        cxx_flags.append(f"-DPy_LIMITED_API={LIMITED_API_HEX}")
    if variant == "cpu":
        return cpp_extension.CppExtension(
            f"{PACKAGE}._C", sources, extra_compile_args={"cxx": cxx_flags}, py_limited_api=True
        )
    # On ROCm torch hipifies the .cu and compiles it with hipcc.
    return cpp_extension.CUDAExtension(
        f"{PACKAGE}._C",
        sources + gpu_sources,
        extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
        py_limited_api=True,
    )


VARIANT = choose_variant()

setup(
    version=VERSION,
    install_requires=[f"torch>={STABLE[0]}.{STABLE[1]}" if STABLE
                      else f"torch=={TORCH_MAJOR}.{TORCH_MINOR}.*", *runtime_deps(VARIANT)],
    ext_modules=[extension(VARIANT)],
    cmdclass={"build_ext": BuildExt},
    options={"bdist_wheel": {"py_limited_api": LIMITED_API_TAG}},
)
