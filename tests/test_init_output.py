"""`extmatrix init --output` anywhere in a repository: the workflow lands where GitHub reads
it, and every path in what init writes leads where the engine looks."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from extmatrix import run
from extmatrix.cells import plan_file
from extmatrix.cli import main

EXTENSION = Path(__file__).resolve().parent / "extensions" / "classic-cuda"
SPEC = "extmatrix @ git+https://example.org/extmatrix@v1"
CELL = "py3.11-torch2.13-cpu"
EVENT_TEST = r"\$\{\{ github\.event_name == '(\w+)' && '(\w*)' \|\| '(\w*)' \}\}"


def init(*args: str) -> int:
    return main(["init", *args, "--torch", "2.13", "--python", "3.11", "--engine-spec", SPEC])


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git repository holding the extension in ext/, entered."""
    root = tmp_path / "repo"
    shutil.copytree(EXTENSION, root / "ext")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    monkeypatch.chdir(root)
    monkeypatch.setenv("EXTMATRIX_WORK", str(tmp_path / "work"))
    return root


def commands(workflow: Path, event: str = "push") -> list[list[str]]:
    """Every extmatrix command the workflow runs, split as the runner's bash splits it with
    the step's env, whose `event_name == 'X' && 'A' || 'B'` expressions are read for
    `event`."""
    steps = [s for job in yaml.safe_load(workflow.read_text())["jobs"].values()
             for s in job["steps"]]
    found = []
    for step in steps:
        env = {"PATH": os.environ["PATH"]}
        for name, value in step.get("env", {}).items():
            test = re.fullmatch(EVENT_TEST, value)
            env[name] = (test[2] if test[1] == event else test[3]) if test else value
        for line in step.get("run", "").splitlines():
            if line.strip().startswith("extmatrix "):
                split = subprocess.run(["bash", "-c", f'set -- {line}; printf "%s\\0" "$@"'],
                                       env=env, capture_output=True, text=True, check=True)
                found.append(split.stdout.split("\0")[:-1])
    return found


@pytest.mark.parametrize("cwd, args, matrix", [
    (".", ["ext"], "matrix.yaml"),
    (".", ["ext", "--output", "sub/matrix.yaml"], "sub/matrix.yaml"),  # sub/ is created
    (".", ["ext", "--output", "ci setup/deep/matrix.yaml"], "ci setup/deep/matrix.yaml"),
    ("sub", ["../ext"], "sub/matrix.yaml"),  # run from the folder, default output
])
def test_the_workflow_sits_at_the_repository_root_and_names_real_paths(
        repo, tmp_path, monkeypatch, capsys, cwd, args, matrix):
    (repo / cwd).mkdir(exist_ok=True)
    monkeypatch.chdir(repo / cwd)
    assert init(*args) == 0, capsys.readouterr().err
    workflow = repo / ".github" / "workflows" / "extmatrix.yml"
    assert list(repo.rglob("extmatrix.yml")) == [workflow]  # GitHub reads no other place
    capsys.readouterr()

    # Steps run at the repository's root: each --matrix must lead to the file init wrote.
    monkeypatch.chdir(repo)
    ran = commands(workflow)
    assert [argv[1] for argv in ran] == ["plan", "build", "test-matrix"]
    for argv in ran:
        assert argv[argv.index("--matrix") + 1] == matrix
    assert main(ran[0][1:]) == 0, capsys.readouterr().err  # the plan job, as CI runs it
    entries = json.loads(capsys.readouterr().out)["include"]
    assert CELL in [c["cell"] for c in entries]
    # Each cell job has every Python its wheel is tested under, then the engine's.
    steps = yaml.safe_load(workflow.read_text())["jobs"]["cell"]["steps"]
    (setup,) = [s for s in steps if s.get("uses", "").startswith("actions/setup-python@")]
    for entry in entries:
        wanted = entry["test_pythons"] if entry["abi3"] else [entry["python"]]
        installed = setup["with"]["python-version"].replace(
            "${{ matrix.python_versions }}", entry["python_versions"]).split()
        assert set(wanted) <= set(installed) and installed[-1] == "3.11", (entry, installed)
    # A pull request plans the pr subset the matrix names.
    pr = commands(workflow, "pull_request")[0]
    assert pr[pr.index("--subset") + 1] == "pr" and "--subset" not in ran[0]
    assert main(pr[1:]) == 0, capsys.readouterr().err
    assert [c["cell"] for c in json.loads(capsys.readouterr().out)["include"]] == [
        CELL, "py3.11-torch2.13-cu132"]

    # The artifact is the folder a build writes its results to.
    ctx = run.context(plan_file(matrix), dist=None, parallel=1)
    assert ctx.ext_dir == repo / "ext"
    steps = yaml.safe_load(workflow.read_text())["jobs"]["cell"]["steps"]
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@"))
    shipped = upload["with"]["path"].replace("${{ matrix.cell }}", CELL)
    assert (repo / shipped).resolve() == ctx.dist / CELL

    # The matrix plans from anywhere, named from there.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["plan", "--matrix", str(repo / matrix), "--json"]) == 0, capsys.readouterr().err
    monkeypatch.chdir((repo / matrix).parent)
    assert main(["plan", "--matrix", "matrix.yaml", "--json"]) == 0, capsys.readouterr().err


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_matrix_that_could_not_build_the_extension_is_refused(repo, tmp_path, monkeypatch,
                                                                capsys):
    """Cells copy the repository holding the matrix (the matrix's own folder when no git
    repository does): init refuses an extension outside it rather than write a matrix that
    `plan` would refuse."""
    plain = tmp_path / "plain"
    shutil.copytree(EXTENSION, plain / "ext")
    monkeypatch.chdir(plain)
    assert init("ext", "--output", "sub/matrix.yaml") == 2
    assert "'git init'" in one_line_error(capsys)
    assert not (plain / "sub").exists()

    monkeypatch.chdir(repo)
    assert init(str(plain / "ext")) == 2
    assert f"lies outside {repo}" in one_line_error(capsys)
    assert not (repo / "matrix.yaml").exists()


def test_an_output_that_names_no_file_to_write_is_a_one_line_error(repo, capsys):
    (repo / "sub").mkdir()
    assert init("ext", "--output", "sub") == 2
    assert one_line_error(capsys).startswith("sub: is a folder; name the matrix file, e.g. "
                                             "--output sub/matrix.yaml")
    assert init("ext", "--output", "ext/setup.py/matrix.yaml") == 2
    assert one_line_error(capsys).startswith("ext/setup.py: is a file")
    assert not (repo / ".github").exists()
