"""What may be published: one file per wheel name in an index, and a per-Python cell's wheel
built for that Python."""

from __future__ import annotations

import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from extmatrix import wheels
from extmatrix.backends import Context, audit_abi3, check_wheel
from extmatrix.cells import plan_file
from extmatrix.cli import main
from extmatrix.errors import StepFailed
from extmatrix.report import CellReport
from extmatrix.steps import Steps

MATRIX = """\
extension: {{name: fastclip, import: fastclip, path: ext, abi3: {abi3}}}
axes:
  torch: ["2.13"]
  flavor: [cpu]
  python: ["3.11", "3.12", "3.14t"]
flavors:
  cpu: {{}}
"""
# scikit-build-core's wheel.py-api = "py3": one name whichever Python builds it.
PY3 = "fastclip-0.2.0+pt213cpu-py3-none-linux_x86_64.whl"


def matrix(tmp_path: Path, abi3: str = "false") -> Path:
    (tmp_path / "ext" / "tests").mkdir(parents=True, exist_ok=True)
    (tmp_path / "ext" / "pyproject.toml").write_text("[project]\nname = 'fastclip'\n")
    (tmp_path / "matrix.yaml").write_text(MATRIX.format(abi3=abi3))
    return tmp_path / "matrix.yaml"


def built(dist: Path, cell: str, name: str, data: bytes, test: str = "passed",
          serves: list[dict] | None = None, junit: dict | None = None,
          requires: list[str] | None = None) -> None:
    """A cell's last good build, as `extmatrix build` then `test-matrix` leave it."""
    (dist / cell).mkdir(parents=True)
    (dist / cell / name).write_bytes(data)
    (dist / cell / "last-good.json").write_text(json.dumps(
        {"build": "built", "wheel": name, "test": test, "serves": serves or [],
         "junit": junit or {}, "requires": requires or []}))


def index(tmp_path: Path, *cells: str, strict: bool = False) -> int:
    """`extmatrix index`; not strict unless asked, whatever $CI says, so that what a test
    leaves unbuilt is reported, not failed."""
    return main(["index", "--matrix", str(tmp_path / "matrix.yaml"), "--dist",
                 str(tmp_path / "dist"), *(arg for c in cells for arg in ("--cell", c)),
                 "--strict" if strict else "--no-strict"])


def test_index_refuses_two_different_wheels_of_one_name(tmp_path, capsys):
    matrix(tmp_path)
    built(tmp_path / "dist", "py3.11-torch2.13-cpu", PY3, b"built by 3.11")
    built(tmp_path / "dist", "py3.12-torch2.13-cpu", PY3, b"built by 3.12")
    assert index(tmp_path) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"{tmp_path / 'dist'}: py3.11-torch2.13-cpu and py3.12-torch2.13-cpu built different "
        f"wheels named {PY3}, and an index holds one file per name; its tags serve every "
        "Python, yet abi3: false builds it once per Python: set extension.abi3: true in the "
        "matrix to build it once and test it on each Python"]
    assert not (tmp_path / "dist" / "index").exists()  # nothing half-published


def test_index_publishes_byte_identical_wheels_of_one_name_once(tmp_path, capsys):
    matrix(tmp_path)
    for cell in ("py3.11-torch2.13-cpu", "py3.12-torch2.13-cpu"):
        built(tmp_path / "dist", cell, PY3, b"the same bytes")
    assert index(tmp_path) == 0, capsys.readouterr().err
    out = tmp_path / "dist" / "index"
    assert [p.name for p in (out / "wheels").iterdir()] == [PY3]
    for page in (out / "torch-2.13.0+cpu.html",
                 out / "torch-2.13.0+cpu" / "simple" / "fastclip" / "index.html"):
        assert page.read_text().count(f">{PY3}</a>") == 1


def test_a_collision_of_cells_that_are_not_per_python_names_the_cells_to_choose_from(
        tmp_path, capsys):
    matrix(tmp_path, abi3="true")  # 3.14t is a cell of its own: the stable ABI leaves it out
    built(tmp_path / "dist", "torch2.13-cpu", PY3, b"regular")
    built(tmp_path / "dist", "py3.14t-torch2.13-cpu", PY3, b"free-threaded")
    assert index(tmp_path) == 2
    assert capsys.readouterr().err.strip().endswith(
        "an index holds one file per name; publish one of them: leave the other cell out "
        "with --cell, -k or --subset")
    assert index(tmp_path, "torch2.13-cpu") == 0


