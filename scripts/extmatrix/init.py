"""`extmatrix init`: a first matrix.yaml (and CI workflow) for an extension that has none.

What can be read from the project is read (distribution name, import package, tests
folder, the Pythons it accepts, abi3 or not, Triton kernels or not); the rest is what
`plan --outdated` would ask for: the newest torch (or the one asked for) with every
flavor and every living Python it ships (CPU alone for an extension with no CUDA or HIP
sources and no Triton kernels). The flavors a GPU-less builder cannot compile without a
container (ROCm, CUDA without nvcc on PyPI) are listed but excluded, saying why.
"""

from __future__ import annotations

import ast
import datetime
import fnmatch
import json
import os
import posixpath
import re
import shlex
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path, PurePosixPath

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from .cells import repository
from .compat import Compat, TorchFacts, version_key
from .config import check_import_name, check_name
from .errors import UserError, describe_os_error
from .outdated import python_end_of_life
from .project import (
    accepts_python,
    committed_files,
    not_ignored,
    pyproject_data,
    pyproject_table,
    pyproject_value,
    requires_python,
    setup_arguments,
    setup_calls,
    setup_cfg_value,
    setup_literal,
    static_name,
    versioned_by_git,
)
from .toolchain import FIRST_PYPI_CUDA

ARCHS = ("8.0", "9.0", "10.0", "12.0")  # A100, H100, B200, RTX 50: SASS for each
# MI200, MI300, MI350, RX 7900, RX 9070: where torch's wheels of the flavor have them.
ROCM_ARCHS = ("gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1201")
SKIP = {"tests", "test", "docs", "doc", "build", "dist", "examples", "benchmarks", "scripts"}
WORKFLOW = Path(".github") / "workflows" / "extmatrix.yml"
INDEX = "https://download.pytorch.org/whl/"
PYTHON = re.compile(r"3\.\d+t?")  # as the matrix takes it: 3.13t, a free-threaded build


@dataclass(frozen=True)
class Project:
    name: str
    import_name: str
    tests: str
    abi3: bool
    # requires-python and the file that states it; SpecifierSet() accepts every Python.
    requires_python: SpecifierSet = field(default_factory=SpecifierSet)
    requires_python_in: str = ""
    py_api: str = ""  # scikit-build-core's wheel.py-api
    triton: bool = False  # the package imports triton: its GPU wheels require it
    # The GPU families the extension has code for: without it a flavor's wheel would hold
    # the CPU build again, which the wheel check refuses for holding no GPU code.
    cuda: bool = True
    rocm: bool = True

    @property
    def gpu(self) -> bool:
        return self.cuda or self.rocm

    def accepts(self, python: str) -> bool:
        return accepts_python(self.requires_python, python)


def describe(ext_dir: Path, import_name: str | None = None) -> Project:
    """What the extension's own files say about it; `import_name` where the user named it."""
    if not ext_dir.is_dir():
        raise UserError(str(ext_dir), "not a folder", "pass the extension's project folder")
    name = _dist_name(ext_dir)
    tests = next((t for t in ("tests", "test") if (ext_dir / t).is_dir()), None)
    if tests is None:
        raise UserError(str(ext_dir), "no tests/ or test/ folder",
                        "add the extension's tests there, then run init again")
    # scikit-build-core's cp3X tags the wheel cp3X-abi3; its py3 (a library that
    # torch.ops.load_library loads, no libpython) tags it py3-none: either serves every Python.
    py_api = pyproject_value(ext_dir, ("tool", "scikit-build", "wheel", "py-api"), str, "")
    abi3 = py_api.startswith(("cp", "py")) if py_api else _limited_api(ext_dir)
    import_name = _import_name(ext_dir, name, import_name)
    specifier, stated_in = requires_python(ext_dir)
    triton = _imports_triton(_module_files(ext_dir, import_name))
    cuda, hip = gpu_sources(ext_dir)
    # torch's build hipifies CUDA sources for ROCm, and Triton compiles for both.
    return Project(name, import_name, tests, abi3, specifier, stated_in, py_api, triton,
                   cuda=triton or cuda, rocm=triton or cuda or hip)


