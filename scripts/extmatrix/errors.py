"""The one error type users see: a place in a file, what is wrong, what would be right."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Where:
    file: str
    line: int | None = None  # 1-based
    col: int | None = None  # 1-based

    def __str__(self) -> str:
        parts = [self.file]
        if self.line is not None:
            parts.append(str(self.line))
            if self.col is not None:
                parts.append(str(self.col))
        return ":".join(parts)


class UserError(Exception):
    """A mistake in the user's input. The CLI prints it on one line and exits 2."""

    def __init__(self, where: Where | str | None, problem: str, fix: str | None = None):
        self.where = where
        self.problem = problem
        self.fix = fix
        super().__init__(str(self))

    def __str__(self) -> str:
        text = self.problem if not self.fix else f"{self.problem}; {self.fix}"
        return f"{self.where}: {text}" if self.where else text


class NotBuildable(Exception):
    """This cell cannot be built on this machine; the message says why."""


class StepFailed(Exception):
    """A command of a cell's build or test failed; `detail` is the cause and the log to read."""

    def __init__(self, step: str, detail: str):
        self.step = step
        self.detail = detail
        super().__init__(f"{step}: {detail}")


class Interrupted(Exception):
    """Ctrl-C or SIGTERM: the running commands were stopped; the CLI exits 130."""


def describe_os_error(exc: OSError) -> str:
    """'PATH: cause' for a failed file operation, the way a person would say it."""
    cause = exc.strerror or exc.__class__.__name__
    paths = [p for p in (exc.filename, exc.filename2) if p]
    return f"{' -> '.join(map(str, paths))}: {cause}" if paths else cause
