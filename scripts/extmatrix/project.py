"""The extension project under build, as the engine needs to know it, whoever wrote it."""

from __future__ import annotations

import ast
import configparser
import fnmatch
import json
import os
import shutil
import subprocess
import tomllib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path, PurePosixPath

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version
from pyproject_hooks import BuildBackendHookCaller, quiet_subprocess_runner

from .errors import StepFailed, UserError
from .steps import first_cause
from .workspace import places_in, skipped

BUILD_TOOLS = ["pip", "ninja"]  # beside the extension's own [build-system] requires
# The cell pins these itself: the extension's own pin would fight the cell's.
CELL_PINNED = {"torch"}


LEGACY_BACKEND = "setuptools.build_meta:__legacy__"  # what pip uses without [build-system]


def pyproject_data(ext_dir: Path) -> dict:
    """The extension's pyproject.toml, parsed; {} where it has none."""
    pyproject = ext_dir / "pyproject.toml"
    if not pyproject.is_file():
        return {}
    try:
        return tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UserError(str(pyproject), f"cannot read ({exc})",
                        "fix the file so that pip can build the project") from None


def pyproject_table(ext_dir: Path, *keys: str) -> dict:
    """A table of the extension's pyproject.toml ({} where it has none); a value of another
    type where a table belongs is the user's mistake, said in one line."""
    table: object = pyproject_data(ext_dir)
    for depth, key in enumerate(keys):
        table = table.get(key, {})
        if not isinstance(table, dict):
            name = ".".join(keys[: depth + 1])
            raise UserError(str(ext_dir / "pyproject.toml"), f"{name} is not a table",
                            f"write it as [{name}]")
    return table


def pyproject_value(ext_dir: Path, keys: tuple[str, ...], kind: type, default: object) -> object:
    """A value of the extension's pyproject.toml, checked to be of `kind`."""
    value = pyproject_table(ext_dir, *keys[:-1]).get(keys[-1], default)
    if not isinstance(value, kind):
        raise UserError(str(ext_dir / "pyproject.toml"),
                        f"{'.'.join(keys)} is {type(value).__name__}",
                        f"write a {kind.__name__} (see its tool's documentation)")
    return value


def build_system(ext_dir: Path) -> dict:
    """[build-system] of the extension's pyproject.toml, with PEP 517's defaults."""
    requires = pyproject_value(ext_dir, ("build-system", "requires"), list, ["setuptools", "wheel"])
    if not all(isinstance(r, str) for r in requires):
        raise UserError(str(ext_dir / "pyproject.toml"), "[build-system] requires holds a "
                        "value that is not a string", "write PEP 508 requirements")
    return {"requires": requires,
            "build-backend": pyproject_value(ext_dir, ("build-system", "build-backend"), str,
                                             LEGACY_BACKEND),
            "backend-path": pyproject_table(ext_dir, "build-system").get("backend-path")}


def build_requirements(ext_dir: Path) -> list[str]:
    """The extension's [build-system] requires, minus torch (the cell pins it)."""
    pyproject = ext_dir / "pyproject.toml"
    requires = build_system(ext_dir)["requires"]
    wanted = []
    for text in requires:
        try:
            name = canonicalize_name(Requirement(text).name)
        except InvalidRequirement as exc:
            why = str(exc).splitlines()[0]  # packaging draws a caret under the text below
            raise UserError(str(pyproject), f"[build-system] requires: {text!r}: {why}",
                            "write PEP 508 requirements") from None
        if name not in CELL_PINNED:
            wanted.append(text)
    return list(dict.fromkeys([*wanted, *BUILD_TOOLS]))


# Version plugins that ask git for the version: setuptools-scm, and hatch-vcs over it.
GIT_VERSIONED_BY = {"setuptools-scm", "hatch-vcs"}
# scikit-build-core's version provider that asks setuptools-scm (others read the tree).
SKBUILD_SCM_PROVIDER = "scikit_build_core.metadata.setuptools_scm"
PRETEND_VERSION = "SETUPTOOLS_SCM_PRETEND_VERSION"


