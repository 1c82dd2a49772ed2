"""Rendering plans for people (rich tables) and for machines (JSON)."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pydantic import ConfigDict, TypeAdapter, ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .cells import Cell, Dropped
from .errors import UserError
from .steps import redact


def plan_json(cells: Iterable[Cell]) -> str:
    """The GitHub Actions form: {"include": [{"cell": ..., ...}, ...]}."""
    return matrix_json([c.to_json() for c in cells])


def matrix_json(entries: list[dict]) -> str:
    return json.dumps({"include": entries}, indent=2) + "\n"


def plan_table(cells: list[Cell], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("cell", "torch", "toolkit", "archs", "pythons", "wheel", "requires"):
        table.add_column(column, overflow="fold")
    for c in cells:
        archs = c.arch_list.replace(";", " ") or "-"
        toolkit = f"{c.family} {c.toolkit}" if c.toolkit else c.family
        pythons = _span(c.test_pythons)
        requires = ", ".join((c.requires_torch, *c.runtime_deps))
        wheel = f"+{c.local_version} {'abi3' if c.abi3 else 'cp' + c.python.replace('.', '')}"
        torch = f"{c.torch} → {c.serves[-1]}" if c.stable and c.serves else c.torch
        table.add_row(*_literal(c.id, torch, toolkit, archs, pythons, wheel, requires))
    return table


def dropped_table(dropped: list[Dropped]) -> Table:
    table = Table(title=f"{len(dropped)} combinations dropped", title_justify="left")
    table.add_column("combination")
    table.add_column("reason", overflow="fold")
    for d in dropped:
        table.add_row(*_literal(d.combo, d.reason))
    return table


def stable_table(cells: list[Cell]) -> Table:
    table = Table(title="stable-ABI wheels: built once, tested beside every torch they serve",
                  title_justify="left")
    for column in ("cell", "built against", "serves", "requires"):
        table.add_column(column, overflow="fold")
    for c in cells:
        table.add_row(*_literal(c.id, f"torch {c.torch} (TORCH_TARGET_VERSION={c.target_version})",
                                " ".join(c.serves), c.requires_torch))
    return table


def compile_counts(cells: list[Cell], dropped: list[Dropped]) -> str:
    """How many wheels the plan compiles, with and without its stable-ABI cells."""
    stable = [c for c in cells if c.stable]
    # A cell left for the Pythons a stable wheel cannot serve is still compiled.
    ids = {c.id for c in cells}
    served = [d for d in dropped if d.reason.startswith("served by the stable-ABI wheel")
              and d.cell not in ids]
    # Under replace: true a per-torch cell of a served torch is left only for Pythons the
    # stable wheel cannot serve (cells.expand): one that tests a Python it serves is kept
    # by replace: false.
    kept = [c for c in cells if not c.stable and any(
        s.flavor == c.flavor and s.platform == c.platform and c.torch in s.serves
        and set(c.test_pythons) & set(s.test_pythons) for s in stable)]
    without = len(cells) - len(stable) + len(served)  # groups with replace: true count too
    if kept:
        return (f"{len(cells)} compiles; {len(kept)} of them are per-torch wheels the stable-ABI "
                f"wheels also serve (replace: false): {len(cells) - len(kept)} with replace: true, "
                f"{without} without stable cells")
    return (f"{len(cells)} compiles; {without} without the stable-ABI cells ({len(stable)} "
            f"stable wheels stand in for {len(served)} per-torch wheels)")


def print_plan(cells: list[Cell], dropped: list[Dropped] | None, console: Console) -> None:
    console.print(plan_table(cells, f"{len(cells)} cells"))
    if dropped is not None:
        stable = [c for c in cells if c.stable]
        if stable:
            console.print(stable_table(stable))
            console.print(compile_counts(cells, dropped), highlight=False)
        console.print(dropped_table(dropped))


def _literal(*texts: str) -> list[str]:
    """Table cells shown as written: a requirement's extras (`pkg[cu13]`) or a reason
    quoting brackets are the user's text, not rich markup to apply or choke on."""
    return [escape(t) for t in texts]


