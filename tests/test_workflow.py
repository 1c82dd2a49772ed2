"""The GitHub Actions workflows, simulated: for each event, which cells each job gets, and
whether every `matrix.*` it reads and every artifact it downloads will be there.

A field renamed in the plan JSON, an artifact renamed on upload but not on download, or a
job matrix the engine cannot produce fails here, not in a run on GitHub.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from extmatrix import workflow
from extmatrix.cells import plan_file
from extmatrix.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
WHEELS, RELEASE = WORKFLOWS / "wheels.yml", WORKFLOWS / "release.yml"
PLAN = plan_file(ROOT / "matrix.yaml")
EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads `on:` as true
    return data


def jobs(path: Path) -> dict[str, dict]:
    return load(path)["jobs"]


def steps(path: Path) -> list[dict]:
    return [s for job in jobs(path).values() for s in job.get("steps", [])]


# What the plan step does with each event (its shell, restated): the cells selected.
EVENTS = {
    "pull_request": {"subset": "pr"},
    "push to main": {},
    "tag (release.yml)": {},
    "schedule": {},
    "dispatch: local subset, cu13 cells": {"subset": "local", "glob": "*cu13*"},
}


def selected(event: str):
    how = EVENTS[event]
    return PLAN.select(how.get("subset"), None, [how["glob"]] if "glob" in how else None)


def with_gpu_runners(cells):
    """The cells, those of a GPU flavor given a GPU runner where the matrix names none: the
    gpu job's entries are the engine's own (workflow.matrix), never an empty list."""
    return [c if c.gpu_runner or c.family == "cpu" else dataclasses.replace(c, gpu_runner="gpu-x")
            for c in cells]


def job_matrix_source(job: dict) -> str | None:
    found = re.search(r"fromJSON\(needs\.plan\.outputs\.(\w+)\)",
                      str(job.get("strategy", {}).get("matrix", "")))
    return found[1] if found else None


def matrix_fields(job: dict) -> set[str]:
    """The matrix.* a job reads in its ${{ }} expressions."""
    found = set()
    for expr in EXPR.findall(yaml.safe_dump(job, width=10_000)):
        code = re.sub(r"'[^']*'", "''", expr)  # not inside string literals
        found |= set(re.findall(r"\bmatrix\.(\w+)", code))
    return found


def render(template: str, entry: dict) -> str:
    def value(match: re.Match) -> str:
        expr = match[1]
        assert expr.startswith("matrix."), f"unexpected expression {expr}"
        return str(entry[expr.split(".", 1)[1]])

    return EXPR.sub(value, template)


def test_plan_outputs_are_the_engines_job_matrices():
    plan_job = jobs(WHEELS)["plan"]
    assert set(plan_job["outputs"]) == set(workflow.JOBS)
    script = plan_job["steps"][-1]["run"]
    assert f"for job in {' '.join(workflow.JOBS)}; do" in script
    for name, job in jobs(WHEELS).items():
        source = job_matrix_source(job)
        if source is not None:
            assert source in workflow.JOBS, f"{name} reads a matrix the engine does not make"


@pytest.mark.parametrize("event", EVENTS)
def test_every_matrix_field_a_job_reads_is_in_its_plan(event):
    cells = selected(event)
    assert cells, f"{event} selects no cell"
    for name, job in jobs(WHEELS).items():
        source = job_matrix_source(job)
        if source is None:
            assert not matrix_fields(job), f"{name} reads matrix.* without a matrix"
            continue
        entries = workflow.matrix(with_gpu_runners(cells), source)
        assert entries, f"{event}: job {name} gets no entry to check"
        for field in matrix_fields(job):
            for entry in entries:
                assert field in entry, f"{event}: job {name} reads matrix.{field}"


ENGINE_PYTHON = re.search(r'^PYTHON = "(.+)"$', (ROOT / "noxfile.py").read_text(), re.M)[1]


@pytest.mark.parametrize("event", EVENTS)
def test_every_job_that_tests_wheels_installs_each_python_they_are_tested_under(event):
    # An abi3 wheel is tested under every Python it serves: with the engine's Python alone
    # on the runner, --strict fails the cell (and before it did, the wheel went out tested
    # under one Python of five).
    cells = with_gpu_runners(selected(event))
    by_id = {c.id: c for c in cells}
    for name in ("cell", "gpu", "cross-torch"):
        job = jobs(WHEELS)[name]
        (setup,) = [s for s in job["steps"] if "setup-python" in s.get("uses", "")]
        for entry in workflow.matrix(cells, job_matrix_source(job)):
            installed = render(setup["with"]["python-version"], entry).split()
            tested = {p for cell_id in (entry.get("cell"), entry.get("first"), entry.get("second"))
                      if cell_id for p in (by_id[cell_id].test_pythons if by_id[cell_id].abi3
                                           else (by_id[cell_id].python,))}
            assert tested and tested <= set(installed), (name, entry.get("cell"), installed)
            assert installed[-1] == ENGINE_PYTHON  # the default: nox and the engine run on it


@pytest.mark.parametrize("event", EVENTS)
def test_artifacts_downloaded_are_the_ones_uploaded(event):
    cells = selected(event)
    wheels = jobs(WHEELS)
    uploads = {}
    for entry in workflow.matrix(cells, "cells"):
        for step in wheels["cell"]["steps"]:
            if "upload-artifact" in step.get("uses", ""):
                uploads[render(step["with"]["name"], entry)] = render(step["with"]["path"], entry)
    assert set(uploads) == {c.id for c in cells}
    for cell_id, path in uploads.items():
        assert path.rstrip("/") == f"dist/{cell_id}"  # where the engine writes the cell
    for name in ("gpu", "cross-torch"):
        source = job_matrix_source(wheels[name])
        entries = workflow.matrix(with_gpu_runners(cells), source)
        assert entries, f"{event}: job {name} gets no entry to check"
        for entry in entries:
            for step in wheels[name]["steps"]:
                if "download-artifact" not in step.get("uses", ""):
                    continue
                artifact = render(step["with"]["name"], entry)
                assert artifact in uploads, f"{event}: {name} downloads {artifact}"
                assert render(step["with"]["path"], entry) == uploads[artifact]
    # release.yml downloads every artifact into dist/<name>/; the GPU results must not be
    # taken for cells of their own.
    publish = jobs(RELEASE)["publish"]
    download = next(s for s in publish["steps"] if "download-artifact" in s.get("uses", ""))
    assert "name" not in download["with"] and download["with"]["path"] == "dist/"
    assert not any(fnmatch.fnmatch(c.id, f"{gpu_results_prefix()}*") for c in cells)


def gpu_results_prefix() -> str:
    gpu_upload = next(s for s in jobs(WHEELS)["gpu"]["steps"]
                      if "upload-artifact" in s.get("uses", ""))
    return gpu_upload["with"]["name"].split("$", 1)[0]


def test_release_publishes_each_cell_with_its_gpu_jobs_results_and_fails_on_any_left_out(
        tmp_path):
    """The publish step's script, run on artifacts as download-artifact lays them out: the
    GPU job's folder of a cell replaces the CPU runner's (whose GPU tests all skipped, so
    the index would leave the cell out), and the index is strict."""
    script = next(s["run"] for s in jobs(RELEASE)["publish"]["steps"]
                  if "extmatrix index" in s.get("run", ""))
    prefix = gpu_results_prefix()
    dist = tmp_path / "dist"
    for folder, record in (("torch2.14-cpu", "cpu runner"), ("torch2.14-cu130", "cpu runner"),
                           (f"{prefix}torch2.14-cu130", "gpu runner")):
        (dist / folder).mkdir(parents=True)
        (dist / folder / "last-good.json").write_text(record)
    fake = tmp_path / "bin" / "extmatrix"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "$@" > "$CALLED"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}",
           "CALLED": str(tmp_path / "called")}
    subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=env, check=True)
    assert sorted(p.name for p in dist.iterdir()) == ["torch2.14-cpu", "torch2.14-cu130"]
    assert (dist / "torch2.14-cu130" / "last-good.json").read_text() == "gpu runner"
    assert (dist / "torch2.14-cpu" / "last-good.json").read_text() == "cpu runner"
    called = (tmp_path / "called").read_text().split()
    assert called[:2] == ["index", "--dist"] and "--strict" in called


def test_release_builds_every_cell_without_caches():
    release = load(RELEASE)
    assert release["on"] == {"push": {"tags": ["v*"]}}
    assert jobs(RELEASE)["wheels"] == {"name": "wheels", "uses": "./.github/workflows/wheels.yml",
                                       "with": {"cache": False}}
    wheels = load(WHEELS)
    assert "tags" not in wheels["on"]["push"]  # tags are release.yml's
    caches = [s for s in jobs(WHEELS)["cell"]["steps"] if "actions/cache" in s.get("uses", "")]
    assert caches
    for step in caches:
        test = EXPR.fullmatch(step["if"])
        assert test, step["if"]
        # A push, pull request or schedule has no inputs (null): caches on. A workflow_call
        # or dispatch: as the input says.
        on = {value: github_if(test[1], {"inputs.cache": value}) for value in (None, True, False)}
        assert on == {None: True, True: True, False: False}, step["if"]


def github_if(expression: str, values: dict) -> bool:
    """`A != B` or `A == B` as GitHub evaluates it: operands of different types are
    compared as numbers (null and false are 0, true 1, a string its number or NaN)."""
    left, op, right = re.fullmatch(r"(.+?)\s*(!=|==)\s*(.+)", expression).groups()
    equal = _loosely_equal(_operand(left, values), _operand(right, values))
    return equal if op == "==" else not equal


def _operand(text: str, values: dict):
    if text in values:
        return values[text]
    if call := re.fullmatch(r"toJSON\((.+)\)", text):
        return json.dumps(_operand(call[1], values))
    if quoted := re.fullmatch(r"'(.*)'", text):
        return quoted[1]
    return {"null": None, "true": True, "false": False}[text]


def _loosely_equal(a, b) -> bool:
    if type(a) is type(b):
        return a == b

    def number(value) -> float:
        if value is None or isinstance(value, bool):
            return float(bool(value))
        try:
            return float(value) if str(value).strip() else 0.0
        except ValueError:
            return math.nan

    return number(a) == number(b)


def test_the_old_cache_test_was_false_on_a_push():
    # What the caches were gated on: off on every push and pull request.
    assert github_if("inputs.cache != false", {"inputs.cache": None}) is False


def test_status_gates_on_every_job_and_gpu_absence_is_said():
    wheels = jobs(WHEELS)
    status = wheels["status"]
    assert status["if"] == "always()"
    assert set(status["needs"]) == set(wheels) - {"status"}
    assert "GPU tests not run: no selected cell has a GPU runner" in status["steps"][0]["run"]
    for name, job in wheels.items():
        assert "timeout-minutes" in job, f"{name} has no timeout"


PAIR = '{"include": [{"cells": "torch2.13-cpu torch2.14-cpu"}]}'


@pytest.mark.skipif(not (shutil.which("bash") and shutil.which("jq")), reason="needs bash, jq")
@pytest.mark.parametrize(("plan", "gpu_cells", "cross", "said"), [
    ("success", '{"include": []}', PAIR, ["GPU tests not run: no selected cell has a GPU runner"]),
    ("success", '{"include": [{"cell": "torch2.11-cu130"}]}', PAIR, []),
    ("success", '{"include": [{"cell": "torch2.11-cu130"}]}', '{"include": []}',
     ["Cross-torch check not run: no two selected cells of different torch releases share a "
      "Python"]),
    ("skipped", "", "", ["GPU tests not run: the plan job's result is skipped"]),
    ("failure", "", "", ["GPU tests not run: the plan job's result is failure"]),
])
def test_status_says_truly_which_checks_did_not_run(tmp_path, plan, gpu_cells, cross, said):
    step = jobs(WHEELS)["status"]["steps"][0]
    needs = {"checks": "failure" if plan == "skipped" else "success", "plan": plan,
             "cell": "success" if plan == "success" else "skipped", "gpu": "skipped",
             "cross-torch": "skipped"}
    env = {"PATH": os.environ["PATH"], "GITHUB_STEP_SUMMARY": str(tmp_path / "summary"),
           "RESULTS": json.dumps({job: {"result": r} for job, r in needs.items()}),
           "GPU_CELLS": gpu_cells, "CROSS_PAIRS": cross}
    # The step's env names no other variable, and the workflow's default shell is bash -eo pipefail.
    assert set(step["env"]) == {"RESULTS", "GPU_CELLS", "CROSS_PAIRS"}
    run = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
                         env=env, capture_output=True, text=True)
    assert run.returncode == (0 if plan == "success" else 1), run.stderr
    said_lines = [line for line in run.stdout.splitlines() if "not run" in line]
    assert said_lines == said
    if said:  # the run's page shows them too
        summary = (tmp_path / "summary").read_text().splitlines()
        assert [line for line in summary if "not run" in line] == said


def test_a_failing_engine_inside_a_pipe_fails_its_step():
    # GitHub runs `run:` with bash -e unless told `shell: bash` (-eo pipefail): the plan
    # step's `extmatrix plan ... | jq` would pass an engine error on as an empty matrix.
    for path in (WHEELS, RELEASE):
        data = load(path)
        piped = [s for s in steps(path) if re.search(r"extmatrix [^\n]*\|", s.get("run", ""))]
        if piped:
            assert data.get("defaults", {}).get("run", {}).get("shell") == "bash", path.name
            assert all(s.get("shell", "bash") == "bash" for s in piped)


def test_third_party_actions_are_pinned_by_commit():
    for path in (WHEELS, RELEASE):
        for step in steps(path):
            if "uses" in step:
                ref = step["uses"]
                assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref), f"{ref} unpinned"


def test_run_steps_take_no_expressions():
    # ${{ }} inside `run:` is pasted into the shell unquoted: pass values through env.
    for path in (WHEELS, RELEASE):
        for step in steps(path):
            assert "${{" not in step.get("run", ""), step["run"]


def test_nox_sessions_and_commands_it_calls_exist():
    noxfile = (ROOT / "noxfile.py").read_text()
    commands = build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001
    for path in (WHEELS, RELEASE):
        text = path.read_text()
        for session in set(re.findall(r"nox -s ([\w-]+)", text)):
            assert re.search(rf"def {session.replace('-', '_')}\(", noxfile), session
        for command in set(re.findall(r"extmatrix (\w[\w-]*)", text)):
            assert command in commands, command


def test_a_job_matrix_github_would_refuse_is_a_one_line_error(monkeypatch, capsys):
    cells = PLAN.select(None, None, None)
    monkeypatch.setattr(workflow, "MAX_JOBS", len(cells) - 1)
    assert main(["plan", "--json", "--matrix", str(ROOT / "matrix.yaml")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (f"extmatrix: the cells job would have {len(cells)} entries, more than the "
                   f"{len(cells) - 1} GitHub Actions runs from one matrix; select fewer cells "
                   "(--subset, -k) or make the extension abi3\n")


def test_the_cross_pair_shares_a_python(tmp_path):
    # Per-Python wheels: a cp310 wheel has no place beside a Python 3.12 torch; the check
    # would be skipped, and the job green.
    (tmp_path / "ext").mkdir()
    (tmp_path / "ext" / "pyproject.toml").write_text("[project]\nname = 'fastclip'\n")
    (tmp_path / "ext" / "tests").mkdir()
    (tmp_path / "matrix.yaml").write_text(
        "extension: {path: ext, name: fastclip, import: fastclip, abi3: false}\n"
        "axes:\n  torch: ['2.13', '2.14']\n  flavor: [cpu]\n  python: ['3.11', '3.12']\n"
        "flavors:\n  cpu: {}\n")
    plan = plan_file(tmp_path / "matrix.yaml")
    by_id = {c.id: c for c in plan.cells}
    apart = [by_id["py3.11-torch2.13-cpu"], by_id["py3.12-torch2.14-cpu"]]
    assert workflow.matrix(apart, "cross") == []
    shared = [*apart, by_id["py3.12-torch2.13-cpu"]]
    (pair,) = workflow.matrix(shared, "cross")
    assert {pair["first"], pair["second"]} == {"py3.12-torch2.13-cpu", "py3.12-torch2.14-cpu"}


def test_a_cross_check_that_could_not_be_made_fails_only_the_strict_run():
    from extmatrix.report import CROSS_NOT_MADE, CellReport, failure

    r = CellReport(cell="c", backend="local", build="built", test="passed",
                   cross_check=f"{CROSS_NOT_MADE} beside d's torch: no matching distribution")
    assert failure(r, strict=True) and not failure(r, strict=False)
    alone = CellReport(cell="c", backend="local", build="built", test="passed",
                       cross_check="skipped: no test environment of a torch it does not serve")
    assert not failure(alone, strict=True)
