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
    """One cell's command log. With `echo`, every command is printed before it runs.

    `shown_path` is where the log will be once the attempt is published: messages
    name that file, never the staging copy that is renamed away."""

    log_path: Path
    echo: TextIO | None = None
    shown_path: Path | None = None
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
            cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
        """Run `cmd` with `env` added to the environment; output goes to the log."""
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
        full_env = {**os.environ, **(env or {})}
        try:
            proc = subprocess.Popen(cmd, env=full_env, cwd=cwd, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            raise StepFailed(step, f"cannot run {cmd[0]}: {exc.strerror or exc}") from None
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
        if check and code != 0:
            cause = first_cause(self.output_since(start))
            raise StepFailed(step, f"{step} failed (exit {code}): "
                                   f"{cause or 'no error message'}; see {self.shown}")
        return subprocess.CompletedProcess(cmd, code)

    def _copy(self, pipe) -> None:
        with pipe:
            for raw in iter(pipe.readline, b""):
                self._log.write(redact(raw.decode("utf-8", errors="replace")))
        self._log.flush()

    def output_since(self, offset: int) -> str:
        self._log.flush()
        with self.log_path.open(encoding="utf-8", errors="replace") as fh:
            fh.seek(offset)
            return fh.read()


def _display(path: Path) -> str:
    """A path relative to where the user stands when it is below it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


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
    r"|note: This error originates|exit code: \d+", re.IGNORECASE)
_COMPILER = re.compile(r"(?:^|[\s:)])(?:fatal )?error(?: [A-Z]+\d+)?:\s*\S", re.IGNORECASE)
_PIP = re.compile(r"^(?:ERROR|error): \S")
_RESOLVER = re.compile(r"^\s*(?:╰─▶|×)\s*(?P<msg>.+)")
_CIBUILDWHEEL = re.compile(r"^cibuildwheel: error:\s*(?P<msg>.*)$")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Exit): .+")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def first_cause(output: str, limit: int = 300) -> str | None:
    """The line of a failed command's output that says what went wrong.

    The compiler's first error, else the resolver's or pip's own message, else the
    last exception a Python tool raised, else the last line printed."""
    lines = [_ANSI.sub("", raw).strip() for raw in output.splitlines()]
    lines = [line for line in lines if line and not line.startswith(("$ ", "# "))]
    meaningful = [line for line in lines if not _NOISE.search(line)]

    def pick(predicate) -> str | None:
        return next((line for line in meaningful if predicate(line)), None)

    found = pick(lambda line: _COMPILER.search(line) is not None and not _PIP.match(line))
    if found is None:
        resolver = [_RESOLVER.match(line) for line in meaningful]
        found = next((m["msg"] for m in reversed(resolver) if m and "╰─▶" in m.group(0)), None)
        found = found or next((m["msg"] for m in resolver if m), None)
    found = found or pick(lambda line: _PIP.match(line) is not None)
    if found is None:
        # cibuildwheel puts its reason on the line after "cibuildwheel: error:" at times,
        # and closes with advice ("or run cibuildwheel with ...") that is never the news.
        for at, line in enumerate(meaningful):
            if (said := _CIBUILDWHEEL.match(line)) is not None:
                found = said["msg"] or next(iter(meaningful[at + 1:at + 2]), None)
    if found is None:
        raised = [line for line in meaningful if _EXCEPTION.match(line)]
        found = raised[-1] if raised else None
    found = found or (meaningful or lines or [None])[-1]
    if found is None:
        return None
    found = redact(found)
    return found if len(found) <= limit else found[: limit - 1] + "…"
