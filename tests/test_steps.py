"""Running commands: their true first error, no credentials in what is written, stopping."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import nox
import pytest

from extmatrix import steps
from extmatrix.errors import StepFailed
from extmatrix.report import CellReport

ROOT = Path(__file__).resolve().parent.parent


def test_credentials_in_index_urls_are_never_written():
    text = "torch from https://alice:s3cret@pypi.example.com/simple and file:///w"
    assert steps.redact(text) == "torch from https://***@pypi.example.com/simple and file:///w"
    saved = CellReport(cell="c", backend="local", sources=[text],
                       commands=["uv pip install --index https://tok@host/simple torch"]).to_json()
    assert "s3cret" not in saved and "tok@" not in saved


def test_first_cause_finds_the_real_error():
    log = "\n".join([
        "$ pip wheel .", "running build_ext",
        "src/k.cu(12): error: identifier \"x\" is undefined",
        "src/k.cpp:3:1: error: second", "error: command '/usr/bin/gcc' failed with exit code 1",
        "ERROR: Failed building wheel for k", "RuntimeError: Error compiling objects"])
    assert steps.first_cause(log) == 'src/k.cu(12): error: identifier "x" is undefined'
    resolver = "  × No solution found when resolving dependencies:\n  ╰─▶ Because torch==9 " \
               "was not found in the package registry, we can conclude ..."
    assert steps.first_cause(resolver).startswith("Because torch==9 was not found")
    assert steps.first_cause("Traceback (most recent call last):\n  File x\n"
                             "ModuleNotFoundError: No module named 'torch'") == \
        "ModuleNotFoundError: No module named 'torch'"
    cibuildwheel = ("Successfully built scm-ops\n   ✕ 3.80s\ncibuildwheel: error: \n"
                    "Build failed because a pure Python wheel was generated.\n\n"
                    "If you expected a platform wheel, check your project configuration,\n"
                    "or run cibuildwheel with CIBW_BUILD_VERBOSITY=1 to view build logs.\n")
    assert steps.first_cause(cibuildwheel) == \
        "Build failed because a pure Python wheel was generated."
    assert steps.first_cause("cibuildwheel: error: No build identifiers selected\n") == \
        "cibuildwheel: error: No build identifiers selected"


def test_command_output_reaches_the_log_without_credentials(tmp_path):
    log = steps.Steps(tmp_path / "build.log", shown_path=tmp_path / "final" / "build.log")
    log.run("env", [sys.executable, "-c", "print('index https://bob:hunter2@mirror/simple')"])
    with pytest.raises(StepFailed) as failed:
        log.run("compile", [sys.executable, "-c",
                            "import sys; print('k.c:1:2: error: no such type'); sys.exit(3)"])
    log.close()
    text = (tmp_path / "build.log").read_text()
    assert "hunter2" not in text and "index https://***@mirror/simple" in text
    assert failed.value.detail == (f"compile failed (exit 3): k.c:1:2: error: no such type; "
                                   f"see {tmp_path / 'final' / 'build.log'}")


def test_nox_keeps_the_engines_usage_and_interrupt_statuses():
    spec = importlib.util.spec_from_file_location("noxfile", ROOT / "noxfile.py")
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)

    class Session:
        posargs: list[str] = []

        def __init__(self, code: int):
            self.code = code

        def run(self, *args, **kwargs):
            assert kwargs["interrupt_timeout"] >= 10  # time to record an interrupted build
            raise nox.command.CommandFailed("failed", return_code=self.code)

    for code in (2, 130):
        with pytest.raises(SystemExit) as stop:
            noxfile.extmatrix(Session(code), "build")
        assert stop.value.code == code
    with pytest.raises(nox.command.CommandFailed):
        noxfile.extmatrix(Session(1), "build")


# uv 0.13's resolver failure, as an env step's log holds it (uv pip install --quiet).
UV_NO_SOLUTION = """\
$ uv pip install --quiet --python build-env/bin/python torch==2.15.0+cpu 'scikit-build-core>=0.10'
error: No solution found when resolving dependencies
  cause: Because there is no version of torch==2.15.0+cpu and you require torch==2.15.0+cpu, \
we can conclude that your requirements are unsatisfiable.
"""
UV_CONFLICT = """\
error: No solution found when resolving dependencies
  cause: Because torch==2.13.0+cpu depends on sympy>=1.13.3 and you require torch==2.13.0+cpu, \
we can conclude that you require sympy>=1.13.3.
         And because you require sympy==1.0, we can conclude that your requirements are \
unsatisfiable.