def versioned_by_git(ext_dir: Path) -> bool:
    """Whether the extension's build may ask git for its version: a [build-system] require,
    or scikit-build-core's setuptools-scm provider (which adds setuptools-scm itself)."""
    if _skbuild_version_provider(ext_dir) == SKBUILD_SCM_PROVIDER:
        return True
    requires = build_system(ext_dir)["requires"]
    try:
        return any(canonicalize_name(Requirement(r).name) in GIT_VERSIONED_BY for r in requires)
    except InvalidRequirement:
        return False  # build_requirements() says what is wrong, where it matters


def _skbuild_version_provider(ext_dir: Path) -> object:
    return pyproject_table(ext_dir, "tool", "scikit-build", "metadata", "version").get("provider")


# setuptools-scm asked with explicit settings (hatch-vcs's, or setup.py's use_scm_version).
GET_VERSION_SCRIPT = ("import json, sys, setuptools_scm; "
                      "print(setuptools_scm.get_version(**json.loads(sys.argv[1])))")
# setup.py's settings over [tool.setuptools_scm], merged as setuptools-scm merges them
# for a build: get_version() takes neither that table's newer keys (write_to_source,
# tag.regex) nor the project's folder, which Configuration.from_file does.
OVER_TABLE_SCRIPT = (
    "import json, sys, setuptools_scm as scm; "
    "config = scm.Configuration.from_file('pyproject.toml', **json.loads(sys.argv[1])); "
    "print(scm._get_version(config, force_write_version_files=False))")
# setuptools-scm settings that name files (to write, or to find the root from), not how
# the version is formed: the query runs in the extension's folder and writes nothing.
SCM_PATH_SETTINGS = {"relative_to", "write_to", "write_to_template", "version_file",
                     "version_file_template"}


def _hatch_vcs_settings(ext_dir: Path) -> dict | None:
    """[tool.hatch.version] with source = "vcs", as setuptools-scm keyword arguments."""
    table = pyproject_table(ext_dir, "tool", "hatch", "version")
    if table.get("source") != "vcs":
        return None
    settings: dict = {"root": "."}
    if "tag-pattern" in table:
        settings["tag_regex"] = table["tag-pattern"]
    if "fallback-version" in table:
        settings["fallback_version"] = table["fallback-version"]
    # Less the settings that name files: hatch-vcs drops write_to itself, and
    # get_version() would write a version file into the user's tree.
    raw = pyproject_table(ext_dir, "tool", "hatch", "version", "raw-options")
    settings.update({k: v for k, v in raw.items() if k not in SCM_PATH_SETTINGS})
    return settings


def _setup_py_scm_settings(ext_dir: Path) -> tuple[dict | None, bool]:
    """setup.py's use_scm_version settings where it spells them out ({} for True), and
    whether it computes them instead (a name, a call, a dict handed on as **kwargs, one
    of several setup() calls): only a single literal can be read without running
    setup.py. (None, False) where it passes none."""
    try:
        tree = ast.parse((ext_dir / "setup.py").read_bytes())
    except (OSError, SyntaxError, ValueError, MemoryError, RecursionError):  # too deep to parse
        return None, False
    given = []  # use_scm_version=..., and {"use_scm_version": ...} to be passed on
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            given += [k.value for k in node.keywords if k.arg == "use_scm_version"]
        elif isinstance(node, ast.Dict):
            given += [v for k, v in zip(node.keys, node.values, strict=True)
                      if isinstance(k, ast.Constant) and k.value == "use_scm_version"]
    if not given:
        return None, False
    value = given[0]
    if len(given) > 1 or not isinstance(value, ast.Constant | ast.Dict):
        return None, True
    if isinstance(value, ast.Constant):
        return ({} if value.value else None), False
    settings = {}
    for key_node, value_node in zip(value.keys, value.values, strict=True):
        key = key_node.value if isinstance(key_node, ast.Constant) else None
        if not isinstance(key, str):
            return None, True  # (a ** inside the dict, or a computed key)
        if key in SCM_PATH_SETTINGS:
            continue  # relative_to=__file__: the folder the query runs in
        try:
            settings[key] = ast.literal_eval(value_node)
        except ValueError:
            return None, True
    return settings, False


# The tables setuptools-scm takes its settings from (10 reads vcs-versioning's too).
SCM_TABLES = ("setuptools_scm", "vcs-versioning")


