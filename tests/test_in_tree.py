"""An extension with its matrix in its own folder (`path: .`, as `extmatrix init` writes it)
and its tests a package beside a flat-layout package that only works installed
(tests/extensions/in-tree): the engine's work and results folders lie inside the extension,
and tests run in place would import the sources instead of the wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cibuildwheel.util.helpers import prepare_command

from extmatrix import cibw, project, run, steps, workspace
from extmatrix.backends import Context, container, copy_sources, local
from extmatrix.cells import plan_file
from extmatrix.cli import main
from extmatrix.errors import UserError
from extmatrix.report import CellReport

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "extensions" / "in-tree"
CELL = "py3.11-torch2.13-cpu"
BROKEN_TEST = "def test_broken():\n    assert [1, 2] == [1, 3]\n"


@pytest.fixture
def ext(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("EXTMATRIX_WORK", raising=False)
    monkeypatch.delenv("CI", raising=False)
    return Path(shutil.copytree(FIXTURE, tmp_path / "in-tree")).resolve()


def sources(folder: Path) -> set[str]:
    """The files of a copy of the extension, less what a build made there."""
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")
            if p.is_file() and not workspace.skipped(p.relative_to(folder))}


def test_a_copy_of_the_extension_leaves_out_the_engines_folders_inside_it(ext, tmp_path):
    work, dist = ext / "scratch" / "work", ext / "ci" / "results"  # $EXTMATRIX_WORK, --dist
    python = work / CELL / "build-env" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    (dist / CELL).mkdir(parents=True)
    (dist / CELL / "in_tree-1.0.0.whl").write_text("wheel")
    (ext / ".extmatrix" / CELL).mkdir(parents=True)  # the default work folder, from a run before
    copy = work / CELL / "src"
    for left in ("scratch/work/y", "ci/results/z"):  # what a copy of itself left there before
        (copy / left).mkdir(parents=True)
    leave_out = workspace.engine_folders(ext, work, dist)
    workspace.sync_tree(ext, copy, leave_out)
    assert sources(copy) == sources(FIXTURE)
    assert not [p for p in ("scratch/work", "ci/results", ".extmatrix") if (copy / p).exists()]
    # What changes in the engine's folders is no change of the sources: the wheel is reused.
    cell = plan_file(ext / "matrix.yaml").cell(CELL)
    before = local.fingerprint(cell, {}, tmp_path / "venv", copy)
    (dist / CELL / "build.log").write_text("log")
    (work / CELL / "wheelhouse").mkdir()
    workspace.sync_tree(ext, copy, leave_out)
    assert local.fingerprint(cell, {}, tmp_path / "venv", copy) == before


def test_the_matrix_and_github_folder_in_the_extension_are_no_part_of_its_copy(ext, tmp_path):
    """A comment or a torch added to the matrix, a CI workflow edited: no source of a wheel
    changed, and every cell reuses its wheel (its own settings are in the fingerprint)."""
    workflow = ext / ".github" / "workflows" / "extmatrix.yml"
    workflow.parent.mkdir(parents=True)
    workflow.write_text("on: push\n")
    ctx = run.context(plan_file(ext / "matrix.yaml"), dist=None, parallel=1)
    src = ctx.work / CELL / "src"
    (src / ".github").mkdir(parents=True)  # what an older engine copied
    (src / "matrix.yaml").write_text("old")

    def fingerprint() -> str:
        copy_sources(ctx, src)
        cell = plan_file(ext / "matrix.yaml").cell(CELL)
        return local.fingerprint(cell, {}, tmp_path / "venv", src)

    before = fingerprint()
    assert sources(src) == sources(FIXTURE) - {"matrix.yaml"} and not (src / ".github").exists()
    matrix = ext / "matrix.yaml"
    matrix.write_text(matrix.read_text().replace('torch: ["2.13"]', 'torch: ["2.12", "2.13"]')
                      + "# a comment\n")
    workflow.write_text("on: pull_request\n")
    assert fingerprint() == before
    (ext / "csrc" / "native.c").write_text((ext / "csrc" / "native.c").read_text() + "\n")
    assert fingerprint() != before


def test_the_default_work_folder_in_the_extension_is_not_its_source(ext):
    # What a build leaves there: environments whose python links out of the extension.
    python = ext / ".extmatrix" / CELL / "build-env" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    ctx = run.context(plan_file(ext / "matrix.yaml"), dist=None, parallel=1)
    assert (ctx.ext_dir, ctx.work, ctx.dist) == (ext, ext / ".extmatrix", ext / "dist")
    src, _ = project.build_tree(ctx.work / CELL / "src", ctx.ext_dir)
    (src / ".extmatrix" / CELL / "src").mkdir(parents=True)  # what a copy of itself left there
    copy_sources(ctx, src)
    assert sources(src) == sources(FIXTURE) - {"matrix.yaml"} and not (src / ".extmatrix").exists()


@pytest.mark.parametrize("flag", ["$EXTMATRIX_WORK", "--dist"])
def test_a_work_or_results_folder_that_is_the_extension_is_one_line(ext, flag):
    work, dist = (ext, ext / "dist") if flag == "$EXTMATRIX_WORK" else (ext / "w", ext)
    with pytest.raises(UserError) as caught:
        workspace.engine_folders(ext, work, dist)
    assert str(caught.value) == (f"{flag}: {ext} is the extension's own folder; point it at a "
                                 "folder of its own (inside the extension or not)")


def test_the_tree_check_leaves_out_the_engines_folders_inside_the_extension(ext, monkeypatch):
    """Named otherwise than .extmatrix and dist, they hold environments whose links lead out
    of the extension: no part of its sources, as no part of their copy."""
    work, dist = ext / "scratch", ext / "ci" / "results"
    for folder in (work, dist):
        python = folder / CELL / "test-env" / "bin" / "python"
        python.parent.mkdir(parents=True)
        python.symlink_to(sys.executable)
    monkeypatch.setenv("EXTMATRIX_WORK", str(work))
    ctx = run.context(plan_file(ext / "matrix.yaml"), dist=str(dist), parallel=1)
    assert (ctx.work, ctx.dist) == (work, dist)
    (ext / "csrc" / "python").symlink_to(sys.executable)  # the sources are still checked
    with pytest.raises(UserError, match="csrc/python: symlink leads outside the extension"):
        run.context(plan_file(ext / "matrix.yaml"), dist=str(dist), parallel=1)


@pytest.mark.parametrize(("variable", "value", "line"), [
    ("EXTMATRIX_WORK", "{ext}", "$EXTMATRIX_WORK: {ext} is the extension's own folder; point it "
     "at a folder of its own (inside the extension or not)"),
    ("MAX_JOBS", "half", "$MAX_JOBS: 'half' is not a number of compile jobs; export a whole "
     "number from 1, or unset it to let extmatrix choose"),
    ("MAX_JOBS", "²", "$MAX_JOBS: '²' is not a number of compile jobs; export a whole "
     "number from 1, or unset it to let extmatrix choose"),
    ("EXTMATRIX_TORCH_INDEX", "cel", "$EXTMATRIX_TORCH_INDEX: 'cel' is not a way to find torch; "
     "export one of auto, cell, host, or unset it (auto)"),
])
def test_a_mistake_every_cell_would_make_is_one_line_before_any_cell_starts(
        ext, tmp_path, monkeypatch, capsys, variable, value, line):
    monkeypatch.setenv(variable, value.format(ext=ext))
    dist = tmp_path / "dist"
    matrix = str(ext / "matrix.yaml")
    assert main(["test-matrix", "--matrix", matrix, "--cell", CELL, "--dist", str(dist)]) == 2
    assert capsys.readouterr().err == line.format(ext=ext) + "\n"
    assert not (dist / CELL).exists()


@pytest.mark.parametrize("work", ["dist", "dist/../dist"])
def test_a_work_folder_that_is_the_results_folder_is_refused_not_waited_on(
        ext, tmp_path, monkeypatch, capsys, work):
    # Spelt relative to where extmatrix runs, the same folder as --dist: its cell locks
    # were taken twice, and the run waited on itself for ever.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EXTMATRIX_WORK", work)
    dist = tmp_path / "dist"
    matrix = str(ext / "matrix.yaml")
    assert main(["test-matrix", "--matrix", matrix, "--cell", CELL, "--dist", str(dist)]) == 2
    assert capsys.readouterr().err == (
        f"$EXTMATRIX_WORK {dist}: is the results folder {dist}; point $EXTMATRIX_WORK (or "
        "--dist) elsewhere\n")


def installed(tmp_path: Path, ext: Path) -> Path:
    """The extension as its wheel installs it, its binary stood in for by Python."""
    package = tmp_path / "site" / "in_tree"
    package.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ext / "in_tree" / "__init__.py", package)
    (package / "_native.py").write_text("def answer():\n    return 42\n")
    return package.parent


def python_in(folder: Path) -> Path:
    """A `python` in `folder`: this one (it has pytest), run under its own name."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (folder / "python").chmod(0o755)
    return folder