hint: `sympy` was found on https://pypi.example.org/simple, but not at the requested version.
"""
UV_UNREACHABLE = """\
error: Request failed after 3 retries in 11.3s
  cause: Failed to fetch: http://127.0.0.1:9/simple/numpy/
  cause: error sending request for url (http://127.0.0.1:9/simple/numpy/)
  cause: client error (Connect)
  cause: tcp connect error
  cause: Connection refused (os error 111)
"""


# A setup.py that raises, as `pip wheel --no-build-isolation` reports it (pip 25).
PIP_HOOK_FAILED = """\
  Preparing metadata (pyproject.toml): finished with status 'error'
  error: subprocess-exited-with-error

  × Preparing metadata (pyproject.toml) did not run successfully.
  │ exit code: 1
  ╰─> [16 lines of output]
      Traceback (most recent call last):
        File "<string>", line 1, in <module>
      ModuleNotFoundError: No module named 'pybind11'
      [end of output]

  note: This error originates from a subprocess, and is likely not a problem with pip.
error: metadata-generation-failed

× Encountered error while generating package metadata.
╰─> from file:///work/cell/src

note: This is an issue with the package mentioned above, not pip.
hint: See above for details.
"""
# scikit-build-core's configure step, under pip.
CMAKE_FAILED = """\
      -- Detecting CXX compile features - done
      CMake Error at CMakeLists.txt:22 (find_package):
        By not providing "FindNotThereLib.cmake" in CMAKE_MODULE_PATH this project
        has asked CMake to find a package configuration file provided by
        "NotThereLib", but CMake did not find one.

        Could not find a package configuration file provided by "NotThereLib" with
        any of the following names:

      -- Configuring incomplete, errors occurred!

      *** CMake configuration failed
      [end of output]

  note: This error originates from a subprocess, and is likely not a problem with pip.
  ERROR: Failed building wheel for cmake-op
Failed to build cmake-op
ERROR: Failed to build one or more wheels
"""
# setuptools linking a library that is not there.
LINK_FAILED = """\
      gcc -shared build/temp.linux-x86_64-cpython-311/src/native.o -lnuma_missing -o _native.so
      /usr/bin/ld: cannot find -lnuma_missing: No such file or directory
      collect2: error: ld returned 1 exit status
      error: Command '['gcc', '-shared', '-lnuma_missing']' returned non-zero exit status 1.
      [end of output]
  ERROR: Failed building wheel for plain-c
"""


def test_first_cause_of_a_failed_build_is_the_builds_own_error_not_pips_frame():
    assert steps.first_cause(PIP_HOOK_FAILED) == "ModuleNotFoundError: No module named 'pybind11'"
    assert steps.first_cause(CMAKE_FAILED) == (
        'CMake Error at CMakeLists.txt:22: By not providing "FindNotThereLib.cmake" in '
        "CMAKE_MODULE_PATH this project has asked CMake to find a package configuration file "
        'provided by "NotThereLib", but CMake did not find one.')
    assert steps.first_cause(LINK_FAILED) == (
        "/usr/bin/ld: cannot find -lnuma_missing: No such file or directory")
    undefined = LINK_FAILED.replace(
        "/usr/bin/ld: cannot find -lnuma_missing: No such file or directory",
        "/usr/bin/ld: native.o: in function `f': native.c:(.text+0x5): undefined reference to "
        "`g'")
    assert steps.first_cause(undefined).endswith("undefined reference to `g'")
    # A compiler's error still comes first: the link never ran.
    assert steps.first_cause("src/a.c:3:1: error: expected ';'\n" + LINK_FAILED) == (
        "src/a.c:3:1: error: expected ';'")


def test_first_cause_gives_uvs_reason_not_its_headline(tmp_path):
    assert steps.first_cause(UV_NO_SOLUTION) == (
        "No solution found when resolving dependencies: Because there is no version of "
        "torch==2.15.0+cpu and you require torch==2.15.0+cpu, we can conclude that your "
        "requirements are unsatisfiable.")
    assert steps.first_cause(UV_CONFLICT) == (
        "No solution found when resolving dependencies: Because torch==2.13.0+cpu depends on "
        "sympy>=1.13.3 and you require torch==2.13.0+cpu, we can conclude that you require "
        "sympy>=1.13.3. And because you require sympy==1.0, we can conclude that your "
        "requirements are unsatisfiable.")
    assert steps.first_cause(UV_UNREACHABLE) == (
        "Request failed after 3 retries in 11.3s: Connection refused (os error 111)")
    log = steps.Steps(tmp_path / "build.log")
    with pytest.raises(StepFailed) as failed:
        log.run("env", [sys.executable, "-c", f"import sys; print({UV_NO_SOLUTION!r}); "
                                              "sys.exit(1)"])
    log.close()
    assert failed.value.detail.startswith(
        "env failed (exit 1): No solution found when resolving dependencies: Because there "
        "is no version of torch==2.15.0+cpu")


# pytest -q -rs (how the tests step runs it): no FAILED/ERROR summary lines.
PYTEST_COLLECTION_ERROR = """\

==================================== ERRORS ====================================
_________________________ ERROR collecting test_rowops.py _________________________
ImportError while importing test module '/home/ci/ext/test/test_rowops.py'.
Hint: make sure your test modules/packages have valid Python names.
Traceback:
/usr/lib/python3.11/importlib/__init__.py:126: in import_module
    return _bootstrap._gcd_import(name[level:], package, level)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
test_rowops.py:3: in <module>
    from torch_rowops import row_max, row_sum
E   ImportError: cannot import name 'row_max' from 'torch_rowops' (/home/ci/test-env/lib/\
python3.11/site-packages/torch_rowops/__init__.py)
!!!!!!!!!!!!!!!!!!!! Interrupted: 1 error during collection !!!!!!!!!!!!!!!!!!!!
1 error in 0.35s
"""
# A test failing inside a helper whose signature has a parameter named `error`.
PYTEST_FAILURE = """\
.F                                                                       [100%]
=================================== FAILURES ===================================
_________________________________ test_opcheck _________________________________

    def test_opcheck():
>       opcheck("row_sum", (1,))

test_ops.py:4: \n\
_ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ \n\

op = 'row_sum', args = (1,), error = None, atol = None

    def opcheck(
        op,
        args,
        *,
        error: RuntimeError | None = None,
        atol=None,
    ):
>       raise RuntimeError("opcheck(op, ...): test_schema failed with The schema of \
row_sum is wrong")
E       RuntimeError: opcheck(op, ...): test_schema failed with The schema of row_sum is wrong

helpers.py:8: RuntimeError
1 failed, 1 passed in 0.03s
"""
PYTEST_ASSERT_AND_FIXTURE = """\
FE                                                                       [100%]
==================================== ERRORS ====================================
___________________________ ERROR at setup of test_a ___________________________

    @pytest.fixture
    def dev():
>       raise ValueError("no device")
E       ValueError: no device

conftest.py:4: ValueError
=================================== FAILURES ===================================
__________________________________ test_plain __________________________________

    def test_plain():
>       assert [1, 2] == [1, 3]
E       assert [1, 2] == [1, 3]
E         \n\
E         At index 1 diff: 2 != 3
E         Use -v to get more diff

test_assert.py:5: AssertionError
1 failed, 1 error in 0.03s
"""
# With -rfE: the summary, its message cut to the terminal's width.
PYTEST_SUMMARY = """\
E       KeyError: 'k'

test_ops.py:6: KeyError
=========================== short test summary info ============================
FAILED test_ops.py::test_opcheck - RuntimeError: opcheck(op, ...): test_sch...
FAILED test_ops.py::test_two - KeyError: 'k'
2 failed, 1 passed in 0.02s
"""


def test_first_cause_of_pytest_output_is_what_the_test_raised():
    assert steps.first_cause(PYTEST_COLLECTION_ERROR) == (
        "ERROR collecting test_rowops.py: ImportError: cannot import name 'row_max' from "
        "'torch_rowops' (/home/ci/test-env/lib/python3.11/site-packages/torch_rowops/"
        "__init__.py)")
    # Never the traceback's source line `error: RuntimeError | None = None,`.
    expected = ("test_opcheck: RuntimeError: opcheck(op, ...): test_schema failed with The "
                "schema of row_sum is wrong")
    assert steps.first_cause(PYTEST_FAILURE) == expected
    assert steps.first_cause(PYTEST_FAILURE.replace("1 failed, 1 passed in 0.03s\n", ""),
                             step="tests") == expected
    assert steps.first_cause(PYTEST_ASSERT_AND_FIXTURE) == \
        "ERROR at setup of test_a: ValueError: no device"
    assert steps.first_cause(PYTEST_ASSERT_AND_FIXTURE.split("=== FAILURES")[1]) == \
        "test_plain: assert [1, 2] == [1, 3]"
    assert steps.first_cause(PYTEST_FAILURE.replace("helpers.py:8: RuntimeError", PYTEST_SUMMARY)) \
        == f"FAILED test_ops.py::test_opcheck - {expected.split(': ', 1)[1]}"
    assert steps.first_cause(PYTEST_SUMMARY) == \
        "FAILED test_ops.py::test_opcheck - RuntimeError: opcheck(op, ...): test_sch..."


def test_the_tests_step_says_what_failed_not_pytests_tally():
    from extmatrix.backends import local

    assert local.test_failure(2, PYTEST_COLLECTION_ERROR, {}).startswith(
        "tests failed (exit 2): ERROR collecting test_rowops.py: ImportError: cannot import "
        "name 'row_max'")
    assert local.test_failure(1, PYTEST_FAILURE, {}) == (
        "tests failed (exit 1): test_opcheck: RuntimeError: opcheck(op, ...): test_schema "
        "failed with The schema of row_sum is wrong")


# A failing test beside a passing one whose warning names a module it could not import.
PYTEST_WARNING_AND_FAILURE = """\
.F                                                                       [100%]
=================================== FAILURES ===================================
_______________________________ test_wrong_result _______________________________

    def test_wrong_result():
>       assert 2 + 2 == 5
E       assert (2 + 2) == 5

test_ops.py:9: AssertionError
=============================== warnings summary ===============================
test_ops.py::test_fast_path
  test_ops.py:5: UserWarning: fast path off (ModuleNotFoundError: No module named 'triton_x')
=========================== short test summary info ============================
FAILED test_ops.py::test_wrong_result - assert (2 + 2) == 5
==================== 1 failed, 1 passed, 1 warning in 0.05s ====================
"""
PYTEST_OWN_MODULE_MISSING = """\
==================================== ERRORS ====================================
_______________________ ERROR collecting test/test_native.py _______________________
test/test_native.py:1: in <module>
    from plain_c._native import scale
E   ModuleNotFoundError: No module named 'plain_c._native'
=========================== short test summary info ============================
ERROR test/test_native.py
!!!!!!!!!!!!!!!!!!!! Interrupted: 1 error during collection !!!!!!!!!!!!!!!!!!!!
1 error in 0.12s
"""
CONFTEST_IMPORT_ERROR = """\
ImportError while loading conftest '/home/ci/ext/tests/conftest.py'.
tests/conftest.py:1: in <module>
    import hypothesis
E   ModuleNotFoundError: No module named 'hypothesis'
"""


def test_a_missing_module_is_blamed_only_where_a_test_failed_on_it():
    from extmatrix.backends import local

    assert local.test_failure(1, PYTEST_WARNING_AND_FAILURE, {}, "plain_c") == (
        "tests failed (exit 1): FAILED test_ops.py::test_wrong_result - assert (2 + 2) == 5")
    assert local.test_failure(2, PYTEST_OWN_MODULE_MISSING, {}, "plain_c") == (
        "the wheel has no module 'plain_c._native', which the tests import: the build left it "
        "out (the build log says what it compiled)")
    assert local.test_failure(4, CONFTEST_IMPORT_ERROR, {}, "plain_c") == (
        "the tests need 'hypothesis', which is not in the test environment: add it to "
        "extension.test_requires in the matrix, or to the extension's `test` extra")


def test_a_failure_names_its_log_so_that_any_folder_finds_it(tmp_path, monkeypatch):
    # The message is kept in the cell's report and shown again by commands run elsewhere.
    monkeypatch.chdir(tmp_path)
    log = steps.Steps(Path("dist") / "cell" / "build.log")
    with pytest.raises(StepFailed) as failed:
        log.run("compile", [sys.executable, "-c", "import sys; sys.exit(3)"])
    log.close()
    named = Path(failed.value.detail.rsplit("; see ", 1)[1])
    assert named.is_absolute() and named == tmp_path / "dist" / "cell" / "build.log"


def test_a_commands_result_holds_its_own_output_not_the_logs_before_it(tmp_path):
    log = steps.Steps(tmp_path / "log.txt")
    try:
        log.run("one", [sys.executable, "-c", "print('first')"])
        second = log.run("two", [sys.executable, "-c", "print('https://u:secret@x/ second')"])
    finally:
        log.close()
    assert second.stdout == "https://***@x/ second\n"


def test_a_chained_exception_is_named_by_the_one_the_test_ended_with():
    output = "\n".join([
        "____________________ TestMyMulAdd.test_opcheck_cpu ____________________",
        "E   NotImplementedError: mymuladd has no fake implementation",
        "The above exception was the direct cause of the following exception:",
        "E   torch.testing._internal.optests.generate_tests.OpCheckError: opcheck(op, ...): "
        "test_faketensor failed",
        "=========================== short test summary info ===========================",
        "FAILED test/test_extension.py::TestMyMulAdd::test_opcheck_cpu - torch.testing...",
        "========================= 1 failed, 3 passed in 2.01s =========================",
    ])
    assert steps.first_cause(output, step="tests") == (
        "FAILED test/test_extension.py::TestMyMulAdd::test_opcheck_cpu - torch.testing._internal."
        "optests.generate_tests.OpCheckError: opcheck(op, ...): test_faketensor failed")
    without_summary = output.split("=====")[0]  # -rs: no summary lines
    assert steps.first_cause(without_summary, step="tests") == (
        "TestMyMulAdd.test_opcheck_cpu: torch.testing._internal.optests.generate_tests."
        "OpCheckError: opcheck(op, ...): test_faketensor failed")
