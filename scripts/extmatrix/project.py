"""The extension project under build, as the engine needs to know it, whoever wrote it."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from collections.abc import Callable
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from pyproject_hooks import BuildBackendHookCaller, quiet_subprocess_runner

from .errors import StepFailed, UserError
from .workspace import skipped

BUILD_TOOLS = ["pip", "ninja"]  # beside the extension's own [build-system] requires
# The cell pins these itself: the extension's own pin would fight the cell's.
CELL_PINNED = {"torch"}


LEGACY_BACKEND = "setuptools.build_meta:__legacy__"  # what pip uses without [build-system]


def build_system(ext_dir: Path) -> dict:
    """[build-system] of the extension's pyproject.toml, with PEP 517's defaults."""
    pyproject = ext_dir / "pyproject.toml"
    data: dict = {}
    if pyproject.is_file():
        try:
            data = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("build-system", {})
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise UserError(str(pyproject), f"cannot read ({exc})",
                            "fix the file so that pip can build the project") from None
    return {"requires": data.get("requires", ["setuptools", "wheel"]),
            "build-backend": data.get("build-backend", LEGACY_BACKEND),
            "backend-path": data.get("backend-path")}


def build_requirements(ext_dir: Path) -> list[str]:
    """The extension's [build-system] requires, minus torch (the cell pins it)."""
    pyproject = ext_dir / "pyproject.toml"
    requires = build_system(ext_dir)["requires"]
    wanted = []
    for text in requires:
        try:
            name = canonicalize_name(Requirement(text).name)
        except InvalidRequirement as exc:
            raise UserError(str(pyproject), f"[build-system] requires: {exc}",
                            "write PEP 508 requirements") from None
        if name not in CELL_PINNED:
            wanted.append(text)
    return list(dict.fromkeys([*wanted, *BUILD_TOOLS]))


# Version plugins that ask git for the version: setuptools-scm, and hatch-vcs over it.
GIT_VERSIONED_BY = {"setuptools-scm", "hatch-vcs"}
PRETEND_VERSION = "SETUPTOOLS_SCM_PRETEND_VERSION"


def versioned_by_git(ext_dir: Path) -> bool:
    """Whether the extension's build asks git for its version (a [build-system] require)."""
    requires = build_system(ext_dir)["requires"]
    try:
        return any(canonicalize_name(Requirement(r).name) in GIT_VERSIONED_BY for r in requires)
    except InvalidRequirement:
        return False  # build_requirements() says what is wrong, where it matters


def git_version_env(ext_dir: Path, python: Path, env: dict[str, str],
                    note: Callable[[str], None] = lambda line: None) -> dict[str, str]:
    """The version git gives the extension's tree, for a build from a copy without .git.

    A cell builds from a copy of the extension that carries no .git, where setuptools-scm
    finds no version. Asked in the tree itself (with the build environment's own
    setuptools-scm and the project's settings), its answer is handed to the build as
    SETUPTOOLS_SCM_PRETEND_VERSION, less the local label (+g1a2b3c4): the cell adds its
    own. A version the user set in the variable is handed on as it is (a container sees
    only what it is given). Nothing is set where the project does not take its version
    from git, or where git gives none (an sdist: its PKG-INFO says)."""
    if not versioned_by_git(ext_dir):
        return {}
    if (given := env.get(PRETEND_VERSION, os.environ.get(PRETEND_VERSION))) is not None:
        note(f"version: {PRETEND_VERSION}={given}, as set")
        return {PRETEND_VERSION: given}
    try:
        asked = subprocess.run([str(python), "-m", "setuptools_scm"], cwd=ext_dir,
                               env={**os.environ, **env}, capture_output=True, text=True,
                               timeout=120)
        version = Version(asked.stdout.strip().splitlines()[-1]) if asked.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, IndexError, InvalidVersion):
        version = None
    if version is None:
        note("setuptools-scm found no version in the extension's tree; the build asks it "
             "again in the copy")
        return {}
    note(f"version from git: {version.public} (setuptools-scm in the extension's tree; the "
         f"cell's copy has no .git, and the cell adds its own local label)")
    return {PRETEND_VERSION: version.public}