def local_suite(ext: Path, tmp_path: Path, monkeypatch) -> tuple[str, dict, str | None, Path]:
    """The local backend's test step, in a stand-in test environment."""
    monkeypatch.setenv("PYTHONPATH", str(installed(tmp_path, ext)))
    ctx = Context(plan_file(ext / "matrix.yaml").matrix, ext, ext / "dist", ext / ".extmatrix",
                  tmp_path / "cache", 1)
    venv = python_in(ctx.work / CELL / "test-env" / "bin").parent
    log = steps.Steps(ctx.dist / CELL / "test.log")
    try:
        outcome, junit, reason = local.run_suite(ctx, venv, ctx.dist / CELL, "", log)
    finally:
        log.close()
    return outcome, junit, reason, venv.parent / workspace.SUITE


def test_the_tests_run_from_a_copy_that_cannot_import_the_sources(ext, tmp_path, monkeypatch):
    outcome, junit, _, suite = local_suite(ext, tmp_path, monkeypatch)
    assert outcome == "passed", (ext / "dist" / CELL / "test.log").read_text()
    # check_settings.py too: the extension's pytest settings (setup.cfg) came along.
    assert junit["passed"] == 2
    assert sorted(p.name for p in suite.iterdir()) == ["setup.cfg", "test"]


