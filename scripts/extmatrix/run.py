"""Running many cells: keep going past failures, optional parallelism, one summary."""

from __future__ import annotations

import errno
import os
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import ModuleType

from packaging.requirements import Requirement
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from . import envs, project, steps, toolchain, workspace
from .backends import Context, local, max_jobs, not_sources
from .cells import Cell, Plan, share_a_python
from .errors import Interrupted, UserError, describe_os_error
from .report import CellReport, failure, repro_lines, summary_markdown, summary_table

BACKENDS = ("local", "container")
# Signals that stop a run as Ctrl-C does (the CLI turns them into KeyboardInterrupt).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class _Console(Console):
    """rich's Console, whose reader going away (`| head`) is no failure of ours (rich's own
    exits 1): on stdout it ends the command quietly, as print() to a closed pipe does
    (main: 141); on stderr it silences the progress and the run goes on, its results
    landing in dist/ whoever watches."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        if not self.stderr:
            raise BrokenPipeError


def console(stderr: bool = True) -> Console:
    """Progress and summaries on stderr (plan's table on stdout); CI logs are no terminal,
    but they are wide."""
    out = _Console(stderr=stderr)
    return out if out.is_terminal else _Console(stderr=stderr, width=max(out.width, 160))


def backend(name: str) -> ModuleType:
    if name == "container":
        from .backends import container

        return container
    return local


def context(plan: Plan, *, dist: str | None, parallel: int, require_gpu: bool = False,
            echo=None, rebuild: bool = False, console: Console | None = None,
            writes_results: bool = True) -> Context:
    """Where a run works and writes; refuses up front what would fail every cell.
    `writes_results`: False for a command that writes no cell results (images), whose
    dist/ is then neither checked nor made."""
    root = Path(plan.source.file).resolve().parent
    work = Path(os.environ.get("EXTMATRIX_WORK") or root / ".extmatrix").resolve()
    out = Path(dist).resolve() if dist else root / "dist"
    if writes_results and work == out:
        # Cells' work folders would stand where their results go (dist/<cell>/).
        raise UserError(f"$EXTMATRIX_WORK {work}", f"is the results folder {out}",
                        "point $EXTMATRIX_WORK (or --dist) elsewhere")
    checked = [(out, "--dist")] if writes_results else []
    for folder, flag in [*checked, (work, "$EXTMATRIX_WORK")]:
        if folder.exists() and not folder.is_dir():
            raise UserError(f"{flag} {folder}", "is a file, not a folder",
                            f"point {flag} at a folder (it is made if missing)")
        try:
            workspace.check_writable(folder)
        except OSError as exc:
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
            raise UserError(None, f"cannot write to {folder}: {exc.strerror or exc}",
                            f"free space there or point {flag} at another folder" if full
                            else f"point {flag} at a writable folder") from None
    ctx = Context(plan.matrix, root, out, work, toolchain.cache_root(), max_jobs(parallel),
                  require_gpu, echo, rebuild, matrix_file=root / Path(plan.source.file).name)
    if console is not None:
        ctx = replace(ctx, say=lambda text: console.print(text, highlight=False, markup=False,
                                                          soft_wrap=True))
    # Each cell asks these again; asked here, a mistake is one line before any cell starts.
    local.compile_jobs(ctx)
    project.check_tree(ctx.ext_dir, not_sources(ctx))
    project.pyproject_data(ctx.ext_dir)
    envs.index_mode()
    return ctx


def each_cell(cells: list[Cell], work: Callable[[Cell], CellReport], verb: str, jobs: int,
              keep_going: bool, console: Console, dist: Path,
              record: Callable[[list[CellReport]], list[CellReport]]) -> list[CellReport]:
    """Run `work` on each cell, `jobs` at a time. Ctrl-C/SIGTERM stops every cell's
    commands, lets each end its attempt, hands the reports to `record` (which returns those
    now on disk), then raises Interrupted."""
    for cell in cells:  # a mistake in one cell's folder is one line before any cell starts
        workspace.check_results(dist / cell.id)
    reports: dict[str, CellReport] = {}
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    steps.reset_cancel()
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    running: dict = {}
    try:
        with Progress(*columns, console=console, transient=True) as progress:
            tasks = {c.id: progress.add_task(f"{verb} {c.id}", start=False) for c in cells}
            pending = list(cells)
            stop = False
            while pending or running:
                while pending and len(running) < max(1, jobs) and not stop:
                    cell = pending.pop(0)
                    progress.start_task(tasks[cell.id])
                    running[pool.submit(_guarded, work, cell, verb)] = cell
                if not running:
                    break
                done = next(as_completed(running))
                cell = running.pop(done)
                report = done.result()
                reports[cell.id] = report
                progress.remove_task(tasks[cell.id])
                mark = "[red]FAILED[/red]" if report.failed else (
                    "ok" if report.build == "built" else report.build)
                console.print(f"{verb} {cell.id}: {mark}")
                stop = stop or (report.failed and not keep_going)
    except KeyboardInterrupt:
        with _signals_absorbed():
            steps.cancel_all()
            for future, cell in running.items():
                reports[cell.id] = future.result()  # each ends its attempt, then returns
            pool.shutdown(cancel_futures=True)
            recorded = record([reports[c.id] for c in cells if c.id in reports])
        raise Interrupted(_interrupted_line(recorded, dist, LOGS[verb])) from None
    pool.shutdown()
    return [reports[c.id] for c in cells if c.id in reports]


LOGS = {"build": "build.log", "test": "test.log"}


@contextmanager
def _signals_absorbed() -> Iterator[None]:
    """A second Ctrl-C or SIGTERM while the cells end their attempts would cut their records
    short: `timeout` and CI runners signal the process and then its group, so a second one
    often follows within milliseconds. The stop is under way; they change nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kinds = (signal.SIGINT, *STOP_SIGNALS)
    previous = {kind: signal.getsignal(kind) for kind in kinds}
    for kind in kinds:
        signal.signal(kind, lambda *_: None)
    try:
        yield
    finally:
        for kind, handler in previous.items():
            signal.signal(kind, handler)


def _guarded(work: Callable[[Cell], CellReport], cell: Cell, verb: str) -> CellReport:
    """One cell's work; whatever escapes it becomes that cell's failure, not everyone's."""
    try:
        return work(cell)
    except (UserError, OSError) as exc:
        reason = describe_os_error(exc) if isinstance(exc, OSError) else str(exc)
    except Interrupted:
        reason = "interrupted"
    except Exception as exc:  # noqa: BLE001 - a bug of ours must not take the other cells down
        reason = f"internal error: {type(exc).__name__}: {exc}; {crash_log(exc)}"
    return CellReport(cell=cell.id, backend="?", build="failed" if verb == "build" else "built",
                      test="failed" if verb == "test" else "not-run",
                      reason=f"{verb} could not finish: {reason}")


def _interrupted_line(recorded: list[CellReport], dist: Path, log: str) -> str:
    """Where the stopped run left its records: paths that exist, one cell or several."""
    if len(recorded) == 1:
        cell = dist / recorded[0].cell
        where = f"; recorded in {cell / 'report.json'} (log: {cell / log})"
    elif recorded:
        where = (f"; recorded in {dist}/<cell>/report.json (log: <cell>/{log}) for "
                 + ", ".join(r.cell for r in recorded))
    else:
        where = "; nothing recorded"
    kept = [r.cell for r in recorded if r.kept]
    return (f"interrupted{where}" +
            (f"; earlier wheels kept for {', '.join(kept)}" if kept else ""))


def _published(reports: list[CellReport]) -> list[CellReport]:
    """A build's attempt is published whatever its outcome (backends.building); a report
    `_guarded` made up for work that broke before it began is on no disk."""
    return [r for r in reports if r.backend != "?"]


def crash_log(exc: BaseException) -> str:
    """Write the traceback of an internal error to a file; say where, in words."""
    import tempfile
    import traceback

    try:
        fd, path = tempfile.mkstemp(prefix="extmatrix-crash-", suffix=".log")
        with os.fdopen(fd, "w") as fh:
            fh.write("".join(traceback.format_exception(exc)))
        return f"traceback in {path}"
    except OSError:
        return "no crash log could be written"


def build(cells: list[Cell], ctx: Context, backend_name: str, jobs: int, keep_going: bool,
          console: Console) -> list[CellReport]:
    impl = backend(backend_name)
    # Mistakes every cell would make: one line first, exit 2, no cell started.
    project.build_requirements(ctx.ext_dir)
    if backend_name == "container":
        from . import engines

        engines.check_choice()
    return each_cell(cells, lambda c: impl.build(c, ctx), "build", jobs, keep_going, console,
                     ctx.dist, _published)


def test(cells: list[Cell], ctx: Context, backend_name: str, jobs: int, keep_going: bool,
         console: Console, known: list[Cell] | None = None) -> list[CellReport]:
    """Test each cell's wheel; then import it beside another torch. The other torch is a
    cell tested in this run, else (one cell, as in repro) any of `known` whose test
    environment an earlier run left."""
    impl = local  # wheels are tested the way users install them: in a plain environment

    def one(cell: Cell) -> CellReport:
        with workspace.claim(cell.id, ctx.dist, ctx.work, ctx.say):
            report = CellReport.read(ctx.dist / cell.id / "report.json")
            if report is None:
                return CellReport(cell=cell.id, backend=backend_name, build="missing",
                                  reason=f"no build result in {ctx.dist / cell.id}; "
                                  "run the build")
            if report.build != "built":
                return report
            report.test, report.cross_check = "not-run", None
            return impl.test(cell, ctx, report)

    def record(done: list[CellReport]) -> list[CellReport]:
        """The cells' test results on disk (stopped: without cross checks; the log and JUnit
        file beside each report are that run's already); those written."""
        written = []
        for report in (r for r in done if r.build == "built" and r.backend != "?"):
            try:
                with workspace.claim(report.cell, ctx.dist, ctx.work, ctx.say):
                    _save_tested(report, ctx.dist)
            except Interrupted:  # stopped while another run holds the cell: its record stands
                continue
            written.append(report)
        return written

    reports = each_cell(cells, one, "test", jobs, keep_going, console, ctx.dist, record)
    by_id = {c.id: c for c in cells}
    tested = [by_id[r.cell] for r in reports if r.test == "passed"]
    earlier = [c for c in known or [] if c.id not in by_id
               and envs.python_of(ctx.work / c.id / "test-env").exists()]
    for report in reports:
        if report.test != "passed":
            continue
        cell = by_id[report.cell]
        other = next((o for o in [*tested, *earlier] if foreign(cell, o)
                      and o.platform == cell.platform and share_a_python(cell, o)), None)
        report.cross_check = (impl.cross_check(cell, other, ctx, report.commands) if other else
                              "skipped: no test environment of a torch it does not serve; "
                              "test it together with a cell of such a torch")
    record(reports)
    return reports


def _save_tested(report: CellReport, dist: Path) -> None:
    """The cell's report, and the last good build's record too where these tests ran on
    its wheel: `index` publishes a wheel only once its tests passed."""
    final = dist / report.cell
    report.write(final / workspace.REPORT)
    good = workspace.last_good(final)
    if good is not None and good.get("attempt") == report.attempt:
        report.write(final / workspace.LAST_GOOD)


def foreign(cell: Cell, other: Cell) -> bool:
    """Is `other`'s torch one that `cell`'s wheel must refuse to load beside?"""
    if other.stable:  # its test environments are per release: none to borrow
        return False
    if cell.stable:
        return not Requirement(cell.requires_torch).specifier.contains(other.torch, True)
    return other.torch_series != cell.torch_series


def finish(reports: list[CellReport], backend_name: str, console: Console,
           strict: bool = False, complete: bool | None = None) -> int:
    """The summary; 1 when a cell failed, or (strict) could not be built here, or
    (complete, by default as strict) left a Python it serves untested."""
    console.print(summary_table(reports, strict, complete))
    for line in repro_lines(reports, backend_name, strict, complete):
        # Unwrapped, however long the paths: one line a log search finds whole.
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        try:
            with open(step_summary, "a", encoding="utf-8") as fh:
                fh.write(summary_markdown(reports, backend_name, strict, complete))
        except OSError as exc:
            console.print(f"cannot write the step summary: {describe_os_error(exc)}")
    return 1 if any(failure(r, strict, complete) for r in reports) else 0


def shell(cell: Cell, ctx: Context, backend_name: str) -> int:
    """Leave the user in the cell: its image, or its environment on this machine."""
    if backend_name == "container":
        return backend(backend_name).shell(cell, ctx)
    from . import shell as cell_shell

    return cell_shell.enter(cell, ctx)