def test_index_publishes_only_wheels_stamped_for_their_cell_whose_tests_passed(tmp_path,
                                                                              capsys):
    matrix(tmp_path)
    cp = "fastclip-0.2.0+pt213cpu-cp3{}-cp3{}-linux_x86_64.whl"
    built(tmp_path / "dist", "py3.11-torch2.13-cpu", cp.format(11, 11), b"ok")
    built(tmp_path / "dist", "py3.12-torch2.13-cpu", cp.format(12, 12), b"red", test="failed")
    built(tmp_path / "dist", "py3.14t-torch2.13-cpu",  # an older engine's: no label, no pin
          "fastclip-0.2.0-cp314-cp314t-linux_x86_64.whl", b"old")
    assert index(tmp_path) == 0
    assert capsys.readouterr().err.splitlines()[:2] == [
        f"left out py3.12-torch2.13-cpu: the tests of {cp.format(12, 12)} failed; run "
        "test-matrix",
        "left out py3.14t-torch2.13-cpu: fastclip-0.2.0-cp314-cp314t-linux_x86_64.whl is not "
        "labelled +pt213cpu; build the cell again"]
    out = tmp_path / "dist" / "index"
    assert [p.name for p in (out / "wheels").iterdir()] == [cp.format(11, 11)]

    shutil.rmtree(tmp_path / "dist")
    built(tmp_path / "dist", "py3.11-torch2.13-cpu", cp.format(11, 11), b"ok", test="not-run")
    assert index(tmp_path) == 2
    assert capsys.readouterr().err == (
        f"{tmp_path / 'dist'}: no built and tested wheel to publish (py3.11-torch2.13-cpu: the "
        f"tests of {cp.format(11, 11)} have not run; run test-matrix); build the cells and run "
        "test-matrix first\n")


def test_a_stable_wheel_is_published_beside_the_torch_builds_it_passed_beside(tmp_path,
                                                                              capsys):
    (tmp_path / "ext" / "tests").mkdir(parents=True)
    (tmp_path / "ext" / "pyproject.toml").write_text("[project]\nname = 'fastclip'\n")
    (tmp_path / "matrix.yaml").write_text(MATRIX.format(abi3="true").replace(
        '["2.13"]', '["2.13", "2.14"]') + 'stable:\n  - {from: "2.13", flavors: [cpu]}\n')
    served = [{"torch": "2.13.0", "test": "passed", "build": "2.13.0+cpu"},
              {"torch": "2.14.1", "test": "not-tested", "reason": "could not be installed"}]
    built(tmp_path / "dist", "stable2.13-cpu", "fastclip-0.2.0+cpu-cp311-abi3-linux_x86_64.whl",
          b"stable", serves=served)
    assert index(tmp_path, "stable2.13-cpu") == 0
    assert "left out stable2.13-cpu: not tested beside torch-2.14.1+cpu" in (
        capsys.readouterr().err)
    assert sorted(p.name for p in (tmp_path / "dist" / "index").glob("*.html")) == [
        "index.html", "torch-2.13.0+cpu.html"]


def fake_wheel(folder: Path, name: str, binary: bytes = b"\x7fELF") -> Path:
    path = folder / name
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("fastclip-0.2.0+pt213cpu.dist-info/METADATA",
                    "Metadata-Version: 2.1\nName: fastclip\nVersion: 0.2.0+pt213cpu\n"
                    "Requires-Dist: torch==2.13.*\n")
        zf.writestr("fastclip/_C.so", binary)
    return path