def _scm_table(ext_dir: Path) -> dict | None:
    """The project's setuptools-scm settings table, None where it has none."""
    tool = pyproject_table(ext_dir, "tool")
    return next((pyproject_table(ext_dir, "tool", name) for name in SCM_TABLES if name in tool),
                None)


def _version_from_git(ext_dir: Path) -> bool:
    """Whether the wheel's version must be git's (check_version_taken)."""
    return _version_source(ext_dir) == "git"


def _version_source(ext_dir: Path) -> str:
    """Where the build takes its version: "git", "stated" (the project's files), or
    "unknown" (a backend not judged here). git_version_env hands git's version to every
    build that may ask; check_version_taken holds the wheel to it only for "git", and a
    "stated" build gets no plain variable (it would reach the build's requirements).

    A version the project states is the one it builds, even beside setuptools-scm's
    settings: [project] version (hatchling, too, reads it before asking hatch-vcs) and,
    with setuptools, [tool.setuptools.dynamic]'s, setup.cfg's (all but attr:, which
    setuptools-scm overrides) or any setup(version=...). Otherwise setuptools' plugin
    infers one only where asked: a settings table, setup.py's use_scm_version, or
    setuptools-scm's [simple] extra; hatch-vcs and scikit-build-core's provider always
    ask."""
    if "version" in pyproject_table(ext_dir, "project"):
        return "stated"
    if _hatch_vcs_settings(ext_dir) is not None:
        return "git"
    dynamic = pyproject_value(ext_dir, ("project", "dynamic"), list, [])
    backend = build_system(ext_dir)["build-backend"]
    if backend.startswith("scikit_build_core.setuptools"):
        backend = "setuptools.build_meta"  # its setuptools wrapper: setuptools' rules
    if backend.startswith("scikit_build_core"):
        provider = _skbuild_version_provider(ext_dir)
        return ("git" if provider == SKBUILD_SCM_PROVIDER and "version" in dynamic
                else "stated" if provider is not None else "unknown")
    if not backend.startswith("setuptools.build_meta"):
        return "unknown"
    if _stated_by_setuptools(ext_dir):
        return "stated"
    if _scm_table(ext_dir) is not None or _setup_py_scm_settings(ext_dir) != (None, False):
        return "git"
    wanted = _scm_requirement(ext_dir)  # [simple]: setuptools-scm 10's switch with no table
    return "git" if wanted is not None and "simple" in wanted.extras and "version" in dynamic \
        else "unknown"


def _stated_by_setuptools(ext_dir: Path) -> bool:
    """Whether setuptools' own settings state the version: [tool.setuptools.dynamic],
    setup.cfg's [metadata] version (but attr:), or setup(version=...), literal or not."""
    if "version" in pyproject_table(ext_dir, "tool", "setuptools", "dynamic"):
        return True
    stated = setup_cfg_value(ext_dir, "version")
    if stated and not stated.startswith("attr:"):
        return True
    return _setup_passes(ext_dir, "version")


def setup_cfg_value(ext_dir: Path, key: str, section: str = "metadata") -> str:
    """setup.cfg's [metadata] (or other `section`) `key`, "" where it has none (or cannot be
    read)."""
    setup_cfg = configparser.ConfigParser(interpolation=None)
    try:
        setup_cfg.read(ext_dir / "setup.cfg", encoding="utf-8")
        return setup_cfg.get(section, key, fallback="").strip()
    except (configparser.Error, UnicodeDecodeError):
        return ""


# A value setup.py computes: it cannot be read without running setup.py.
SETUP_UNKNOWN = object()


def setup_py(ext_dir: Path) -> tuple[ast.Module, dict[str, object]] | None:
    """setup.py's syntax tree, with its constants: the names assigned a literal once, at
    the top level (PACKAGE_NAME = "my-ops"), and nowhere else."""
    try:
        tree = ast.parse((ext_dir / "setup.py").read_bytes())
    except (OSError, SyntaxError, ValueError, MemoryError, RecursionError):  # too deep to parse
        return None
    assigned: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            assigned[node.id] = assigned.get(node.id, 0) + 1
        elif isinstance(node, ast.alias):  # an import binds a name too
            bound = (node.asname or node.name).split(".")[0]
            assigned[bound] = assigned.get(bound, 0) + 1
    constants = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(target := node.targets[0], ast.Name)
                and assigned[target.id] == 1
                and (value := setup_literal(node.value, {})) is not SETUP_UNKNOWN):
            constants[target.id] = value
    return tree, constants