def mirror_tracked_files(ext_dir: Path, copy: Path,
                         note: Callable[[str], None] = lambda line: None) -> bytes:
    """Make the copy a git repository that tracks what git tracks in the tree; returns
    the list (NUL-separated paths), b"" where nothing was done.

    For an extension versioned by git, setuptools-scm also decides package data: with
    include_package_data (on by default under pyproject.toml), every file git tracks in
    a package ships in the wheel (a JIT extension's .cu sources, headers, data). In a
    copy without .git they were left out, silently. The copy's repository holds one
    commit of exactly those files (export-ignore in .gitattributes still applies); no
    configuration, hook or signing of the user's takes part."""
    ours = copy / ".git"
    if not versioned_by_git(ext_dir):
        shutil.rmtree(ours, ignore_errors=True)  # a repository of an earlier build's
        return b""
    # The tree is the user's, read with their settings (safe.directory among them); the
    # copy is ours, written with none.
    quiet = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}

    def git(where: Path, *args: str, feed: bytes | None = None) -> bytes:
        return subprocess.run(["git", "-C", str(where), *args], input=feed,
                              env=None if where == ext_dir else quiet,
                              capture_output=True, check=True, timeout=600).stdout

    try:
        listed = git(ext_dir, "ls-files", "-z", "--recurse-submodules")
    except (OSError, subprocess.SubprocessError):
        listed = b""
    files = sorted(p for p in listed.split(b"\0") if p and os.path.lexists(copy / os.fsdecode(p)))
    if not files:
        # No repository of ours, then: an unpacked sdist's PKG-INFO must keep the version.
        shutil.rmtree(ours, ignore_errors=True)
        note("git tracks no files in the extension's tree: its package data is what "
             "MANIFEST.in and the build's own settings say")
        return b""
    tracked = b"\0".join(files)
    try:
        if not ours.is_dir():
            git(copy, "init", "-q")
        git(copy, "read-tree", "--empty")
        git(copy, "add", "--force", "--pathspec-from-file=-", "--pathspec-file-nul", feed=tracked)
        git(copy, "-c", "user.name=extmatrix", "-c", "user.email=extmatrix@localhost",
            "commit", "-q", "--allow-empty", "--no-verify", "-m", "the extension's sources")
    except (OSError, subprocess.SubprocessError) as exc:
        raise StepFailed("env", f"cannot give the build copy git's list of the extension's "
                                f"files ({exc})") from None
    note(f"the build copy tracks the {len(files)} files git tracks in the extension's tree "
         "(setuptools-scm takes package data from them)")
    return tracked


def dynamic_build_requirements(ext_dir: Path, python: Path, env: dict[str, str]) -> list[str]:
    """What the build backend asks for beyond [build-system] requires, minus torch.

    A build without isolation never asks: scikit-build-core's cmake and ninja, or
    meson-python's, would be missing. setuptools' answer is only `wheel`, and asking
    costs a run of setup.py (a torch import): it is not asked."""
    system = build_system(ext_dir)
    if system["build-backend"].startswith("setuptools."):
        return []
    caller = BuildBackendHookCaller(str(ext_dir), system["build-backend"],
                                    backend_path=system["backend-path"],
                                    runner=_runner_with(env), python_executable=str(python))
    asked = caller.get_requires_for_build_wheel()
    return [r for r in asked if canonicalize_name(Requirement(r).name) not in CELL_PINNED]


def _runner_with(env: dict[str, str]):
    def run(cmd, cwd=None, extra_environ=None):
        quiet_subprocess_runner(cmd, cwd=cwd, extra_environ={**env, **(extra_environ or {})})

    return run


def check_tree(ext_dir: Path) -> None:
    """Refuse a source tree that cannot be copied faithfully into a cell: a dangling
    symlink, or one that leads out of the extension (the copy would not carry what
    it points at, and a container would not see it)."""
    root = ext_dir.resolve()
    for folder, dirs, files in os.walk(ext_dir):
        dirs[:] = [d for d in dirs if not skipped(Path(folder, d).relative_to(ext_dir))]
        for name in [*dirs, *files]:
            path = Path(folder) / name
            if not path.is_symlink():
                continue
            shown = path.relative_to(ext_dir.parent) if ext_dir.parent in path.parents else path
            target = os.readlink(path)
            if not path.exists():
                raise UserError(str(shown), f"dangling symlink (-> {target})",
                                "remove it or point it at a file inside the extension")
            if not path.resolve().is_relative_to(root):
                raise UserError(str(shown), f"symlink leads outside the extension (-> {target})",
                                "copy the file into the extension instead")
