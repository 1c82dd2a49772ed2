"""Backends build and test cells; they share the layout of what they leave behind.

dist/<cell>/ holds the cell's wheel, report.json, logs and JUnit XML. It is
replaced in one rename, so a failed or interrupted cell never leaves half a
result, and never touches another cell's folder.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ..cells import Cell
from ..config import Matrix
from ..report import CellReport
from ..steps import StepFailed, Steps
from ..toolchain import NotBuildable


@dataclass(frozen=True)
class Context:
    matrix: Matrix
    root: Path  # folder of matrix.yaml
    dist: Path
    work: Path  # per-cell environments and build trees
    cache: Path  # shared across projects: toolkits, ccache, tools
    max_jobs: int
    require_gpu: bool = False
    echo: TextIO | None = None  # print each command (repro)
    rebuild: bool = False  # compile even when the inputs are unchanged

    @property
    def ext_dir(self) -> Path:
        return (self.root / self.matrix.extension.path).resolve()


def staging_dir(ctx: Context, cell: Cell) -> Path:
    staging = ctx.dist / f".{cell.id}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


@contextmanager
def building(ctx: Context, cell: Cell, backend: str) -> Iterator[tuple[CellReport, Path, Steps]]:
    """One cell's build: staged results, the outcome recorded whatever happens, then published.

    A cell that cannot be had here or whose step fails ends in its report, never in an
    exception that would stop the other cells."""
    report = CellReport(cell=cell.id, backend=backend)
    staging = staging_dir(ctx, cell)
    steps = Steps(staging / "build.log", echo=ctx.echo)
    try:
        yield report, staging, steps
        report.build = "built"
    except NotBuildable as exc:
        report.build, report.reason = "not-buildable", f"not buildable here: {exc}"
    except StepFailed as exc:
        report.build, report.reason = "failed", str(exc)
    finally:
        report.timings.update(steps.timings)
        report.commands = steps.commands
        steps.close()
        publish(ctx, cell, staging, report)


def publish(ctx: Context, cell: Cell, staging: Path, report: CellReport) -> None:
    """Swap the staged results in as dist/<cell>/."""
    report.write(staging / "report.json")
    final = ctx.dist / cell.id
    old = ctx.dist / f".{cell.id}.old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(staging, final)
    shutil.rmtree(old, ignore_errors=True)


def max_jobs(parallel_cells: int) -> int:
    """Compile jobs per cell: share the cores, and leave ~3 GB of memory per nvcc job."""
    cores = os.cpu_count() or 1
    mem_gb = _available_memory_gb()
    by_memory = max(1, int(mem_gb // 3)) if mem_gb else cores
    return max(1, min(cores, by_memory) // max(1, parallel_cells))


def _available_memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return None
