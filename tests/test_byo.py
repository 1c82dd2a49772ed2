"""Extensions written the way others write them build and test unmodified.

Each extension under tests/extensions/ follows a style found in the wild and
none follows ext/'s conventions: classic setuptools with FORCE_CUDA (classic-cuda),
scikit-build-core + CMake + TORCH_LIBRARY (cmake-op), pure Python with Triton
kernels (triton-kernels), a version from git tags through setuptools-scm (scm-version),
and one that decides CUDA from torch.cuda.is_available() (probes-gpu), whose CUDA cell
must fail with the one-line diagnosis.

EXTMATRIX_BYO_CUDA=1 (`nox -s byo-cuda`) also builds classic-cuda and cmake-op for
torch2.14-cu130 and reads their SASS: minutes of nvcc, so not in every run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from extmatrix.cli import main
from extmatrix.report import CellReport

ROOT = Path(__file__).resolve().parent.parent
EXTENSIONS = ROOT / "tests" / "extensions"
CPU, CUDA = "py3.11-torch2.13-cpu", "py3.11-torch2.14-cu130"
CUDA_ARCHS = ["8.0", "9.0"]

pytestmark = pytest.mark.cells


def matrix(name: str, dist: str, import_name: str, tests: str) -> str:
    return f"""\
extension:
  path: ext
  name: {dist}
  import: {import_name}
  tests: {tests}
  abi3: false
axes:
  torch: ["2.13", "2.14"]
  flavor: [cpu, cu130]
  python: ["3.11"]
flavors:
  cpu: {{}}
  cu130: {{archs: {CUDA_ARCHS}, runtime_deps: [triton]}}
exclude:
  - {{torch: "2.13", flavor: cu130}}
  - {{torch: "2.14", flavor: cpu}}