CUDA_SUFFIXES = (".cu", ".cuh")
HIP_SUFFIXES = (".hip",)
# CMake compiles a source in a GPU language only once the project enables it; a kernel in a
# .cpp file (set_source_files_properties(... LANGUAGE CUDA)) has no suffix to tell.
CMAKE_LANGUAGE = re.compile(r"^\s*(?:enable_language\s*\(|project\s*\([^)]*LANGUAGES)([^)]*)\)",
                            re.IGNORECASE | re.MULTILINE)


def gpu_sources(ext_dir: Path) -> tuple[bool, bool]:
    """Whether the wheel's own sources hold CUDA code and HIP code: files of the repository
    (ignored ones are not the project's) outside tests, docs, examples, build output and
    virtualenvs at any depth (a vendored library's count: the build may compile them). A
    virtualenv is left out even where git does not ignore it, or outside git: torch's own
    headers in it hold .cuh files."""
    listed = committed_files(ext_dir)
    files = [Path(f) for f in listed] if listed is not None else _project_files(ext_dir)
    virtualenv: dict[Path, bool] = {}

    def in_virtualenv(folder: Path) -> bool:
        if folder not in virtualenv:
            virtualenv[folder] = (ext_dir / folder / "pyvenv.cfg").is_file()
        return virtualenv[folder]

    cuda = hip = False
    for path in files:
        folders = path.parts[:-1]
        if any(_left_out(part) for part in folders) or any(
                in_virtualenv(Path(*folders[:depth])) for depth in range(1, len(folders) + 1)):
            continue
        cuda = cuda or path.suffix in CUDA_SUFFIXES
        hip = hip or path.suffix in HIP_SUFFIXES
        if path.name == "CMakeLists.txt" or path.suffix == ".cmake":
            try:
                text = (ext_dir / path).read_text(errors="replace")
            except OSError:
                continue
            for match in CMAKE_LANGUAGE.finditer(text):
                words = set(re.split(r"\s+", match.group(1).upper()))
                cuda = cuda or "CUDA" in words
                hip = hip or "HIP" in words
    return cuda, hip


def _left_out(folder: str) -> bool:
    """A folder whose files are not the wheel's sources, wherever it lies."""
    return (folder in SKIP or folder.startswith(".") or folder == "__pycache__"
            or folder == "site-packages")


def _project_files(ext_dir: Path) -> list[Path]:
    """The files below ext_dir outside git, relative to it; the folders gpu_sources leaves
    out are not entered (a virtualenv holds thousands of files)."""
    found = []
    for folder, dirs, files in os.walk(ext_dir):
        dirs[:] = [d for d in dirs if not _left_out(d)
                   and not os.path.isfile(os.path.join(folder, d, "pyvenv.cfg"))]
        rel = Path(folder).relative_to(ext_dir)
        found += [rel / name for name in files]
    return found


def _module_files(ext_dir: Path, import_name: str) -> list[Path]:
    """The Python files of the import package (or module), flat or src layout; none for a
    compiled module alone."""
    rel = Path(*import_name.split("."))
    for base in (ext_dir / "src", ext_dir):
        if (base / rel).is_dir():
            return sorted((base / rel).rglob("*.py"))
        if (module := (base / rel).with_suffix(".py")).is_file():
            return [module]
    return []


def _imports_triton(files: list[Path]) -> bool:
    """Whether the package's own modules import triton (its tests' imports do not count)."""
    for path in files:
        try:
            tree = ast.parse(path.read_bytes())
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            if any(n.split(".")[0] == "triton" for n in names):
                return True
    return False