def setup_literal(node: ast.expr, constants: dict[str, object]) -> object:
    """The value of a literal, or of a name of setup.py's constants; SETUP_UNKNOWN otherwise."""
    if isinstance(node, ast.Name):
        return constants.get(node.id, SETUP_UNKNOWN)
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return SETUP_UNKNOWN


def _callee(call: ast.Call) -> str:
    return getattr(call.func, "id", None) or getattr(call.func, "attr", None) or ""


def setup_calls(ext_dir: Path, callees: tuple[str, ...]
                ) -> tuple[list[ast.Call], dict[str, object]]:
    """setup.py's calls of a callee whose name (in lower case) matches one of `callees`,
    with setup.py's constants."""
    if (parsed := setup_py(ext_dir)) is None:
        return [], {}
    tree, constants = parsed
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and any(fnmatch.fnmatchcase(_callee(node).lower(), c) for c in callees)], constants


def setup_arguments(ext_dir: Path, callees: tuple[str, ...], keyword: str) -> list[object]:
    """The values setup.py passes as `keyword` to those calls (SETUP_UNKNOWN for a computed
    one)."""
    calls, constants = setup_calls(ext_dir, callees)
    return [setup_literal(k.value, constants) for call in calls for k in call.keywords
            if k.arg == keyword]


def _setup_passes(ext_dir: Path, keyword: str) -> bool:
    return any(k.arg == keyword for call in setup_calls(ext_dir, ("setup",))[0]
               for k in call.keywords)


def _setup_keyword(ext_dir: Path, keyword: str) -> str | None:
    """A literal string setup.py passes setup() as `keyword`, where it passes one."""
    found = {k.value.value for call in setup_calls(ext_dir, ("setup",))[0]
             for k in call.keywords if k.arg == keyword and isinstance(k.value, ast.Constant)}
    value = found.pop() if len(found) == 1 else None
    return value if isinstance(value, str) else None


def _scm_requirement(ext_dir: Path) -> Requirement | None:
    """The extension's [build-system] requirement of setuptools-scm, if any."""
    for text in build_system(ext_dir)["requires"]:
        try:
            wanted = Requirement(text)
        except InvalidRequirement:
            continue
        if canonicalize_name(wanted.name) == "setuptools-scm":
            return wanted
    return None


def static_name(ext_dir: Path) -> str | None:
    """The distribution's name where a file states it: [project] name, setup.cfg's, or a
    literal setup(name="...") in setup.py."""
    if isinstance(name := pyproject_table(ext_dir, "project").get("name"), str):
        return name
    return setup_cfg_value(ext_dir, "name") or _setup_keyword(ext_dir, "name")


def static_requires_python(ext_dir: Path) -> tuple[str, str] | None:
    """The Pythons the project accepts where a file states them, with that file's name:
    [project] requires-python, setup.cfg's python_requires, or a literal one in setup.py."""
    if isinstance(text := pyproject_table(ext_dir, "project").get("requires-python"), str):
        return text, "pyproject.toml"
    if text := setup_cfg_value(ext_dir, "python_requires", section="options"):
        return text, "setup.cfg"
    if text := _setup_keyword(ext_dir, "python_requires"):
        return text, "setup.py"
    return None


def accepts_python(specifier: SpecifierSet, python: str) -> bool:
    """Whether a requires-python takes CPython X.Y (3.13t as 3.13)."""
    # pip compares the interpreter's full version, and a runner has each minor's newest
    # patch: a high one stands for it (>=3.10.2 takes 3.10; <=3.12 only 3.12.0).
    return specifier.contains(f"{python.rstrip('t')}.99")


def requires_python(ext_dir: Path) -> tuple[SpecifierSet, str]:
    """The project's requires-python (SpecifierSet() takes every Python) and the file
    stating it ('' where none does)."""
    stated = static_requires_python(ext_dir)
    if stated is None:
        return SpecifierSet(), ""
    text, stated_in = stated
    try:
        return SpecifierSet(text), str(ext_dir / stated_in)
    except InvalidSpecifier:
        raise UserError(str(ext_dir / stated_in), f"requires-python '{text}' is not a "
                        "version specifier", "write one such as '>=3.10'") from None


