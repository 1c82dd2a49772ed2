"""A real container cell, end to end: its image, cibuildwheel inside it, the wheel tested outside.

Slow (minutes; the first run also bootstraps the Debian base image without a
registry). Needs podman (with runc) or docker with buildx. Skipped when neither is
usable, unless EXTMATRIX_CONTAINER_TESTS=required (CI sets it: an engine that went
missing must fail the run, not skip it).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from extmatrix import engines, envs, toolchain
from extmatrix.cli import main
from extmatrix.report import CellReport
from extmatrix.toolchain import NotBuildable

ROOT = Path(__file__).resolve().parent.parent
MATRIX = str(ROOT / "matrix.yaml")
CPU = "torch2.13-cpu"

pytestmark = [pytest.mark.cells, pytest.mark.container]


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    try:
        engines.detect(None, ROOT, toolchain.cache_root())
    except NotBuildable as exc:
        if os.environ.get("EXTMATRIX_CONTAINER_TESTS") == "required":
            pytest.fail(f"container tests are required here: {exc}")
        pytest.skip(str(exc))
    assert main(["images", "--matrix", MATRIX, "--cell", CPU]) == 0
    out = tmp_path_factory.mktemp("container-dist")
    status = main(["build", "--matrix", MATRIX, "--backend", "container", "--cell", CPU,
                   "--dist", str(out)])
    log = out / CPU / "build.log"
    assert status == 0 and log.is_file(), log.read_text()[-3000:] if log.is_file() else status
    return out


def test_the_wheel_is_repaired_and_leaves_torch_to_torch(dist):
    report = CellReport.read(dist / CPU / "report.json")
    assert report is not None and report.build == "built", report and report.reason
    assert report.backend == "container"
    assert report.wheel.startswith("segment_ops-0.1.0+pt213cpu-cp310-abi3-manylinux_2_")
    assert "torch==2.13.*" in report.requires
    repair = report.repair
    assert repair["tag"].split("-")[-1].startswith("manylinux_2_")
    assert {"libc10.so", "libtorch_cpu.so"} <= set(repair["excluded"])
    assert not [lib for lib in repair["vendored"] if lib.startswith(("libtorch", "libc10"))]
    assert repair["problems"] == []
    assert report.timings["compile"] > 0 and report.timings["in_image_tests"] > 0


def test_the_wheel_passes_the_matrix_tests(dist, capsys):
    status = main(["test-matrix", "--matrix", MATRIX, "--cell", CPU, "--dist", str(dist)])
    assert status == 0, capsys.readouterr().err
    report = CellReport.read(dist / CPU / "report.json")
    assert report.test == "passed" and report.junit["failures"] == 0
    assert report.junit["passed"] > 20


def test_hipify_turns_the_cuda_kernels_into_hip(dist, tmp_path):
    """The ROCm build's first step, on CPU: torch's own hipify over the .cu sources.

    Compiling the result needs a ROCm torch and a matching hipcc, neither of which a
    CPU-only builder without PyTorch's index has; that part runs in real CI only.
    """
    venv = Path(os.environ.get("EXTMATRIX_WORK") or ROOT / ".extmatrix") / CPU / "test-env"
    assert envs.python_of(venv).exists()  # left by test-matrix
    script = (
        "import shutil, sys\n"
        "from torch.utils.hipify import hipify_python\n"
        "root = sys.argv[1]\n"
        "shutil.copytree(sys.argv[2], root + '/csrc')\n"
        "done = hipify_python.hipify(project_directory=root, output_directory=root,\n"
        "    includes=[root + '/csrc/cuda/*'], is_pytorch_extension=True,\n"
        "    show_detailed=False, show_progress=False)\n"
        "print('\\n'.join(str(v.hipified_path) for v in done.values() if v.hipified_path))\n")
    result = subprocess.run([str(envs.python_of(venv)), "-c", script, str(tmp_path / "hip"),
                             str(ROOT / "ext" / "csrc")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    produced = [Path(p) for p in result.stdout.split() if p.endswith(".hip")]
    assert produced, result.stdout
    text = "".join(p.read_text() for p in produced)
    assert '#include "hip/hip_runtime.h"' in text
    assert "hipLaunchKernelGGL" in text and "<<<" not in text
    assert "hipStream_t" in text and "cudaStream_t" not in text
    assert "c10/hip/HIPGuard.h" in text and "c10/cuda/" not in text
