"""Backends build and test cells; what both own lives here.

A build is one attempt on the cell's workspace (see `workspace`): staged, its
outcome recorded whatever happens, then published without ever losing the last
good wheel. Whatever goes wrong inside one cell ends in that cell's report, never
in an exception that would stop the other cells.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from .. import steps as steps_mod
from .. import toolchain, wheels, workspace
from ..cells import Cell
from ..config import Matrix
from ..errors import Interrupted, NotBuildable, StepFailed, UserError, describe_os_error
from ..report import CellReport
from ..steps import Steps


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
    say: Callable[[str], None] = field(default=workspace.say_on_stderr, compare=False)
    matrix_file: Path | None = None  # in `root`; no part of a cell's copy (not_sources)

    @property
    def ext_dir(self) -> Path:
        return (self.root / self.matrix.extension.path).resolve()


def not_sources(ctx: Context) -> list[Path]:
    """What a copy of the extension leaves out besides the build products (workspace.skipped):
    the engine's folders (workspace.engine_folders), and the matrix file and .github/ (GitHub's
    CI settings, the repository's where the extension is the repository), where they lie in
    the extension. No build reads those two, and in the copy the build cache's fingerprint
    would hash them: a comment or a torch added to the matrix would recompile every cell,
    whose own settings are in the fingerprint already."""
    return [*workspace.engine_folders(ctx.ext_dir, ctx.work, ctx.dist), ctx.ext_dir / ".github",
            *([ctx.matrix_file] if ctx.matrix_file else [])]


def copy_sources(ctx: Context, src: Path) -> None:
    """Bring the cell's copy of the extension, `src`, up to date with its sources."""
    workspace.sync_tree(ctx.ext_dir, src, not_sources(ctx))


@contextmanager
def building(ctx: Context, cell: Cell, backend: str) -> Iterator[tuple[CellReport, Path, Steps]]:
    """One cell's build attempt: (report, staging folder, command log)."""
    with workspace.claim(cell.id, ctx.dist, ctx.work, ctx.say):
        attempt = workspace.begin(cell.id, ctx.dist)
        report = CellReport(cell=cell.id, backend=backend, attempt=attempt.id)
        report.disk_free_gb["start"] = _free_gb(ctx.work)
        log = attempt.final / "build.log"
        steps = Steps(attempt.staging / "build.log", echo=ctx.echo, shown_path=log)
        try:
            yield report, attempt.staging, steps
            report.build = "built"
        except BaseException as exc:
            report.build, report.reason = _outcome(exc, steps)
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt in the main thread: recorded below, then on up
        finally:
            report.timings.update(steps.timings)
            report.commands = steps.commands
            report.build_commands = len(steps.commands)
            report.finished = workspace.now()
            report.disk_free_gb["end"] = _free_gb(ctx.work)
            steps.close()
            good = report.build == "built"
            kept = None if good else workspace.last_good(attempt.final)
            if kept is not None:
                report.kept = {k: kept.get(k) for k in ("wheel", "attempt", "finished")}
            try:
                workspace.publish(attempt, report.to_json(), good, kept)
            except OSError as exc:
                # dist/<cell>/ still holds the last record whole, so the one line must say
                # where this attempt's log is instead.
                full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
                raise UserError(None, f"its attempt could not be recorded in {attempt.final} "
                                f"({describe_os_error(exc)}); its log is "
                                f"{attempt.staging / 'build.log'}",
                                "free space there and build again" if full else
                                "make that folder writable (its owner, its permissions) and "
                                "build again") from None


def _free_gb(folder: Path) -> float | None:
    """Free space where cells build: CUDA/ROCm cells fill small CI disks."""
    try:
        return round(shutil.disk_usage(folder).free / 1e9, 1)
    except OSError:
        return None


def _outcome(exc: BaseException, steps: Steps) -> tuple[str, str]:
    if steps_mod.cancelled() or isinstance(exc, (Interrupted, KeyboardInterrupt)):
        return "interrupted", "interrupted (Ctrl-C or SIGTERM); the commands were stopped"
    if isinstance(exc, NotBuildable):
        return "not-buildable", f"not buildable here: {exc}"
    if isinstance(exc, StepFailed):
        return "failed", exc.detail
    if isinstance(exc, UserError):
        return "failed", str(exc)
    if isinstance(exc, OSError):
        return "failed", f"{describe_os_error(exc)}; see {steps.shown}"
    # A bug of ours: the whole story goes to the cell's log, one line to the user.
    steps.note("internal error:\n" + "".join(traceback.format_exception(exc)))
    return "failed", (f"internal error: {type(exc).__name__}: {exc}; traceback in {steps.shown}")


def stamp_wheel(cell: Cell, wheel: Path, report: CellReport, steps: Steps) -> Path:
    """The cell's label, torch pin and runtime deps, written into whatever the build made."""
    stamped, changes = wheels.stamp(wheel, cell)
    if changes:
        steps.note(f"stamped {stamped.name}: {'; '.join(changes)}")
    report.stamped = changes
    return stamped


def audit_abi3(cell: Cell, wheel: Path, steps: Steps) -> None:
    """abi3audit an abi3 cell's wheel, whichever backend built it: a wheel tagged abi3 whose
    binary calls beyond the limited API installs on every Python and breaks on most. A
    py3-none wheel has no Python ABI to audit: check_wheel looks for Python in its binaries
    instead."""
    # Tagged otherwise (cp312-cp312: a build that ignored the limited API), check_wheel says
    # what to change; abi3audit would only fail on the tag.
    if cell.abi3 and "-abi3-" in wheel.name:
        with steps.timed("abi3audit"):
            steps.run("abi3audit", [sys.executable, "-m", "abi3audit", "--strict", "--report",
                                    str(wheel)])


def check_wheel(cell: Cell, ctx: Context, wheel: Path, report: CellReport, staging: Path,
                venv: Path | None, found: Sequence[str] = ()) -> None:
    """Fail the cell unless the wheel holds what the cell promised (and the backend `found`
    nothing wrong with it); keep it in staging, a refused one in its rejected/ folder, away
    from the last good wheel carried forward."""
    facts = wheels.inspect(wheel, cell, toolchain.cuobjdump(ctx.cache, venv)
                           if cell.family == "cuda" else None)
    report.wheel, report.wheel_size, report.version = facts.name, facts.size, facts.version
    report.requires, report.sass, report.ptx = facts.requires, facts.sass, facts.ptx
    problems = ["the wheel " + "; ".join(facts.problems)] if facts.problems else []
    if problems or found:
        (staging / workspace.REJECTED).mkdir(exist_ok=True)
        shutil.copy2(wheel, staging / workspace.REJECTED / wheel.name)
        shown = ctx.dist / cell.id / workspace.REJECTED / wheel.name
        raise StepFailed("check", "; ".join([*problems, *found]) + f" (it is {shown})")
    shutil.copy2(wheel, staging / wheel.name)


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
