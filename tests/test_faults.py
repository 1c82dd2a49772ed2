"""What a demanding user does to a build, and what they must get back: the last good wheel
kept, one true line naming a log that exists, and never a traceback.

The builds are real (pip, setuptools, gcc, a cell environment with torch 2.13 CPU) but of
`tests/extensions/plain-c`, a C extension small enough to compile in a second.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from extmatrix.cli import main
from extmatrix.report import CellReport, summary_rows

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "extensions" / "plain-c"
CELL = "py3.11-torch2.13-cpu"
MATRIX = """\
extension:
  path: ext
  name: plain-c
  import: plain_c
  abi3: false
axes:
  torch: ["2.13"]
  flavor: [cpu, rocm7.2]
  python: ["3.11"]
flavors:
  cpu: {}
  rocm7.2: {archs: [gfx942]}
subsets:
  local: [py3.11-torch2.13-cpu, py3.11-torch2.13-rocm7.2]
"""
# A build step that takes long enough to be interrupted, with a child of its own that must
# not outlive the interruption.
SLOW_SETUP = """\
import os, subprocess, pathlib
from setuptools import Extension, setup
child = subprocess.Popen(["sleep", "300"])
pathlib.Path(os.environ["PLAIN_C_STARTED"]).write_text(str(child.pid))
child.wait()
setup(ext_modules=[Extension("plain_c._native", ["src/native.c"])])
"""

pytestmark = pytest.mark.cells


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """One cell environment for the whole module: faults are about results, not installs."""
    return tmp_path_factory.mktemp("work")


@pytest.fixture
def project(tmp_path, work, monkeypatch) -> Path:
    shutil.copytree(FIXTURE, tmp_path / "ext")
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    monkeypatch.setenv("EXTMATRIX_WORK", str(work))
    monkeypatch.delenv("CI", raising=False)
    return tmp_path


def cli(project: Path, *args: str) -> list[str]:
    return ["--matrix", str(project / "matrix.yaml"), "--dist", str(project / "dist"), *args]


def build(project: Path, *args: str) -> int:
    return main(["build", *cli(project, "--cell", CELL, *args)])


def report(project: Path) -> CellReport:
    found = CellReport.read(project / "dist" / CELL / "report.json")
    assert found is not None
    return found


def wheels(project: Path) -> list[str]:
    return sorted(p.name for p in (project / "dist" / CELL).glob("*.whl"))


def assert_one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err, err
    return lines[-1]


@pytest.fixture
def good(project, capsys) -> str:
    assert build(project) == 0, capsys.readouterr().err
    (found,) = wheels(project)
    assert found.startswith("plain_c-1.0.0+pt213cpu-cp311-cp311-")
    capsys.readouterr()
    return found


def test_a_compile_error_keeps_the_good_wheel_and_says_the_compilers_line(project, good, capsys):
    assert main(["test-matrix", *cli(project, "--cell", CELL)]) == 0, capsys.readouterr().err
    tested = {name: (project / "dist" / CELL / name).read_bytes()
              for name in ("test.log", "junit.xml")}
    source = project / "ext" / "src" / "native.c"
    source.write_text(source.read_text() + "\n#error the kernel does not compile\n")
    assert build(project) == 1
    err = capsys.readouterr().err
    saved = report(project)
    assert saved.build == "failed"
    assert "native.c:" in saved.reason
    assert "error: #error the kernel does not compile" in saved.reason
    log = Path(saved.reason.rsplit("see ", 1)[1])
    assert log.is_file() and "the kernel does not compile" in log.read_text()
    assert "error: #error the kernel does not compile" in err  # the user sees the cause
    assert wheels(project) == [good]
    assert saved.kept["wheel"] == good and saved.kept["attempt"]
    kept = json.loads((project / "dist" / CELL / "last-good.json").read_text())
    assert kept["build"] == "built" and kept["wheel"] == good and kept["test"] == "passed"
    # The records its "passed" stands on stay with it.
    assert {name: (project / "dist" / CELL / name).read_bytes() for name in tested} == tested
    assert "Traceback" not in err


@pytest.mark.parametrize("sig, twice", [(signal.SIGINT, False), (signal.SIGTERM, False),
                                        (signal.SIGTERM, True),
                                        (signal.SIGHUP, False)])  # the ssh session dropped
def test_an_interrupted_compile_stops_its_children_and_keeps_the_good_wheel(project, good, sig,
                                                                            twice):
    (project / "ext" / "setup.py").write_text(SLOW_SETUP)
    started = project / "started"
    proc = subprocess.Popen(
        [sys.executable, "-m", "extmatrix.cli", "build", *cli(project, "--cell", CELL)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "PLAIN_C_STARTED": str(started)})
    deadline = time.monotonic() + 120
    while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert started.exists(), proc.communicate()[1]
    sent = time.monotonic()
    os.killpg(proc.pid, sig)  # what a terminal does: the whole foreground group
    if twice:  # `timeout` and CI runners: the process, then its group, milliseconds apart
        time.sleep(0.01)
        os.kill(proc.pid, sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert time.monotonic() - sent < 20
    line = assert_one_line(err)
    dist = project / "dist" / CELL
    assert line == (f"extmatrix: interrupted; recorded in {dist / 'report.json'} (log: "
                    f"{dist / 'build.log'}); earlier wheels kept for {CELL}")
    child = int(started.read_text())
    assert not Path(f"/proc/{child}").exists() or "State:\tZ" in Path(
        f"/proc/{child}/status").read_text()
    saved = report(project)
    assert saved.build == "interrupted" and saved.kept["wheel"] == good
    assert wheels(project) == [good]
    assert (project / "dist" / CELL / "build.log").is_file()


def test_ctrl_c_while_waiting_for_another_run_of_the_cell_stops_at_once_touching_nothing(
        project, good, work):
    from filelock import FileLock

    before = {p.name: p.read_bytes() for p in (project / "dist" / CELL).iterdir()}
    with FileLock(work / ".locks" / f"{CELL}.lock"):  # another extmatrix, building for hours
        proc = subprocess.Popen(
            [sys.executable, "-m", "extmatrix.cli", "build", *cli(project, "--cell", CELL)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        waiting = ""
        while "waiting for it to finish" not in waiting and proc.poll() is None:
            waiting += proc.stderr.readline()
        assert "another extmatrix is building or testing this cell" in waiting
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert time.monotonic() - sent < 5  # not when the other run ends
    assert proc.returncode == 130, err
    assert assert_one_line(err) == "extmatrix: interrupted; nothing recorded"
    assert {p.name: p.read_bytes() for p in (project / "dist" / CELL).iterdir()} == before


def test_interrupted_tests_are_recorded_where_the_line_says(project, good, capsys):
    assert main(["test-matrix", *cli(project, "--cell", CELL)]) == 0, capsys.readouterr().err
    assert report(project).test == "passed"
    last_good = project / "dist" / CELL / "last-good.json"
    assert json.loads(last_good.read_text())["test"] == "passed"  # what `index` publishes by
    started = project / "tests-started"
    (project / "ext" / "tests" / "test_slow.py").write_text(
        "import os, pathlib, time\n"
        "def test_slow():\n"
        f"    pathlib.Path({str(started)!r}).write_text('x')\n"
        "    time.sleep(300)\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "extmatrix.cli", "test-matrix", *cli(project, "--cell", CELL)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert started.exists(), proc.communicate()[1]
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    dist = project / "dist" / CELL
    assert assert_one_line(err) == (f"extmatrix: interrupted; recorded in {dist / 'report.json'}"
                                    f" (log: {dist / 'test.log'})")
    saved = report(project)  # not the passed run's: the log beside it is this run's
    assert saved.test == "failed" and saved.reason == "tests interrupted (Ctrl-C or SIGTERM)"
    assert "test_slow" in (dist / "test.log").read_text()
    assert json.loads(last_good.read_text())["test"] == "failed"  # not published as tested
    assert wheels(project) == [good] and saved.build == "built"


@pytest.mark.parametrize("reason, passes", [
    ("needs hypothesis", False),  # a test dependency missing: nothing was verified
    ("needs a CUDA device", True),  # the GPU job's to run, with --require-gpu
])
def test_a_run_whose_every_test_skipped_passes_only_for_want_of_a_gpu(project, good, capsys,
                                                                       reason, passes):
    (project / "ext" / "tests" / "test_plain_c.py").write_text(
        f"import pytest\n\npytestmark = pytest.mark.skip(reason={reason!r})\n\n\n"
        "def test_twice():\n    pass\n")
    status = main(["test-matrix", *cli(project, "--cell", CELL)])
    err = capsys.readouterr().err
    saved = report(project)
    if passes:
        assert status == 0 and saved.test == "passed", err
        assert saved.junit["gpu_skipped"] == 1
    else:
        assert status == 1 and saved.test == "failed"
        assert saved.reason.startswith("no test passed: all 1 skipped, 1 not for want of a GPU "
                                       "(the log lists why); see ")
        assert reason in Path(saved.reason.rsplit("see ", 1)[1]).read_text()


def test_a_file_where_the_cells_results_go_is_kept_and_named(project, capsys):
    (project / "dist").mkdir()
    (project / "dist" / CELL).write_text("my notes\n")
    assert build(project) == 2  # before any cell starts
    assert capsys.readouterr().err == (f"{project / 'dist' / CELL}: a file stands where the "
                                       "cell's results go; move it away and build again\n")
    assert (project / "dist" / CELL).read_text() == "my notes\n"


def test_two_builds_of_one_cell_at_once_both_end_cleanly(project, good):
    cmd = [sys.executable, "-m", "extmatrix.cli", "build", *cli(project, "--cell", CELL,
                                                                 "--rebuild")]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    for proc, (_, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
        assert "Traceback" not in err
    assert any("another extmatrix is building or testing this cell" in err for _, err in results)
    assert wheels(project) == [good]
    assert report(project).build == "built"
    assert list((project / "dist" / ".staging").iterdir()) == []


def test_a_damaged_environment_is_rebuilt(project, good, work, capsys):
    site = next((work / CELL / "build-env").glob("lib/python3*/site-packages"))
    (site / "torch" / "__init__.py").unlink()  # dist-info stays: a marker would trust it
    assert build(project, "--rebuild") == 0, capsys.readouterr().err
    log = (project / "dist" / CELL / "build.log").read_text()
    assert "recreating" in log and "torch/__init__.py" in log


def test_a_stale_wheel_is_never_reused_after_a_quick_edit(project, good, capsys):
    source = project / "ext" / "src" / "native.c"
    source.write_text(source.read_text().replace("2 * value", "3 * value"))
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns - stat.st_mtime_ns % 10**9))
    assert build(project) == 0
    assert not report(project).reused


def test_not_buildable_fails_only_where_the_cell_was_asked_for(project, capsys):
    named = main(["build", *cli(project, "--cell", "py3.11-torch2.13-rocm7.2")])
    err = capsys.readouterr().err
    assert named == 1 and "Traceback" not in err
    assert "py3.11-torch2.13-rocm7.2: not buildable here: ROCm 7.2 is not installed" in err
    assert main(["build", *cli(project, "-k", "*rocm*", "--no-strict")]) == 0
    err = capsys.readouterr().err
    assert "not-buildable: not buildable here: ROCm 7.2" in " ".join(err.split())


@contextlib.contextmanager
def small_disk(project: Path, size: str):
    """A tmpfs of `size` at project/small, unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    mount = project / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                       str(mount)]).returncode:
        pytest.skip("tmpfs cannot be mounted here")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_read_only_and_full_results_folders_are_one_line(project, capsys):
    with small_disk(project, "64k") as mount:
        with contextlib.suppress(OSError):
            (mount / "filler").write_bytes(b"\0" * 64 * 1024)  # up to the last block
        status = main(["build", "--matrix", str(project / "matrix.yaml"), "--dist",
                       str(mount / "dist"), "--cell", CELL])
        line = assert_one_line(capsys.readouterr().err)
        assert status == 2 and "No space left on device" in line and str(mount) in line
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        status = main(["build", "--matrix", str(project / "matrix.yaml"), "--dist",
                       str(mount / "dist"), "--cell", CELL])
        line = assert_one_line(capsys.readouterr().err)
        assert status == 2 and "Read-only file system" in line and "--dist" in line


