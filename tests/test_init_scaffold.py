"""What `extmatrix init` writes for extensions written the way others write them: a matrix
whose cells install the right torch, that `plan --outdated` finds current, that lists only
Pythons the project takes, and whose default subsets exist."""

from __future__ import annotations

import datetime
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from extmatrix import init, project
from extmatrix.cells import plan_file
from extmatrix.cli import main
from extmatrix.compat import Compat, version_key

EXTENSIONS = Path(__file__).resolve().parent / "extensions"
SPEC = "extmatrix @ git+https://example.org/extmatrix@v1"
NEWEST = max(Compat.load().facts.torch, key=version_key)


def replace(file: str, old: str, new: str):
    """An edit of the extension: `old`, which `file` has, becomes `new`."""
    def edit(repo: Path) -> None:
        path = repo / file
        assert old in path.read_text()
        path.write_text(path.read_text().replace(old, new, 1))
    return edit


ABI3 = replace("pyproject.toml", 'wheel.py-api = "py3"', 'wheel.py-api = "cp39"')  # cmake-op


def extension(tmp_path: Path, monkeypatch, name: str, edit=None) -> Path:
    """tests/extensions/NAME as a git repository, changed by `edit`, entered."""
    repo = tmp_path / "repo"
    shutil.copytree(EXTENSIONS / name, repo)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    if edit:
        edit(repo)
    monkeypatch.chdir(repo)
    return repo


def scaffold(tmp_path: Path, monkeypatch, name: str, edit=None):
    """The plan of the matrix init writes at the root of the extension."""
    extension(tmp_path, monkeypatch, name, edit)
    assert main(["init", "--engine-spec", SPEC]) == 0
    return plan_file("matrix.yaml")


def test_every_cell_takes_torch_from_its_flavors_index(tmp_path, monkeypatch):
    # PyPI's Linux torch is a CUDA build: torch==X+cpu, and the CUDA flavors PyPI's is not,
    # exist only on PyTorch's index of the flavor.
    plan = scaffold(tmp_path, monkeypatch, "classic-cuda")
    assert {c.family for c in plan.cells} == {"cpu", "cuda"}
    for cell in plan.cells:
        assert cell.index == f"https://download.pytorch.org/whl/{cell.flavor}", cell.id
    assert next(c for c in plan.cells if c.family == "cpu").torch_spec.endswith("+cpu")
    assert plan.matrix.defaults["rocm"].index == "https://download.pytorch.org/whl/{flavor}"


@pytest.mark.parametrize("name, edit, abi3", [("classic-cuda", None, False),
                                              ("cmake-op", ABI3, True)])
def test_a_fresh_matrix_is_what_plan_outdated_asks_for(tmp_path, monkeypatch, capsys, name,
                                                       edit, abi3):
    plan = scaffold(tmp_path, monkeypatch, name, edit)
    assert plan.matrix.extension.abi3 is abi3
    capsys.readouterr()
    assert main(["plan", "--outdated", "--check"]) == 0, capsys.readouterr().out
    # The flavors GitHub's runners cannot build are listed for it, and excluded, saying why.
    rocm = [d for d in plan.dropped if "rocm" in d.combo]
    assert rocm and all("excluded by exclude" in d.reason for d in rocm)


def test_the_pythons_are_every_living_one_the_torch_ships_for():
    project = init.describe(EXTENSIONS / "classic-cuda")

    def pythons(today: datetime.date) -> list[str]:
        text = init.matrix_text(project, ".", Compat.load(), "2.14", today=today)
        return yaml.safe_load(text)["axes"]["python"]

    assert pythons(datetime.date(2026, 6, 1)) == ["3.10", "3.11", "3.12", "3.13", "3.14"]
    # 3.10 reaches its end of life on 2026-10-31: `plan --outdated` would drop it.
    assert pythons(datetime.date(2026, 12, 1)) == ["3.11", "3.12", "3.13", "3.14"]


@pytest.mark.parametrize("name, edit", [
    ("cmake-op", replace("pyproject.toml", '">=3.10"', '">=3.13"')),
    ("classic-cuda", lambda repo: (repo / "setup.cfg").write_text(
        "[options]\npython_requires = >=3.13\n")),
    ("classic-cuda", replace("setup.py", "setup(", "setup(python_requires='>=3.13', ")),
])
def test_only_pythons_the_project_takes_are_listed(tmp_path, monkeypatch, name, edit):
    plan = scaffold(tmp_path, monkeypatch, name, edit)
    assert min(plan.matrix.axes.python, key=version_key) == "3.13"


