"""The model extension's CMake build names the CMake its CUDA kernels need.

CMake learned nvcc's C++20 flag in 3.25.2; older ones (Debian 12's 3.25.1 among
them) configure the CUDA build and only then stop on a dialect they "do not know
the flags" for. The guard in ext/CMakeLists.txt says so in one line, before any
compiler or toolkit is looked for, so the CUDA half runs without CUDA.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from extmatrix import envs

EXT = Path(__file__).resolve().parent.parent / "ext"
TOO_OLD = "3.25.0"  # the newest on PyPI before 3.25.2
# What could lead CMake to a real torch or another generator on this machine.
HOST_HINTS = ("CMAKE_PREFIX_PATH", "Torch_DIR", "Torch_ROOT", "CMAKE_GENERATOR")


def test_cuda_build_refuses_a_cmake_without_cuda20(tmp_path):
    target = tmp_path / "cmake"
    subprocess.run([envs.uv(), "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                    f"cmake=={TOO_OLD}"], check=True)
    cmake = target / "cmake" / "data" / "bin" / "cmake"
    assert TOO_OLD in subprocess.run([cmake, "--version"], capture_output=True,
                                     text=True, check=True).stdout
    # A stand-in TorchConfig.cmake: reaching find_package(Torch) says so and stops.
    stub = tmp_path / "torch-stub"
    stub.mkdir()
    (stub / "TorchConfig.cmake").write_text('message(FATAL_ERROR "stub Torch reached")\n')
    env = {k: v for k, v in os.environ.items() if k not in HOST_HINTS}

    def configure(cuda: str) -> tuple[int, str]:
        done = subprocess.run(
            [cmake, "-S", str(EXT), "-B", str(tmp_path / f"build-{cuda}"),
             f"-DSEGMENT_OPS_CUDA={cuda}", f"-DTorch_DIR={stub}",
             "-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF"],
            capture_output=True, text=True, env=env)
        return done.returncode, " ".join(done.stderr.split())

    status, said = configure("ON")
    assert status != 0
    assert (f"SEGMENT_OPS_CUDA=ON needs CMake 3.25.2 or newer for C++20 CUDA, this is {TOO_OLD}:"
            " pip install 'cmake>=3.25.2'") in said, said
    assert "stub Torch reached" not in said
    # The CPU build passes the guard and goes on to find_package(Torch).
    status, said = configure("OFF")
    assert status != 0 and "stub Torch reached" in said and "needs CMake" not in said, said