"""


STYLES = {
    "classic-cuda": ("classic-ops", "classic_ops", "test"),
    "cmake-op": ("cmake-op", "cmake_op", "tests"),
    "triton-kernels": ("tri-kernels", "tri_kernels", "tests"),
    "probes-gpu": ("probes-gpu", "probes_gpu", "tests"),
    "scm-version": ("scm-ops", "scm_ops", "tests"),
}


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("work")


def project(name: str, tmp_path: Path, work: Path, monkeypatch) -> Path:
    """A copy of the extension, byte for byte, beside a matrix that points at it."""
    shutil.copytree(EXTENSIONS / name, tmp_path / "ext")
    (tmp_path / "matrix.yaml").write_text(matrix(name, *STYLES[name]))
    monkeypatch.setenv("EXTMATRIX_WORK", str(work / name))
    monkeypatch.delenv("CI", raising=False)
    return tmp_path


def run(command: str, where: Path, cell: str) -> int:
    return main([command, "--matrix", str(where / "matrix.yaml"), "--dist", str(where / "dist"),
                 "--cell", cell])


def result(where: Path, cell: str) -> CellReport:
    found = CellReport.read(where / "dist" / cell / "report.json")
    assert found is not None
    return found


def unchanged(name: str, where: Path) -> None:
    for path in (EXTENSIONS / name).rglob("*"):
        if path.is_file():
            assert (where / "ext" / path.relative_to(EXTENSIONS / name)).read_bytes() == \
                path.read_bytes(), f"the build changed {path.name}"


@pytest.mark.parametrize("name, wheel_start", [
    ("classic-cuda", "classic_ops-1.2.0+pt213cpu-cp311-cp311-linux_x86_64"),
    ("cmake-op", "cmake_op-0.3.0+pt213cpu-py3-none-linux_x86_64"),
    ("triton-kernels", "tri_kernels-0.5.1+pt213cpu-py3-none-any"),
])
def test_unmodified_extension_builds_and_passes_its_cpu_cell(name, wheel_start, tmp_path, work,
                                                              monkeypatch, capsys):
    where = project(name, tmp_path, work, monkeypatch)
    assert run("build", where, CPU) == 0, capsys.readouterr().err
    built = result(where, CPU)
    assert built.wheel.startswith(wheel_start), built.wheel
    assert "torch==2.13.*" in built.requires
    assert any("version" in change for change in built.stamped)  # the engine wrote the label
    with zipfile.ZipFile(where / "dist" / CPU / built.wheel) as zf:
        assert zf.testzip() is None
    assert run("test-matrix", where, CPU) == 0, capsys.readouterr().err
    tested = result(where, CPU)
    assert tested.test == "passed" and tested.junit["passed"] >= 1
    if name == "triton-kernels":
        assert tested.junit["gpu_skipped"] == 1  # counted by the engine's plugin
    unchanged(name, where)


def test_a_module_deleted_since_the_last_build_leaves_the_wheel(tmp_path, work, monkeypatch,
                                                                capsys):
    """setuptools' build_py never prunes its staging; the engine keeps the objects warm
    between builds, not the staged package, so the wheel holds what the tree holds."""
    where = project("classic-cuda", tmp_path, work, monkeypatch)
    legacy = where / "ext" / "classic_ops" / "legacy.py"
    legacy.write_text("OLD = True\n")
    for holds_legacy in (True, False):
        assert run("build", where, CPU) == 0, capsys.readouterr().err
        with zipfile.ZipFile(where / "dist" / CPU / result(where, CPU).wheel) as zf:
            assert ("classic_ops/legacy.py" in zf.namelist()) is holds_legacy
        legacy.unlink(missing_ok=True)


def test_a_version_from_git_tags_reaches_the_wheel(tmp_path, work, monkeypatch, capsys):
    """setuptools-scm asks git for the version and for package data, and a cell's copy of
    the sources has no .git of the tree's: the engine asks in the tree and hands the
    version on (the cell's local label for git's), and gives the copy git's file list."""
    where = project("scm-version", tmp_path, work, monkeypatch)
    monkeypatch.delenv("SETUPTOOLS_SCM_PRETEND_VERSION", raising=False)

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org",
                        "-C", str(where / "ext"), *args], check=True, capture_output=True)

    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    git("tag", "v0.4.0")
    (where / "ext" / "NEWS").write_text("one change since 0.4.0\n")
    git("add", "NEWS")
    git("commit", "-q", "-m", "second")
    assert run("build", where, CPU) == 0, capsys.readouterr().err
    built = result(where, CPU)
    assert built.wheel.startswith("scm_ops-0.4.1.dev1+pt213cpu-py3-none-any"), built.wheel
    with zipfile.ZipFile(where / "dist" / CPU / built.wheel) as zf:
        assert "scm_ops/kernels/double.cu" in zf.namelist()  # package data git lists
    assert run("test-matrix", where, CPU) == 0, capsys.readouterr().err  # the tests read both


def test_package_data_reaches_the_wheel_from_a_subfolder_of_the_repository(
        tmp_path, work, monkeypatch, capsys):
    """The extension in a folder of its repository, which its pyproject names as
    setuptools-scm's root (root = ".."): setuptools-scm 10 lists package data from the
    repository the root names, and the copy's sat one level too high (whatever holds the
    build folder: here the user's own repository, which does not track it), so the .cu
    file was missing from the wheel."""
    where = project("scm-version", tmp_path, work, monkeypatch)
    monkeypatch.delenv("SETUPTOOLS_SCM_PRETEND_VERSION", raising=False)
    monkeypatch.setenv("EXTMATRIX_WORK", str(where / ".extmatrix"))  # inside the repository
    pyproject = where / "ext" / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("[tool.setuptools_scm]",
                                                       '[tool.setuptools_scm]\nroot = ".."'))
    (where / ".gitignore").write_text(".extmatrix/\ndist/\n")

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org",
                        "-C", str(where), *args], check=True, capture_output=True)

    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "first"],
                 ["tag", "v0.4.0"]):
        git(*args)
    assert run("build", where, CPU) == 0, capsys.readouterr().err
    built = result(where, CPU)
    assert built.wheel.startswith("scm_ops-0.4.0+pt213cpu-py3-none-any"), built.wheel
    with zipfile.ZipFile(where / "dist" / CPU / built.wheel) as zf:
        assert "scm_ops/kernels/double.cu" in zf.namelist()


