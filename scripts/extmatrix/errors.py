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