def not_ignored(repo: Path, paths: list[str]) -> list[str]:
    """Those of `paths` (relative to repo; a folder ends in /) that git would not ignore;
    none where repo is no git work tree, or git cannot say."""
    done = _git(repo, "check-ignore", "-z", "--stdin",
                feed=b"".join(p.encode() + b"\0" for p in paths))
    if done.returncode not in (0, 1):  # 1: none ignored
        return []
    ignored = set(done.stdout.decode(errors="replace").split("\0"))
    return [p for p in paths if p not in ignored]


def committed_files(ext_dir: Path) -> list[str] | None:
    """The files (posix, relative to ext_dir) that the repository holds or would commit:
    tracked ones, submodules' included, and untracked ones git does not ignore. None where
    ext_dir is no git work tree or git cannot say."""
    tracked = _git(ext_dir, "ls-files", "-z", "--cached", "--recurse-submodules")
    untracked = _git(ext_dir, "ls-files", "-z", "--others", "--exclude-standard")
    if tracked.returncode or untracked.returncode:
        return None
    return sorted({os.fsdecode(p) for p in (tracked.stdout + b"\0" + untracked.stdout).split(b"\0")
                   if p})


def _named_key(name: str) -> str:
    """..._FOR_<NAME>, the name normalized as setuptools-scm 8 and later normalize it."""
    return f"{PRETEND_VERSION}_FOR_{canonicalize_name(name).replace('-', '_').upper()}"


def _named_pretend_read(ext_dir: Path, build_python: Path | None) -> bool:
    """Whether the build's setuptools-scm reads ..._FOR_<NAME> as pretend_version_key
    writes it: from 8 on (before, the name was not normalized: SCM-OPS, not SCM_OPS).
    Asked of the build environment where there is one here (build_python); else read from
    the extension's requirement, which must exclude every release before 8."""
    if build_python is not None:
        asked = subprocess.run([str(build_python), "-c", "import importlib.metadata as m; "
                                "print(m.version('setuptools-scm'))"],
                               capture_output=True, text=True, timeout=120, check=False)
        try:
            return Version(asked.stdout.strip()) >= Version("8")
        except InvalidVersion:
            return False
    wanted = _scm_requirement(ext_dir)
    return wanted is not None and not wanted.specifier.contains("7.999", prereleases=True)


def pretend_version_key(ext_dir: Path, build_python: Path | None = None) -> str:
    """The variable that hands the version to this extension's build alone.

    The plain SETUPTOOLS_SCM_PRETEND_VERSION reaches every project setuptools-scm
    versions in the build, a build requirement built from its sdist included, which then
    gets the extension's version and fails pip's check of it. setuptools-scm also reads
    ..._FOR_<NAME> (its dist_name, or the project's name). hatch-vcs asks setuptools-scm
    with no name unless its raw-options give a dist_name; a name that only setup.py
    computes cannot be known; setuptools-scm before 8 reads the name unnormalized: those
    keep the plain one. check_version_taken catches a build that read neither."""
    hatch = _hatch_vcs_settings(ext_dir)
    if hatch is not None:
        name = hatch.get("dist_name")
    else:
        name = (_scm_table(ext_dir) or {}).get("dist_name") or static_name(ext_dir)
    if not isinstance(name, str) or not _named_pretend_read(ext_dir, build_python):
        return PRETEND_VERSION
    return _named_key(name)


def copy_commit(copy: Path) -> str | None:
    """The commit of the build copy's own repository, whose top is `copy` (the folder
    build_tree was given), if it has one."""
    done = _git(copy, "rev-parse", "HEAD", own=True)
    return done.stdout.decode().strip() if done.returncode == 0 else None