def test_a_disk_that_fills_during_a_build_is_one_line_naming_the_attempts_log(project, capsys):
    with small_disk(project, "512k") as mount:
        args = ["build", "--matrix", str(project / "matrix.yaml"), "--dist", str(mount / "dist"),
                "--cell", CELL]
        assert main(args) == 0, capsys.readouterr().err
        dist = mount / "dist" / CELL
        before = {p.name: p.read_bytes() for p in dist.iterdir()}
        # Room for the start's write check (4 KB), not for a new attempt's wheel and report.
        free = shutil.disk_usage(mount).free - 8192
        (mount / "filler").write_bytes(b"\0" * free)
        capsys.readouterr()
        assert main([*args, "--rebuild"]) == 1
        err = capsys.readouterr().err
        assert "Traceback" not in err
        (line,) = [x for x in err.splitlines() if x.startswith(f"{CELL}: build could not")]
        assert "No space left on device" in line and f"could not be recorded in {dist}" in line
        assert line.endswith("free space there and build again")
        log = Path(line.split("its log is ", 1)[1].split(";", 1)[0])
        assert log.is_file() and log.read_text()
        assert {p.name: p.read_bytes() for p in dist.iterdir()} == before  # the good build's


def test_user_side_faults_are_one_line_with_exit_2(project, good, capsys):
    for jobs in ("0", "-1"):
        with pytest.raises(SystemExit) as stop:
            main(["build", *cli(project, "-j", jobs)])
        assert stop.value.code == 2
        assert "cells at a time; give 1 or more" in assert_one_line(capsys.readouterr().err)
    (project / "dist" / CELL / "report.json").write_text(json.dumps({"cell": 5}))
    assert main(["test-matrix", *cli(project, "--cell", CELL)]) == 1  # that cell only
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "report.json: damaged report: cell: Input should be a valid string; rebuild the " \
           "cell" in " ".join(err.split())
    (project / "ext" / "src" / "gone.h").symlink_to("nowhere.h")
    assert build(project) == 2
    line = assert_one_line(capsys.readouterr().err)
    assert "gone.h: dangling symlink (-> nowhere.h)" in line


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a machine without a GPU")
@pytest.mark.parametrize("require_gpu", [False, True])
def test_the_gpu_gate_holds_for_the_extensions_own_test_command(project, good, capsys,
                                                                require_gpu):
    # A command of the extension's own runs no plugin of the engine's: --require-gpu on a
    # machine without a GPU must still fail, not pass on the command's exit status.
    matrix = project / "matrix.yaml"
    matrix.write_text(MATRIX.replace("  abi3: false\n", "  abi3: false\n  test_command: "
                                     "['{python}', '-c', 'import plain_c']\n"))
    status = main(["test-matrix", *cli(project, "--cell", CELL),
                   *(["--require-gpu"] if require_gpu else [])])
    err = capsys.readouterr().err
    saved = report(project)
    if not require_gpu:
        assert status == 0 and saved.test == "passed", err
        return
    assert status == 1 and saved.test == "failed"
    said, log = saved.reason.rsplit("; see ", 1)
    assert said == "--require-gpu, but torch sees no GPU on this machine"
    assert "torch.cuda.is_available()" in Path(log).read_text()
    assert "Traceback" not in err


