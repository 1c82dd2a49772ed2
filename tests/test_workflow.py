"""The GitHub Actions workflow: its actions are pinned, and it only calls what exists."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from extmatrix.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "wheels.yml"


def steps() -> list[dict]:
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    return [step for job in jobs.values() for step in job["steps"]]


def test_third_party_actions_are_pinned_by_commit():
    uses = [s["uses"] for s in steps() if "uses" in s]
    assert uses
    for ref in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", ref), f"{ref} is not pinned by SHA"


def test_run_steps_take_no_expressions():
    # ${{ }} inside `run:` is pasted into the shell unquoted: pass values through env.
    for step in steps():
        assert "${{" not in step.get("run", ""), step["run"]


def test_nox_sessions_and_commands_it_calls_exist():
    text = WORKFLOW.read_text()
    noxfile = (ROOT / "noxfile.py").read_text()
    for session in set(re.findall(r"nox -s ([\w-]+)", text)):
        assert re.search(rf"def {session.replace('-', '_')}\(", noxfile), session
    commands = build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001
    for command in set(re.findall(r"extmatrix (\w[\w-]*)", text)):
        assert command in commands, command
