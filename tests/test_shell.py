"""`repro --shell` through a real pseudo-terminal, with a startup file that fights it.

The user's ~/.bashrc puts a pyenv-like shim folder first on PATH, as many developers'
do; inside the cell's shell `python` must still be the cell's, with its torch and the
built extension importable.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pexpect = pytest.importorskip("pexpect")

ROOT = Path(__file__).resolve().parent.parent
CELL = "py3.11-torch2.13-cpu"
MATRIX = """\
extension:
  path: ext
  name: plain-c
  import: plain_c
  abi3: false
axes:
  torch: ["2.13"]
  flavor: [cpu]
  python: ["3.11"]
flavors:
  cpu: {}
"""

pytestmark = pytest.mark.cells


def repro_shell(project: Path, env: dict[str, str]):
    """`extmatrix repro CELL --shell` of the project's matrix, in a pseudo-terminal."""
    return pexpect.spawn(sys.executable, ["-m", "extmatrix.cli", "repro", CELL, "--matrix",
                                          str(project / "matrix.yaml"), "--shell"],
                         env=env, cwd=str(project), encoding="utf-8", timeout=600,
                         dimensions=(40, 500))


@pytest.mark.parametrize("shell", ["bash", "sh-fallback"])
def test_the_cells_python_wins_over_the_users_startup_files(tmp_path, shell):
    shutil.copytree(ROOT / "tests" / "extensions" / "plain-c", tmp_path / "ext")
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    home = tmp_path / "home"
    shims = home / "shims"
    shims.mkdir(parents=True)
    for name in ("python", "python3"):
        (shims / name).write_text("#!/bin/sh\necho 'not the cell python'\nexit 1\n")
        (shims / name).chmod(0o755)
    (home / ".bashrc").write_text('export PATH="$HOME/shims:$PATH"\nalias ll="ls -l"\n')
    env = {**os.environ, "HOME": str(home), "TERM": "dumb",
           "SHELL": "/bin/bash" if shell == "bash" else "/bin/fish-not-installed",
           "EXTMATRIX_WORK": str(tmp_path / "work")}
    env.pop("CI", None)
    child = repro_shell(tmp_path, env)
    try:
        child.expect("entering its test environment")
        child.expect(r"installed there: torch 2\.13\.0\S* and plain_c-1\.0\.0\+pt213cpu")
        if shell != "bash":
            child.expect("is neither bash nor zsh: opening")
        child.expect(rf"\({CELL}\) ", timeout=60)
        child.sendline("python -c 'import torch, plain_c; print(\"CELL\", torch.__version__, "
                       "plain_c.twice(4))'")
        child.expect(r"CELL (\S+) 8", timeout=120)
        assert child.match.group(1).startswith("2.13.0")
        if shell == "bash":
            child.sendline("type ll")  # the user's own startup file did run
            child.expect("aliased to")
        child.sendline("exit")
        child.expect(pexpect.EOF, timeout=60)
    finally:
        child.close()
    assert child.exitstatus == 0


@pytest.mark.container
def test_the_container_shell_has_the_cells_torch_and_wheel(tmp_path):
    from extmatrix import engines, toolchain
    from extmatrix.errors import NotBuildable

    required = os.environ.get("EXTMATRIX_CONTAINER_ENGINES", "").split()
    try:
        engine = engines.detect(required[0] if required else None, ROOT, toolchain.cache_root())
    except NotBuildable as exc:
        if required:
            pytest.fail(f"container tests are required here: {exc}")
        pytest.skip(str(exc))
    env = {**os.environ, "TERM": "dumb", "EXTMATRIX_ENGINE": engine.name}
    env.pop("CI", None)
    cell = "torch2.13-cpu"
    matrix = str(ROOT / "matrix.yaml")
    # The cell's image, as CI makes it first (cached when an earlier test built it).
    images = pexpect.run(f"{sys.executable} -m extmatrix.cli images --matrix {matrix} "
                         f"--cell {cell} --engine {engine.name}", env=env, timeout=1200,
                         withexitstatus=True, encoding="utf-8")
    assert images[1] == 0, images[0][-2000:]
    child = pexpect.spawn(sys.executable, ["-m", "extmatrix.cli", "repro", cell, "--matrix",
                                           matrix, "--backend", "container", "--dist",
                                           str(tmp_path / "dist"), "--shell"],
                          env=env, cwd=str(tmp_path), encoding="utf-8", timeout=1200,
                          dimensions=(40, 500))
    try:
        child.expect(r"installing torch==2\.13\.0\+cpu and segment_ops-0\.1\.0\+pt213cpu-\S+ "
                     r"into Python")
        child.expect(rf"\({cell}\) ", timeout=600)
        child.sendline("python -c 'import torch, segment_ops; print(\"CELL\", torch.__version__)'")
        child.expect(r"CELL (\S+)", timeout=120)
        assert child.match.group(1) == "2.13.0+cpu"
        child.sendline("exit")
        child.expect(pexpect.EOF, timeout=60)
    finally:
        child.close()
    assert child.exitstatus == 0


def test_a_failed_cell_keeps_its_status_and_an_empty_environment_is_not_entered(tmp_path):
    # The test environment's install fails (a test requirement no index has): the shell must
    # enter the build environment, which holds torch, not the empty test one, and the exit
    # status is the cell's failure, not the shell's `exit 0`.
    shutil.copytree(ROOT / "tests" / "extensions" / "plain-c", tmp_path / "ext")
    (tmp_path / "matrix.yaml").write_text(
        MATRIX.replace("  abi3: false\n", "  abi3: false\n  test_requires: [no-such-pkg-zzq]\n"))
    env = {**os.environ, "HOME": str(tmp_path), "TERM": "dumb", "SHELL": "/bin/bash",
           "EXTMATRIX_WORK": str(tmp_path / "work")}
    env.pop("CI", None)
    child = repro_shell(tmp_path, env)
    try:
        child.expect("entering its build environment")
        child.expect(rf"\({CELL}\) ", timeout=60)
        child.sendline("python -c 'import torch; print(\"TORCH\", torch.__version__)'")
        child.expect(r"TORCH 2\.13\.0", timeout=120)
        child.sendline("exit 0")
        child.expect(pexpect.EOF, timeout=60)
    finally:
        child.close()
    assert child.exitstatus == 1


def test_no_shell_for_a_cell_this_machine_cannot_build(tmp_path):
    shutil.copytree(ROOT / "tests" / "extensions" / "plain-c", tmp_path / "ext")
    (tmp_path / "matrix.yaml").write_text(
        MATRIX.replace("flavor: [cpu]", "flavor: [cpu, rocm7.2]").replace(
            "  cpu: {}\n", "  cpu: {}\n  rocm7.2: {archs: [gfx942]}\n"))
    env = {**os.environ, "EXTMATRIX_WORK": str(tmp_path / "work")}
    env.pop("CI", None)
    run = subprocess.run([sys.executable, "-m", "extmatrix.cli", "repro",
                          "py3.11-torch2.13-rocm7.2", "--matrix", str(tmp_path / "matrix.yaml"),
                          "--shell"], env=env, cwd=tmp_path, capture_output=True, text=True,
                         stdin=subprocess.DEVNULL, timeout=600)
    assert run.returncode == 1, run.stderr
    assert "extmatrix: no shell: cell py3.11-torch2.13-rocm7.2 has no environment yet" in run.stderr
    assert "build it first" not in run.stderr and "Traceback" not in run.stderr