@pytest.mark.parametrize(("cell", "tag", "problem"), [
    ("py3.11-torch2.13-cpu", "cp311-cp311-linux_x86_64", None),
    # A TORCH_LIBRARY library links no libpython: one wheel is right for every Python.
    ("py3.11-torch2.13-cpu", "py3-none-linux_x86_64", None),
    ("py3.11-torch2.13-cpu", "cp39-abi3-linux_x86_64", None),
    ("py3.14t-torch2.13-cpu", "cp314-cp314t-linux_x86_64", None),
    ("py3.11-torch2.13-cpu", "cp312-cp312-linux_x86_64",
     "is tagged cp312-cp312-linux_x86_64, which CPython 3.11 does not install: another "
     "Python built it"),
    ("py3.11-torch2.13-cpu", "cp312-abi3-linux_x86_64",
     "is tagged cp312-abi3-linux_x86_64, which CPython 3.11 does not install: another "
     "Python built it"),
    ("py3.14t-torch2.13-cpu", "cp314-cp314-linux_x86_64",
     "is tagged cp314-cp314-linux_x86_64, which CPython 3.14t does not install: another "
     "Python built it"),
])
def test_a_per_python_cells_wheel_is_for_its_python(tmp_path, cell, tag, problem):
    plan = plan_file(matrix(tmp_path))
    wheel = fake_wheel(tmp_path, f"fastclip-0.2.0+pt213cpu-{tag}.whl")
    assert wheels.inspect(wheel, plan.cell(cell), None).problems == ([problem] if problem else [])


@pytest.mark.parametrize(("tag", "problem"), [
    ("cp311-abi3-linux_x86_64", None),
    ("cp39-abi3-linux_x86_64", None),
    ("cp311-cp311-linux_x86_64",  # the build ignored Py_LIMITED_API
     "is tagged cp311-cp311-linux_x86_64, which CPython 3.12 does not install, yet the cell's "
     "one wheel serves 3.11, 3.12: tag it cp311-abi3 (built with Py_LIMITED_API) or py3-none, "
     "or set extension.abi3: false to build it once per Python"),
    ("cp312-abi3-linux_x86_64",
     "is tagged cp312-abi3-linux_x86_64, which CPython 3.11 does not install, yet the cell's "
     "one wheel serves 3.11, 3.12: tag it cp311-abi3 (built with Py_LIMITED_API) or py3-none, "
     "or set extension.abi3: false to build it once per Python"),
])
def test_an_abi3_cells_wheel_installs_on_every_python_it_serves(tmp_path, tag, problem):
    cell = plan_file(matrix(tmp_path, abi3="true")).cell("torch2.13-cpu")
    assert (cell.python, cell.test_pythons) == ("3.11", ("3.11", "3.12"))
    wheel = fake_wheel(tmp_path, f"fastclip-0.2.0+pt213cpu-{tag}.whl")
    assert wheels.inspect(wheel, cell, None).problems == ([problem] if problem else [])


def library(folder: Path, code: str, *links: str) -> bytes:
    """A shared library built from C `code`, linking stand-ins of the libraries `links`."""
    assert shutil.which("cc"), "these tests build shared libraries with the system C compiler"
    for lib in links:
        subprocess.run(["cc", "-shared", "-o", str(folder / lib), "-x", "c", "-",
                        f"-Wl,-soname,{lib}"], input="int stub;", text=True, check=True)
    out = folder / "_C.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), "-x", "c", "-", "-x", "none",
                    "-Wl,--no-as-needed", *(str(folder / lib) for lib in links)],
                   input=code, text=True, check=True)
    return out.read_bytes()


# What torch.ops.load_library loads: a TORCH_LIBRARY library, no Python in it.
OP = "int clip(int x) { return x < 0 ? 0 : x; }\n"
# An extension module tagged py3: it calls into the Python of whoever loads it.
MODULE = ("void *PyObject_GetAttr(void *, void *);\n"
          "void *attr(void *o, void *name) { return PyObject_GetAttr(o, name); }\n")
FIX = ('tag it cp3X-abi3 (wheel.py-api = "cp3X", built with Py_LIMITED_API), or set '
       "extension.abi3: false to build it once per Python")