def _dist_name(ext_dir: Path) -> str:
    # Read as the engine reads it everywhere else: setup.py's setup(name=...) itself,
    # not the first name= in the file (an Extension's name often comes first).
    if name := static_name(ext_dir) or _setup_value(ext_dir, "name"):
        try:  # the matrix would refuse it: said here, where it was read
            return check_name(name)
        except ValueError as exc:
            raise UserError(str(ext_dir), f"the distribution name {exc}",
                            "fix the project's name (PEP 508: what pip installs)") from None
    if (ext_dir / "setup.py").is_file() and "project" not in pyproject_data(ext_dir):
        # A [project] table would make pyproject.toml the metadata's source, which then
        # lacks the version and the rest that setup.py passes.
        raise UserError(str(ext_dir), "no distribution name found in setup.cfg, nor a "
                        "setup(name=...) in setup.py that can be read without running it",
                        "state it as 'name = ...' under [metadata] in setup.cfg, or as a "
                        "literal setup(name=\"...\")")
    raise UserError(str(ext_dir), "no distribution name found in pyproject.toml, setup.cfg or "
                    "setup.py", "add [project] name to pyproject.toml")


def _setup_value(ext_dir: Path, keyword: str) -> str | None:
    """A string setup.py passes setup() as `keyword`, through a constant (name=NAME)."""
    found = set(setup_arguments(ext_dir, ("setup",), keyword))
    value = found.pop() if len(found) == 1 else None
    return value if isinstance(value, str) else None


# Extension, CppExtension, CUDAExtension, Pybind11Extension, or a variable holding one of
# them (extension = CUDAExtension if ... else CppExtension).
EXTENSIONS = ("*extension",)
FINDS = ("find_packages", "find_namespace_packages")


def _limited_api(ext_dir: Path) -> bool:
    """Whether setuptools builds an abi3 wheel: an extension built with py_limited_api=True,
    or bdist_wheel's py_limited_api = cp3X in setup.cfg, setup(options=...) or pyproject.toml.
    Only literals count (py_limited_api=False says the opposite; a computed one is unknown)."""
    if any(v is True for v in setup_arguments(ext_dir, EXTENSIONS, "py_limited_api")):
        return True
    modules = pyproject_value(ext_dir, ("tool", "setuptools", "ext-modules"), list, [])
    if any(isinstance(m, dict) and m.get("py-limited-api") is True for m in modules):
        return True
    tags = [options.get("bdist_wheel", {}).get("py_limited_api")
            for options in setup_arguments(ext_dir, ("setup",), "options")
            if isinstance(options, dict) and isinstance(options.get("bdist_wheel"), dict)]
    tags.append(pyproject_table(ext_dir, "tool", "distutils", "bdist_wheel")
                .get("py-limited-api"))
    tags.append(setup_cfg_value(ext_dir, "py_limited_api", "bdist_wheel"))
    return any(isinstance(tag, str) and tag.startswith("cp3") for tag in tags)


def _names(value: object) -> list[str]:
    """The strings of a literal list (or a setup.cfg list, one a line or comma-separated)."""
    if isinstance(value, str):
        return [v for v in re.split(r"[,\s]+", value) if v]
    if isinstance(value, list | tuple):
        return [v for v in value if isinstance(v, str)]
    return []


def _declared(ext_dir: Path) -> tuple[list[str], list[str], set[str], list[str]]:
    """What the project's files say the wheel holds: extension modules' dotted names,
    packages and top-level modules, and the patterns package discovery excludes."""
    tool = ("tool", "setuptools")
    calls, constants = setup_calls(ext_dir, EXTENSIONS)
    named = [setup_literal(n, constants) for call in calls
             for n in call.args[:1] or [k.value for k in call.keywords if k.arg == "name"]]
    extensions = [n for n in named if isinstance(n, str)]
    extensions += [m["name"] for m in pyproject_value(ext_dir, (*tool, "ext-modules"), list, [])
                   if isinstance(m, dict) and isinstance(m.get("name"), str)]
    packages = [*(n for v in setup_arguments(ext_dir, ("setup",), "packages") for n in _names(v)),
                *_names(pyproject_table(ext_dir, *tool).get("packages")),
                *(PurePosixPath(p).name for p in _names(pyproject_table(
                    ext_dir, "tool", "scikit-build", "wheel").get("packages")))]
    cfg_packages = setup_cfg_value(ext_dir, "packages", "options")
    if not cfg_packages.startswith("find"):
        packages += _names(cfg_packages)
    find = pyproject_table(ext_dir, *tool, "packages", "find") if isinstance(
        pyproject_table(ext_dir, *tool).get("packages", {}), dict) else {}
    # find_packages(include=["myops", "myops.*"]) declares myops; a pattern, nothing.
    packages += [n for v in [*setup_arguments(ext_dir, FINDS, "include"), find.get("include"),
                             setup_cfg_value(ext_dir, "include", "options.packages.find")]
                 for n in _names(v) if not any(c in n for c in "*?[")]
    modules = [*(n for v in setup_arguments(ext_dir, ("setup",), "py_modules") for n in _names(v)),
               *_names(pyproject_table(ext_dir, *tool).get("py-modules")),
               *_names(setup_cfg_value(ext_dir, "py_modules", "options"))]
    excluded = [n for v in [*setup_arguments(ext_dir, FINDS, "exclude"), find.get("exclude"),
                            setup_cfg_value(ext_dir, "exclude", "options.packages.find")]
                for n in _names(v)]
    return extensions, [p.split(".")[0] for p in packages], set(modules), excluded