def test_a_python_the_project_refuses_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    repo = extension(tmp_path, monkeypatch, "cmake-op")
    assert main(["init", "--engine-spec", SPEC, "--python", "3.9"]) == 2
    assert capsys.readouterr().err == ("--python 3.9: pyproject.toml requires Python >=3.10; "
                                       "pass a Python it takes\n")
    replace("pyproject.toml", '">=3.10"', '"<3.9"')(repo)
    assert main(["init", "--engine-spec", SPEC]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "takes none of Python" in err and "pass --torch" in err
    replace("pyproject.toml", '"<3.9"', '"3.10+"')(repo)
    assert main(["init", "--engine-spec", SPEC]) == 2
    assert "requires-python '3.10+' is not a version specifier" in capsys.readouterr().err
    assert not (repo / "matrix.yaml").exists()


@pytest.mark.parametrize("edit", [None, ABI3])
def test_the_default_subsets_exist_and_local_builds_without_gpu(tmp_path, monkeypatch, edit):
    plan = scaffold(tmp_path, monkeypatch, "cmake-op", edit)
    (local,) = plan.select("local")  # what `build` and `test-matrix` take by default
    assert local.family == "cpu" and local.torch_series == NEWEST
    pr = plan.select("pr")
    assert {c.family for c in pr} == {"cpu", "cuda"}
    pythons = plan.matrix.axes.python
    assert {p for c in pr for p in c.test_pythons} >= {pythons[0], pythons[-1]}


@pytest.mark.parametrize("name, triton", [("classic-cuda", False), ("triton-kernels", True)])
def test_triton_is_required_only_by_an_extension_that_imports_it(tmp_path, monkeypatch, name,
                                                                  triton):
    plan = scaffold(tmp_path, monkeypatch, name)
    for cell in plan.cells:
        assert cell.runtime_deps == (("triton",) if triton and cell.family == "cuda" else ())
    rocm = plan.matrix.defaults["rocm"].runtime_deps
    assert rocm == (["pytorch-triton-rocm"] if triton else None)


def move(source: str, to: str):
    """An edit of the extension: file `source` moves to `to` (None: deleted)."""
    def edit(repo: Path) -> None:
        if to is None:
            (repo / source).unlink()
        else:
            (repo / to).parent.mkdir(parents=True, exist_ok=True)
            (repo / source).rename(repo / to)
    return edit


def ignored_venv(repo: Path) -> None:
    headers = repo / "venv" / "lib" / "site-packages" / "torch" / "include" / "ATen" / "cuda"
    headers.mkdir(parents=True)
    (headers / "CUDAContext.cuh").write_text("#pragma once\n")
    (repo / ".gitignore").write_text("venv/\n")


@pytest.mark.parametrize("name, edit, families", [
    ("classic-cuda", None, {"cpu", "cuda", "rocm"}),
    ("triton-kernels", None, {"cpu", "cuda", "rocm"}),  # no .cu, but GPU kernels all the same
    ("scm-version", None, {"cpu", "cuda", "rocm"}),  # .cu inside the package
    ("classic-cuda", move("csrc/scale_cuda.cu", None), {"cpu"}),
    # CUDA sources that only the tests compile are not the wheel's.
    ("classic-cuda", move("csrc/scale_cuda.cu", "tests/scale_cuda.cu"), {"cpu"}),
    ("classic-cuda", move("csrc/scale_cuda.cu", "third_party/lib/kernels/scale.cu"),
     {"cpu", "cuda", "rocm"}),
    # ... but a vendored library's tests are not, however deep.
    ("classic-cuda", move("csrc/scale_cuda.cu", "third_party/lib/test/scale.cu"), {"cpu"}),
    # HIP sources alone: ROCm's flavors, no CUDA cell bound to build CPU code again.
    ("classic-cuda", move("csrc/scale_cuda.cu", "csrc/scale.hip"), {"cpu", "rocm"}),
    # A virtualenv git ignores is not the project's, whatever headers torch put in it.
    ("classic-cuda", lambda repo: (move("csrc/scale_cuda.cu", None)(repo), ignored_venv(repo)),
     {"cpu"}),
    # A kernel in a .cpp file that CMake compiles as CUDA.
    ("cmake-op", lambda repo: (move("csrc/clamp_cuda.cu", "csrc/clamp_kernels.cpp")(repo),
                               replace("CMakeLists.txt", "csrc/clamp_cuda.cu",
                                       "csrc/clamp_kernels.cpp")(repo)),
     {"cpu", "cuda", "rocm"}),
    ("cmake-op", lambda repo: (move("csrc/clamp_cuda.cu", None)(repo),
                               replace("CMakeLists.txt", "enable_language(CUDA)", "")(repo)),
     {"cpu"}),
])
def test_gpu_flavors_only_for_an_extension_with_gpu_code(tmp_path, monkeypatch, capsys, name,
                                                         edit, families):
    # A GPU flavor of a CPU-only extension builds its CPU code again, and the wheel check
    # refuses that wheel for holding no GPU code: init lists no cell bound to fail.
    plan = scaffold(tmp_path, monkeypatch, name, edit)
    assert {"rocm" if f.startswith("rocm") else "cuda" if f.startswith("cu") else f
            for f in plan.matrix.axes.flavor} == families
    assert {c.family for c in plan.cells} == families - {"rocm"}
    assert ("no CUDA or HIP sources" in Path("matrix.yaml").read_text()) is (families == {"cpu"})
    pr = plan.select("pr")
    assert {c.family for c in pr} == families - {"rocm"}
    capsys.readouterr()
    # ... and `plan --outdated` does not propose the families it left out.
    assert main(["plan", "--outdated", "--check"]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("edit", [None, ABI3])
def test_a_scikit_build_wheel_for_every_python_is_built_once_per_cell(tmp_path, monkeypatch,
                                                                      edit):
    # cp3X: a cp3X-abi3 wheel. py3: a py3-none one, which the matrix says why it is abi3: one
    # file of each name per torch build, where a per-Python build makes copies `index` refuses.
    plan = scaffold(tmp_path, monkeypatch, "cmake-op", edit)
    assert plan.matrix.extension.abi3 is True
    assert not [c for c in plan.cells if c.id.startswith("py")]
    assert ('wheel.py-api = "py3": one py3-none wheel' in Path("matrix.yaml").read_text()) is (
        edit is None)


@pytest.mark.parametrize("ignores, hint", [
    ("build/\ndist/\n", "hint: git does not ignore .extmatrix/, which extmatrix runs fill "
     "beside the matrix: add /.extmatrix/ to .gitignore\n"),
    ("dist/\n.extmatrix/\n", None),
])
def test_folders_git_would_commit_are_named_not_ignored_silently(tmp_path, monkeypatch, capsys,
                                                                 ignores, hint):
    scaffold(tmp_path, monkeypatch, "classic-cuda",
             lambda repo: (repo / ".gitignore").write_text(ignores))
    err = capsys.readouterr().err
    assert (hint in err) if hint else "hint:" not in err
    assert Path(".gitignore").read_text() == ignores  # the maintainer's file, untouched


def test_an_older_torch_gets_no_cuda_exclude_rule_for_a_cpu_only_extension(tmp_path,
                                                                            monkeypatch):
    # torch 2.14 ships CUDA 12 flavors, which the local backend cannot build: a GPU matrix
    # excludes them, a CPU-only one lists none, so such a rule would match nothing.
    extension(tmp_path, monkeypatch, "classic-cuda", move("csrc/scale_cuda.cu", None))
    assert main(["init", "--engine-spec", SPEC, "--torch", "2.14"]) == 0
    plan = plan_file("matrix.yaml")
    assert {c.family for c in plan.cells} == {"cpu"} and not plan.matrix.exclude


@pytest.mark.parametrize("name, edit, says", [
    ("cmake-op", None, "the CPU wheel and the newest CUDA one, each tested on every Python."),
    ("cmake-op", lambda repo: (move("csrc/clamp_cuda.cu", None)(repo),
                               replace("CMakeLists.txt", "enable_language(CUDA)", "")(repo)),
     "the CPU wheel, tested on every Python."),
    ("classic-cuda", None, "CPU with the oldest Python, the newest CUDA with the newest."),
    ("classic-cuda", move("csrc/scale_cuda.cu", None), "CPU with the oldest Python, and with the "
     "newest."),
])
def test_the_pr_subset_says_what_its_cells_test(tmp_path, monkeypatch, name, edit, says):
    # An abi3 cell tests its one wheel under every Python: no cell is "the oldest Python's".
    plan = scaffold(tmp_path, monkeypatch, name, edit)
    assert f"  # Pull requests: {says}\n" in Path("matrix.yaml").read_text()
    if plan.matrix.extension.abi3:
        assert all(c.test_pythons == plan.cells[0].test_pythons for c in plan.select("pr"))


def package(folder: str):
    """An edit of the extension: a package `folder` (holding __init__.py) beside its own."""
    def edit(repo: Path) -> None:
        (repo / folder).mkdir(parents=True)
        (repo / folder / "__init__.py").write_text("")
    return edit


def edits(*steps):
    """The edits `steps`, one after the other."""
    def edit(repo: Path) -> None:
        for step in steps:
            step(repo)
    return edit


RENAMED = replace("setup.py", 'name="classic-ops"', 'name="my-ops"')  # not the package's


@pytest.mark.parametrize("name, edit, wanted", [
    # The package the extension module lives in, not the first folder: benchmark/ sorts first.
    ("classic-cuda", edits(RENAMED, package("benchmark")), "classic_ops"),
    # Excluded from discovery, a folder is not the wheel's.
    ("triton-kernels", edits(replace("pyproject.toml", 'name = "tri-kernels"', 'name = "tri"'),
                             replace("pyproject.toml", 'where = ["src"]',
                                     'where = ["src"]\nexclude = ["bench*"]'),
                             package("src/bench")), "tri_kernels"),
    # Declared packages: scikit-build's wheel.packages.
    ("cmake-op", edits(replace("pyproject.toml", 'name = "cmake-op"', 'name = "clamp"'),
                       package("src/aaa")), "cmake_op"),
    # PyTorch's tutorial: a top-level extension module and no package at all.
    ("tutorial-lltm", None, "lltm_cpp"),
    # A private top-level extension module (_lltm_C) beside the package users import, its
    # packages found by a call init cannot evaluate.
    ("tutorial-lltm", edits(replace("setup.py", 'CppExtension("lltm_cpp"',
                                    'CppExtension("_lltm_C"'),
                            replace("setup.py", 'ext_modules=', 'packages=find_packages(), '
                                    'ext_modules='),
                            replace("setup.py", "from setuptools import setup",
                                    "from setuptools import find_packages, setup"),
                            package("lltm")), "lltm"),
    # A namespace package: acme/ has no __init__.py.
    ("plain-c", edits(move("src/plain_c/__init__.py", "src/acme/plain_c/__init__.py"),
                      replace("setup.py", '"plain_c._native"', '"acme.plain_c._native"')),
     "acme"),
])
def test_the_import_is_the_package_the_wheel_ships(tmp_path, monkeypatch, name, edit, wanted):
    plan = scaffold(tmp_path, monkeypatch, name, edit)
    assert plan.matrix.extension.import_name == wanted


def test_a_package_init_cannot_choose_is_named_by_hand(tmp_path, monkeypatch, capsys):
    repo = extension(tmp_path, monkeypatch, "triton-kernels",
                     edits(replace("pyproject.toml", 'name = "tri-kernels"', 'name = "tri"'),
                           package("src/other")))
    assert main(["init", "--engine-spec", SPEC]) == 2
    assert capsys.readouterr().err == (".: cannot tell which of other, tri_kernels the tests "
                                       "import; pass it as --import NAME\n")
    assert not (repo / "matrix.yaml").exists()
    assert main(["init", "--engine-spec", SPEC, "--import", "tri-kernels"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("--import tri-kernels: is not a Python")
    assert main(["init", "--engine-spec", SPEC, "--import", "tri_kernels"]) == 0
    plan = plan_file("matrix.yaml")
    assert plan.matrix.extension.import_name == "tri_kernels"
    assert plan.matrix.defaults["cuda"].runtime_deps == ["triton"]  # its modules were read


@pytest.mark.parametrize(("args", "line"), [
    (["--import", "class"], "--import class: is not a Python module name ('class' is not a "
     "Python import name; use identifiers joined by '.'); pass the name the tests import, e.g. "
     "--import mypackage"),
    (["--python", "3.12", "--python", "3.12"], "--python 3.12: is given twice; pass each Python "
     "once"),
    (["--torch", ""], "--torch: is empty; pass a torch release such as 2.11, or leave --torch "
     "out for the newest"),
    (["--engine-spec", "extmatrix @ git+https://x/$(id)"], "--engine-spec extmatrix @ "
     "git+https://x/$(id): holds a character the workflow's shell would read ($, `, \\ or \"); "
     "pass a plain requirement"),
])
def test_init_refuses_what_the_matrix_would_refuse(tmp_path, monkeypatch, capsys, args, line):
    repo = extension(tmp_path, monkeypatch, "triton-kernels")
    assert main(["init", "--engine-spec", SPEC, *args]) == 2  # the last --engine-spec wins
    assert capsys.readouterr().err == line + "\n"
    assert not (repo / "matrix.yaml").exists()


def test_a_distribution_name_pip_would_refuse_is_named_in_one_line(tmp_path, monkeypatch,
                                                                   capsys):
    repo = extension(tmp_path, monkeypatch, "triton-kernels",
                     replace("pyproject.toml", 'name = "tri-kernels"', 'name = "tri kernels!"'))
    assert main(["init", "--engine-spec", SPEC]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the distribution name 'tri kernels!' is not a valid" in err
    assert not (repo / "matrix.yaml").exists()


@pytest.mark.parametrize("folder", ["x #1", "on", "a: b"])
def test_a_folder_name_yaml_would_misread_is_quoted(tmp_path, monkeypatch, folder):
    repo = extension(tmp_path, monkeypatch, "triton-kernels")
    moved = repo.parent / folder
    repo.rename(moved)
    monkeypatch.chdir(tmp_path)
    assert main(["init", folder, "--output", "matrix.yaml", "--no-workflow",
                 "--engine-spec", SPEC]) == 0
    assert plan_file("matrix.yaml").matrix.extension.path == folder


def test_a_workflow_that_cannot_be_written_leaves_no_matrix_behind(tmp_path, monkeypatch,
                                                                    capsys):
    repo = extension(tmp_path, monkeypatch, "triton-kernels")
    (repo / ".github").write_text("not a folder\n")
    assert main(["init", "--engine-spec", SPEC]) == 2
    assert capsys.readouterr().err == (".github: is a file, so extmatrix.yml cannot be written "
                                       "below it; move it away, or choose another --output\n")
    assert not (repo / "matrix.yaml").exists()


def test_an_extension_without_a_package_is_named_by_hand(tmp_path, monkeypatch, capsys):
    # A scikit-build project says no module's name: only the user can.
    extension(tmp_path, monkeypatch, "cmake-op",
              edits(replace("pyproject.toml", 'wheel.packages = ["src/cmake_op"]', ""),
                    move("src/cmake_op/__init__.py", "src/cmake_op/ops.py")))
    assert main(["init", "--engine-spec", SPEC]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("pass the module the tests import as "
                                                 "--import NAME\n")
    assert main(["init", "--engine-spec", SPEC, "--import", "cmake_op"]) == 0
    assert plan_file("matrix.yaml").matrix.extension.import_name == "cmake_op"


def unignored_venv(repo: Path, folder: str = "venv") -> None:
    """A virtualenv git does not ignore, torch's CUDA headers in it."""
    headers = repo / folder / "lib" / "python3.12" / "site-packages" / "torch" / "include"
    headers.mkdir(parents=True)
    (headers / "Atomic.cuh").write_text("#pragma once\n")
    (repo / folder / "include").mkdir()
    (repo / folder / "include" / "kernels.cuh").write_text("#pragma once\n")
    (repo / folder / "pyvenv.cfg").write_text("home = /usr/bin\n")


def installed_torch(repo: Path) -> None:
    """A folder of installed packages, wherever pip --target put it, torch's in it."""
    headers = repo / "deps" / "site-packages" / "torch" / "include"
    headers.mkdir(parents=True)
    (headers / "Atomic.cuh").write_text("#pragma once\n")


@pytest.mark.parametrize("in_git", [True, False])
@pytest.mark.parametrize("edit", [
    unignored_venv,
    lambda repo: unignored_venv(repo, "tools/env"),  # any name, any depth
    installed_torch,
])
def test_a_virtualenv_in_the_project_adds_no_gpu_flavor(tmp_path, monkeypatch, edit, in_git):
    # Not ignored by git, or with no git to ask: torch's headers are still not the project's.
    repo = extension(tmp_path, monkeypatch, "classic-cuda",
                     edits(move("csrc/scale_cuda.cu", None), edit))
    if not in_git:
        shutil.rmtree(repo / ".git")
    assert init.gpu_sources(repo) == (False, False)
    assert init.describe(repo).gpu is False


@pytest.mark.parametrize("edit, abi3", [
    (None, False),
    (replace("setup.py", "define_macros=define_macros,", "py_limited_api=False,"), False),
    (replace("setup.py", "define_macros=define_macros,", "py_limited_api=True,"), True),
    (replace("setup.py", "    cmdclass=", '    options={"bdist_wheel": {"py_limited_api": '
             '"cp310"}},\n    cmdclass='), True),
    (lambda repo: (repo / "setup.cfg").write_text("[bdist_wheel]\npy_limited_api = cp310\n"),
     True),
    # Words are not settings.
    (replace("setup.py", "def get_extensions():", "def get_extensions():  # no py_limited_api"),
     False),
])
def test_abi3_only_where_setuptools_is_told_to_build_it(tmp_path, monkeypatch, edit, abi3):
    assert init.describe(extension(tmp_path, monkeypatch, "classic-cuda", edit)).abi3 is abi3


NAMED = replace("setup.py", '__version__ = "1.2.0"', '__version__ = "1.2.0"\nNAME = "var-ops"')


@pytest.mark.parametrize("edit, name", [
    (edits(NAMED, replace("setup.py", 'name="classic-ops"', "name=NAME")), "var-ops"),
    # Assigned twice, the name is computed: none is taken.
    (edits(NAMED, replace("setup.py", 'name="classic-ops"', "name=NAME"),
           replace("setup.py", "WITH_CUDA = False", "NAME = 'other'")), None),
])
def test_a_name_setup_py_passes_through_a_constant_is_read(tmp_path, monkeypatch, capsys, edit,
                                                           name):
    repo = extension(tmp_path, monkeypatch, "classic-cuda", edit)
    if name:
        assert init.describe(repo).name == name
        return
    assert main(["init", "--engine-spec", SPEC]) == 2
    err = capsys.readouterr().err
    # A [project] table in pyproject.toml would break the setuptools build: not advised.
    assert err.count("\n") == 1 and "'name = ...' under [metadata] in setup.cfg" in err
    assert "[project]" not in err


@pytest.mark.parametrize("python, says", [
    ("foo", "--python foo: is not a Python series"),
    ("3.11.2", "--python 3.11.2: is not a Python series"),
    ("3.15", "--python 3.15: torch 2.13 ships for Python 3.10–3.14 and free-threaded 3.14t"),
    ("3.13t", "--python 3.13t: torch 2.13 ships for Python 3.10–3.14 and free-threaded 3.14t"),
])
def test_a_python_the_torch_does_not_ship_is_a_one_line_error(tmp_path, monkeypatch, capsys,
                                                              python, says):
    # cmake-op requires Python >=3.10: no --python that is no Python is said to be below it.
    repo = extension(tmp_path, monkeypatch, "cmake-op")
    assert main(["init", "--engine-spec", SPEC, "--torch", "2.13", "--python", python]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(says) and "requires" not in err
    assert not (repo / "matrix.yaml").exists()
    # The stable ABI leaves free-threaded builds out: 3.14t gets cells of its own, which the
    # subsets name as such (cmake-op's wheel is abi3).
    assert main(["init", "--engine-spec", SPEC, "--torch", "2.13", "--python", "3.14t",
                 "--python", "3.12"]) == 0
    plan = plan_file("matrix.yaml")
    assert plan.matrix.axes.python == ["3.12", "3.14t"] and plan.matrix.extension.abi3
    assert [c.id for c in plan.select("local")] == ["torch2.13-cpu"]
    assert [c.id for c in plan.select("pr")] == ["torch2.13-cpu", "py3.14t-torch2.13-cu132"]


def test_a_setup_py_too_deep_to_parse_is_read_as_no_literal_not_a_crash(tmp_path):
    (tmp_path / "setup.py").write_text("x = " + "-" * 200_000 + "1\n")
    assert project.setup_py(tmp_path) is None
    assert project.static_name(tmp_path) is None


def test_a_full_torch_release_names_its_series(tmp_path, monkeypatch):
    extension(tmp_path, monkeypatch, "triton-kernels")
    assert main(["init", "--engine-spec", SPEC, "--torch", "2.11.0"]) == 0
    assert {c.torch_series for c in plan_file("matrix.yaml").cells} == {"2.11"}