@pytest.mark.parametrize(("code", "links", "needs"), [
    (OP, (), None),
    (MODULE, (), "calls the Python C API (PyObject_GetAttr)"),
    (OP, ("libpython3.11.so.1.0",), "links libpython3.11.so.1.0"),
])
def test_an_abi3_cells_py3_none_wheel_needs_no_python(tmp_path, code, links, needs):
    """abi3: true builds one wheel per cell for all its Pythons: a py3-none one (wheel.py-api
    = "py3") is sound where its binaries link no libpython and call no Python C API."""
    cell = plan_file(matrix(tmp_path, abi3="true")).cell("torch2.13-cpu")
    wheel = fake_wheel(tmp_path, PY3, library(tmp_path, code, *links))
    problems = wheels.inspect(wheel, cell, None).problems
    assert problems == ([f"is tagged py3-none-linux_x86_64, for every Python, yet fastclip/_C.so "
                         f"{needs}: {FIX}"] if needs else [])


@pytest.mark.parametrize(("tag", "audited"), [("py3-none-linux_x86_64", False),
                                              ("cp39-abi3-linux_x86_64", True),
                                              # check_wheel says what to change instead
                                              ("cp311-cp311-linux_x86_64", False)])
def test_abi3audit_audits_an_abi3_cells_wheel_tagged_abi3(tmp_path, tag, audited):
    # abi3audit --strict refuses a py3-none wheel: "failed to determine ABI version baseline".
    cell = plan_file(matrix(tmp_path, abi3="true")).cell("torch2.13-cpu")
    wheel = fake_wheel(tmp_path, f"fastclip-0.2.0+pt213cpu-{tag}.whl", library(tmp_path, OP))
    steps = Steps(tmp_path / "build.log")
    try:
        audit_abi3(cell, wheel, steps)
    finally:
        steps.close()
    assert ("abi3audit" in steps.timings) is audited
    problems = wheels.inspect(wheel, cell, None).problems
    assert problems == ([] if "none" in tag or "abi3" in tag else [
        "is tagged cp311-cp311-linux_x86_64, which CPython 3.12 does not install, yet the "
        "cell's one wheel serves 3.11, 3.12: tag it cp311-abi3 (built with Py_LIMITED_API) or "
        "py3-none, or set extension.abi3: false to build it once per Python"])


def test_abi3audit_fails_an_abi3_wheel_whose_binary_calls_beyond_the_limited_api(tmp_path):
    cell = plan_file(matrix(tmp_path, abi3="true")).cell("torch2.13-cpu")
    outside = ("void *PyObject_Print(void *, void *, int);\n"  # not in the stable ABI
               "void *show(void *o) { return PyObject_Print(o, 0, 0); }\n")
    wheel = fake_wheel(tmp_path, "fastclip-0.2.0+pt213cpu-cp39-abi3-linux_x86_64.whl",
                       library(tmp_path, outside))
    steps = Steps(tmp_path / "build.log")
    try:
        with pytest.raises(StepFailed) as caught:
            audit_abi3(cell, wheel, steps)
    finally:
        steps.close()
    assert caught.value.step == "abi3audit"
    assert "PyObject_Print" in (tmp_path / "build.log").read_text()


def test_a_py3_none_wheel_that_needs_python_fails_its_cell_in_one_line(tmp_path):
    cell = plan_file(matrix(tmp_path, abi3="true")).cell("torch2.13-cpu")
    wheel = fake_wheel(tmp_path, PY3, library(tmp_path, MODULE))
    ctx = Context(plan_file(tmp_path / "matrix.yaml").matrix, tmp_path, tmp_path / "dist",
                  tmp_path / "work", tmp_path / "cache", 1)
    (staging := tmp_path / "staging").mkdir()
    with pytest.raises(StepFailed) as caught:
        check_wheel(cell, ctx, wheel, CellReport(cell=cell.id, backend="local"), staging, None)
    rejected = tmp_path / "dist" / cell.id / "rejected" / PY3
    assert caught.value.detail == (
        f"the wheel is tagged py3-none-linux_x86_64, for every Python, yet fastclip/_C.so calls "
        f"the Python C API (PyObject_GetAttr): {FIX} (it is {rejected})")


