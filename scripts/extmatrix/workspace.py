"""A cell's results folder, dist/<cell>/: one writer at a time; a good wheel is replaced
only by a newer good one.

Each build is an *attempt* staged in dist/.staging/<cell>/<attempt>/. Publishing
swaps the staged folder in as dist/<cell>/ in one atomic exchange (renameat2), so
there is never a moment without a dist/<cell>/. An attempt that did not produce a
good wheel (failed, not buildable, interrupted, crashed) still publishes its
report and log, and carries the last good wheel forward with `last-good.json`, the
report of the build that made it.

Both backends build through `attempt()`; `claim()` alone guards a test run.
"""

from __future__ import annotations

import configparser
import ctypes
import errno
import json
import os
import secrets
import shutil
import sys
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from filelock import FileLock, Timeout

from .errors import Interrupted, StepFailed, UserError, describe_os_error
from .steps import cancelled

LAST_GOOD = "last-good.json"
# What test-matrix writes beside the wheel it tested: a failed build carries them forward
# with the last good wheel (the tests always run on that wheel).
KEPT_TEST_RECORDS = ("test.log", "junit*.xml", "test-facts.json")
REPORT = "report.json"
# A wheel the checks refused, kept for a look but out of the cell's *.whl: the last good
# wheel beside it stays the only one there.
REJECTED = "rejected"
# Not the extension's sources. Build products live in a cell's copy of the sources and
# must survive syncs: they keep rebuilds warm. build/ and dist/ are build products only
# at the extension's top: deeper, a folder of that name is a package of the extension's
# own (a `dist` subpackage of distributed ops, say) and is copied like any other.
# .extmatrix: the engine's default work folder, beside a matrix that may sit in the extension
# (engine_folders leaves out any other place of it by path).
SKIP_ANYWHERE = {"__pycache__", ".pytest_cache", ".git", ".nox", ".tox", ".venv", ".extmatrix"}
SKIP_AT_TOP = {"build", "dist"}


def say_on_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Attempt:
    id: str  # UTC start time and a random suffix: sortable, unique across machines
    staging: Path
    final: Path  # dist/<cell>/


def new_attempt_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


@contextmanager
def claim(cell_id: str, dist: Path, work: Path,
          say: Callable[[str], None] = say_on_stderr) -> Iterator[None]:
    """Hold the cell's locks (its work folder and its results folder) for a build or test.

    A second extmatrix on the same cell waits, saying so once; other cells go on. Ctrl-C
    or SIGTERM ends the wait (Interrupted) with nothing of the cell touched."""
    # Resolved: one folder named two ways must not be locked twice (a wait on ourselves).
    locks = [(folder / ".locks" / f"{cell_id}.lock").resolve() for folder in (work, dist)]
    held: list[FileLock] = []
    try:
        for path in dict.fromkeys(locks):
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = FileLock(path)
            try:
                lock.acquire(timeout=0)
            except Timeout:
                say(f"{cell_id}: another extmatrix is building or testing this cell; "
                    f"waiting for it to finish (lock {path})")
                _wait_for(lock)
            held.append(lock)
        yield
    finally:
        for lock in reversed(held):
            lock.release()


def _wait_for(lock: FileLock) -> None:
    """Acquire `lock`, however long the other run takes, unless the run is stopped: the
    wait runs in a worker thread, which a Ctrl-C in the main thread does not reach."""
    while True:
        if cancelled():
            raise Interrupted("stopped while waiting for another extmatrix on the cell")
        try:
            lock.acquire(timeout=0.2)
            return
        except Timeout:
            continue


def begin(cell_id: str, dist: Path) -> Attempt:
    """A fresh staging folder for an attempt; leftovers of killed attempts go first."""
    final = dist / cell_id
    check_results(final)
    root = dist / ".staging" / cell_id
    shutil.rmtree(root, ignore_errors=True)  # we hold the lock: nothing in there is alive
    attempt_id = new_attempt_id()
    staging = root / attempt_id
    staging.mkdir(parents=True)
    return Attempt(attempt_id, staging, final)


