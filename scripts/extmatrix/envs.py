"""Per-cell virtual environments, made with uv so that cells sharing a torch share its files.

uv's cache hard-links installed files: the first environment with torch 2.14.1
unpacks ~5 GB, every later one costs seconds. Package sources are the cell's torch
index (when reachable) plus whatever pip is already configured with on this host
(find-links, extra indexes), so local wheel folders and mirrors keep working.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .cells import Cell
from .errors import NotBuildable, UserError
from .toolchain import pip_command


@dataclass(frozen=True)
class Sources:
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=(), compare=False)

    def uv_args(self) -> list[str]:
        args: list[str] = []
        if self.index_url:
            args += ["--default-index", self.index_url]
        for url in self.extra_index_urls:
            args += ["--index", url]
        for link in self.find_links:
            args += ["--find-links", link]
        # torch lives on several indexes at once (PyPI and PyTorch's); take the best match.
        return args + ["--index-strategy", "unsafe-best-match"]


@cache
def uv() -> str:
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if not found:
            raise NotBuildable("uv is not installed (pip install uv)") from None
        return found


@cache
def host_sources() -> Sources:
    """find-links and indexes from the host's pip configuration and environment."""
    out = _pip_config()
    values: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, raw = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        values.setdefault(name, []).extend(raw.strip().strip("'\"").split())
    index = (values.get("index-url") or [None])[0]
    return Sources(index, tuple(dict.fromkeys(values.get("extra-index-url", []))),
                   tuple(dict.fromkeys(values.get("find-links", []))))


def _pip_config() -> str:
    try:
        return subprocess.run([*pip_command(), "config", "list"], capture_output=True,
                              text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def reachable(url: str, timeout: float = 5.0) -> bool:
    if url.startswith("file://"):
        return Path(url[len("file://"):]).exists()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return True
    except urllib.error.HTTPError as exc:
        return exc.code < 500
    except (OSError, ValueError):
        return False


# auto: the cell's index where it answers; cell: always it; host: only the host's pip sources.
INDEX_MODES = ("auto", "cell", "host")


def index_mode() -> str:
    mode = os.environ.get("EXTMATRIX_TORCH_INDEX", "auto").strip() or "auto"
    if mode not in INDEX_MODES:
        raise UserError("$EXTMATRIX_TORCH_INDEX", f"'{mode}' is not a way to find torch",
                        f"export one of {', '.join(INDEX_MODES)}, or unset it (auto)")
    return mode


def sources_for(cell: Cell) -> Sources:
    """The cell's torch index first; the host's configured sources keep working beside it."""
    host = host_sources()
    mode = index_mode()
    if cell.index and mode != "host" and (mode == "cell" or reachable(cell.index)):
        return Sources(host.index_url, (cell.index, *host.extra_index_urls), host.find_links,
                       (f"torch from {cell.index}",))
    note = (f"{cell.index} not reachable: torch from the host's pip sources"
            if cell.index and mode != "host" else "torch from the host's pip sources")
    return Sources(host.index_url, host.extra_index_urls, host.find_links, (note,))


def find_python(cell: Cell) -> str:
    """An installed interpreter for the cell: the build Python, else any Python it tests."""
    return installed_pythons(cell, first_only=True)[0][1]


def installed_pythons(cell: Cell, first_only: bool = False) -> list[tuple[str, str]]:
    """(series, interpreter) of each Python the cell is tested under that is installed here
    (an abi3 cell: every Python it serves; another: its own), the running one first; raises
    NotBuildable when there is none."""
    wanted = [cell.python] if not cell.abi3 else list(cell.test_pythons)
    # 3.13t: a free-threaded interpreter serves no 3.13 cell, and the other way round.
    here = (f"{sys.version_info.major}.{sys.version_info.minor}"
            f"{'t' if sysconfig.get_config_var('Py_GIL_DISABLED') else ''}")
    found: list[tuple[str, str]] = []
    if here in wanted:
        # The interpreter itself, not the venv we run in (nox gives each session its own).
        found.append((here, os.path.realpath(sys.executable)))
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    for version in wanted:
        if (found and first_only) or version == here:
            continue
        located = subprocess.run([uv(), "python", "find", version], capture_output=True,
                                 text=True, env=env)
        if located.returncode == 0 and located.stdout.strip():
            found.append((version, located.stdout.strip()))
    if not found:
        raise NotBuildable(f"no Python {' or '.join(wanted)} is installed here")
    return found


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def env_marker(venv: Path) -> Path:
    return venv / "extmatrix-env.json"


def matches(venv: Path, wanted: dict) -> bool:
    marker = env_marker(venv)
    try:
        return python_of(venv).exists() and json.loads(marker.read_text()) == wanted
    except (OSError, ValueError):
        return False


# Run by the environment's own Python: what is really installed, and whether every
# file a distribution's RECORD lists is still there (a deleted torch leaves its
# dist-info behind and would pass any marker).
_INSPECT = """
import json, sys
from importlib import metadata
out = {}
for name in json.loads(sys.argv[1]):
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        out[name] = {"version": None, "missing": None}
        continue
    missing = next((str(f) for f in dist.files or () if not f.locate().exists()), None)
    out[name] = {"version": dist.version, "missing": missing}
print(json.dumps(out))
"""


def health(venv: Path, requirements: list[str]) -> str | None:
    """None when every requirement is installed, whole, at a version it allows; else why not."""
    python = python_of(venv)
    if not python.exists():
        return f"{python} does not exist"
    reqs = [Requirement(r) for r in requirements]
    names = [canonicalize_name(r.name) for r in reqs]
    try:
        result = subprocess.run([str(python), "-c", _INSPECT, json.dumps(names)],
                                capture_output=True, text=True, timeout=120)
        found = json.loads(result.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return f"{python} does not run"
    for req, name in zip(reqs, names, strict=True):
        facts = found.get(name) or {}
        if facts.get("version") is None:
            return f"{req.name} is not installed"
        if facts.get("missing"):
            return f"{req.name} {facts['version']} lacks its file {facts['missing']}"
        if req.specifier and not req.specifier.contains(facts["version"], prereleases=True):
            return f"{req.name} {facts['version']} does not satisfy {req}"
    return None


def write_marker(venv: Path, wanted: dict) -> None:
    env_marker(venv).write_text(json.dumps(wanted, indent=2, sort_keys=True) + "\n")


def create_cmd(venv: Path, python: str) -> list[str]:
    return [uv(), "venv", "--quiet", "--clear", "--python", python, str(venv)]


def install_cmd(venv: Path, requirements: list[str], sources: Sources,
                extra: list[str] | None = None) -> list[str]:
    return [uv(), "pip", "install", "--quiet", "--python", str(python_of(venv)),
            *sources.uv_args(), *(extra or []), *requirements]
