"""Text from the matrix and from cell reports is printed as written: brackets in a reason
or a requirement's extras are not rich markup."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from extmatrix import report
from extmatrix.cells import Dropped
from extmatrix.cli import main
from extmatrix.report import CellReport, ServedTorch

BROKEN_MARKUP = "CUDA 12.6 [/] see issue #12"
TAGS = "[bold]now[/bold]"
EXTRAS = "nvidia-cutlass[cu13]>=4.0"

MATRIX = f"""\
extension: {{name: demo, import: demo, abi3: false}}
axes:
  torch: ["2.14"]
  flavor: [cpu, cu130]
  python: ["3.11", "3.12"]
flavors:
  cpu: {{}}
  cu130: {{archs: ["9.0"], runtime_deps: ["{EXTRAS}"]}}
exclude:
  - {{flavor: cpu, python: "3.11", reason: "{BROKEN_MARKUP}"}}
  - {{flavor: cpu, python: "3.12", reason: "{TAGS}"}}
"""


@pytest.fixture
def matrix(tmp_path, monkeypatch) -> str:
    (tmp_path / "ext" / "tests").mkdir(parents=True)
    (tmp_path / "ext" / "pyproject.toml").write_text("[project]\nname='demo'\n")
    (tmp_path / "extmatrix.yaml").write_text(MATRIX)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EXTMATRIX_MATRIX", raising=False)
    return "extmatrix.yaml"


def render(table) -> str:
    console = Console(file=io.StringIO(), width=400)
    console.print(table)
    return console.file.getvalue()


def test_exclude_reasons_are_printed_as_written(matrix, capsys):
    assert main(["plan", "--matrix", matrix, "--explain"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert BROKEN_MARKUP in out
    assert TAGS in out


def test_requirement_extras_are_printed(matrix, capsys):
    assert main(["plan", "--matrix", matrix]) == 0
    out = capsys.readouterr().out
    assert f"torch==2.14.*, {EXTRAS}" in out


def test_cell_reports_are_printed_as_written():
    built = CellReport(cell="py3.12-torch2.14-cu130", backend="local", build="built",
                       test="failed", reason=f"{TAGS}: see [/] C:\\logs\\",
                       wheel="demo-1.0+[pt214]-cp312-linux_x86_64.whl", wheel_size=2_000_000,
                       serves=[ServedTorch(torch="2.13.0", test="failed", build="2.13.0+[cpu]",
                                           reason=BROKEN_MARKUP)])
    failed = CellReport(cell="py3.11-torch2.14-cu130", backend="local", build="failed",
                        reason="nvcc: [error] in kernel[0].cu", cross_check="FAILED [x]")
    out = render(report.summary_table([built, failed]))
    for text in (f"FAILED: {TAGS}: see [/] C:\\logs\\", "demo-1.0+[pt214]-cp312", "2.13.0+[cpu]",
                 f"FAILED: {BROKEN_MARKUP}", "FAILED: nvcc: [error] in kernel[0].cu"):
        assert text in out, text


def test_markdown_summary_is_unchanged_by_the_escaping():
    r = CellReport(cell="c", backend="local", build="failed", reason=TAGS)
    assert f"| FAILED: {TAGS} |" in report.summary_markdown([r], "local")


def test_dropped_combinations_are_printed_as_written():
    dropped = [Dropped(combo="torch 2.14 × [cpu]", reason=BROKEN_MARKUP)]
    out = render(report.dropped_table(dropped))
    assert "torch 2.14 × [cpu]" in out and BROKEN_MARKUP in out


def test_tests_skipped_for_want_of_a_gpu_are_counted_apart():
    skipped = CellReport(cell="py3.11-torch2.13-cpu", backend="local", build="built",
                         test="passed", junit={"passed": 0, "skipped": 3, "gpu_skipped": 3})
    (row, failed), = report.summary_rows([skipped])
    assert row[2] == "passed: 0 passed, 3 skipped (3 need a GPU)" and not failed


def test_a_hand_edited_report_with_one_failure_count_is_summarised():
    # Valid to the report's schema, and once a KeyError ('failures') in every summary.
    edited = CellReport(cell="py3.11-torch2.13-cpu", backend="local", build="built",
                        test="failed", junit={"passed": 2, "errors": 1})
    (row, failed), = report.summary_rows([edited])
    assert row[2] == "failed: 2 passed, 0 skipped, 1 failed" and failed


def test_the_pythons_an_abi3_wheel_was_not_tested_under_show_without_junit_counts():
    # An extension's own test command may write no JUnit file: the Pythons still show.
    r = CellReport(cell="torch2.13-cpu", backend="local", build="built", test="passed",
                   pythons={"3.11": "passed", "3.12": "not installed here"})
    (row, _), = report.summary_rows([r])
    assert row[2] == ("passed (exit status only: no JUnit, no tally); on Python 3.11 (3.12 "
                      "not installed here)")


def test_an_abi3_wheel_untested_under_a_python_it_serves_fails_the_strict_run():
    # CI's runner had one Python: the wheel goes out to four it was never imported under.
    r = CellReport(cell="torch2.13-cpu", backend="local", build="built", test="passed",
                   junit={"tests": 2, "passed": 2},
                   pythons={"3.11": "passed", "3.12": "not installed here",
                            "3.13": "not installed here"})
    (row, failed), = report.summary_rows([r], strict=True)
    assert failed and row[1] == ("FAILED (--strict): Python 3.12, 3.13 it serves went untested "
                                 "(not installed here)")
    assert report.repro_lines([r], "local", strict=True)[0].splitlines()[0] == (
        "torch2.13-cpu: not tested under Python 3.12, 3.13, which the wheel serves: not "
        "installed here; install them where the tests run")
    (row, failed), = report.summary_rows([r])
    assert not failed and row[1] == "ok"
    assert row[2] == "passed: 2 passed, 0 skipped; on Python 3.11 (3.12, 3.13 not installed here)"


def test_the_job_summary_says_in_words_when_gpu_tests_did_not_run():
    cpu = CellReport(cell="torch2.13-cpu", backend="local", build="built", test="passed",
                     junit={"tests": 2, "passed": 2})
    cuda = CellReport(cell="torch2.13-cu130", backend="local", build="built", test="passed",
                      junit={"tests": 6, "passed": 2, "skipped": 4, "gpu_skipped": 4})
    assert "GPU tests not run" not in report.summary_markdown([cpu], "local")
    said = report.summary_markdown([cpu, cuda], "local").splitlines()
    assert ("**GPU tests not run here: 4 test(s) of `torch2.13-cu130` need a GPU.** A flavor's "
            "`gpu_runner` in the matrix runs them on a GPU machine (`test-matrix "
            "--require-gpu`).") in said


def test_a_pass_on_the_exit_status_alone_says_so():
    r = CellReport(cell="torch2.13-cpu", backend="local", build="built", test="passed")
    (row, _), = report.summary_rows([r])
    assert row[2] == "passed (exit status only: no JUnit, no tally)"


def test_a_cell_failed_by_strict_says_so_in_its_row():
    from extmatrix.report import CROSS_NOT_MADE, ServedTorch

    untested = CellReport(cell="stable2.13-cpu", backend="local", build="built", test="passed",
                          serves=[ServedTorch(torch="2.13.0", test="passed"),
                                  ServedTorch(torch="2.16.0", reason="could not be installed")])
    (row, failed), _ = report.summary_rows([untested], strict=True)[:2]
    assert failed and row[1] == "FAILED (--strict): a torch it serves went untested"
    (row, failed), _ = report.summary_rows([untested])[:2]
    assert not failed and row[1] == "ok"
    skipped = CellReport(cell="c", backend="local", build="built", test="passed",
                         cross_check=f"{CROSS_NOT_MADE} beside d's torch: no wheel for 3.10")
    ((row, failed),) = report.summary_rows([skipped], strict=True)
    assert failed and row[1].startswith("FAILED (--strict): skipped: could not install the wheel")