def test_a_failing_test_is_named_by_pytests_failed_line(ext, tmp_path, monkeypatch):
    (ext / "test" / "test_broken.py").write_text(BROKEN_TEST)
    outcome, _, reason, _ = local_suite(ext, tmp_path, monkeypatch)
    assert outcome == "failed"
    assert reason.startswith("tests failed (exit 1): FAILED test/test_broken.py::test_broken - "
                             "assert [1, 2] == [1, 3]; see "), reason


def test_a_refused_test_command_says_what_pytest_refused(ext, tmp_path, monkeypatch):
    matrix = ext / "matrix.yaml"
    matrix.write_text(matrix.read_text().replace("  abi3: false\n",
                                                 "  abi3: false\n  test_args: [--bogus]\n"))
    outcome, _, reason, _ = local_suite(ext, tmp_path, monkeypatch)
    assert outcome == "failed"
    assert reason.startswith("the test command was refused (exit 4): ")
    assert "error: unrecognized arguments: --bogus; see " in reason, reason


def test_a_test_that_ends_the_process_with_status_0_fails_the_run(ext, tmp_path, monkeypatch):
    # pytest never reaches the end of its session: no report, no tally, exit 0.
    (ext / "test" / "test_quits.py").write_text("import os\n\n\ndef test_quits():\n"
                                                "    os._exit(0)\n")
    outcome, _, reason, _ = local_suite(ext, tmp_path, monkeypatch)
    assert outcome == "failed"
    assert reason.startswith("the tests exited 0 without writing their JUnit report"), reason


def test_a_test_command_that_hides_a_failure_behind_exit_0_fails(ext, tmp_path, monkeypatch):
    # Piped through tee, pytest's exit status is lost; its tally is not.
    (ext / "test" / "test_broken.py").write_text(BROKEN_TEST)
    matrix = ext / "matrix.yaml"
    matrix.write_text(matrix.read_text().replace("  abi3: false\n", "  abi3: false\n"
        '  test_command: ["sh", "-c", "{python} -m pytest -q -p no:cacheprovider {tests} '
        '| tee {tests}/../pytest.log"]\n'))
    outcome, junit, reason, _ = local_suite(ext, tmp_path, monkeypatch)
    assert (outcome, junit["failures"]) == ("failed", 1), reason
    assert reason.startswith("the test command exited 0, yet 1 of its tests failed or erred")


UNITTEST = ('  test_command: ["{python}", "-m", "unittest", "discover", "-s", "{tests}", '
            '"-t", "{tests}/.."]\n')