def check_results(final: Path) -> None:
    """Refuse a cell's results folder that an attempt could not replace safely."""
    if final.exists() and not final.is_dir():  # the swap would put it where staging is deleted
        raise UserError(str(final), "a file stands where the cell's results go",
                        "move it away and build again")
    _check_record(final / LAST_GOOD)


def _check_record(path: Path) -> None:
    """Refuse to start on a last-good record that cannot be read: a failed build would then
    not know which wheel to carry forward."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:
        why = describe_os_error(exc) if isinstance(exc, OSError) else f"not JSON: {exc}"
        raise UserError(str(path), f"the record of the cell's last good build cannot be read "
                        f"({why})", "restore it, or move the cell's folder away to start "
                        "the cell afresh") from None
    if not isinstance(data, dict):
        raise UserError(str(path), "the record of the cell's last good build is not a JSON "
                        "object", "restore it, or move the cell's folder away to start the "
                        "cell afresh")


def last_good(final: Path) -> dict | None:
    """The report of the build that made the wheel now in dist/<cell>/, if any."""
    for name in (LAST_GOOD, REPORT):
        try:
            data = json.loads((final / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("build") == "built" and data.get("wheel") and (
                final / str(data["wheel"])).is_file():
            return data
    return None


def publish(attempt: Attempt, report_json: str, good: bool, kept: dict | None) -> None:
    """Swap the attempt in as dist/<cell>/.

    `report_json` is written as the attempt's report.json. A good attempt also
    writes it as last-good.json; any other carries `kept` (from `last_good`), the
    last good build's wheel and report, forward."""
    (attempt.staging / REPORT).write_text(report_json)
    if good:
        (attempt.staging / LAST_GOOD).write_text(report_json)
    elif attempt.final.is_dir():
        # Every wheel there, the last good one's and those no record accounts for (an
        # older release's, records deleted by hand): only a good build replaces a wheel.
        if kept is not None:
            (attempt.staging / LAST_GOOD).write_text(json.dumps(kept, indent=2) + "\n")
            # ... with the records of its tests, which last-good.json's verdict stands on.
            for pattern in KEPT_TEST_RECORDS:
                for record in attempt.final.glob(pattern):
                    if record.is_file() and not (attempt.staging / record.name).exists():
                        _link_or_copy(record, attempt.staging / record.name)
        for wheel in attempt.final.glob("*.whl"):
            if wheel.is_file():
                _link_or_copy(wheel, attempt.staging / wheel.name)
    swap_in(attempt.staging, attempt.final)
    shutil.rmtree(attempt.staging.parent, ignore_errors=True)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def swap_in(staged: Path, final: Path) -> None:
    """Make `staged` be `final`, atomically where the kernel can exchange two names.

    Afterwards the previous `final` (if any) sits at `staged`, for the caller to delete."""
    if not final.exists():
        os.replace(staged, final)
        return
    if _exchange(staged, final):
        return
    # No renameat2 (another OS, an old kernel or a filesystem without it): two renames.
    old = staged.with_name(staged.name + ".old")
    os.replace(final, old)
    os.replace(staged, final)
    os.replace(old, staged)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                          ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def check_writable(folder: Path) -> None:
    """Raise OSError naming `folder` when results could not be written there."""
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".write-test-{os.getpid()}"
    try:
        probe.write_bytes(b"x" * 4096)
    finally:
        probe.unlink(missing_ok=True)


# ------------------------------------------------------------------ source copies


def skipped(rel: Path) -> bool:
    """Whether `rel`, a path inside the extension, lies outside its sources."""
    return any(name in SKIP_ANYWHERE or name.endswith(".egg-info")
               or (depth == 0 and name in SKIP_AT_TOP)
               for depth, name in enumerate(rel.parts))


def engine_folders(ext_dir: Path, work: Path, dist: Path) -> list[Path]:
    """The engine's work and results folders: never part of a copy of the extension, where
    they lie inside it (a matrix in the extension's own folder puts both there), or the
    copy would hold itself, and every wheel and log."""
    for folder, flag in ((work, "$EXTMATRIX_WORK"), (dist, "--dist")):
        if folder.resolve() == ext_dir.resolve():
            raise UserError(flag, f"{folder} is the extension's own folder",
                            "point it at a folder of its own (inside the extension or not)")
    return [work, dist]


