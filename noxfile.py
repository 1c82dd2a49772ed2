"""Front doors. Each session is a few lines: the work lives in the extmatrix engine."""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["tests"]

PYTHON = "3.11"


def engine(session: nox.Session, *extras: str) -> None:
    session.install("-e", f".[{','.join(extras)}]" if extras else ".")


@nox.session(python=PYTHON)
def plan(session: nox.Session) -> None:
    """Show the cells: `nox -s plan -- --json | --explain | --subset pr | -k GLOB`."""
    engine(session)
    session.run("extmatrix", "plan", *session.posargs)


@nox.session(python=PYTHON)
def schema(session: nox.Session) -> None:
    """Regenerate matrix.schema.json for editors."""
    engine(session)
    session.run("extmatrix", "schema", *session.posargs)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The project's tests (what CI runs)."""
    engine(session, "test")
    session.run("pytest", *session.posargs)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks that print ratios measured side by side."""
    engine(session)
    session.run("python", "benchmarks/bench_plan.py", *session.posargs)
