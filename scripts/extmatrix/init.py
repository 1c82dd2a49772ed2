"""`extmatrix init`: a first matrix.yaml (and CI workflow) for an extension that has none.

What can be read from the project is read (distribution name, import package,
tests folder, abi3 or not); what cannot be known is chosen the way the compat
facts allow: the newest torch (or the one asked for), its CPU flavor and every
CUDA 13.x flavor it ships — the flavors a GPU-less builder can compile without a
container — and its oldest and newest Python.
"""

from __future__ import annotations

import json
import os
import posixpath
import shlex
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name

from .cells import repository
from .compat import Compat, version_key
from .errors import UserError
from .project import static_name, versioned_by_git

ARCHS = ("8.0", "9.0", "10.0", "12.0")  # A100, H100, B200, RTX 50: SASS for each
SKIP = {"tests", "test", "docs", "doc", "build", "dist", "examples", "benchmarks", "scripts"}
WORKFLOW = Path(".github") / "workflows" / "extmatrix.yml"


@dataclass(frozen=True)
class Project:
    name: str
    import_name: str
    tests: str
    abi3: bool


def describe(ext_dir: Path) -> Project:
    """What the extension's own files say about it."""
    if not ext_dir.is_dir():
        raise UserError(str(ext_dir), "not a folder", "pass the extension's project folder")
    name = _dist_name(ext_dir)
    tests = next((t for t in ("tests", "test") if (ext_dir / t).is_dir()), None)
    if tests is None:
        raise UserError(str(ext_dir), "no tests/ or test/ folder",
                        "add the extension's tests there, then run init again")
    setup_py = ext_dir / "setup.py"
    abi3 = setup_py.is_file() and "py_limited_api" in setup_py.read_text(errors="replace")
    return Project(name, _import_name(ext_dir, name), tests, abi3)


def _dist_name(ext_dir: Path) -> str:
    # Read as the engine reads it everywhere else: setup.py's setup(name=...) itself,
    # not the first name= in the file (an Extension's name often comes first).
    if name := static_name(ext_dir):
        return name
    raise UserError(str(ext_dir), "no distribution name found in pyproject.toml, setup.cfg or "
                    "setup.py", "add [project] name to pyproject.toml")


def _import_name(ext_dir: Path, dist: str) -> str:
    candidates = []
    for base in (ext_dir / "src", ext_dir):
        if base.is_dir():
            candidates += sorted(p.parent.name for p in base.glob("*/__init__.py")
                                 if p.parent.name not in SKIP)
    wanted = canonicalize_name(dist).replace("-", "_")
    if wanted in candidates:
        return wanted
    if candidates:
        return candidates[0]
    raise UserError(str(ext_dir), "no Python package (a folder with __init__.py) found",
                    "name it with 'import:' in the matrix by hand")


def matrix_text(project: Project, path: str, compat: Compat, torch: str | None,
                pythons: list[str] | None = None) -> str:
    series = torch or max(compat.facts.torch, key=version_key)
    facts = compat.facts.torch.get(series)
    if facts is None:
        known = ", ".join(sorted(compat.facts.torch, key=version_key))
        raise UserError(None, f"torch {series} is not in the compatibility facts",
                        f"choose one of {known}")
    cuda13 = [v for v in facts.cuda if version_key(v)[:1] == (13,)]
    flavors = ["cpu", *(f"cu{v.replace('.', '')}" for v in cuda13)]
    lines = [
        f"# Written by `extmatrix init` for {project.name}: torch {series}, its CPU flavor and the",
        "# CUDA 13 flavors a builder without a GPU compiles with NVIDIA's PyPI toolkit. Add torch",
        "# releases, CUDA 12 or ROCm flavors (built in containers: --backend container) as needed;",
        "# `extmatrix plan --explain` shows what each change gives.",
        "",
        "extension:",
        f"  path: {path}",
        f"  name: {project.name}",
        f"  import: {project.import_name}",
        f"  tests: {project.tests}",
        f"  abi3: {'true' if project.abi3 else 'false'}",
        "",
        "axes:",
        f'  torch: ["{series}"]',
        f"  flavor: [{', '.join(flavors)}]",
        f"  python: [{', '.join(f'{p!r}' for p in pythons)}]".replace("'", '"') if pythons
        else f'  python: ["{facts.python.min}", "{facts.python.max}"]',
        "",
        "defaults:",
        "  cuda:",
        "    runtime_deps: [triton]",
        "",
        "# GPU archs are named here, never detected: a builder has no GPU.",
        "flavors:",
        "  cpu: {}",
    ]
    for version in cuda13:
        toolkit = compat.toolkit("cuda", version)
        archs = [a for a in ARCHS if toolkit is None or a in toolkit.archs]
        lines.append(f"  cu{version.replace('.', '')}: "
                     f"{{archs: [{', '.join(map(repr, archs))}], ptx: [{archs[-1]!r}]}}"
                     .replace("'", '"'))
    return "\n".join(lines) + "\n"


