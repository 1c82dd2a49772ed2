"""What the CLI tells a maintainer to do next: a repro command that works in their project,
and which cells a run takes when the matrix has no `local` subset."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from extmatrix import cli, report
from extmatrix.cli import main
from extmatrix.report import CellReport

MATRIX = """\
extension: {name: demo, import: demo, path: ext, abi3: false}
axes:
  torch: ["2.13"]
  flavor: [cpu, cu130]
  python: ["3.11", "3.12"]
flavors:
  cpu: {}
  cu130: {archs: ["9.0"]}
"""
CELL = "py3.11-torch2.13-cpu"


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    (tmp_path / "ci" / "ext" / "tests").mkdir(parents=True)
    (tmp_path / "ci" / "ext" / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (tmp_path / "ci" / "extmatrix.yaml").write_text(MATRIX)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EXTMATRIX_MATRIX", raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    return tmp_path


def reproduce(capsys, *args: str) -> list[str]:
    """The repro commands a failed run prints (a test without a build fails at once)."""
    assert main(["test-matrix", "--cell", CELL, "--dist", "out", *args]) == 1
    return [line.strip() for line in capsys.readouterr().err.splitlines()
            if "reproduce:" in line]


def test_repro_hint_is_the_engines_command_with_the_matrix_it_needs(project, monkeypatch,
                                                                    capsys):
    assert reproduce(capsys, "--matrix", "ci/extmatrix.yaml") == [
        f"reproduce: extmatrix repro {CELL} --matrix ci/extmatrix.yaml --dist out"]
    # The matrix the engine finds by itself needs no --matrix.
    monkeypatch.setenv("EXTMATRIX_MATRIX", "ci/extmatrix.yaml")
    assert reproduce(capsys) == [f"reproduce: extmatrix repro {CELL} --dist out"]
    assert reproduce(capsys, "--matrix", str(project / "ci" / "extmatrix.yaml")) == [
        f"reproduce: extmatrix repro {CELL} --dist out"]
    monkeypatch.delenv("EXTMATRIX_MATRIX")
    (project / "matrix.yaml").write_text(MATRIX.replace("path: ext", "path: ci/ext"))
    assert reproduce(capsys, "--matrix", "./matrix.yaml") == [
        f"reproduce: extmatrix repro {CELL} --dist out"]
    # What the run asked of the cell, the repro asks too: without --require-gpu, a cell that
    # failed for want of a GPU passes its repro.
    assert reproduce(capsys, "--require-gpu") == [
        f"reproduce: extmatrix repro {CELL} --dist out --require-gpu"]


def test_repro_hint_in_the_step_summary_and_for_containers():
    failed = [CellReport(cell=CELL, backend="container", build="failed", reason="boom")]
    with report.repro_options("my matrix.yaml"):
        assert report.repro_lines(failed, "container")[0].endswith(
            f"reproduce: extmatrix repro {CELL} --backend container --matrix 'my matrix.yaml'")
        assert (f"- `{CELL}`: `extmatrix repro {CELL} --backend container --matrix "
                "'my matrix.yaml'`") in report.summary_markdown(failed, "container")
    assert report.repro_lines(failed, "local")[0].endswith(f"reproduce: extmatrix repro {CELL}")


def select(*args: str) -> list[str]:
    parsed = cli.build_parser().parse_args(["build", "--matrix", "ci/extmatrix.yaml", *args])
    cells = [c.id for c in cli.selected(parsed, default_subset="local")[1]]
    cli._note(parsed)  # what build says once the rest of its command line is checked
    return cells


def test_no_local_subset_selects_every_cell_and_says_so(project, capsys):
    assert len(select()) == 4
    assert capsys.readouterr().err.splitlines() == [
        "# ci/extmatrix.yaml has no 'local' subset: all 4 cells selected; narrow with "
        "--subset, --cell or -k, or add a 'local' subset to the matrix"]
    assert select("--cell", CELL) == [CELL]
    assert len(select("-k", "*-cpu")) == 2
    assert capsys.readouterr().err == ""
    (project / "ci" / "extmatrix.yaml").write_text(MATRIX + f"subsets:\n  local: [{CELL}]\n")
    assert select() == [CELL]
    assert capsys.readouterr().err == ""
    (project / "ci" / "extmatrix.yaml").write_text(MATRIX)
    assert main(["plan", "--matrix", "ci/extmatrix.yaml", "--json"]) == 0
    assert capsys.readouterr().err == ""  # plan shows every cell by design: nothing to say


def test_a_mistake_after_the_selection_is_still_one_line(project, monkeypatch, capsys):
    monkeypatch.setenv("MAX_JOBS", "abc")
    assert main(["build", "--matrix", "ci/extmatrix.yaml"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "$MAX_JOBS: 'abc' is not a number of compile jobs; export a whole number from 1, or "
        "unset it to let extmatrix choose"]


def test_a_piped_plan_keeps_each_cell_id_on_one_line(project, monkeypatch, capsys):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["plan", "--matrix", "ci/extmatrix.yaml"]) == 0
    out = capsys.readouterr().out
    for cell in ("py3.11-torch2.13-cpu", "py3.12-torch2.13-cu130"):
        assert cell in out, f"{cell} is wrapped in:\n{out}"


@pytest.mark.parametrize(("ci", "strict"), [("", False), ("false", False), ("0", False),
                                             ("no", False), ("true", True), ("1", True)])
def test_ci_turns_strict_on_only_when_set_to_a_true_value(monkeypatch, ci, strict):
    monkeypatch.setenv("CI", ci)
    args = cli.build_parser().parse_args(["test-matrix"])
    assert cli._strict(args) is strict


@pytest.mark.parametrize(("ci", "args", "strict", "complete"), [
    ("", ["--cell", CELL], True, False),  # a named cell must build; a laptop has its Pythons
    ("true", [], True, True),  # CI: both
    ("", ["--strict"], True, True),
    ("true", ["--cell", CELL, "--no-strict"], False, False),
])
def test_a_named_cell_is_strict_but_only_ci_or_strict_asks_for_every_python(
        monkeypatch, ci, args, strict, complete):
    monkeypatch.setenv("CI", ci)
    parsed = cli.build_parser().parse_args(["test-matrix", *args])
    assert (cli._strict(parsed), cli._complete(parsed)) == (strict, complete)


def test_strict_fails_a_stable_wheel_left_untested_beside_a_torch_it_serves():
    from extmatrix.report import ServedTorch, failure

    stable = CellReport(cell="stable2.13-cpu", backend="local", build="built", test="passed",
                        serves=[ServedTorch(torch="2.13.0", test="passed"),
                                ServedTorch(torch="2.15.0", reason="torch 2.15.0 could not be "
                                            "installed here")])
    assert not failure(stable, strict=False)  # a laptop without that torch: said, not failed
    assert failure(stable, strict=True)
    assert report.repro_lines([stable], "local", strict=True)[0].splitlines()[0] == (
        "stable2.13-cpu: beside torch 2.15.0: not tested: torch 2.15.0 could not be installed "
        "here")
    rows = report.summary_rows([stable], strict=True)
    assert [failed for _, failed in rows] == [True, False, True]


def test_ctrl_c_while_the_engine_loads_is_the_one_line_too():
    import subprocess
    import sys

    # The console script's own route: extmatrix._entry imports the CLI, which takes a
    # moment; the interrupt lands inside that import.
    code = ("import sys\n"
            "class Interrupt:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'extmatrix.cli':\n"
            "            raise KeyboardInterrupt\n"
            "sys.meta_path.insert(0, Interrupt())\n"
            "from extmatrix._entry import main\n"
            "sys.exit(main())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (130, "extmatrix: interrupted\n")


@pytest.mark.parametrize(("args", "line"), [
    (["--check"], "--check: only applies with --outdated; pass --outdated --check"),
    (["--outdated", "--json"], "--outdated: prints a patch, not JSON; drop --json, or run it "
     "separately"),
    (["--outdated", "--explain"], "--outdated: prints a patch, not a table; drop --explain, or "
     "run it separately"),
    (["--for", "gpu"], "--for gpu: chooses the JSON of a workflow job; pass --json --for gpu"),
])
def test_plan_options_that_would_be_ignored_are_refused(capsys, args, line):
    matrix = Path(__file__).resolve().parents[1] / "matrix.yaml"
    assert main(["plan", "--matrix", str(matrix), *args]) == 2
    assert capsys.readouterr() == ("", line + "\n")


@pytest.mark.parametrize("args", [["--json"], [], ["--explain"]])  # print, then rich
def test_a_reader_that_stops_early_ends_the_run_quietly(monkeypatch, capsys, args):
    read, write = os.pipe()
    os.close(read)  # `extmatrix plan --json | head -c 10`, head gone
    out = os.fdopen(write, "w")
    monkeypatch.setattr(sys, "stdout", out)
    matrix = Path(__file__).resolve().parents[1] / "matrix.yaml"
    try:
        assert main(["plan", "--matrix", str(matrix), *args]) == 128 + signal.SIGPIPE
    finally:
        monkeypatch.undo()
    assert capsys.readouterr().err == ""


def test_a_build_whose_watcher_went_away_goes_on_quietly():
    # `extmatrix build 2>&1 | head`: the build's results still land in dist/, and its exit
    # status is the build's, not rich's 1 for a closed pipe.
    from extmatrix import run

    read, write = os.pipe()
    os.close(read)
    console = run.console()
    console.file = os.fdopen(write, "w")
    console.print("build torch2.13-cpu: ok")  # no SystemExit, no BrokenPipeError
    assert console.quiet


@pytest.mark.parametrize(("requires", "said"), [
    ('["setuptools>>=64"]', "[build-system] requires: "),
    ("[5]", "[build-system] requires holds a value that is not a string"),
])
def test_a_broken_build_requirement_is_one_line_before_any_cell_starts(project, capsys,
                                                                       requires, said):
    pyproject = project / "ci" / "ext" / "pyproject.toml"
    pyproject.write_text(f"[build-system]\nrequires = {requires}\n[project]\nname = 'demo'\n")
    assert main(["build", "--matrix", "ci/extmatrix.yaml", "--cell", CELL]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{pyproject}: {said}") and err.count("\n") == 1, err
    assert not (project / "ci" / "dist" / CELL).exists()  # no cell started, nothing recorded
