"""The job matrices of the GitHub Actions workflow, from the plan.

Each job that fans out takes its matrix from here (`extmatrix plan --json --for JOB`),
so matrix.yaml stays the one place that says what runs where:

- cells: every selected cell, built and tested on its `runner`;
- gpu:   the cells whose flavor names a `gpu_runner`, tested there with --require-gpu;
- cross: one pair of cells of different torch releases and a Python in common, whose
         wheels are each imported beside the other's torch (CPU cells first: they are the
         cheapest to install).
         Stable-ABI cells are left out: their own job tests them beside every torch
         they serve.
"""

from __future__ import annotations

from .cells import Cell, share_a_python
from .errors import UserError

JOBS = ("cells", "gpu", "cross")
# GitHub Actions refuses a job matrix of more jobs than this when the workflow starts.
MAX_JOBS = 256


def matrix(cells: list[Cell], job: str) -> list[dict]:
    jobs = _jobs(cells, job)
    if len(jobs) > MAX_JOBS:
        raise UserError(None, f"the {job} job would have {len(jobs)} entries, more than the "
                        f"{MAX_JOBS} GitHub Actions runs from one matrix",
                        "select fewer cells (--subset, -k) or make the extension abi3")
    return jobs


def _jobs(cells: list[Cell], job: str) -> list[dict]:
    if job == "gpu":
        return [_entry(c) for c in cells if c.gpu_runner]
    if job == "cross":
        ordered = sorted((c for c in cells if not c.stable),
                         key=lambda c: (c.family != "cpu", c.id))
        for first in ordered:
            other = next((c for c in ordered if c.torch_series != first.torch_series
                          and c.platform == first.platform and share_a_python(c, first)),
                         None)
            if other is not None:
                return [{"cells": f"{first.id} {other.id}", "runner": first.runner,
                         "first": first.id, "second": other.id,
                         "python_versions": python_versions([first, other])}]
        return []
    return [_entry(c) for c in cells]


def _entry(cell: Cell) -> dict:
    return {**cell.to_json(), "python_versions": python_versions([cell])}


def python_versions(cells: list[Cell]) -> str:
    """Every Python the cells' wheels are tested under, one a line, as actions/setup-python
    takes several: an abi3 wheel is tested under each Python it serves, and a runner with
    only the engine's Python would leave the others untested (which --strict fails)."""
    versions = [p for c in cells for p in (c.test_pythons if c.abi3 else (c.python,))]
    return "\n".join(dict.fromkeys(versions))