def workflow_text(engine_spec: str, matrix: str, *, versioned_by_git: bool = False) -> str:
    """`matrix` is the matrix file's path from the repository's root, where steps run; the
    engine writes each cell's results to dist/ beside the matrix."""
    # A shallow checkout has no tags: setuptools-scm would call every build 0.1.devN.
    history = ("\n          fetch-depth: 0  # the version comes from git tags"
               if versioned_by_git else "")
    dist = posixpath.join(posixpath.dirname(matrix), "dist")
    matrix = shlex.quote(matrix)
    return f"""\
# Written by `extmatrix init`. Builds and tests every cell of {matrix} on GitHub's
# Linux runners (no GPU: GPU tests skip). The job matrix comes from `extmatrix plan`.
name: extmatrix

on:
  pull_request:
  push:
    branches: [main]
  workflow_dispatch:

permissions:
  contents: read

jobs:
  plan:
    runs-on: ubuntu-24.04
    timeout-minutes: 10
    outputs:
      matrix: ${{{{ steps.plan.outputs.matrix }}}}
    steps:
      - uses: actions/checkout@08c6903cd8c0fde910a37f88322edcfb5dd907a8 # v5.0.0
        with:
          persist-credentials: false
      - uses: actions/setup-python@e797f83bcb11b83ae66e0230d6156d7c80228e7c # v6.0.0
        with:
          python-version: "3.11"
      - run: python -m pip install "{engine_spec}"
      - id: plan
        run: |
          {{
            echo "matrix<<PLAN_EOF"
            extmatrix plan --matrix {matrix} --json
            echo "PLAN_EOF"
          }} >> "$GITHUB_OUTPUT"

  cell:
    needs: plan
    timeout-minutes: 180
    name: ${{{{ matrix.cell }}}}
    runs-on: ${{{{ matrix.runner }}}}
    strategy:
      fail-fast: false
      matrix: ${{{{ fromJSON(needs.plan.outputs.matrix) }}}}
    env:
      CELL: ${{{{ matrix.cell }}}}
    steps:
      - uses: actions/checkout@08c6903cd8c0fde910a37f88322edcfb5dd907a8 # v5.0.0
        with:
          persist-credentials: false{history}
      - uses: actions/setup-python@e797f83bcb11b83ae66e0230d6156d7c80228e7c # v6.0.0
        with:
          python-version: ${{{{ matrix.python }}}}
      - run: python -m pip install "{engine_spec}"
      - run: extmatrix build --matrix {matrix} --strict --cell "$CELL"
      - run: extmatrix test-matrix --matrix {matrix} --strict --cell "$CELL"
      - uses: actions/upload-artifact@330a01c490aca151604b8cf639adc76d48f6c5d4 # v5.0.0
        if: always()
        with:
          name: ${{{{ matrix.cell }}}}
          path: {dist}/${{{{ matrix.cell }}}}/
          if-no-files-found: error
          overwrite: true
"""


def installed_engine_spec() -> str | None:
    """How CI can install this very engine: the git URL and commit it was installed from
    (PEP 610's direct_url.json). None when installed from a folder or an archive here."""
    try:
        record = json.loads(metadata.distribution("extmatrix").read_text("direct_url.json")
                            or "null")
    except (metadata.PackageNotFoundError, ValueError):
        return None
    vcs = (record or {}).get("vcs_info") or {}
    if vcs.get("vcs") != "git" or not record.get("url", "").startswith("https://"):
        return None
    revision = vcs.get("commit_id") or vcs.get("requested_revision")
    return f"extmatrix @ git+{record['url']}@{revision}"


def write(ext_dir: Path, output: Path, *, torch: str | None, pythons: list[str] | None,
          engine_spec: str | None, with_workflow: bool, force: bool) -> list[Path]:
    """Write the matrix, and the workflow at the root of the repository that holds it (the
    only place GitHub reads workflows from); never over a file."""
    engine_spec = engine_spec or installed_engine_spec()
    if with_workflow and engine_spec is None:
        raise UserError(None, "the workflow must install this engine, and it was not installed "
                        "from a git URL", "pass --engine-spec 'extmatrix @ "
                        "git+https://…/extmatrix@TAG', or --no-workflow")
    project = describe(ext_dir)
    _check_output(output)
    repo = repository(output)
    if not ext_dir.resolve().is_relative_to(repo):
        # `plan` would refuse the matrix: cells build from a copy of that repository.
        raise UserError(str(output), f"the extension folder {ext_dir} lies outside {repo}, the "
                        "repository this matrix would build (the nearest folder up holding .git, "
                        "else the matrix's own)", "write the matrix inside the extension's "
                        "repository, running 'git init' there first if it has none")
    rel = os.path.relpath(ext_dir.resolve(), output.resolve().parent)
    targets = {output: matrix_text(project, rel, Compat.load(), torch, pythons)}
    if with_workflow:
        workflow = repo / WORKFLOW
        here = Path.cwd().resolve()
        if workflow.is_relative_to(here):  # named from here, as the matrix was given
            workflow = workflow.relative_to(here)
        targets[workflow] = workflow_text(
            engine_spec, output.resolve().relative_to(repo).as_posix(),
            versioned_by_git=versioned_by_git(ext_dir))
    for target in targets:
        if target.exists() and not force:
            raise UserError(str(target), "already exists", "pass --force to replace it")
    for target, text in targets.items():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return list(targets)


def _check_output(output: Path) -> None:
    # Folders missing on the way are created, as for the default output; a file in the way
    # is a mistake to name, not an OSError from mkdir.
    if output.is_dir():
        raise UserError(str(output), "is a folder", f"name the matrix file, e.g. --output "
                        f"{output / 'matrix.yaml'}")
    blocking = next(p for p in output.parents if p.exists())
    if not blocking.is_dir():
        raise UserError(str(blocking), "is a file, so the matrix cannot be written below it",
                        "choose another --output")