def test_a_second_index_drops_what_the_first_published_and_this_one_leaves_out(tmp_path,
                                                                               capsys):
    matrix(tmp_path)
    cp = "fastclip-0.2.0+pt213cpu-cp3{}-cp3{}-linux_x86_64.whl"
    for minor in (11, 12):
        built(tmp_path / "dist", f"py3.{minor}-torch2.13-cpu", cp.format(minor, minor),
              f"{minor}".encode())
    out = tmp_path / "dist" / "index"
    out.mkdir(parents=True)
    (out / "CNAME").write_text("wheels.example.org\n")  # the maintainer's own file
    assert index(tmp_path) == 0
    assert index(tmp_path, "py3.12-torch2.13-cpu") == 0, capsys.readouterr().err
    assert sorted(p.name for p in (out / "wheels").iterdir()) == [cp.format(12, 12)]
    assert f">{cp.format(11, 11)}<" not in (out / "torch-2.13.0+cpu.html").read_text()
    assert (out / "CNAME").read_text() == "wheels.example.org\n"


def test_index_output_that_is_a_file_is_a_one_line_error_and_urls_are_escaped(tmp_path,
                                                                              capsys):
    matrix(tmp_path)
    built(tmp_path / "dist", "py3.11-torch2.13-cpu",
          "fastclip-0.2.0+pt213cpu-cp311-cp311-linux_x86_64.whl", b"ok")
    (tmp_path / "afile").write_text("")
    args = ["index", "--matrix", str(tmp_path / "matrix.yaml"), "--dist", str(tmp_path / "dist"),
            "--no-strict"]
    assert main([*args, "--output", str(tmp_path / "afile")]) == 2
    assert capsys.readouterr().err == (
        f"{tmp_path / 'afile'}: not a folder; pass --output a folder for the index\n")
    assert main([*args, "--base-url", 'https://x/"><script>']) == 0
    page = (tmp_path / "dist" / "index" / "torch-2.13.0+cpu.html").read_text()
    assert "<script>" not in page and "https://x/&quot;&gt;&lt;script&gt;/wheels/" in page


def test_index_never_overwrites_a_page_it_did_not_write(tmp_path, capsys):
    matrix(tmp_path)
    built(tmp_path / "dist", "py3.11-torch2.13-cpu",
          "fastclip-0.2.0+pt213cpu-cp311-cp311-linux_x86_64.whl", b"ok")
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("MINE")
    args = ["index", "--matrix", str(tmp_path / "matrix.yaml"), "--dist", str(tmp_path / "dist"),
            "--output", str(site), "--no-strict"]
    assert main(args) == 2
    assert capsys.readouterr().err == (
        f"{site / 'index.html'}: exists, and no earlier index wrote it (1 such file); pass "
        "--output an empty or new folder, or move those files away\n")
    assert sorted(p.name for p in site.iterdir()) == ["index.html"]
    assert (site / "index.html").read_text() == "MINE"
    (site / "index.html").unlink()
    assert main(args) == 0 and main(args) == 0  # its own files it replaces


def test_a_record_naming_no_wheel_file_is_left_out_in_one_line(tmp_path, capsys):
    matrix(tmp_path)
    built(tmp_path / "dist", "py3.11-torch2.13-cpu", "notawheel.whl", b"x")
    built(tmp_path / "dist", "py3.12-torch2.13-cpu",
          "fastclip-0.2.0+pt213cpu-cp312-cp312-linux_x86_64.whl", b"ok")
    assert index(tmp_path) == 0
    assert "left out py3.11-torch2.13-cpu: notawheel.whl is not a wheel's file name" in (
        capsys.readouterr().err)


def test_a_wheel_whose_every_test_skipped_is_not_published(tmp_path, capsys):
    # The CPU job calls a run whose tests all skipped for want of a GPU "passed" (they are
    # the GPU job's): nothing of the wheel was verified, and the index is no place for it.
    matrix(tmp_path)
    cp = "fastclip-0.2.0+pt213cpu-cp3{}-cp3{}-linux_x86_64.whl"
    built(tmp_path / "dist", "py3.11-torch2.13-cpu", cp.format(11, 11), b"ok",
          junit={"tests": 4, "passed": 1, "skipped": 3, "gpu_skipped": 3})
    built(tmp_path / "dist", "py3.12-torch2.13-cpu", cp.format(12, 12), b"unverified",
          junit={"tests": 3, "passed": 0, "skipped": 3, "gpu_skipped": 3})
    assert index(tmp_path) == 0
    assert capsys.readouterr().err.splitlines()[0] == (
        f"left out py3.12-torch2.13-cpu: no test of {cp.format(12, 12)} ran (all 3 skipped); "
        "run its tests where they can run: test-matrix --require-gpu on a GPU machine")
    assert [p.name for p in (tmp_path / "dist" / "index" / "wheels").iterdir()] == [
        cp.format(11, 11)]