@pytest.mark.parametrize(("skip", "outcome"), [(False, "passed"), (True, "failed")])
def test_a_test_command_without_junit_is_counted_from_its_runners_tally(
        ext, tmp_path, monkeypatch, skip, outcome):
    matrix = ext / "matrix.yaml"
    matrix.write_text(matrix.read_text().replace("  abi3: false\n", "  abi3: false\n" + UNITTEST))
    (ext / "test" / "test_answer.py").write_text(
        "import unittest\n\nimport in_tree\n\n\nclass Answer(unittest.TestCase):\n"
        + ('    @unittest.skip("no GPU here")\n' if skip else "")
        + "    def test_answer(self):\n        self.assertEqual(in_tree.answer(), 42)\n")
    for other in ("check_settings.py", "conftest.py"):
        (ext / "test" / other).unlink()
    got, junit, reason, _ = local_suite(ext, tmp_path, monkeypatch)
    assert (got, junit["tests"], junit["skipped"]) == (outcome, 1, int(skip)), reason
    if skip:
        assert reason.startswith("no test passed: all 1 skipped, 1 not for want of a GPU")


def in_image(ext: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """The in-image tests as cibuildwheel runs them: its placeholders filled, then sh in a
    scratch folder with the test venv's python first on PATH."""
    ctx = Context(plan_file(ext / "matrix.yaml").matrix, ext, ext / "dist", ext / ".extmatrix",
                  tmp_path / "cache", 1)
    command = cibw.test_command(ctx.matrix.extension, container._pytest_settings(ctx))
    line = prepare_command(command, project=str(ext), package=str(ext), wheel="/w.whl")
    scratch = tmp_path / "test_cwd"
    scratch.mkdir(parents=True)
    path = f"{python_in(tmp_path / 'venv' / 'bin')}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(["sh", "-c", line], capture_output=True, text=True, cwd=scratch,
                          env={**os.environ, "PATH": path,
                               "PYTHONPATH": str(installed(tmp_path, ext))})


