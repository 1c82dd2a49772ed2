"""The model extension's CMake build names the CMake its CUDA kernels need.

CMake learned nvcc's C++20 flag in 3.25.2; older ones (Debian 12's 3.25.1 among
them) configure the CUDA build and only then stop on a dialect they "do not know
the flags" for.
The guard in ext/CMakeLists.txt says so in one line, before any toolkit is
looked for, so this runs on a machine without CUDA.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from extmatrix import envs

EXT = Path(__file__).resolve().parent.parent / "ext"
TOO_OLD = "3.25.0"  # the newest on PyPI before 3.25.2


def test_cuda_build_refuses_a_cmake_without_cuda20(tmp_path):
    target = tmp_path / "cmake"
    subprocess.run([envs.uv(), "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                    f"cmake=={TOO_OLD}"], check=True)
    cmake = target / "cmake" / "data" / "bin" / "cmake"
    assert TOO_OLD in subprocess.run([cmake, "--version"], capture_output=True,
                                     text=True, check=True).stdout

    def configure(*args: str) -> subprocess.CompletedProcess:
        build = tmp_path / f"build{len(args)}"
        return subprocess.run([cmake, "-S", str(EXT), "-B", str(build), *args],
                              capture_output=True, text=True)

    cuda = configure("-DSEGMENT_OPS_CUDA=ON")
    assert cuda.returncode != 0
    said = " ".join(cuda.stderr.split())
    assert (f"SEGMENT_OPS_CUDA=ON needs CMake 3.25.2 or newer for C++20 CUDA, this is {TOO_OLD}:"
            " pip install 'cmake>=3.25.2'") in said, cuda.stderr
    # The CPU build passes the guard: it stops only at find_package(Torch), not given here.
    cpu = configure("-DSEGMENT_OPS_CUDA=OFF", "-DCMAKE_PREFIX_PATH=")
    assert "needs CMake 3.25.2" not in cpu.stderr and "Torch" in cpu.stderr, cpu.stderr
