"""YAML merge keys (`<<: *anchor`) as YAML defines them: the mapping's own keys override
merged ones, and of several merged maps the earlier wins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from extmatrix import source
from extmatrix.cli import main
from extmatrix.errors import UserError

MATRIX = """\
extension: {name: demo, import: demo}
defaults:
  cuda: &common {index: "https://download.pytorch.org/whl/{flavor}", archs: ["9.0"]}
axes:
  torch: ["2.14"]
  flavor: [cu130]
  python: ["3.12"]
flavors:
  cu130:
    <<: *common
"""
MIRROR = '    index: "https://mirror.example.com/whl/{flavor}"\n'


@pytest.fixture
def write(tmp_path, monkeypatch):
    """Writes a matrix beside an extension; returns its name."""
    (tmp_path / "ext" / "tests").mkdir(parents=True)
    (tmp_path / "ext" / "pyproject.toml").write_text("[project]\nname='demo'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EXTMATRIX_MATRIX", raising=False)

    def write(text: str) -> str:
        Path("extmatrix.yaml").write_text(text)
        return "extmatrix.yaml"

    return write


def plan_json(matrix: str, capsys) -> list[dict]:
    assert main(["plan", "--matrix", matrix, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)["include"]


def plan_error(matrix: str, capsys) -> str:
    assert main(["plan", "--matrix", matrix]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    return err.strip()


def test_a_key_written_after_a_merge_overrides_the_merged_value(write, capsys):
    (cell,) = plan_json(write(MATRIX + MIRROR), capsys)
    assert cell["index"] == "https://mirror.example.com/whl/cu130"
    assert cell["archs"] == ["9.0"]  # merged, not overridden


def test_the_override_may_come_before_the_merge(write, capsys):
    matrix = MATRIX.replace("    <<: *common\n", MIRROR + "    <<: *common\n")
    (cell,) = plan_json(write(matrix), capsys)
    assert cell["index"] == "https://mirror.example.com/whl/cu130"


def test_of_several_merged_maps_the_earlier_wins_and_own_keys_win_over_both():
    data = source.parse(
        "a: &a {x: a, y: a}\n"
        "b: &b {x: b, y: b, z: b}\n"
        "c:\n"
        "  <<: [*a, *b]\n"
        "  y: c\n",
        "m.yaml",
    ).data
    assert data["c"] == {"x": "a", "y": "c", "z": "b"}
    assert data["a"] == {"x": "a", "y": "a"} and data["b"] == {"x": "b", "y": "b", "z": "b"}


def test_merges_chain_through_anchors_that_merge():
    data = source.parse(
        "a: &a {x: a, y: a}\n"
        "b: &b {<<: *a, x: b}\n"
        "c: {<<: *b, z: c}\n",
        "m.yaml",
    ).data
    assert data["b"] == {"x": "b", "y": "a"}
    assert data["c"] == {"x": "b", "y": "a", "z": "c"}


def test_positions_are_where_each_value_was_written():
    parsed = source.parse(
        "a: &a {x: 1, y: 2}\n"
        "c:\n"
        "  <<: *a\n"
        "  x: 3\n",
        "m.yaml",
    )
    assert str(parsed.where(("c", "x"))) == "m.yaml:4:6"  # the override
    assert str(parsed.where(("c", "y"))) == "m.yaml:1:17"  # the merged value
    assert str(parsed.where(("c", "x"), key=True)) == "m.yaml:4:3"


def test_errors_in_an_override_point_at_the_override(write, capsys):
    matrix = write(MATRIX + '    archs: ["9.0", "6.0"]\n')
    assert plan_error(matrix, capsys).startswith(
        "extmatrix.yaml:11:20: CUDA 13.0 cannot target arch '6.0'")


def test_errors_in_a_merged_value_point_at_the_anchor(write, capsys):
    matrix = write(MATRIX.replace('archs: ["9.0"]', 'archs: ["6.0"]'))
    assert plan_error(matrix, capsys).startswith(
        "extmatrix.yaml:3:78: CUDA 13.0 cannot target arch '6.0'")


def test_a_key_written_twice_beside_a_merge_is_still_a_duplicate(write, capsys):
    matrix = write(MATRIX + MIRROR + MIRROR)
    assert plan_error(matrix, capsys) == (
        "extmatrix.yaml:12:5: duplicate key 'index'; keep only one of them")


@pytest.mark.parametrize(("text", "message"), [
    ("a: &a x\nb: {<<: *a}\n",
     "m.yaml:1:4: cannot merge: expected a mapping or list of mappings for merging, "
     "but found scalar"),
    ("a: &a {x: 1}\nb: {<<: [*a, 3]}\n",
     "m.yaml:2:14: cannot merge: expected a mapping for merging, but found scalar"),
    ("b: {<<: {x: 1, x: 2}}\n", "m.yaml:1:16: duplicate key 'x'; keep only one of them"),
    ("a: &a {<<: *a, x: 1}\n",
     "m.yaml:1:12: a mapping cannot merge itself; an alias must not contain itself"),
])
def test_bad_merges_are_one_line_errors(text, message):
    with pytest.raises(UserError) as caught:
        source.parse(text, "m.yaml")
    assert str(caught.value) == message


def test_merging_one_anchor_many_times_is_bounded():
    keys = ", ".join(f"k{i}: {i}" for i in range(1000))
    text = f"a: &a {{{keys}}}\nb: {{<<: [{', '.join(['*a'] * 100_000)}]}}\n"
    with pytest.raises(UserError) as caught:
        source.parse(text, "m.yaml")
    assert "aliases expand to too many values (over 100,000)" in str(caught.value)