def places_in(top: Path, folders: Iterable[Path]) -> set[Path]:
    """Where those of `folders` that lie inside `top` (not `top` itself) lie, relative to it:
    as named, and where links lead (a work folder may be a link in the extension to a
    larger disk)."""
    places = set()
    for folder in folders:
        for path, root in ((Path(os.path.abspath(folder)), Path(os.path.abspath(top))),
                           (folder.resolve(), top.resolve())):
            if path.is_relative_to(root) and path != root:
                places.add(path.relative_to(root))
    return places


def sync_tree(src: Path, dst: Path, leave_out: Iterable[Path] = ()) -> None:
    """Mirror src into dst, touching only changed files so incremental builds stay warm.

    A file counts as unchanged only with the same size and nanosecond mtime: whole
    seconds would miss an edit made within the second of the last copy. Symlinks
    are copied as links (the extension check has refused those that leave the tree).
    The files and folders `leave_out` (and dst) name are left out wherever they lie in
    src, and go from dst: an earlier copy may hold them."""
    dst.mkdir(parents=True, exist_ok=True)
    out = places_in(src, [*leave_out, dst])
    seen: set[Path] = set()
    for root, dirs, files in os.walk(src):
        rel = Path(root).relative_to(src)
        dirs[:] = [d for d in dirs if not skipped(rel / d) and rel / d not in out]
        if (dst / rel).is_symlink() or (dst / rel).is_file():
            (dst / rel).unlink()
        (dst / rel).mkdir(parents=True, exist_ok=True)
        seen.add(rel)
        for name in [*(f for f in files if rel / f not in out),
                     *(d for d in dirs if (Path(root) / d).is_symlink())]:
            source, target = Path(root) / name, dst / rel / name
            seen.add(rel / name)
            if source.is_symlink():
                link = os.readlink(source)
                if not (target.is_symlink() and os.readlink(target) == link):
                    _remove(target)
                    target.symlink_to(link)
                continue
            s = source.stat()
            try:
                t = target.lstat()
                if (not target.is_symlink() and t.st_size == s.st_size
                        and t.st_mtime_ns == s.st_mtime_ns):
                    continue
            except FileNotFoundError:
                pass
            _remove(target)
            shutil.copy2(source, target)
        dirs[:] = [d for d in dirs if not (Path(root) / d).is_symlink()]
    for root, dirs, files in os.walk(dst):
        rel = Path(root).relative_to(dst)
        dirs[:] = [d for d in dirs if rel / d in out or not skipped(rel / d)]
        for name in [*files, *dirs]:
            if rel / name not in seen and (rel / name in out or not skipped(rel / name)):
                _remove(Path(root) / name)
        dirs[:] = [d for d in dirs if rel / d in seen]


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def recorded_wheel(folder: Path) -> Path:
    """The wheel of the cell's last good build, the one its record names: dist/<cell>/ may
    also hold older wheels that failed builds kept. A folder with no record: its one wheel."""
    good = last_good(folder)
    if good is not None:
        return folder / str(good["wheel"])
    return single_wheel(folder)


def single_wheel(folder: Path) -> Path:
    found = sorted(folder.glob("*.whl"))
    if len(found) != 1:
        raise StepFailed("compile", f"expected one wheel in {folder}, found {len(found)}")
    return found[0]


# ------------------------------------------------------------------- test copies

# The tests run from a copy of their folder, alone in this one: run in place, pytest puts
# the folder above a tests package (the extension's) first on sys.path, and the tests
# import the sources instead of the installed wheel.
SUITE = "suite"
# Where pytest looks for its settings, in its order (pytest 9 reads the .toml files).
PYTEST_SETTINGS = ("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml",
                   "tox.ini", "setup.cfg")