def _import_name(ext_dir: Path, dist: str, given: str | None = None) -> str:
    """The top-level module the wheel's users import: the package its extension modules
    live in (acme.fastops._C: acme, a namespace package or not), else the packages it
    declares, else a public top-level extension module or py_modules' (PyTorch's
    tutorial builds lltm_cpp so), else the packages found in the source tree but those
    excluded, else a private top-level module (_foo_C)."""
    if given is not None:
        try:
            return check_import_name(given)
        except ValueError as exc:
            raise UserError(f"--import {given}", f"is not a Python module name ({exc})",
                            "pass the name the tests import, e.g. --import mypackage") from None
    extensions, packages, modules, excluded = _declared(ext_dir)
    found = []
    for base in (ext_dir / "src", ext_dir):
        if base.is_dir():
            found += sorted(p.parent.name for p in base.glob("*/__init__.py")
                            if p.parent.name not in SKIP)
    top = {n for n in extensions if "." not in n} | modules
    # A private top-level module (_foo_C) is what the package imports, not what its users
    # do: the packages in the tree come first, and it only where there are none.
    public = {n for n in top if not n.startswith("_")}
    tree = {n for n in found if not any(fnmatch.fnmatchcase(n, x) for x in excluded)}
    candidates = ({n.split(".")[0] for n in extensions if "." in n} or set(packages)
                  or public or tree or top)
    wanted = canonicalize_name(dist).replace("-", "_")
    if len(candidates) == 1:
        return candidates.pop()
    if wanted in candidates:
        return wanted
    if candidates:
        raise UserError(str(ext_dir), f"cannot tell which of {', '.join(sorted(candidates))} "
                        "the tests import", "pass it as --import NAME")
    raise UserError(str(ext_dir), "no Python package (a folder with __init__.py) or extension "
                    "module named in setup.py or pyproject.toml found",
                    "pass the module the tests import as --import NAME")


def _pythons(project: Project, facts: TorchFacts, series: str,
             today: datetime.date) -> list[str]:
    """The Pythons the torch ships for and the project accepts, but those past their end
    of life: what `plan --outdated` would neither add nor drop."""
    low, high = (int(v.split(".")[1]) for v in (facts.python.min, facts.python.max))
    accepted = [p for p in (f"3.{m}" for m in range(low, high + 1)) if project.accepts(p)]
    if not accepted:
        raise UserError(project.requires_python_in, f"requires-python "
                        f"'{project.requires_python}' takes none of Python {facts.python.min}"
                        f"–{facts.python.max}, which torch {series} ships for",
                        "pass --torch with a release that ships a Python the project takes")
    return [p for p in accepted if python_end_of_life(p) > today] or accepted


def _scalar(value: str) -> str:
    """`value` as YAML reads it back: plain where that is safe, else quoted (a folder
    named `x #1` or `on`, a package named `null`)."""
    dumped = yaml.safe_dump(value, width=float("inf"), allow_unicode=True)
    return dumped.removesuffix("\n...\n") if dumped.endswith("\n...\n") else json.dumps(value)