def test_an_unreadable_record_of_the_last_good_build_stops_before_anything_is_touched(
        project, good, capsys):
    source = project / "ext" / "src" / "native.c"
    source.write_text(source.read_text() + "\n#error the kernel does not compile\n")
    assert build(project) == 1  # a failed build: the good wheel stays, with its record
    record = project / "dist" / CELL / "last-good.json"
    record.write_text("{garbage")
    before = sorted(p.name for p in record.parent.iterdir())
    capsys.readouterr()
    assert build(project) == 2  # one line before any cell starts
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"{record}: the record of the cell's last good build cannot be read "
                           "(not JSON: ")
    assert line.endswith("restore it, or move the cell's folder away to start the cell afresh")
    assert sorted(p.name for p in record.parent.iterdir()) == before
    assert wheels(project) == [good] and record.read_text() == "{garbage"


def test_a_wheel_whose_records_were_deleted_outlives_a_failed_build(project, good):
    (project / "dist" / CELL / "last-good.json").unlink()
    (project / "dist" / CELL / "report.json").unlink()
    source = project / "ext" / "src" / "native.c"
    source.write_text(source.read_text() + "\n#error the kernel does not compile\n")
    assert build(project) == 1
    assert report(project).build == "failed"
    assert wheels(project) == [good]