def test_the_in_image_tests_run_from_a_copy_that_cannot_import_the_sources(ext, tmp_path):
    done = in_image(ext, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


def test_a_failing_in_image_test_is_named_by_pytests_failed_line(ext, tmp_path):
    (ext / "test" / "test_broken.py").write_text(BROKEN_TEST)
    done = in_image(ext, tmp_path)
    assert done.returncode == 1
    assert steps.first_cause(done.stdout, step="cibuildwheel") == (
        "FAILED test/test_broken.py::test_broken - assert [1, 2] == [1, 3]"), done.stdout


# A test that reads files of the extension outside its own folder, as test_portability.py
# reads the kernels.
READS_SOURCES = """from pathlib import Path

TOP = Path(__file__).parents[{up}]


def test_the_sources_beside_the_tests():
    assert "PyInit__native" in (TOP / "csrc" / "native.c").read_text()
    assert (TOP / "pyproject.toml").is_file()
"""


def with_test_sources(ext: Path, tests: str = "test", up: int = 1) -> None:
    """The fixture with its tests at `tests`, one of them reading csrc/ and pyproject.toml
    `up` folders above its own."""
    if tests != "test":
        shutil.move(ext / "test", ext / tests)
    (ext / tests / "test_sources.py").write_text(READS_SOURCES.format(up=up))
    matrix = ext / "matrix.yaml"
    matrix.write_text(matrix.read_text().replace("  tests: test\n", f"  tests: {tests}\n"))


def list_test_sources(ext: Path) -> None:
    matrix = ext / "matrix.yaml"
    matrix.write_text(matrix.read_text().replace(
        "  abi3: false\n", "  abi3: false\n  test_sources: [csrc, pyproject.toml]\n"))


@pytest.mark.parametrize(("tests", "up"), [("test", 1), ("checks/test", 2)])
def test_the_tests_read_their_test_sources_beside_their_copy(ext, tmp_path, monkeypatch, tests,
                                                             up):
    with_test_sources(ext, tests, up)
    outcome, _, reason, _ = local_suite(ext, tmp_path / "unlisted", monkeypatch)
    assert outcome == "failed" and "FAILED " in reason and "native.c" in reason, reason
    list_test_sources(ext)
    outcome, junit, _, suite = local_suite(ext, tmp_path / "listed", monkeypatch)
    assert outcome == "passed", (ext / "dist" / CELL / "test.log").read_text()
    assert junit["passed"] == 3
    # Each at its place in the extension: the tests' copy, their settings, the test sources.
    assert (suite / tests / "test_sources.py").is_file() and (suite / "setup.cfg").is_file()
    assert sorted(p.name for p in (suite / "csrc").iterdir()) == ["native.c"]
    assert not (suite / "in_tree").exists()


@pytest.mark.parametrize(("tests", "up"), [("test", 1), ("checks/test", 2)])
def test_the_in_image_tests_read_their_test_sources_beside_their_copy(ext, tmp_path, tests, up):
    with_test_sources(ext, tests, up)
    done = in_image(ext, tmp_path / "unlisted")
    assert done.returncode == 1 and "FileNotFoundError" in done.stdout, done.stdout
    list_test_sources(ext)
    done = in_image(ext, tmp_path / "listed")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout


@pytest.mark.cells
def test_an_extension_with_its_matrix_inside_builds_and_tests_its_wheel(ext, capsys):
    """Real builds, in the work folder the engine picks: inside the extension."""
    matrix = str(ext / "matrix.yaml")
    assert main(["build", "--matrix", matrix]) == 0, capsys.readouterr().err
    assert main(["test-matrix", "--matrix", matrix]) == 0, capsys.readouterr().err
    tested = CellReport.read(ext / "dist" / CELL / "report.json")
    assert tested.test == "passed" and tested.junit["passed"] == 2
    # What a maintainer edits between builds, none of it a source of the wheel.
    (ext / "matrix.yaml").write_text((ext / "matrix.yaml").read_text() + "# a comment\n")
    (ext / ".github" / "workflows").mkdir(parents=True)
    (ext / ".github" / "workflows" / "extmatrix.yml").write_text("on: push\n")
    assert main(["build", "--matrix", matrix]) == 0, capsys.readouterr().err
    assert CellReport.read(ext / "dist" / CELL / "report.json").reused
    assert sources(ext / ".extmatrix" / CELL / "src") == sources(FIXTURE) - {"matrix.yaml"}


def test_an_extension_that_is_its_own_tests_folder_leaves_its_package_out(ext, tmp_path,
                                                                          monkeypatch):
    matrix = ext / "matrix.yaml"
    matrix.write_text(matrix.read_text().replace("  tests: test\n", "  tests: .\n"))
    outcome, junit, _, suite = local_suite(ext, tmp_path, monkeypatch)
    assert outcome == "passed", (ext / "dist" / CELL / "test.log").read_text()
    assert junit["passed"] == 2
    copied = sorted(p.name for p in (suite / "tests").iterdir())
    assert "in_tree" not in copied and ".extmatrix" not in copied and "dist" not in copied
    done = in_image(ext, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


def with_root_conftest(ext: Path) -> None:
    """A conftest.py at the extension's top, whose fixture a test uses: pytest loads it for
    the tests in place."""
    (ext / "conftest.py").write_text("import pytest\n\n\n@pytest.fixture\ndef grid():\n"
                                     "    return [1, 2, 3]\n")
    (ext / "test" / "test_grid.py").write_text("def test_grid(grid):\n"
                                               "    assert sum(grid) == 6\n")


def test_a_conftest_above_the_tests_comes_with_their_copy(ext, tmp_path, monkeypatch):
    with_root_conftest(ext)
    outcome, junit, _, suite = local_suite(ext, tmp_path, monkeypatch)
    assert outcome == "passed", (ext / "dist" / CELL / "test.log").read_text()
    assert junit["passed"] == 3 and (suite / "conftest.py").is_file()


def test_a_conftest_above_the_tests_comes_with_their_in_image_copy(ext, tmp_path):
    with_root_conftest(ext)
    ctx = Context(plan_file(ext / "matrix.yaml").matrix, ext, ext / "dist", ext / ".extmatrix",
                  tmp_path / "cache", 1)
    command = cibw.test_command(ctx.matrix.extension, container._pytest_settings(ctx),
                                container._conftests(ctx))
    line = prepare_command(command, project=str(ext), package=str(ext), wheel="/w.whl")
    scratch = tmp_path / "test_cwd"
    scratch.mkdir(parents=True)
    path = f"{python_in(tmp_path / 'venv' / 'bin')}{os.pathsep}{os.environ['PATH']}"
    done = subprocess.run(["sh", "-c", line], capture_output=True, text=True, cwd=scratch,
                          env={**os.environ, "PATH": path,
                               "PYTHONPATH": str(installed(tmp_path, ext))})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout
