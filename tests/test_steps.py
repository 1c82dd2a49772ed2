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
