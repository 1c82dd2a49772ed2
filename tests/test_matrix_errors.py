"""Every broken matrix file yields exactly its one-line error and exit status 2."""

from __future__ import annotations

import os
import re
import signal
import time
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


def test_an_empty_matrix_path_is_named_as_one(capsys):
    assert main(["plan", "--matrix", ""]) == 2
    assert capsys.readouterr().err == ("--matrix: names no matrix file (an empty path); pass a "
                                       "matrix file with --matrix\n")


def test_missing_matrix_file(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "--matrix", "nope.yaml"]) == 2
    assert capsys.readouterr().err == (
        "nope.yaml: file not found; pass an existing matrix file with --matrix\n"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--subset", "nightly"], "unknown subset 'nightly'; subsets: pr, local, stable"),
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


def test_a_cell_the_plan_leaves_out_on_purpose_is_named_with_its_rule(capsys, monkeypatch):
    # Not "did you mean 'torch2.14-cu132'?": the cell exists in the axes, a rule removed it.
    monkeypatch.chdir(Path(__file__).parent.parent)
    assert main(["plan", "--cell", "torch2.14-cu126"]) == 2
    assert capsys.readouterr().err == (
        "extmatrix: cell 'torch2.14-cu126' is removed by exclude[0] (matrix.yaml:87:5); "
        "narrow the rule to build it\n")


LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n"
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
)


def _hostile(tmp_path: Path, kind: str) -> str:
    """A matrix file written to cost time, memory or a hang; returns what to pass."""
    path = tmp_path / f"{kind}.yaml"
    if kind == "fifo":
        os.mkfifo(path)  # nobody ever writes: opening it for reading would block
    elif kind == "directory":
        path.mkdir()
    elif kind == "dev-zero":
        return "/dev/zero"
    else:
        path.write_bytes({
            "laughs": LAUGHS.encode(),
            "self-alias": b"a: &a [x, *a]\n",
            "deep-flow": b"a: " + b"[" * 100_000 + b"]" * 100_000 + b"\n",
            "deep-block": "".join(" " * i + f"k{i}:\n" for i in range(600)).encode() + b"x\n",
            "huge": b"# padding\n" * 200_000,
            "nul": b"a: b\x00c\n",
            "latin-1": b"a: caf\xe9\n",
        }[kind])
    return str(path)


@pytest.mark.parametrize(("kind", "message"), [
    ("laughs", ":6:8: aliases expand to too many values (over 100,000)"),
    ("self-alias", ":1:11: aliases nest deeper than 64 levels"),
    ("deep-flow", ":1:67: the YAML nests deeper than 64 levels"),
    ("deep-block", ":65:65: the YAML nests deeper than 64 levels"),
    ("huge", ": file is larger than 1 MiB"),
    ("nul", ":1:5: character U+0000 is not allowed in YAML"),
    ("latin-1", ":1:7: not UTF-8 text (byte 0xe9)"),
    ("fifo", ": not a regular file (a FIFO); pass a matrix file"),
    ("directory", ": not a regular file (a directory); pass a matrix file"),
    ("dev-zero", ": not a regular file (a character device); pass a matrix file"),
])
def test_hostile_input_ends_quickly_in_one_line(kind, message, tmp_path, capsys):
    matrix = _hostile(tmp_path, kind)

    def too_slow(*_):
        raise TimeoutError(f"planning {kind} did not end")

    # A regression here would hang (a FIFO's open) rather than fail: bound it.
    previous = signal.signal(signal.SIGALRM, too_slow)
    signal.setitimer(signal.ITIMER_REAL, 10)
    start = time.perf_counter()
    try:
        status = main(["plan", "--matrix", matrix])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    elapsed = time.perf_counter() - start
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1 and err.startswith(matrix + message), err
    assert elapsed < 5


def test_a_subset_asked_of_a_matrix_without_subsets_says_so(tmp_path, capsys, monkeypatch):
    from extmatrix.cli import main

    (tmp_path / "ext" / "tests").mkdir(parents=True)
    (tmp_path / "ext" / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (tmp_path / "matrix.yaml").write_text(
        "extension: {path: ext, name: demo, import: demo}\naxes:\n  torch: ['2.14']\n"
        "  flavor: [cpu]\n  python: ['3.12']\nflavors:\n  cpu: {}\n")
    assert main(["plan", "--matrix", str(tmp_path / "matrix.yaml"), "--subset", "pr"]) == 2
    assert capsys.readouterr().err == ("extmatrix: unknown subset 'pr'; the matrix names none: "
                                       "add 'subsets:' to it\n")


def test_a_schema_output_that_cannot_be_written_is_a_usage_mistake(tmp_path, capsys):
    from extmatrix.cli import main

    target = tmp_path / "missing" / "x.json"
    assert main(["schema", "--output", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"--output {target}: cannot be written: ") and err.count("\n") == 1
