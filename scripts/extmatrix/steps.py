"""Running a cell's commands: logged, timed, stoppable, and printable as a reproduction recipe.

Every command runs in its own process group, so that stopping a cell stops
everything under it (pip → ninja → nvcc, cibuildwheel → podman), and a Ctrl-C
typed at the terminal reaches only us: we decide how the children end, and
record the attempt before leaving.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from .errors import Interrupted, StepFailed

__all__ = ["Steps", "StepFailed", "cancel_all", "cancelled", "first_cause", "redact"]

_running: set[subprocess.Popen] = set()
_guard = threading.Lock()
_cancel = threading.Event()
# How long children get to clean up after SIGINT (cibuildwheel removes its container),
# then after SIGTERM, before SIGKILL.
GRACE = (10.0, 3.0)


def cancelled() -> bool:
    return _cancel.is_set()


def reset_cancel() -> None:
    _cancel.clear()


def cancel_all() -> None:
    """Stop every running command's process group: SIGINT, then SIGTERM, then SIGKILL."""
    _cancel.set()
    for sig, wait in ((signal.SIGINT, GRACE[0]), (signal.SIGTERM, GRACE[1]), (signal.SIGKILL, 0)):
        with _guard:
            alive = [p for p in _running if p.poll() is None]
        if not alive:
            return
        for proc in alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
        deadline = time.monotonic() + wait
        while wait and time.monotonic() < deadline and any(p.poll() is None for p in alive):
            time.sleep(0.05)


_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s'\"]+@")


def redact(text: str) -> str:
    """Hide user:password@ (or a token@) in URLs before text is logged or saved."""
    return _CREDENTIALS.sub(r"\g<scheme>***@", text)


