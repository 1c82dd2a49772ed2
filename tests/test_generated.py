"""Generated output is pinned by golden files; checked-in generated files are fresh."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from extmatrix import schema
from extmatrix.cli import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("plan-all.json", []),
        ("plan-local.json", ["--subset", "local"]),
        ("plan-pr.json", ["--subset", "pr"]),
    ],
)
def test_plan_json(name, args, golden, capsys):
    assert main(["plan", "--matrix", str(ROOT / "matrix.yaml"), "--json", *args]) == 0
    golden(name, capsys.readouterr().out)


def test_plan_explain_table(golden, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")
    monkeypatch.chdir(ROOT)
    assert main(["plan", "--explain"]) == 0
    golden("plan-explain.txt", capsys.readouterr().out)


def test_checked_in_schema_is_fresh():
    assert (ROOT / "matrix.schema.json").read_text() == schema.render(), (
        "matrix.schema.json is stale: run 'nox -s schema'"
    )


def test_schema_check_command_detects_staleness(tmp_path, capsys):
    stale = tmp_path / "schema.json"
    stale.write_text("{}\n")
    assert main(["schema", "--check", "--output", str(stale)]) == 2
    assert "the JSON Schema is stale" in capsys.readouterr().err
    assert main(["schema", "--output", str(stale)]) == 0
    assert main(["schema", "--check", "--output", str(stale)]) == 0
    stale.write_bytes(b"\xff")  # not UTF-8: stale, not a crash
    assert main(["schema", "--check", "--output", str(stale)]) == 2
    capsys.readouterr()
    assert main(["schema", "--check", "--output", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"{tmp_path}: is a folder; pass --output the schema "
                                       "file\n")


def test_ext_benchmark_page_is_rendered_from_its_json(tmp_path):
    """ext/docs/benchmarks.md is what ext/benchmarks/render.py makes of the checked-in JSON."""
    docs = ROOT / "ext" / "docs"
    out = tmp_path / "benchmarks.md"
    subprocess.run([sys.executable, str(ROOT / "ext" / "benchmarks" / "render.py"),
                    str(docs / "benchmarks.json"), "--out", str(out)], check=True)
    assert out.read_text() == (docs / "benchmarks.md").read_text(), (
        "ext/docs/benchmarks.md is stale: rerun render.py on ext/docs/benchmarks.json")


def load_ext_sources():
    path = ROOT / "ext" / "benchmarks" / "sources.py"
    spec = importlib.util.spec_from_file_location("ext_benchmark_sources", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ext_benchmark_page_was_measured_on_this_code():
    """The page's JSON names the digest of the kernels and package it measured
    (bench.py records it); code changed since then needs a new run on the GPU."""
    recorded = json.loads((ROOT / "ext" / "docs" / "benchmarks.json").read_text())["header"]
    now = load_ext_sources().digest(ROOT / "ext")
    assert recorded.get("sources") == now, (
        f"ext/docs/benchmarks.json was measured on code with digest {recorded.get('sources')}, "
        f"ext/csrc and ext/src now digest to {now}: rerun ext/benchmarks/bench.py on the GPU "
        "and render.py (comments and layout do not count)"
    )


def test_ext_source_digest_ignores_comments_and_layout_but_not_code(tmp_path):
    sources = load_ext_sources()
    for folder in ("csrc", "src"):
        shutil.copytree(ROOT / "ext" / folder, tmp_path / folder)
    before = sources.digest(tmp_path)
    kernel = tmp_path / "csrc" / "cuda" / "segment_kernels.cuh"
    text = kernel.read_text()
    kernel.write_text("// a new first line\n" + text.replace(" = ", "=").replace("\n", "\n\n"))
    package = tmp_path / "src" / "segment_ops" / "ops.py"
    package.write_text(package.read_text() + "\n# a trailing comment\n")
    assert sources.digest(tmp_path) == before
    kernel.write_text(text.replace("kThreads = 256;", "kThreads = 128;"))
    assert sources.digest(tmp_path) != before


def test_ext_source_digest_spells_python_alike_on_every_version():
    """The GPU machine's Python is not the builder's: 3.12 splits an f-string into
    tokens 3.11 reads as one, and numbers token types differently, so the digest
    spells each token by what it is, and an f-string as written."""
    code = 'x = f"a {b!r:>{w}} {f\'{c}\'} # no comment"  # a comment\nif x:\n    pass\n'
    assert load_ext_sources().python_code(code).split("\n") == [
        "x", "=", 'f"a {b!r:>{w}} {f\'{c}\'} # no comment"', "<newline>",
        "if", "x", ":", "<newline>", "<indent>", "pass", "<newline>", "<dedent>",
    ]
