"""Every broken matrix file yields exactly its one-line error and exit status 2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from extmatrix.cli import main

BROKEN = Path(__file__).parent / "matrices" / "broken"
CASES = sorted(BROKEN.glob("*.yaml"))


def expected(path: Path) -> str:
    match = re.search(r"^# expect: (.*)$", path.read_text(), re.MULTILINE)
    assert match, f"{path.name} has no '# expect:' line"
    return f"{path.name}:{match.group(1)}"


def test_corpus_is_large_enough():
    assert len(CASES) >= 25


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_broken_matrix(path: Path, capsys, monkeypatch):
    monkeypatch.chdir(BROKEN)
    status = main(["plan", "--matrix", path.name])
    out, err = capsys.readouterr()
    assert status == 2
    assert out == ""
    assert err == expected(path) + "\n"
    assert "Traceback" not in err


def test_missing_matrix_file(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "--matrix", "nope.yaml"]) == 2
    assert capsys.readouterr().err == (
        "nope.yaml: file not found; pass an existing matrix file with --matrix\n"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--subset", "nightly"], "unknown subset 'nightly'; subsets: pr, local"),
        (["--subset", "loca"], "unknown subset 'loca'; did you mean 'local'?"),
        (["--cell", "torch2.11-cu13"],
         "unknown cell 'torch2.11-cu13'; did you mean 'torch2.11-cu130'?"),
        (["-k", "torch9*"],
         "no cell matches the given filters; run 'extmatrix plan' to list the cells"),
    ],
)
def test_bad_selection(args, message, capsys):
    matrix = str(Path(__file__).parent.parent / "matrix.yaml")
    assert main(["plan", "--matrix", matrix, *args]) == 2
    assert capsys.readouterr().err == f"extmatrix: {message}\n"
