"""The same sources built the two other ways: JIT (torch.utils.cpp_extension.load)
and CMake (find_package(Torch) + torch.ops.load_library), each under its own op
namespace so they coexist with the installed wheel in this process, and each
checked against the wheel's results. The stable-ABI sources are JIT-built too.

These need the source tree (SEGMENT_OPS_SRC, default: the folder above this
file) and a C++ compiler; the CMake test also needs cmake. With a CUDA build of
torch the CMake test compiles the CUDA kernels as well, for the GPU it then
checks them on (or for $TORCH_CUDA_ARCH_LIST), so it is a GPU test there and
needs the CUDA toolkit torch was built with. Select or deselect them with
``-m build`` / ``-m "not build"``.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from torch.library import opcheck

import segment_ops
from segment_ops.ops import register_python_parts

pytestmark = pytest.mark.build

SOURCE_DIR = Path(os.environ.get("SEGMENT_OPS_SRC", Path(__file__).resolve().parents[1]))
CPU_SOURCES = [SOURCE_DIR / "csrc" / "segment_sum.cpp"]
STABLE_CPU_SOURCES = [SOURCE_DIR / "csrc" / "stable" / "segment_ops.cpp"]


@pytest.fixture(scope="module", autouse=True)
def needs_sources_and_compiler():
    if not CPU_SOURCES[0].exists():
        pytest.fail(f"extension sources not found at {SOURCE_DIR} (set SEGMENT_OPS_SRC)")
    if not shutil.which(os.environ.get("CXX", "c++")):
        pytest.skip("no C++ compiler (c++ or $CXX) on PATH")


def same_results_as_wheel(namespace):
    ops = getattr(torch.ops, namespace)
    register_python_parts(namespace)
    indptr = torch.tensor([0, 3, 3, 7, 8])
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        src = torch.randn(8, 5, dtype=torch.float64).to(dtype)
        assert torch.equal(ops.segment_sum(src, indptr), segment_ops.segment_sum(src, indptr))
    src = torch.randn(8, 5, dtype=torch.float64, requires_grad=True)
    opcheck(ops.segment_sum.default, (src, indptr))
    assert torch.autograd.gradcheck(ops.segment_sum, (src, indptr))
    unsorted = torch.tensor([0, 5, 3, 8])
    with pytest.raises(RuntimeError, match="indptr must be non-decreasing") as built:
        ops.segment_sum(src, unsorted)
    with pytest.raises(RuntimeError) as wheel:
        segment_ops.segment_sum(src, unsorted)
    # Word for word, whichever build: the stable sources format their own
    # messages (csrc/stable/segment_ops.h says why).
    assert str(built.value).splitlines()[0] == str(wheel.value).splitlines()[0]


def test_jit_load(tmp_path):
    from torch.utils.cpp_extension import load

    load(
        name="segment_ops_jit",
        sources=[str(s) for s in CPU_SOURCES],
        extra_cflags=["-O2", "-DSEGMENT_OPS_NAMESPACE=segment_ops_jit"],
        build_directory=str(tmp_path),
        is_python_module=False,  # loads the library with torch.ops.load_library
    )
    same_results_as_wheel("segment_ops_jit")


def test_jit_load_stable_abi(tmp_path):
    from torch.utils.cpp_extension import load

    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    if (major, minor) < (2, 10):
        pytest.skip(f"torch {torch.__version__} has no TORCH_TARGET_VERSION (2.10 and later)")
    load(
        name="segment_ops_stable_jit",
        sources=[str(s) for s in STABLE_CPU_SOURCES],
        extra_cflags=[
            "-O2",
            "-DSEGMENT_OPS_NAMESPACE=segment_ops_stable_jit",
            f"-DTORCH_TARGET_VERSION=0x{major:02x}{minor:02x}000000000000",
        ],
        build_directory=str(tmp_path),
        is_python_module=False,
    )
    same_results_as_wheel("segment_ops_stable_jit")


# With a CUDA torch the CMake builds compile the CUDA kernels too and are
# checked on the GPU.
CMAKE_FLAVORS = pytest.mark.parametrize(
    "flavor",
    [pytest.param("cuda", marks=pytest.mark.gpu) if torch.version.cuda else "cpu"],
)


def needs_cmake(monkeypatch):
    """cmake ($CMAKE, the one beside this Python, or PATH's), or a skip saying
    why the CMake path cannot run here."""
    if torch.version.hip:
        pytest.skip("the CMake path builds CPU or CUDA kernels, not ROCm ones (CMakeLists.txt)")
    ab = import_ab(monkeypatch)
    try:
        return ab.find_cmake()
    except ab.UsageError as err:
        pytest.skip(str(err))


def run(cmd):
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode:
        pytest.fail(f"{' '.join(cmd)} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")


def import_ab(monkeypatch):
    """benchmarks/ab.py, which builds the sources with CMake as users would."""
    monkeypatch.syspath_prepend(str(SOURCE_DIR / "benchmarks"))
    import ab

    return ab


def cmake_cuda_args(monkeypatch):
    """What find_package(Torch) needs to build the CUDA kernels beside a CUDA torch."""
    ab = import_ab(monkeypatch)
    # The kernels run on this GPU, so they are built for it, unless the
    # caller names the architectures.
    if not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        capability = torch.cuda.get_device_capability()
        monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "{}.{}".format(*capability))
    try:
        return ab.cuda_args()
    except ab.UsageError as err:  # no toolkit here
        pytest.skip(f"CMake CUDA build: {err}")


def same_cuda_results_as_wheel(namespace):
    ops = getattr(torch.ops, namespace)
    # Widths and lengths that reach each kernel family: tile/lane (1 column),
    # team (32 columns, long segments), stream (64 columns, short segments).
    for inner, max_len in ((1, 16), (1, 4000), (32, 2000), (64, 16)):
        lengths = torch.randint(0, max_len + 1, (3000,))
        indptr = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]).cuda()
        rows = int(indptr[-1])
        for dtype in (torch.float32, torch.bfloat16):
            src = torch.randn(rows, inner, device="cuda", dtype=dtype)
            assert torch.equal(ops.segment_sum(src, indptr), segment_ops.segment_sum(src, indptr))
            seg = torch.randn(indptr.numel() - 1, inner, device="cuda", dtype=dtype)
            assert torch.equal(
                ops.segment_gather(seg, indptr, rows),
                segment_ops.segment_gather(seg, indptr, rows),
            )


@CMAKE_FLAVORS
def test_cmake_build(tmp_path, monkeypatch, flavor):
    cmake = needs_cmake(monkeypatch)
    build = tmp_path / "build"
    run(
        [
            cmake,
            "-S",
            str(SOURCE_DIR),
            "-B",
            str(build),
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
            "-DSEGMENT_OPS_NAMESPACE=segment_ops_cmake",
            *(cmake_cuda_args(monkeypatch) if flavor == "cuda" else []),
        ]
    )
    run([cmake, "--build", str(build), "-j", os.environ.get("MAX_JOBS", "2")])
    torch.ops.load_library(str(build / "libsegment_ops.so"))
    same_results_as_wheel("segment_ops_cmake")
    if flavor == "cuda":
        same_cuda_results_as_wheel("segment_ops_cmake")


@CMAKE_FLAVORS
def test_ab_variants_side_by_side(tmp_path, monkeypatch, flavor):
    # benchmarks/ab.py builds one library per variant of the kernel header and
    # times them in one process: two copies of the same header must load side
    # by side and give the wheel's results.
    needs_cmake(monkeypatch)  # ab.py finds the same one
    if flavor == "cuda":
        cmake_cuda_args(monkeypatch)  # skips without a toolkit, names the GPU's arch
    ab = import_ab(monkeypatch)

    header = SOURCE_DIR / "csrc" / "cuda" / "segment_kernels.cuh"
    # b also defines a macro that nothing reads: its build must still match a's.
    probe = "SEGMENT_OPS_AB_PROBE=1"
    assert ab.main(["build", "--out", str(tmp_path), f"a={header}", f"b={header}:{probe}"]) == 0
    assert f"-D{probe}" in (tmp_path / "b" / "CMakeCache.txt").read_text()
    assert f"-D{probe}" not in (tmp_path / "a" / "CMakeCache.txt").read_text()
    assert ab.main(["build", "--out", str(tmp_path), "c"]) == 2  # not NAME=HEADER
    assert ab.main(["build", "--out", str(tmp_path), f"c={header}:1X"]) == 2  # not a macro
    out = tmp_path / "ab.json"
    device = "cuda" if flavor == "cuda" else "cpu"
    args = [
        "run",
        str(tmp_path),
        "--device",
        device,
        "--rows",
        "20000",
        "--rounds",
        "1",
        "--budget",
        "0.01",
        "--cases",
        "float32:power:1,bfloat16:short:64",
        "--out",
        str(out),
    ]
    assert ab.main(args) == 0
    profile = ["profile", str(tmp_path), "--device", device, "--rows", "2000", "--calls", "2"]
    assert ab.main([*profile, "--case", "bfloat16:power:4", "--op", "bwd", "--variant", "b"]) == 0
    cases = json.loads(out.read_text())["cases"]
    assert [(c["dtype"], c["inner"]) for c in cases] == [("float32", 1), ("bfloat16", 64)]
    for case in cases:
        assert set(case["variants"]) == {"a", "b"}
        for kind in ("fwd", "bwd"):
            assert case["variants"]["b"][kind]["max_abs_diff"] == 0
            assert case["variants"]["b"][kind]["copy_fraction"] > 0
    same_results_as_wheel("segment_ops_ab_b")
    if flavor == "cuda":
        same_cuda_results_as_wheel("segment_ops_ab_b")
