"""Real cells, end to end: build a CPU and a CUDA wheel here, then test them as users would.

Slow (minutes): the CUDA cell compiles kernels for four archs on a CPU-only machine.
Deselect with `-m "not cells"` for a quick run.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from extmatrix import envs
from extmatrix.cells import plan_file
from extmatrix.cli import main
from extmatrix.report import CellReport

ROOT = Path(__file__).resolve().parent.parent
MATRIX = str(ROOT / "matrix.yaml")
CPU, CUDA = "torch2.13-cpu", "torch2.14-cu130"

pytestmark = pytest.mark.cells


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    status = main(["build", "--matrix", MATRIX, "--cell", CPU, "--cell", CUDA, "--dist", str(out)])
    for cell in (CPU, CUDA):
        log = out / cell / "build.log"
        assert log.is_file(), f"{cell} left no build log"
    assert status == 0, (out / CUDA / "build.log").read_text()[-3000:]
    return out


def report(dist: Path, cell: str) -> CellReport:
    found = CellReport.read(dist / cell / "report.json")
    assert found is not None
    return found


def test_wheels_carry_what_the_cells_promised(dist):
    plan = plan_file(MATRIX)
    cpu, cuda = report(dist, CPU), report(dist, CUDA)
    assert cpu.wheel.startswith("segment_ops-0.1.0+pt213cpu-cp310-abi3-")
    assert cuda.wheel.startswith("segment_ops-0.1.0+pt214cu130-cp310-abi3-")
    assert "torch==2.13.*" in cpu.requires and "triton" not in cpu.requires
    # ext/setup.py pins torch itself and knows no cell: the engine adds only the label.
    assert cpu.stamped == ["version 0.1.0 -> 0.1.0+pt213cpu"]
    assert {"torch==2.14.*", "triton"} <= set(cuda.requires)
    cell = plan.cell(CUDA)
    assert cuda.sass == list(cell.archs) and cuda.ptx == list(cell.ptx)  # read from the binary
    assert (dist / CUDA / cuda.wheel).is_file()


def test_wheels_pass_their_tests_and_refuse_a_foreign_torch(dist, capsys):
    # Not strict: a machine with fewer Pythons than the abi3 wheels serve would fail them on
    # that alone (test_faults tests that rule).
    status = main(["test-matrix", "--matrix", MATRIX, "--cell", CPU, "--cell", CUDA,
                   "--dist", str(dist), "--no-strict"])
    assert status == 0, capsys.readouterr().err
    for cell in (CPU, CUDA):
        result = report(dist, cell)
        assert result.test == "passed"
        assert result.junit["passed"] > 20 and result.junit["failures"] == 0
        assert (dist / cell / "junit.xml").is_file()
        assert result.cross_check.startswith("ok beside"), result.cross_check
        assert "built for torch" in result.cross_check


def test_gpu_tests_fail_without_a_gpu_when_required(dist, capsys):
    status = main(["test-matrix", "--matrix", MATRIX, "--cell", CPU, "--dist", str(dist),
                   "--require-gpu"])
    assert status == 1
    result = report(dist, CPU)
    # The engine's plugin stops the session before any test runs: no GPU, no green.
    assert result.test == "failed"
    assert result.reason.startswith("--require-gpu, but torch sees no GPU on this machine")


def test_jit_and_cmake_builds_match_the_wheel(dist):
    """The extension's other two build paths, run once against the CPU cell's torch."""
    venv = Path(os.environ.get("EXTMATRIX_WORK") or ROOT / ".extmatrix") / CPU / "test-env"
    assert envs.python_of(venv).exists()
    subprocess.run([envs.uv(), "pip", "install", "--quiet", "--python",
                    str(envs.python_of(venv)), "cmake==4.4.4", "ninja==1.13.2"], check=True)
    result = subprocess.run(
        [str(envs.python_of(venv)), "-m", "pytest", str(ROOT / "ext" / "tests"), "-m", "build",
         "-p", "no:cacheprovider", "-q", "-rs"], capture_output=True, text=True, cwd=venv)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout.splitlines()[-1]


def test_the_index_serves_each_torch_its_own_wheel(dist, tmp_path, capsys):
    """Real pip, no network: each cell's torch gets that cell's wheel from the index."""
    args = ["index", "--matrix", MATRIX, "--dist", str(dist), "--output",
            str(tmp_path / "index"), "--cell", CPU, "--cell", CUDA]

    def tests_of_last_good_build(cell_id: str, test: str) -> None:
        """As test-matrix records them (whatever the tests above left there)."""
        tested = report(dist, cell_id)
        tested.test = test
        tested.write(dist / cell_id / "last-good.json")

    tests_of_last_good_build(CPU, "failed")
    tests_of_last_good_build(CUDA, "passed")
    assert main(args) == 1  # the cells were named: all of them, or a failure
    assert f"left out {CPU}: the tests of " in capsys.readouterr().err
    assert not (tmp_path / "index" / "torch-2.13.0+cpu.html").exists()
    tests_of_last_good_build(CPU, "passed")
    assert main(args) == 0
    plan = plan_file(MATRIX)
    for cell_id, label in ((CPU, "pt213cpu"), (CUDA, "pt214cu130")):
        cell = plan.cell(cell_id)
        page = tmp_path / "index" / f"torch-{cell.torch}+{cell.flavor}.html"
        assert page.is_file()
        venv = tmp_path / f"env-{cell_id}"
        subprocess.run([envs.uv(), "venv", "--quiet", "--seed", "--python",
                        envs.find_python(cell), str(venv)], check=True)
        sources = envs.sources_for(cell)
        subprocess.run(envs.install_cmd(venv, [cell.torch_spec], sources), check=True)
        # Only the index: no pip configuration of this machine, no other index.
        offline = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
        for how in (["--no-index", "-f", str(page)],
                    ["--index-url", (tmp_path / "index" / page.stem / "simple").as_uri()]):
            subprocess.run([str(envs.python_of(venv)), "-m", "pip", "uninstall", "-y", "-q",
                            "segment-ops"], capture_output=True)
            done = subprocess.run([str(envs.python_of(venv)), "-m", "pip", "install", "-q",
                                   *how, "segment-ops"], capture_output=True, text=True,
                                  env=offline)
            assert done.returncode == 0, done.stderr[-2000:]
            version = subprocess.run([str(envs.python_of(venv)), "-c",
                                      "import importlib.metadata as m; "
                                      "print(m.version('segment-ops'))"],
                                     capture_output=True, text=True).stdout.strip()
            assert version == f"0.1.0+{label}", how


def test_stable_abi_audit_on_real_builds(dist, tmp_path):
    """The audit passes the stable sources compiled against the cell's torch and fails
    the classic wheel, naming the libtorch C++ symbols it imports."""
    import zipfile

    from extmatrix import symbols

    classic = report(dist, CPU)
    with zipfile.ZipFile(dist / CPU / classic.wheel) as zf:
        member = next(n for n in zf.namelist() if n.endswith(".so"))
        result = symbols.audit(Path(zf.extract(member, tmp_path)))
    assert not result.ok and len(result.torch_cxx) > 10
    assert "uses" in symbols.problem(result) and "at::" in symbols.problem(result)

    venv = Path(os.environ.get("EXTMATRIX_WORK") or ROOT / ".extmatrix") / CPU / "build-env"
    python = envs.python_of(venv)
    include = subprocess.run(
        [str(python), "-c", "import torch.utils.cpp_extension as c; "
                            "print(c.include_paths()[0])"],
        capture_output=True, text=True, check=True).stdout.strip()
    library = tmp_path / "libstable.so"
    subprocess.run(["c++", "-std=c++20", "-O1", "-shared", "-fPIC", f"-I{include}",
                    "-DTORCH_TARGET_VERSION=0x020b000000000000",
                    str(ROOT / "ext" / "csrc" / "stable" / "segment_ops.cpp"), "-o", str(library)],
                   check=True)
    stable = symbols.audit(library)
    assert stable.ok, symbols.problem(stable)
    assert "torch_parallel_for" in stable.shims