def test_the_tests_take_the_wheel_the_record_names_among_those_kept(project, good, capsys):
    # A failed build keeps every wheel (an older release's too): the tests and the cross
    # check take the last good build's, not "the one wheel" of the folder.
    folder = project / "dist" / CELL
    shutil.copy(folder / good, folder / good.replace("1.0.0+", "0.9.0+"))
    assert main(["test-matrix", *cli(project, "--cell", CELL)]) == 0, capsys.readouterr().err
    assert report(project).test == "passed"
    installed = (folder / "test.log").read_text()
    assert (folder / good).as_uri() in installed and "0.9.0" not in installed


def test_a_wheel_tagged_abi3_whose_binary_is_not_is_refused_by_the_local_build(project, capsys):
    # Tagged cp39-abi3, built without Py_LIMITED_API and calling outside the limited API: it
    # would install on every Python and fail to load on most.
    (project / "ext" / "setup.py").write_text(
        "from setuptools import Extension, setup\n\n"
        "setup(ext_modules=[Extension('plain_c._native', ['src/native.c'], "
        "py_limited_api=True)], options={'bdist_wheel': {'py_limited_api': 'cp39'}})\n")
    source = project / "ext" / "src" / "native.c"
    source.write_text(source.read_text() + "\nint show(PyObject *o) { return PyObject_Print(o, "
                      "stdout, 0); }\n")
    (project / "matrix.yaml").write_text(
        MATRIX.replace("abi3: false", "abi3: true").replace(
            "local: [py3.11-torch2.13-cpu, py3.11-torch2.13-rocm7.2]", "local: [torch2.13-cpu]"))
    assert main(["build", *cli(project, "--cell", "torch2.13-cpu")]) == 1
    err = capsys.readouterr().err
    saved = CellReport.read(project / "dist" / "torch2.13-cpu" / "report.json")
    assert saved.build == "failed" and saved.reason.startswith("abi3audit failed (exit 1)")
    assert "PyObject_Print" in Path(saved.reason.rsplit("; see ", 1)[1]).read_text()
    assert not list((project / "dist" / "torch2.13-cpu").glob("*.whl"))
    assert "Traceback" not in err