def check_version_taken(wheel: Path, handed: Mapping[str, str], ext_dir: Path,
                        copy: Path | None = None) -> None:
    """Fail where the build did not take the version handed to it (git_version_env): a
    setuptools-scm that reads no variable of that name versions the copy's repository,
    0.1.dev1, without a word. A project that states its version (_version_from_git) may
    build another, but never one of the copy's commit (its +g<hash> label)."""
    built = parse_wheel_filename(wheel.name)[1]
    commit = copy_commit(copy) if copy is not None else None
    if commit and any(part.startswith("g") and len(part) >= 8 and commit.startswith(part[1:])
                      for part in (built.local or "").split(".")):
        raise StepFailed("compile", f"the build made version {built} from the build copy's own "
                         "repository: its setuptools-scm took no version handed to it "
                         f"({', '.join(handed) or 'none was'}); state the project's name in "
                         f"pyproject.toml or setup.cfg, or set {PRETEND_VERSION}")
    checked = _version_from_git(ext_dir)
    for key, given in handed.items():
        try:
            wanted = Version(given)
        except InvalidVersion:
            continue  # the user's own, which setuptools-scm judges
        if built.public != wanted.public and checked:
            # A variable named for a project, set here, that the build may have read first
            # (a name setup.py computes cannot be matched to it).
            named = sorted(k for k in os.environ
                           if k.startswith(f"{PRETEND_VERSION}_FOR_") and k not in handed)
            cause = (f"{', '.join(f'{k}={os.environ[k]!r}' for k in named)}, set here, may be "
                     "what it read: unset it, or state the project's name in pyproject.toml "
                     "or setup.cfg" if named else
                     f"set {PRETEND_VERSION} to the version wanted to override")
            raise StepFailed("compile", f"the build made version {built}, not {wanted} as git "
                             f"gives it, handed to it as {key}: its setuptools-scm did not "
                             f"read that variable; {cause}")


def _why(stderr: str | bytes) -> str:
    """What a failed tool said, as the engine reports any failed command's cause."""
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
    return first_cause(text) or "no message"


def _without_git_variables(env: Mapping[str, str]) -> dict[str, str]:
    """Git sets GIT_DIR, GIT_INDEX_FILE and the like for its hooks: an engine run from a
    hook must neither read nor write the user's repository through them."""
    return {k: v for k, v in env.items() if not k.startswith("GIT_")}


OWN_COMMIT_DATE = "2000-01-01T00:00:00+0000"


def _git(where: Path, *args: str, feed: bytes | None = None,
         own: bool = False) -> subprocess.CompletedProcess:
    """git on the extension's tree (read only) or, `own`, on the copy's repository."""
    env = _without_git_variables(os.environ)
    if own:  # ours: no configuration, hook or signing of the user's takes part
        env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1",
                   # The same files make the same commit on every run: the version
                   # setuptools-scm gives the copy (+g<commit>), and check_version_taken's
                   # view of a reused wheel, stay the same.
                   GIT_AUTHOR_DATE=OWN_COMMIT_DATE, GIT_COMMITTER_DATE=OWN_COMMIT_DATE)
        cmd = ["git", f"--git-dir={where / '.git'}", f"--work-tree={where}"]
    else:  # the user's, whose owner may not be us (a CI checkout, a container)
        cmd = ["git", "-c", "safe.directory=*", "-C", str(where)]
    try:
        return subprocess.run([*cmd, *args], input=feed, env=env, capture_output=True,
                              timeout=600)
    except (OSError, subprocess.SubprocessError) as exc:  # no git here, or it hung
        return subprocess.CompletedProcess(cmd, 127, b"", str(exc).encode())