def test_a_strict_index_fails_when_it_leaves_anything_out(tmp_path, capsys, monkeypatch):
    # A release job publishing fewer wheels than it built must not go green.
    matrix(tmp_path)
    cp = "fastclip-0.2.0+pt213cpu-cp3{}-cp3{}-linux_x86_64.whl"
    built(tmp_path / "dist", "py3.11-torch2.13-cpu", cp.format(11, 11), b"ok")
    built(tmp_path / "dist", "py3.12-torch2.13-cpu", cp.format(12, 12), b"unverified",
          junit={"tests": 3, "passed": 0, "skipped": 3, "gpu_skipped": 3})
    assert index(tmp_path, "py3.11-torch2.13-cpu", "py3.12-torch2.13-cpu", strict=True) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("left out py3.12-torch2.13-cpu: no test of ")
    assert err[-1] == ("1 left out, and --strict publishes all or fails (the lines above say "
                       "why each was)")
    assert index(tmp_path, "py3.11-torch2.13-cpu", strict=True) == 0  # all it was asked for
    # The default, as for build and test-matrix: strict under CI, or where cells are named.
    every_cell = ["index", "--matrix", str(tmp_path / "matrix.yaml"), "--dist",
                  str(tmp_path / "dist")]
    monkeypatch.delenv("CI", raising=False)
    assert main(every_cell) == 0
    assert main([*every_cell, "--cell", "py3.11-torch2.13-cpu", "--cell",
                 "py3.12-torch2.13-cpu"]) == 1
    monkeypatch.setenv("CI", "true")
    assert main(every_cell) == 1


def test_a_stable_wheel_built_for_another_range_than_the_matrix_says_is_left_out(tmp_path,
                                                                                 capsys):
    (tmp_path / "ext" / "tests").mkdir(parents=True)
    (tmp_path / "ext" / "pyproject.toml").write_text("[project]\nname = 'fastclip'\n")
    (tmp_path / "matrix.yaml").write_text(MATRIX.format(abi3="true").replace(
        '["2.13"]', '["2.13", "2.14"]') + 'stable:\n  - {from: "2.13", below: "2.14", '
        'flavors: [cpu]}\n')
    served = [{"torch": "2.13.0", "test": "passed", "build": "2.13.0+cpu"}]
    name = "fastclip-0.2.0+cpu-cp311-abi3-linux_x86_64.whl"
    # Built and tested before `below` was added: it claims every later torch.
    built(tmp_path / "dist", "stable2.13-cpu", name, b"stable", serves=served,
          requires=["torch>=2.13"])
    assert index(tmp_path, "stable2.13-cpu") == 2
    assert (f"stable2.13-cpu: {name} requires torch>=2.13, the matrix now torch<2.14,>=2.13; "
            "build the cell again") in capsys.readouterr().err
    shutil.rmtree(tmp_path / "dist")
    built(tmp_path / "dist", "stable2.13-cpu", name, b"stable", serves=served,
          requires=["torch<2.14,>=2.13"])
    assert index(tmp_path, "stable2.13-cpu") == 0


def test_an_index_output_that_cannot_be_written_is_one_line(tmp_path, capsys):
    matrix(tmp_path)
    built(tmp_path / "dist", "py3.11-torch2.13-cpu",
          "fastclip-0.2.0+pt213cpu-cp311-cp311-linux_x86_64.whl", b"ok")
    (tmp_path / "afile").write_text("")
    out = tmp_path / "afile" / "site"  # below a file: no folder can be made there
    assert main(["index", "--matrix", str(tmp_path / "matrix.yaml"), "--dist",
                 str(tmp_path / "dist"), "--output", str(out), "--no-strict"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"--output {out}: cannot write the index: ") and err.count("\n") == 1