@dataclass
class Steps:
    """One cell's command log. With `echo`, every command is printed before it runs; with
    `stream`, the commands' output is also shown as it comes (an image build's progress).

    `shown_path` is where the log will be once the attempt is published: messages
    name that file, never the staging copy that is renamed away."""

    log_path: Path
    echo: TextIO | None = None
    shown_path: Path | None = None
    stream: TextIO | None = None
    timings: dict[str, float] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("a", encoding="utf-8")

    @property
    def shown(self) -> str:
        return _display(self.shown_path or self.log_path)

    def close(self) -> None:
        self._log.close()

    def note(self, text: str) -> None:
        self._log.write(f"# {redact(text)}\n")
        self._log.flush()
        if self.echo:
            print(f"# {redact(text)}", file=self.echo, flush=True)

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = round(self.timings.get(name, 0.0) + time.perf_counter() - start, 2)

    def run(self, step: str, cmd: list[str], *, env: dict[str, str] | None = None,
            cwd: Path | None = None, check: bool = True,
            drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        """Run `cmd` with `env` added to the environment, less inherited variables whose
        names start with a prefix in `drop`; output goes to the log, and comes back as the
        result's `stdout` (stderr merged in, credentials taken out)."""
        if _cancel.is_set():
            raise Interrupted(step)
        shown = " ".join(shlex.quote(c) for c in cmd)
        exports = " ".join(_export(k, v) for k, v in sorted((env or {}).items()))
        where = f"cd {shlex.quote(str(cwd))} && " if cwd else ""
        line = redact(f"{where}{exports + ' ' if exports else ''}{shown}")
        self.commands.append(line)
        self._log.write(f"$ {line}\n")
        self._log.flush()
        start = self._log.tell()
        if self.echo:
            print(f"$ {line}", file=self.echo, flush=True)
        full_env = {**{k: v for k, v in os.environ.items() if not k.startswith(drop)},
                    **(env or {})}
        try:
            proc = subprocess.Popen(cmd, env=full_env, cwd=cwd, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            raise StepFailed(step, f"cannot run {cmd[0]}: {exc.strerror or exc}; see "
                                   f"{self.shown}") from None
        # Tools print their configuration (cibuildwheel: the whole environment, index
        # URLs included): the log gets their output with credentials taken out.
        copier = threading.Thread(target=self._copy, args=(proc.stdout,), daemon=True)
        copier.start()
        with _guard:
            _running.add(proc)
        try:
            code = proc.wait()
        except BaseException:
            # The main thread itself was interrupted while waiting: take the group down.
            _cancel.set()
            cancel_all()
            raise
        finally:
            with _guard:
                _running.discard(proc)
            # A daemon the command left behind may hold the pipe open: do not wait on it.
            copier.join(timeout=5)
        if _cancel.is_set():
            raise Interrupted(step)
        output = self.output_since(start)
        if check and code != 0:
            cause = first_cause(output, step=step)
            raise StepFailed(step, f"{step} failed (exit {code}): "
                                   f"{cause or 'no error message'}; see {self.shown}")
        return subprocess.CompletedProcess(cmd, code, stdout=output)

    def _copy(self, pipe) -> None:
        with pipe:
            for raw in iter(pipe.readline, b""):
                text = raw.decode("utf-8", errors="replace")
                self._log.write(redact(text))
                if self.stream is not None:
                    self.stream.write(text)
                    self.stream.flush()
        self._log.flush()

    def output_since(self, offset: int) -> str:
        self._log.flush()
        with self.log_path.open(encoding="utf-8", errors="replace") as fh:
            fh.seek(offset)
            return fh.read()


def _display(path: Path) -> str:
    """The log's absolute path: a message naming it is kept in the cell's report and shown
    again later, by commands run from other folders (test-matrix, repro, a CI summary)."""
    return os.path.abspath(path)


def _export(key: str, value: str) -> str:
    """KEY=value for a shell line; a PATH extended from ours is shown as PREFIX:$PATH."""
    inherited = os.environ.get(key, "")
    if key == "PATH" and inherited and value.endswith(os.pathsep + inherited):
        prefix = value[: -len(inherited) - 1]
        return f'{key}="{prefix}{os.pathsep}$PATH"'
    return f"{key}={shlex.quote(value)}"


# What build tools print around the real error, which is never the news.
_NOISE = re.compile(
    r"subprocess-exited-with-error|metadata-generation-failed|legacy-install-failure"
    r"|Failed (building|to build)|error: command '|ninja: build stopped"
    r"|CalledProcessError|ERROR: Command errored out|Error compiling objects for extension"
    r"|note: This error originates|exit code: \d+"
    # pip's frame around a failed build hook's own output, and gcc's echo of a failed link.
    r"|did not run successfully|Encountered error while|\[end of output\]|lines of output\]"
    r"|collect2: error: ld returned", re.IGNORECASE)
_COMPILER = re.compile(r"(?:^|[\s:)])(?:fatal )?error(?: [A-Z]+\d+)?:\s*\S", re.IGNORECASE)
# The linker's own line ("/usr/bin/ld: cannot find -lfoo", "undefined reference to `f'").
_LINKER = re.compile(r"(?:^|/)ld(?:\.\w+)?: (?!warning)\S|undefined reference to ")
_CMAKE = re.compile(r"^\s*CMake Error(?P<where> at \S+)?(?: \(\w+\))?:\s*(?P<msg>.*)$")
_PIP = re.compile(r"^(?:ERROR|error): \S")
_RESOLVER = re.compile(r"^\s*(?:╰─▶|×)\s*(?P<msg>.+)")
# uv 0.13 and later: "error: No solution found …", then why, indented: "  cause: Because …"
# (wrapped onto deeper lines); a chain of causes ends with the root one.
_UV_CAUSE = re.compile(r"^\s+(?:cause|Caused by):\s*(?P<msg>\S.*)")
_CIBUILDWHEEL = re.compile(r"^cibuildwheel: error:\s*(?P<msg>.*)$")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Exit): .+")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# pytest's closing tally ("2 failed, 1 passed in 0.08s"), the rule that opens a test's
# section ("____ test_x ____"), a short-summary line, and a traceback's "E   " line.
PYTEST_TALLY = re.compile(r"^=*\s*(?:(?:\d+ \w+|no tests ran)(?:, )?)+ in \d[\d.]*s\b")
_PYTEST_SECTION = re.compile(r"^_{3,} (?P<name>.+?) _{3,}$")
_PYTEST_SUMMARY = re.compile(r"^(?P<head>(?:FAILED|ERROR) \S.*?)(?: - (?P<msg>.+))?$")
_PYTEST_E = re.compile(r"^E\s+(?!\[\s*\d+%\]$)(?P<msg>\S.*)")  # not progress: "E   [100%]"


def first_cause(output: str, limit: int = 300, *, step: str | None = None) -> str | None:
    """The line of a failed command's output that says what went wrong.

    The compiler's first error, else the resolver's or pip's own message, else the
    last exception a Python tool raised, else the last line printed. Of pytest's output
    (the tests step, or output that closes with pytest's tally), what the first failing
    test raised: a traceback's source lines are no compiler's, nor any tool's, errors."""
    lines = [_ANSI.sub("", raw).strip() for raw in output.splitlines()]
    lines = [line for line in lines if line and not line.startswith(("$ ", "# "))]
    if not lines:
        return None
    if step == "tests" or any(PYTEST_TALLY.match(line) for line in lines):
        return _shorten(_pytest_cause(lines) or _last_exception(lines) or lines[-1], limit)
    meaningful = [line for line in lines if not _NOISE.search(line)]

    def pick(predicate) -> str | None:
        return next((line for line in meaningful if predicate(line)), None)

    found = pick(lambda line: _COMPILER.search(line) is not None and not _PIP.match(line))
    found = found or pick(lambda line: _LINKER.search(line) is not None) or _cmake_error(output)
    if found is None:
        resolver = [_RESOLVER.match(line) for line in meaningful]
        found = next((m["msg"] for m in reversed(resolver) if m and "╰─▶" in m.group(0)), None)
        found = found or _uv_cause(output)
        found = found or next((m["msg"] for m in resolver if m), None)
    found = found or pick(lambda line: _PIP.match(line) is not None)
    if found is None:
        # cibuildwheel puts its reason on the line after "cibuildwheel: error:" at times,
        # and closes with advice ("or run cibuildwheel with ...") that is never the news.
        for at, line in enumerate(meaningful):
            if (said := _CIBUILDWHEEL.match(line)) is not None:
                found = said["msg"] or next(iter(meaningful[at + 1:at + 2]), None)
    return _shorten(found or _last_exception(meaningful) or (meaningful or lines)[-1], limit)


def _cmake_error(output: str) -> str | None:
    """CMake's first error, with its message: the paragraph under "CMake Error at F:L (cmd):",
    joined into one line."""
    lines = [_ANSI.sub("", raw) for raw in output.splitlines()]
    for at, line in enumerate(lines):
        if (said := _CMAKE.match(line)) is None:
            continue
        words = [said["msg"].strip()] if said["msg"].strip() else []
        for more in lines[at + 1:]:
            if not more.strip():
                if words:
                    break
                continue
            words.append(more.strip())
        where = f" at {said['where'].removeprefix(' at ')}" if said["where"] else ""
        return f"CMake Error{where}: {' '.join(words)}"
    return None


def _shorten(found: str, limit: int) -> str:
    found = redact(found)
    return found if len(found) <= limit else found[: limit - 1] + "…"


def _last_exception(lines: list[str]) -> str | None:
    return next((line for line in reversed(lines) if _EXCEPTION.match(line)), None)


def _uv_cause(output: str) -> str | None:
    """uv's "error:" line with the root of the causes under it: what failed, then why."""
    error, cause = "", []
    depth = None  # inside an "error:" block: the indent of its latest cause
    for raw in output.splitlines():
        line = _ANSI.sub("", raw).rstrip()
        indent = len(line) - len(line.lstrip())
        if line.startswith("error: "):
            error, cause, depth = line[len("error: "):], [], 0
        elif depth is not None and (said := _UV_CAUSE.match(line)) is not None:
            cause, depth = [said["msg"]], indent
        elif depth and indent > depth:
            cause.append(line.strip())
        else:
            depth = None
    return f"{error}: {' '.join(cause)}" if cause else None


def _pytest_cause(lines: list[str]) -> str | None:
    """pytest's first FAILED/ERROR summary line, its message completed from the traceback
    where the summary cut it short; without one (-rs leaves them out), what the first
    failing test raised, named by its section ("test_x", "ERROR collecting t.py")."""
    shown: dict[str, list[str]] = {}  # section -> its "E" lines, in order
    section = ""
    for line in lines:
        if (rule := _PYTEST_SECTION.match(line)) is not None:
            section = rule["name"]
        elif (e := _PYTEST_E.match(line)) is not None:
            shown.setdefault(section, []).append(e["msg"])

    def raised(messages: list[str]) -> str:
        # "Exc: msg" over a section's other E lines (an assert's operands, a diff); of a
        # chain ("During handling ..."), the last: the one the test ended with.
        return next((m for m in reversed(messages) if _EXCEPTION.match(m)), messages[0])

    summary = next((m for line in lines if (m := _PYTEST_SUMMARY.match(line))), None)
    if summary is None:
        return next((f"{s}: {raised(m)}" if s else raised(m) for s, m in shown.items()), None)
    if summary["msg"] and not summary["msg"].endswith("..."):
        return summary.group(0)
    # A bare "ERROR t/test_x.py" is a collection error; the section names the file from the
    # rootdir ("ERROR collecting test_x.py"), the summary from where pytest was started.
    cut, test = (summary["msg"] or "").removesuffix("..."), summary["head"].rsplit("/", 1)[-1]
    full = next((m for s, messages in shown.items() for m in reversed(messages)
                 if m.startswith(cut) and (cut or s.endswith(test))), None)
    return f"{summary['head']} - {full}" if full else summary.group(0)