def git_version_env(ext_dir: Path, python: Path, env: dict[str, str], in_git: bool,
                    note: Callable[[str], None] = lambda line: None,
                    builds_here: bool = True) -> dict[str, str]:
    """The version git gives the extension's tree, for a build from a copy of it.

    The copy's git repository (mirror_tracked_files) has the tree's files, not its
    history or tags. setuptools-scm is asked in the tree itself, with the project's
    settings ([tool.setuptools_scm], setup.py's use_scm_version where it spells them
    out, or hatch-vcs's [tool.hatch.version]), and its answer
    is handed to the build (pretend_version_key), less the local label
    (+g1a2b3c4): the cell adds its own. A version the user set in the variable is handed
    on as it is (a container sees only what it is given). Nothing is set where the
    project does not take its version from git, or outside a git tree (an sdist: its
    PKG-INFO says); inside one, no answer fails the build, naming setuptools-scm's reason,
    where the copy's own repository would give a wrong version without a word."""
    if not versioned_by_git(ext_dir):
        return {}
    source = _version_source(ext_dir)
    checked = source == "git"
    key = pretend_version_key(ext_dir, python if builds_here else None)
    # setuptools-scm reads the first of these that is set, and an empty one as no
    # version at all (an unfilled CI input): git's is then handed on under `key`, which
    # replaces it.
    for given_key in dict.fromkeys((key, PRETEND_VERSION)):
        given = env.get(given_key, os.environ.get(given_key))
        if given:
            note(f"version: {given_key}={given}, as set")
            return {given_key: given}
        if given is not None:
            break
    if not in_git:
        return {}
    if source == "stated" and key == PRETEND_VERSION:
        # The plain variable reaches every project setuptools-scm versions in the build (a
        # requirement built from its sdist too): not for a build that states its version.
        return {}
    ask = [str(python), "-m", "setuptools_scm"]
    if (hatch := _hatch_vcs_settings(ext_dir)) is not None:
        ask = [str(python), "-c", GET_VERSION_SCRIPT, json.dumps(hatch, default=str)]
    else:
        from_setup_py, computed = _setup_py_scm_settings(ext_dir)
        if from_setup_py and _scm_table(ext_dir) is not None:
            ask = [str(python), "-c", OVER_TABLE_SCRIPT, json.dumps(from_setup_py)]
        elif from_setup_py:
            ask = [str(python), "-c", GET_VERSION_SCRIPT,
                   json.dumps({"root": ".", **from_setup_py})]
        elif computed:
            note("version: setup.py computes its use_scm_version settings, which cannot be "
                 "read without running it; setuptools-scm is asked with pyproject.toml's")
    try:
        asked = subprocess.run(ask, cwd=ext_dir, env=_without_git_variables({**os.environ, **env}),
                               capture_output=True, text=True, timeout=300)
        reason = _why(asked.stderr)
        version = Version(asked.stdout.split()[-1]) if asked.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, IndexError, InvalidVersion) as exc:
        version, reason = None, str(exc)
    if version is None and not checked:  # the project states its version: nothing to hand
        note(f"version: setuptools-scm gives none in the tree ({reason}); the build's own")
        return {}
    if version is None:
        raise StepFailed("env", f"setuptools-scm gives no version in {ext_dir}: {reason}")
    note(f"version from git: {version.public} (setuptools-scm in the extension's tree; the "
         f"cell adds its own local label), as {key}")
    return {key: version.public}


def folder_in_repository(ext_dir: Path) -> PurePosixPath:
    """Where a git-versioned extension lies in its git repository (PurePosixPath() at
    its top, outside git, or for a project not versioned by git).

    A project in a subfolder tells setuptools-scm where the repository is (root = "..",
    or use_scm_version's root). Its build copy sits as deep in a folder of the build's
    own (build_tree), which mirror_tracked_files makes the repository, so that the root
    finds that repository and not whatever holds the build folder: setuptools-scm 10
    lists package data from the repository the root names, and the tree's files were
    missing from the wheel."""
    if not versioned_by_git(ext_dir):
        return PurePosixPath()
    asked = _git(ext_dir, "rev-parse", "--show-prefix")
    if asked.returncode:
        return PurePosixPath()
    return PurePosixPath(os.fsdecode(asked.stdout.strip()))


def build_tree(top: Path, ext_dir: Path) -> tuple[Path, PurePosixPath]:
    """The extension's copy under a build folder `top`, and where it lies in `top`
    (folder_in_repository). What else `top` holds (a copy of an earlier layout) goes:
    cibuildwheel copies all of `top` into the container."""
    inside = folder_in_repository(ext_dir)
    if inside.parts and top.is_dir():
        for entry in top.iterdir():
            if entry.name not in (".git", inside.parts[0]):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
    return top.joinpath(*inside.parts), inside


