"""The GitHub Actions workflows, simulated: for each event, which cells each job gets, and
whether every `matrix.*` it reads and every artifact it downloads will be there.

A field renamed in the plan JSON, an artifact renamed on upload but not on download, or a
job matrix the engine cannot produce fails here, not in a run on GitHub.
"""

from __future__ import annotations

import fnmatch
import re
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
        # gpu: the cells would be those with a gpu_runner; their fields are every cell's.
        entries = (workflow.matrix(cells, source) if source != "gpu"
                   else [c.to_json() for c in cells])
        if not entries:
            continue
        for field in matrix_fields(job):
            for entry in entries:
                assert field in entry, f"{event}: job {name} reads matrix.{field}"


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
        entries = (workflow.matrix(cells, source) if source != "gpu"
                   else [c.to_json() for c in cells])
        for entry in entries:
            for step in wheels[name]["steps"]:
                if "download-artifact" not in step.get("uses", ""):
                    continue
                artifact = render(step["with"]["name"], entry)
                assert artifact in uploads, f"{event}: {name} downloads {artifact}"
                assert render(step["with"]["path"], entry) == uploads[artifact]
    # release.yml downloads every artifact into dist/<name>/ and drops the GPU results.
    publish = jobs(RELEASE)["publish"]
    download = next(s for s in publish["steps"] if "download-artifact" in s.get("uses", ""))
    assert "name" not in download["with"] and download["with"]["path"] == "dist/"
    gpu_upload = next(s for s in wheels["gpu"]["steps"] if "upload-artifact" in s.get("uses", ""))
    prefix = gpu_upload["with"]["name"].split("$", 1)[0]
    assert f"rm -rf dist/{prefix}*" in yaml.safe_dump(publish)
    assert not any(fnmatch.fnmatch(c.id, f"{prefix}*") for c in cells)


def test_release_builds_every_cell_without_caches():
    release = load(RELEASE)
    assert release["on"] == {"push": {"tags": ["v*"]}}
    assert jobs(RELEASE)["wheels"] == {"name": "wheels", "uses": "./.github/workflows/wheels.yml",
                                       "with": {"cache": False}}
    wheels = load(WHEELS)
    assert "tags" not in wheels["on"]["push"]  # tags are release.yml's
    for step in jobs(WHEELS)["cell"]["steps"]:
        if "actions/cache" in step.get("uses", ""):
            assert step["if"] == "${{ inputs.cache != false }}"


def test_status_gates_on_every_job_and_gpu_absence_is_said():
    wheels = jobs(WHEELS)
    status = wheels["status"]
    assert status["if"] == "always()"
    assert set(status["needs"]) == set(wheels) - {"status"}
    assert "GPU tests not run: no selected cell has a GPU runner" in status["steps"][0]["run"]
    for name, job in wheels.items():
        assert "timeout-minutes" in job, f"{name} has no timeout"


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