def matrix_text(project: Project, path: str, compat: Compat, torch: str | None,
                pythons: list[str] | None = None, today: datetime.date | None = None) -> str:
    if torch is not None and not torch.strip():
        raise UserError("--torch", "is empty", "pass a torch release such as 2.11, or leave "
                        "--torch out for the newest")
    series = torch or max(compat.facts.torch, key=version_key)
    if series.count(".") >= 2 and series.rsplit(".", 1)[0] in compat.facts.torch:
        series = series.rsplit(".", 1)[0]  # 2.11.0: the matrix names series; 2.11 it is
    facts = compat.facts.torch.get(series)
    if facts is None:
        known = ", ".join(sorted(compat.facts.torch, key=version_key))
        raise UserError(None, f"torch {series} is not in the compatibility facts",
                        f"choose one of {known}")
    for python in pythons or ():
        if (pythons or []).count(python) > 1:
            raise UserError(f"--python {python}", "is given twice", "pass each Python once")
        if not PYTHON.fullmatch(python):
            raise UserError(f"--python {python}", "is not a Python series (3.X, or 3.Xt for "
                            "a free-threaded build)", 'pass one such as "3.12"')
        if not project.accepts(python):
            raise UserError(f"--python {python}", f"{project.requires_python_in} requires "
                            f"Python {project.requires_python}", "pass a Python it takes")
        if not compat.supports_python(series, python):
            threaded = facts.python_free_threaded
            raise UserError(f"--python {python}", f"torch {series} ships for Python "
                            f"{facts.python.min}–{facts.python.max}"
                            + (f" and free-threaded {', '.join(threaded)}" if threaded else
                               ", none free-threaded"), "pass one of those, or another --torch")
    pythons = sorted(pythons or _pythons(project, facts, series,
                                         today or datetime.date.today()), key=version_key)
    cuda = {f"cu{v.replace('.', '')}": v for v in facts.cuda} if project.cuda else {}
    built = ["cpu", *(f for f, v in cuda.items() if version_key(v) >= FIRST_PYPI_CUDA)]
    rocm_versions = facts.rocm if project.rocm else []
    rocm = [f"rocm{v}" for v in rocm_versions]
    # The flavors the workflow's local backend cannot build, and why: exclude rules.
    unbuilt = {f"cu{major}*": f"NVIDIA's PyPI wheels have no CUDA {major} nvcc: build in a "
               f"container or where CUDA {major} is installed"
               for major in (version_key(v)[0] for v in cuda.values()
                             if version_key(v) < FIRST_PYPI_CUDA)}
    if rocm:
        unbuilt["rocm*"] = "ROCm builds need a container or ROCm installed"
    lines = [
        f"# Written by `extmatrix init` for {project.name}: torch {series} with every flavor",
        "# and Python it ships for. Cells build on a machine without a GPU, as GitHub's runners",
        "# are; the exclude rules say which flavors need more. `extmatrix plan --explain` shows",
        "# the cells, and `extmatrix plan --outdated` what a newer torch or Python would add.",
        *(["# The extension has HIP code but no CUDA sources (.cu, .cuh) or Triton kernels:",
           "# its GPU flavors are ROCm's alone."] if not project.cuda else []),
    ] if project.gpu else [
        f"# Written by `extmatrix init` for {project.name}: torch {series} on CPU with every",
        "# Python it ships for. The extension has no CUDA or HIP sources (.cu, .cuh, .hip) and",
        "# no Triton kernels, so a GPU flavor would build the same CPU code: add cuXXX flavors",
        "# once it has GPU code. `extmatrix plan --explain` shows the cells, and",
        "# `extmatrix plan --outdated` what a newer torch or Python would add.",
    ]
    lines += [
        "",
        "extension:",
        f"  path: {_scalar(path)}",
        f"  name: {_scalar(project.name)}",
        f"  import: {_scalar(project.import_name)}",
        f"  tests: {_scalar(project.tests)}",
    ]
    if project.py_api.startswith("py"):
        lines += [
            f'  # wheel.py-api = "{project.py_api}": one {project.py_api}-none wheel, linking no '
            "libpython, serves every",
            "  # Python: built once per cell (its binaries checked for Python C API calls) and",
            "  # tested under each Python.",
        ]
    lines += [
        f"  abi3: {'true' if project.abi3 else 'false'}",
        "",
        "axes:",
        f'  torch: ["{series}"]',
        f"  flavor: [{', '.join([*built, *(f for f in cuda if f not in built), *rocm])}]",
        f"  python: [{', '.join(f'{p!r}' for p in pythons)}]".replace("'", '"'),
        "",
        "# Settings shared by every flavor of a family. PyTorch's index of the flavor serves",
        "# its torch (torch==X+cpu, X+cu130): PyPI's Linux torch is one CUDA build.",
        "defaults:",
        "  cpu:",
        f"    index: {INDEX}cpu",
    ]
    if cuda:
        lines += [
            "  cuda:",
            f"    index: {INDEX}{{flavor}}",
            *(["    runtime_deps: [triton]"] if project.triton else []),
        ]
    if rocm:
        lines += [
            "  rocm:",
            f"    index: {INDEX}{{flavor}}",
            "    # PyTorch's own ROCm wheel builder: ROCm and every CPython inside.",
            "    base_image: docker.io/pytorch/manylinux2_28-builder:rocm{toolkit}",
            *(["    runtime_deps: [pytorch-triton-rocm]"] if project.triton else []),
        ]
    lines += ["", *(["# GPU archs are named here, never detected: a builder has no GPU."]
                    if project.gpu else []), "flavors:", "  cpu: {}"]
    for name, version in cuda.items():
        toolkit = compat.toolkit("cuda", version)
        archs = [a for a in ARCHS if toolkit is None or a in toolkit.archs]
        # NVIDIA's PyPI wheels carry no nvcc before CUDA 13: an image that has one does.
        image = ("" if name in built else
                 ", base_image: 'docker.io/pytorch/manylinux2_28-builder:cuda{toolkit}'")
        lines.append(f"  {name}: {{archs: [{', '.join(map(repr, archs))}], "
                     f"ptx: [{archs[-1]!r}]{image}}}".replace("'", '"'))
    for version in rocm_versions:
        published = compat.rocm_archs(series, version)
        archs = [a for a in ROCM_ARCHS if a in published] or published
        lines.append(f"  rocm{version}: {{archs: [{', '.join(archs)}]}}")
    if unbuilt:
        lines += [
            "",
            "# Listed, so that `plan --outdated` counts them, but not built: the workflow's",
            "# local backend takes nvcc from NVIDIA's PyPI wheels (CUDA 13 on) and ROCm from",
            "# the machine. Drop a rule to build its cells with --backend container, or on a",
            "# runner with that toolkit.",
            "exclude:",
            *(f'  - {{flavor: "{glob}", reason: "{why}"}}' for glob, why in unbuilt.items()),
        ]

    def cell(python: str, flavor: str) -> str:
        # The stable ABI leaves free-threaded builds out: an abi3 wheel serves none of them.
        each = not project.abi3 or python.endswith("t")
        return f"{f'py{python}-' if each else ''}torch{series}-{flavor}"

    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    pr = dict.fromkeys([cell(pythons[0], "cpu"), cell(pythons[-1], built[-1])])
    newest_cuda = built[-1] != "cpu"
    local_why = ["  # What `build` and `test-matrix` take by default: a Linux box without a GPU",
                 "  # or a container builds it."]
    if project.abi3:  # a cell's one wheel is tested under every Python
        pr_why = ("  # Pull requests: the CPU wheel and the newest CUDA one, each tested on every"
                  " Python." if newest_cuda else
                  "  # Pull requests: the CPU wheel, tested on every Python.")
    else:
        local_why[-1] = ("  # or a container builds it, with the Python `extmatrix init` ran on "
                         "where it is listed.")
        pr_why = ("  # Pull requests: CPU with the oldest Python, "
                  f"{'the newest CUDA' if newest_cuda else 'and'} with the newest.")
    lines += [
        "",
        "subsets:",
        *local_why,
        f"  local: [{cell(here if here in pythons else pythons[0], 'cpu')}]",
        pr_why,
        f"  pr: [{', '.join(pr)}]",
    ]
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
# Written by `extmatrix init`. Builds and tests the cells of {matrix} on GitHub's
# Linux runners (no GPU: GPU tests skip): every cell on a push, the `pr` subset on a pull
# request. The job matrix comes from `extmatrix plan`.
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
        env:  # pull requests build the matrix's pr subset; pushes, every cell
          SUBSET: ${{{{ github.event_name == 'pull_request' && 'pr' || '' }}}}
        run: |
          {{
            echo "matrix<<PLAN_EOF"
            extmatrix plan --matrix {matrix} --json ${{SUBSET:+--subset "$SUBSET"}}
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
      # Every Python the wheel is tested under, then the engine's (the last is the default).
      - uses: actions/setup-python@e797f83bcb11b83ae66e0230d6156d7c80228e7c # v6.0.0
        with:
          python-version: |
            ${{{{ matrix.python_versions }}}}
            3.11
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


def _check_engine_spec(spec: str) -> None:
    """The spec goes into the workflow's shell between double quotes: a requirement pip
    reads, and nothing a shell would expand."""
    try:
        Requirement(spec)
    except InvalidRequirement as exc:
        raise UserError(f"--engine-spec {spec}", f"is not a requirement pip reads ({exc})",
                        "pass one such as 'extmatrix @ git+https://…/extmatrix@TAG'") from None
    if any(c in spec for c in '"$`\\'):
        raise UserError(f"--engine-spec {spec}", "holds a character the workflow's shell would "
                        "read ($, `, \\ or \")", "pass a plain requirement")


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
          engine_spec: str | None, with_workflow: bool, force: bool,
          import_name: str | None = None) -> list[Path]:
    """Write the matrix, and the workflow at the root of the repository that holds it (the
    only place GitHub reads workflows from); never over a file."""
    engine_spec = engine_spec or installed_engine_spec()
    if engine_spec is not None:
        _check_engine_spec(engine_spec)
    if with_workflow and engine_spec is None:
        raise UserError(None, "the workflow must install this engine, and it was not installed "
                        "from a git URL", "pass --engine-spec 'extmatrix @ "
                        "git+https://…/extmatrix@TAG', or --no-workflow")
    project = describe(ext_dir, import_name)
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
    for target in targets:  # all checked before any is written: no half-written result
        _check_output(target)
        if target.exists() and not force:
            raise UserError(str(target), "already exists", "pass --force to replace it")
    for target, text in targets.items():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        except OSError as exc:
            raise UserError(str(target), f"cannot be written ({describe_os_error(exc)})",
                            "make its folder writable, or choose another --output") from None
    _hint_ignores(repo, output)
    return list(targets)


def _hint_ignores(repo: Path, output: Path) -> None:
    """Runs write dist/ and .extmatrix/ beside the matrix: say so where git would commit
    them. The repository's .gitignore is its maintainer's to change, not init's."""
    folder = output.resolve().parent.relative_to(repo).as_posix()
    prefix = "" if folder == "." else f"{folder}/"
    missing = not_ignored(repo, [f"{prefix}dist/", f"{prefix}.extmatrix/"])
    if missing:
        gitignore, here = repo / ".gitignore", Path.cwd().resolve()
        shown = gitignore.relative_to(here) if gitignore.is_relative_to(here) else gitignore
        print(f"hint: git does not ignore {' and '.join(missing)}, which extmatrix runs fill "
              f"beside the matrix: add {' and '.join(f'/{m}' for m in missing)} to {shown}",
              file=sys.stderr)


def _check_output(output: Path) -> None:
    # Folders missing on the way are created, as for the default output; a file in the way
    # is a mistake to name, not an OSError from mkdir.
    if output.is_dir():
        raise UserError(str(output), "is a folder", f"name the matrix file, e.g. --output "
                        f"{output / 'matrix.yaml'}")
    blocking = next(p for p in output.parents if p.exists())
    if not blocking.is_dir():
        raise UserError(str(blocking), f"is a file, so {output.name} cannot be written below "
                        "it", "move it away, or choose another --output")
