"""Running a cell's commands: logged, timed, and printable as a reproduction recipe."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO


class StepFailed(Exception):
    def __init__(self, step: str, detail: str):
        self.step = step
        self.detail = detail
        super().__init__(f"{step}: {detail}")


@dataclass
class Steps:
    """One cell's command log. With `echo`, every command is printed before it runs."""

    log_path: Path
    echo: TextIO | None = None
    timings: dict[str, float] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("a", encoding="utf-8")

    def close(self) -> None:
        self._log.close()

    def note(self, text: str) -> None:
        self._log.write(f"# {text}\n")
        self._log.flush()
        if self.echo:
            print(f"# {text}", file=self.echo, flush=True)

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
        shown = " ".join(shlex.quote(c) for c in cmd)
        exports = " ".join(_export(k, v) for k, v in sorted((env or {}).items()))
        where = f"cd {shlex.quote(str(cwd))} && " if cwd else ""
        line = f"{where}{exports + ' ' if exports else ''}{shown}"
        self.commands.append(line)
        self._log.write(f"$ {line}\n")
        self._log.flush()
        if self.echo:
            print(f"$ {line}", file=self.echo, flush=True)
        full_env = {**os.environ, **(env or {})}
        result = subprocess.run(cmd, env=full_env, cwd=cwd, stdout=self._log,
                                stderr=subprocess.STDOUT, text=True)
        if check and result.returncode != 0:
            raise StepFailed(step, f"exit status {result.returncode}; see {self.log_path}"
                             f"\n{self.tail()}")
        return result

    def tail(self, lines: int = 15) -> str:
        self._log.flush()
        text = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join(text[-lines:])


def _export(key: str, value: str) -> str:
    """KEY=value for a shell line; a PATH extended from ours is shown as PREFIX:$PATH."""
    inherited = os.environ.get(key, "")
    if key == "PATH" and inherited and value.endswith(os.pathsep + inherited):
        prefix = value[: -len(inherited) - 1]
        return f'{key}="{prefix}{os.pathsep}$PATH"'
    return f"{key}={shlex.quote(value)}"