def test_a_build_that_probes_for_a_gpu_gets_a_one_line_diagnosis(tmp_path, work, monkeypatch,
                                                                 capsys):
    where = project("probes-gpu", tmp_path, work, monkeypatch)
    assert run("build", where, CUDA) == 1
    err = capsys.readouterr().err
    built = result(where, CUDA)
    assert built.build == "failed"
    assert "holds no GPU code at all" in built.reason
    assert "torch.cuda.is_available()" in built.reason and "FORCE_CUDA=1" in built.reason
    assert built.reason.count("no SASS") == 0  # one line for the cell, not one per arch
    assert "holds no GPU code at all" in " ".join(err.split())
    assert "Traceback" not in err


def test_missing_test_dependency_is_named(tmp_path, work, monkeypatch, capsys):
    where = project("triton-kernels", tmp_path, work, monkeypatch)
    test = where / "ext" / "tests" / "test_relu.py"
    test.write_text("import hypothesis_not_installed\n" + test.read_text())
    assert run("build", where, CPU) == 0, capsys.readouterr().err
    assert run("test-matrix", where, CPU) == 1
    reason = result(where, CPU).reason
    assert "the tests need 'hypothesis_not_installed'" in reason
    assert "extension.test_requires" in reason
    log = Path(reason.rsplit("see ", 1)[1])
    assert log.is_file()


def test_require_gpu_works_for_a_suite_that_never_heard_of_it(tmp_path, work, monkeypatch,
                                                               capsys):
    where = project("triton-kernels", tmp_path, work, monkeypatch)
    assert run("build", where, CPU) == 0, capsys.readouterr().err
    status = main(["test-matrix", "--matrix", str(where / "matrix.yaml"), "--dist",
                   str(where / "dist"), "--cell", CPU, "--require-gpu"])
    assert status == 1
    assert result(where, CPU).reason.startswith(
        "--require-gpu, but torch sees no GPU on this machine")


@pytest.mark.skipif(os.environ.get("EXTMATRIX_BYO_CUDA") != "1",
                    reason="CUDA builds of the fixtures: EXTMATRIX_BYO_CUDA=1 (nox -s byo-cuda)")
@pytest.mark.parametrize("name", ["classic-cuda", "cmake-op"])
def test_unmodified_extension_builds_its_cuda_cell_with_every_arch(name, tmp_path, work,
                                                                   monkeypatch, capsys):
    where = project(name, tmp_path, work, monkeypatch)
    assert run("build", where, CUDA) == 0, capsys.readouterr().err
    built = result(where, CUDA)
    assert built.sass == CUDA_ARCHS  # read from the binary with cuobjdump
    assert {"torch==2.14.*", "triton"} <= set(built.requires)
    unchanged(name, where)


def test_init_writes_a_matrix_that_plans_and_builds(tmp_path, work, monkeypatch, capsys):
    shutil.copytree(EXTENSIONS / "classic-cuda", tmp_path / "classic-cuda")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EXTMATRIX_WORK", str(work / "init"))
    monkeypatch.delenv("CI", raising=False)
    # Installed from this checkout, the engine cannot tell CI where to get it.
    assert main(["init", "classic-cuda", "--torch", "2.13", "--python", "3.11"]) == 2
    assert "pass --engine-spec" in capsys.readouterr().err
    assert not (tmp_path / "matrix.yaml").exists()
    spec = "extmatrix @ git+https://example.org/extmatrix@v1"
    assert main(["init", "classic-cuda", "--torch", "2.13", "--python", "3.11",
                 "--engine-spec", spec]) == 0
    text = (tmp_path / "matrix.yaml").read_text()
    assert "name: classic-ops" in text and "import: classic_ops" in text and "tests: test" in text
    workflow = (tmp_path / ".github" / "workflows" / "extmatrix.yml").read_text()
    assert "extmatrix build --matrix matrix.yaml --strict" in workflow
    assert f'pip install "{spec}"' in workflow
    assert main(["init", "classic-cuda", "--engine-spec", spec]) == 2  # never over a file
    assert "matrix.yaml: already exists; pass --force" in capsys.readouterr().err
    assert main(["plan", "--json"]) == 0
    cells = [c["cell"] for c in json.loads(capsys.readouterr().out)["include"]]
    assert CPU in cells and "py3.11-torch2.13-cu130" in cells
    assert main(["build", "--cell", CPU]) == 0, capsys.readouterr().err
    assert result(tmp_path, CPU).wheel.startswith("classic_ops-1.2.0+pt213cpu-")