def tests_path(tests: str) -> str:
    """Where the tests folder's copy lies in the suite: where it lies in the extension ("tests"
    for the extension's own folder), so that a path a test takes from its own file (parents[1]
    / "csrc") leads to the test sources' copies as it does in the extension."""
    return PurePosixPath(tests).as_posix() if PurePosixPath(tests).name else "tests"


def extension_path(tests: str) -> str:
    """Where the extension's folder lies in the suite: the suite, or the tests' copy where the
    extension is its own tests folder."""
    return "." if PurePosixPath(tests).name else "tests"


def pytest_settings(ext_dir: Path, tests: str) -> Path | None:
    """The file pytest takes its settings from for the tests in place, where it lies above
    the tests folder inside the extension (one inside it comes with the copy)."""
    top = ext_dir.resolve()
    for folder in (top / tests).resolve().parents:
        if not folder.is_relative_to(top):
            break
        for name in PYTEST_SETTINGS:
            if _holds_pytest_settings(folder / name):
                return folder / name
    return None


def conftests_above(ext_dir: Path, tests: str) -> list[Path]:
    """The conftest.py files between the extension's folder and its tests folder (one inside
    that comes with the copy): in place, pytest loads those below its settings' folder, and
    the copy keeps them where they were, so that it loads the same ones."""
    top = ext_dir.resolve()
    found = [folder / "conftest.py" for folder in (top / tests).resolve().parents
             if folder.is_relative_to(top) and (folder / "conftest.py").is_file()]
    return sorted(found)


def _holds_pytest_settings(path: Path) -> bool:
    if not path.is_file():
        return False
    try:
        if path.name == "pyproject.toml":
            return isinstance(tomllib.loads(path.read_text(encoding="utf-8"))
                              .get("tool", {}).get("pytest"), dict)
        if path.name in ("tox.ini", "setup.cfg"):
            parser = configparser.ConfigParser(interpolation=None)
            parser.read(path, encoding="utf-8")
            return parser.has_section("pytest" if path.name == "tox.ini" else "tool:pytest")
    except (OSError, UnicodeDecodeError, ValueError, configparser.Error):
        return False  # pytest says what is wrong with it
    return True  # pytest.ini and the like: pytest's even when empty


def stage_tests(ext_dir: Path, tests: str, import_name: str, suite: Path,
                leave_out: Iterable[Path] = (), sources: Iterable[str] = ()) -> Path:
    """A fresh copy of the tests folder in `suite`, with the pytest settings they run under
    in place (or empty ones: pytest looks no further up) and the test `sources` they read,
    each at its place in the extension; returns the tests' copy.

    Links are followed: a link to data elsewhere in the extension would lead nowhere from
    the copy. An extension's folder that is its own tests folder leaves its import
    package out: the copy would import it instead of the wheel."""
    top, source = ext_dir.resolve(), (ext_dir / tests).resolve()
    out = {p.resolve() for p in (*leave_out, suite)}

    def ignore(folder: str, names: list[str]) -> set[str]:
        here = Path(folder)
        left = {n for n in names if skipped(here.relative_to(top) / n)
                or (here / n).resolve() in out
                or here.resolve().is_relative_to((here / n).resolve())}  # a link up: a loop
        if here == top:
            left |= {n for n in names if n.split(".")[0] == import_name}
        return left

    shutil.rmtree(suite, ignore_errors=True)
    suite.mkdir(parents=True)
    copy, root = suite / tests_path(tests), suite / extension_path(tests)
    shutil.copytree(source, copy, ignore=ignore)
    for rel in sources:  # a folder holding the tests merges with their copy
        found, place = (top / rel).resolve(), root / rel
        place.parent.mkdir(parents=True, exist_ok=True)
        if found.is_dir():
            shutil.copytree(found, place, ignore=ignore, dirs_exist_ok=True)
        else:
            shutil.copy2(found, place)
    settings = pytest_settings(ext_dir, tests)
    if settings is None:
        (suite / "pytest.ini").write_text("")
    else:
        shutil.copy2(settings, root / settings.relative_to(top))
    for conftest in conftests_above(ext_dir, tests):
        place = root / conftest.relative_to(top)
        place.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(conftest, place)
    return copy