ABI3_SETUP = ("from setuptools import Extension, setup\n\n"
              "setup(ext_modules=[Extension('plain_c._native', ['src/native.c'], "
              "py_limited_api=True)], options={'bdist_wheel': {'py_limited_api': 'cp39'}})\n")


def test_an_abi3_wheel_is_tested_under_each_python_installed_and_names_the_rest(
        project, capsys, monkeypatch):
    from extmatrix import envs

    (project / "ext" / "setup.py").write_text(ABI3_SETUP)
    (project / "matrix.yaml").write_text(
        MATRIX.replace("abi3: false", "abi3: true").replace('["3.11"]', '["3.11", "3.12"]')
        .replace("local: [py3.11-torch2.13-cpu, py3.11-torch2.13-rocm7.2]",
                 "local: [torch2.13-cpu]"))
    here = os.path.realpath(sys.executable)
    cell = ["--cell", "torch2.13-cpu"]
    assert main(["build", *cli(project, *cell)]) == 0, capsys.readouterr().err
    dist = project / "dist" / "torch2.13-cpu"

    monkeypatch.setattr(envs, "installed_pythons", lambda c, first_only=False: [("3.11", here)])
    # --strict (CI's default): a wheel that goes out to a Python it was never imported
    # under fails. A cell merely named (a laptop reproducing it) reports the Python.
    assert main(["test-matrix", *cli(project, *cell), "--strict"]) == 1
    assert ("torch2.13-cpu: not tested under Python 3.12, which the wheel serves: not installed "
            "here; install them where the tests run") in capsys.readouterr().err
    assert main(["test-matrix", *cli(project, *cell)]) == 0, capsys.readouterr().err
    alone = CellReport.read(dist / "report.json")
    assert alone.pythons == {"3.11": "passed", "3.12": "not installed here"}
    (row, _), = summary_rows([alone])
    assert row[2].endswith("; on Python 3.11 (3.12 not installed here)"), row[2]

    # A second Python found (this interpreter again, standing in for 3.12): its own env.
    monkeypatch.setattr(envs, "installed_pythons",
                        lambda c, first_only=False: [("3.11", here), ("3.12", here)])
    assert main(["test-matrix", *cli(project, *cell)]) == 0, capsys.readouterr().err
    both = CellReport.read(dist / "report.json")
    assert both.pythons == {"3.11": "passed", "3.12": "passed"}
    assert both.junit["passed"] == 2 * alone.junit["passed"] > 0
    assert (dist / "junit-py3.12.xml").is_file()
    assert sum("test-env" in c and "uv venv" in c for c in both.commands) == 2