def mirror_tracked_files(ext_dir: Path, copy: Path,
                         note: Callable[[str], None] = lambda line: None) -> bytes:
    """Make the copy a git repository that tracks what git tracks in the tree; returns
    the list as recorded there (NUL-separated paths, below the copy's folder in that
    repository), b"" where nothing was done.

    The repository is made at the copy's folder as many levels up as the extension lies
    below its own repository's top (build_tree), with the same paths.

    For an extension versioned by git, setuptools-scm also decides package data: with
    include_package_data (on by default under pyproject.toml), every file git tracks in
    a package ships in the wheel (a JIT extension's .cu sources, headers, data). In a
    copy without .git they were left out, silently. The copy's repository holds one
    commit of exactly those files, submodules left out as setuptools-scm's own listing
    (git archive) leaves them; export-ignore in .gitattributes still applies."""
    inside = folder_in_repository(ext_dir)
    top = copy
    for _ in inside.parts:
        top = top.parent
    ours = top / ".git"
    if not versioned_by_git(ext_dir):
        shutil.rmtree(ours, ignore_errors=True)  # a repository of an earlier build's
        return b""
    listed = _git(ext_dir, "ls-files", "-z", "--stage")
    files = set()
    for entry in listed.stdout.split(b"\0") if listed.returncode == 0 else []:
        mode, _, path = entry.partition(b"\t")
        if path and not mode.startswith(b"160000") and os.path.lexists(copy / os.fsdecode(path)):
            files.add(path)
    if not files:
        # No repository of ours, then: an unpacked sdist's PKG-INFO must keep the version.
        shutil.rmtree(ours, ignore_errors=True)
        why = (f"git cannot list them ({_why(listed.stderr)})" if listed.returncode
               else "git tracks none of them")
        note(f"the extension's files: {why}; its package data is what MANIFEST.in and the "
             "build's own settings say")
        return b""
    prefix = os.fsencode(inside.as_posix()) + b"/" if inside.parts else b""
    recorded = b"\0".join(prefix + path for path in sorted(files))

    def record() -> subprocess.CompletedProcess:
        steps = [] if ours.is_dir() else [(("init", "-q", "--template="), None)]
        steps += [(("read-tree", "--empty"), None),
                  # Literal paths (no pathspec magic in a name), fast on big trees.
                  (("update-index", "--add", "-z", "--stdin"), recorded),
                  # A root commit each time: with the fixed dates (_git), the same files
                  # make the same commit on every run.
                  (("update-ref", "-d", "HEAD"), None),
                  (("-c", "user.name=extmatrix", "-c", "user.email=extmatrix@localhost",
                    "commit", "-q", "--allow-empty", "--no-verify", "-m",
                    "the extension's sources"), None)]
        for args, feed in steps:
            done = _git(top, *args, feed=feed, own=True)
            if done.returncode:
                break
        return done

    if (done := record()).returncode:
        # A repository an interrupted build left half written (index.lock): once afresh.
        shutil.rmtree(ours, ignore_errors=True)
        if (done := record()).returncode:
            raise StepFailed("env", "git cannot record the extension's files in the build "
                                    f"copy: {_why(done.stderr)}")
    note(f"the build copy tracks the {len(files)} files git tracks in the extension's tree "
         "(setuptools-scm takes package data from them)")
    return recorded


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


def check_tree(ext_dir: Path, leave_out: Iterable[Path] = ()) -> None:
    """Refuse a source tree that cannot be copied faithfully into a cell: a dangling
    symlink, or one that leads out of the extension (the copy would not carry what
    it points at, and a container would not see it). What `leave_out` names (the engine's
    folders, the matrix: backends.not_sources) is no part of the copy, nor of the check."""
    root = ext_dir.resolve()
    out = places_in(ext_dir, leave_out)
    for folder, dirs, files in os.walk(ext_dir):
        rel = Path(folder).relative_to(ext_dir)
        dirs[:] = [d for d in dirs if not skipped(rel / d) and rel / d not in out]
        for name in [*dirs, *files]:
            path = Path(folder) / name
            if not path.is_symlink() or rel / name in out:
                continue
            shown = path.relative_to(ext_dir.parent) if ext_dir.parent in path.parents else path
            target = os.readlink(path)
            if not path.exists():
                raise UserError(str(shown), f"dangling symlink (-> {target})",
                                "remove it or point it at a file inside the extension")
            if not path.resolve().is_relative_to(root):
                raise UserError(str(shown), f"symlink leads outside the extension (-> {target})",
                                "copy the file into the extension instead")