def _span(pythons: tuple[str, ...]) -> str:
    """3.10 3.11 3.12 -> 3.10–3.12; gaps, and free-threaded builds (3.14t), are listed."""
    minors = [int(minor) if minor.isdigit() else None for p in pythons
              for minor in [p.split(".")[1]]]
    if len(minors) > 2 and minors == list(range(minors[0] or 0, (minors[-1] or 0) + 1)):
        return f"{pythons[0]}–{pythons[-1]}"
    return " ".join(pythons)


# A cross check that found another cell's torch but could not install the wheel beside it.
CROSS_NOT_MADE = "skipped: could not install the wheel"
NOT_INSTALLED = "not installed here"  # CellReport.pythons: a Python the wheel was not tested on


@dataclass
class ServedTorch:
    """A stable-ABI wheel's tests beside one torch release it promises to serve."""

    __pydantic_config__ = ConfigDict(strict=True, extra="ignore")

    torch: str  # the release, e.g. 2.12.1
    test: str = "not-tested"  # passed | failed | not-tested
    build: str | None = None  # what got installed: 2.12.1+cu130
    reason: str | None = None
    junit: dict[str, int] = field(default_factory=dict)


@dataclass
class CellReport:
    """What happened to one cell; saved as dist/<cell>/report.json."""

    # Read back strictly: a report edited by hand or by another tool is refused in one
    # line, not trusted into a traceback later.
    __pydantic_config__ = ConfigDict(strict=True, extra="ignore")

    cell: str
    backend: str
    build: str = "pending"  # built | failed | not-buildable | interrupted
    test: str = "not-run"  # passed | failed | not-run
    reason: str | None = None
    attempt: str | None = None  # which build attempt this is (workspace.new_attempt_id)
    finished: str | None = None
    # A build that made no good wheel keeps the last good one: {wheel, attempt, finished}.
    kept: dict[str, str | None] | None = None
    toolkit: str | None = None
    sources: list[str] = field(default_factory=list)
    wheel: str | None = None
    wheel_size: int | None = None
    version: str | None = None
    requires: list[str] = field(default_factory=list)
    stamped: list[str] = field(default_factory=list)  # what the engine wrote into the wheel
    sass: list[str] = field(default_factory=list)
    ptx: list[str] = field(default_factory=list)
    ccache: dict[str, int] = field(default_factory=dict)
    reused: bool = False  # inputs unchanged: the last build's wheel, checked again
    repair: dict = field(default_factory=dict)  # container builds: wheel tag, libraries left out
    timings: dict[str, float] = field(default_factory=dict)
    disk_free_gb: dict[str, float | None] = field(default_factory=dict)  # start, end
    junit: dict[str, int] = field(default_factory=dict)
    serves: list[ServedTorch] = field(default_factory=list)  # stable-ABI cells: one per torch
    # abi3 cells: the outcome under each Python the wheel serves (or "not installed here").
    pythons: dict[str, str] = field(default_factory=dict)
    cross_check: str | None = None
    commands: list[str] = field(default_factory=list)
    # How many of `commands` the build ran: each test run replaces the ones after them.
    build_commands: int | None = None

    @property
    def failed(self) -> bool:
        return (self.build in ("failed", "missing", "interrupted") or self.test == "failed"
                or (self.cross_check or "").startswith("FAILED"))

    def to_json(self) -> str:
        # Index URLs from pip configuration may carry credentials: never saved as given.
        return redact(json.dumps(asdict(self), indent=2)) + "\n"

    def write(self, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(self.to_json())
        tmp.replace(path)

    @classmethod
    def read(cls, path: Path) -> CellReport | None:
        """The report at `path`; None when there is none. A damaged one is a UserError."""
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(str(path), f"cannot read ({exc})", "rebuild the cell") from None
        try:
            return _READER.validate_json(text)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"]) or "the file"
            raise UserError(str(path), f"damaged report: {where}: {first['msg']}",
                            "rebuild the cell (extmatrix build --cell "
                            f"{path.parent.name})") from None


_READER = TypeAdapter(CellReport)


def _status(r: CellReport, strict: bool = False, complete: bool | None = None) -> str:
    if r.build == "built" and not r.failed:
        if strict and failure(r, strict, complete):  # ok on its own, failed by --strict
            untested = _untested_pythons(r) if complete is not False else []
            if any(s.test != "passed" for s in r.serves):
                why = "a torch it serves went untested"
            elif untested:
                why = f"Python {', '.join(untested)} it serves went untested (not installed here)"
            else:
                why = first_line(r.cross_check)
            return f"FAILED (--strict): {why}"
        return "ok"
    status = "FAILED" if r.failed else r.build
    reason = first_line(r.reason or r.cross_check)
    kept = f" (kept wheel of {r.kept.get('attempt')})" if r.kept else ""
    return f"{status}: {reason}{kept}" if reason else f"{status}{kept}"


def _tests(r: CellReport) -> str:
    if not r.junit:
        # A test_command that wrote no JUnit and printed no tally: its exit status alone.
        uncounted = " (exit status only: no JUnit, no tally)" if r.test == "passed" else ""
        return r.test + uncounted + _pythons(r)
    j = r.junit
    # Skips for want of a GPU said apart: on a GPU-less runner they are the tests the GPU
    # job must run, and "passed" with nothing run is no pass to trust.
    gpu = f" ({j['gpu_skipped']} need a GPU)" if j.get("gpu_skipped") else ""
    return f"{r.test}: {j.get('passed', 0)} passed, {j.get('skipped', 0)} skipped{gpu}" + (
        f", {_failed(j)} failed" if _failed(j) else "") + _pythons(r)


def _pythons(r: CellReport) -> str:
    """Under which Pythons an abi3 wheel was tested, and which it serves untested."""
    if not r.pythons:
        return ""
    ran = [p for p, outcome in r.pythons.items() if outcome != NOT_INSTALLED]
    missing = _untested_pythons(r)
    return f"; on Python {', '.join(ran)}" + (
        f" ({', '.join(missing)} not installed here)" if missing else "")


def _untested_pythons(r: CellReport) -> list[str]:
    return [p for p, outcome in r.pythons.items() if outcome == NOT_INSTALLED]


def _wheel(r: CellReport) -> str:
    if not r.wheel:
        return "-"
    size = f"{r.wheel_size / 1e6:.1f} MB" if r.wheel_size else ""
    archs = " ".join([*(f"sm{a}" for a in r.sass), *(f"ptx{a}" for a in r.ptx)])
    return f"{r.wheel} ({size}{'; ' + archs if archs else ''})"


def _times(r: CellReport) -> str:
    return " ".join(f"{k} {v:.0f}s" for k, v in r.timings.items())


def failure(r: CellReport, strict: bool, complete: bool | None = None) -> bool:
    """Failed, or not buildable where the cell had to be built (named, or --strict), or
    (--strict) a stable-ABI wheel left untested beside a torch it serves, or a cross check
    with a foreign torch at hand that could not be made; or (`complete`, by default as
    `strict`) an abi3 wheel left untested under a Python it serves. A run is strict for
    the cells it names, but complete only where asked (--strict, CI): a machine with one
    Python reproducing a cell need not have them all."""
    complete = strict if complete is None else complete
    return r.failed or (complete and bool(_untested_pythons(r))) or (
        strict and (r.build == "not-buildable"
                    or any(s.test != "passed" for s in r.serves)
                    or (r.cross_check or "").startswith(CROSS_NOT_MADE)))


def first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


def summary_rows(reports: list[CellReport], strict: bool = False,
                 complete: bool | None = None) -> list[tuple[list[str], bool]]:
    """One row per cell, then one per torch a stable-ABI cell was tested beside; each row
    with whether it failed."""
    rows = []
    for r in reports:
        cache = f"{r.ccache.get('hits', 0)}/{r.ccache.get('hits', 0) + r.ccache.get('misses', 0)}" \
            if r.ccache else "-"
        foreign = "-" if not r.cross_check else (
            "FAILED" if r.cross_check.startswith("FAILED") else
            "refused" if r.cross_check.startswith("ok") else
            "loads" if r.cross_check.startswith("loads") else "skipped")
        rows.append(([r.cell, _status(r, strict, complete), _tests(r), foreign, _wheel(r),
                      cache, _times(r)],
                     failure(r, strict, complete)))
        for served in r.serves:
            rows.append(([f"  beside torch {served.torch}", _served_status(served),
                          _served_tests(served), "", served.build or "-", "", ""],
                         served.test == "failed" or (strict and served.test != "passed")))
    return rows


def _served_status(served: ServedTorch) -> str:
    if served.test == "passed":
        return "ok"
    status = "FAILED" if served.test == "failed" else "not tested"
    return f"{status}: {first_line(served.reason)}" if served.reason else status


def _failed(junit: dict[str, int]) -> int:
    # A report edited by hand may hold one of the two counts alone.
    return junit.get("failures", 0) + junit.get("errors", 0)


def _served_tests(served: ServedTorch) -> str:
    j = served.junit
    if not j:
        return served.test
    return f"{served.test}: {j.get('passed', 0)} passed, {j.get('skipped', 0)} skipped" + (
        f", {_failed(j)} failed" if _failed(j) else "")


# "foreign torch": the wheel imported beside another cell's torch: refused cleanly, or loads.
SUMMARY_COLUMNS = ["cell", "status", "tests", "foreign torch", "wheel", "ccache hits", "timings"]


def summary_table(reports: list[CellReport], strict: bool = False,
                  complete: bool | None = None) -> Table:
    table = Table(title=f"{len(reports)} cells", title_justify="left")
    for column in SUMMARY_COLUMNS:
        table.add_column(column, overflow="fold")
    for row, failed in summary_rows(reports, strict, complete):
        table.add_row(*_literal(*row), style="red" if failed else None)
    return table


# The options of the run a repro command must repeat (repro_options).
_REPRO: ContextVar[tuple[str, ...]] = ContextVar("repro_options", default=())


@contextmanager
def repro_options(matrix: str | None, dist: str | None = None,
                  require_gpu: bool = False) -> Iterator[None]:
    """Within: the repro commands printed repeat the run's matrix, results folder and GPU
    requirement (the CLI sets them for its run): without --require-gpu, a cell that failed
    for want of a GPU passes its repro."""
    options = [*(["--matrix", matrix] if matrix is not None else []),
               *(["--dist", dist] if dist is not None else []),
               *(["--require-gpu"] if require_gpu else [])]
    token = _REPRO.set(tuple(options))
    try:
        yield
    finally:
        _REPRO.reset(token)


def repro_command(cell: str, backend: str) -> str:
    """What rebuilds and retests one cell, printing every command; the engine's own command,
    for a project of the maintainer's has no noxfile."""
    args = ["extmatrix", "repro", cell]
    if backend != "local":
        args += ["--backend", backend]
    return shlex.join([*args, *_REPRO.get()])


def why_failed(r: CellReport, strict: bool = False, complete: bool | None = None) -> str:
    """The one line that says why the cell counts as failed."""
    untested = [s for s in r.serves if s.test != "passed"]
    if strict and untested and not r.failed:
        s = untested[0]
        return f"beside torch {s.torch}: {_served_status(s)}"
    pythons = _untested_pythons(r)
    if (strict if complete is None else complete) and pythons and not r.failed:
        return (f"not tested under Python {', '.join(pythons)}, which the wheel serves: not "
                "installed here; install them where the tests run")
    return first_line(r.reason or r.cross_check) or r.build


def repro_lines(reports: list[CellReport], backend: str, strict: bool = False,
                complete: bool | None = None) -> list[str]:
    return [f"{r.cell}: {why_failed(r, strict, complete)}\n"
            f"    reproduce: {repro_command(r.cell, backend)}"
            for r in reports if failure(r, strict, complete)]


def summary_markdown(reports: list[CellReport], backend: str, strict: bool = False,
                     complete: bool | None = None) -> str:
    lines = ["| " + " | ".join(SUMMARY_COLUMNS) + " |",
             "|" + " --- |" * len(SUMMARY_COLUMNS)]
    for row, _ in summary_rows(reports, strict, complete):
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
    # A job summary is all most readers see: tests that could not run here are said in
    # words, not left to a count in a column.
    wanting = [(r.cell, (r.junit or {}).get("gpu_skipped", 0)) for r in reports]
    wanting = [(cell, n) for cell, n in wanting if n]
    if wanting:
        lines += ["", f"**GPU tests not run here: {sum(n for _, n in wanting)} test(s) of "
                  f"{', '.join(f'`{cell}`' for cell, _ in wanting)} need a GPU.** A flavor's "
                  "`gpu_runner` in the matrix runs them on a GPU machine (`test-matrix "
                  "--require-gpu`)."]
    failed = [r for r in reports if failure(r, strict, complete)]
    if failed:
        lines += ["", "Failed cells:", ""]
        lines += [f"- `{r.cell}`: `{repro_command(r.cell, backend)}`" for r in failed]
    return "\n".join(lines) + "\n"
