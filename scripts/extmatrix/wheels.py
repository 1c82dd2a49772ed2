"""What a built wheel really contains, and the cell's identity written into it.

A cell is only good if its wheel says what the cell promised: the local version,
the torch pin, the flavor's runtime dependencies, and machine code for every arch
the cell asked for. Whatever build backend made the wheel, `stamp` writes the
cell's identity into it (extension authors need not know about cells). Archs are
read from the binary with cuobjdump, not trusted from the build's arguments.
"""

from __future__ import annotations

import email.policy
import re
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from pathlib import Path

from packaging.markers import UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version
from wheel.wheelfile import WheelFile

from . import symbols
from .cells import Cell
from .compat import version_key
from .errors import StepFailed


@dataclass
class WheelFacts:
    name: str
    size: int
    version: str
    requires: list[str]
    sass: list[str] = field(default_factory=list)  # e.g. ["8.0", "9.0"]
    ptx: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    shims: list[str] = field(default_factory=list)  # stable C shims a stable wheel calls


def read_metadata(wheel: Path) -> tuple[str, Message]:
    """The wheel's .dist-info/METADATA: its member name and its headers."""
    with zipfile.ZipFile(wheel) as zf:
        member = next((n for n in zf.namelist() if n.count("/") == 1
                       and n.endswith(".dist-info/METADATA")), None)
        if member is None:
            raise StepFailed("stamp", f"{wheel.name} has no .dist-info/METADATA")
        return member, message_from_bytes(zf.read(member), policy=email.policy.compat32)


def metadata(wheel: Path) -> tuple[str, list[str]]:
    msg = read_metadata(wheel)[1]
    return msg["Version"], msg.get_all("Requires-Dist") or []


def extras(wheel: Path) -> list[str]:
    """The extras a wheel declares (Provides-Extra)."""
    return read_metadata(wheel)[1].get_all("Provides-Extra") or []


def _requirements(requires: list[str]) -> list[Requirement | None]:
    out: list[Requirement | None] = []
    for text in requires:
        try:
            out.append(Requirement(text))
        except InvalidRequirement:
            out.append(None)
    return out


def inspect(wheel: Path, cell: Cell, cuobjdump: Path | None) -> WheelFacts:
    version, requires = metadata(wheel)
    facts = WheelFacts(wheel.name, wheel.stat().st_size, version, requires)
    if not cell.abi3 and (foreign := _foreign_python(wheel.name, cell.python)):
        facts.problems.append(foreign)
    if cell.abi3 and (narrow := _not_for_every_python(wheel.name, cell)):
        facts.problems.append(narrow)
    if not version.endswith(f"+{cell.local_version}"):
        facts.problems.append(f"version {version} lacks the local label +{cell.local_version}")
    parsed = _requirements(requires)
    pin = Requirement(cell.requires_torch)
    if not any(r is not None and r.marker is None and canonicalize_name(r.name) == "torch"
               and r.specifier == pin.specifier for r in parsed):
        facts.problems.append(f"Requires-Dist does not pin {cell.requires_torch}")
    for r in parsed:
        if (r is not None and r.marker is not None and canonicalize_name(r.name) == "torch"
                and _excludes_cell_torch(r, cell)):
            facts.problems.append(f"Requires-Dist {r} excludes the cell's torch {cell.torch}")
    for dep in cell.runtime_deps:
        wanted = Requirement(dep)
        found = _providing(parsed, wanted)
        if not found:
            facts.problems.append(f"Requires-Dist lacks the runtime dependency {dep}")
        if clash := _clash(parsed, wanted, cell):
            facts.problems.append(f"Requires-Dist {clash} contradicts the runtime dependency "
                                  f"{dep}")
    if cell.family == "cuda":
        _cuda_archs(wheel, cell, cuobjdump, facts)
    if cell.stable:
        _stable_abi(wheel, facts)
    if cell.abi3 and no_python_abi(wheel.name):
        _python_free(wheel, facts)
    return facts


def _foreign_python(name: str, python: str) -> str | None:
    """Why CPython `python` would not install a per-Python cell's wheel: another Python
    built it. A wheel for every Python (py3-none: a TORCH_LIBRARY library links no
    libpython; cp39-abi3) installs and is sound, so it passes; each Python's cell then
    makes a file of that one name: `extmatrix index` publishes it once, and refuses
    where those files differ."""
    try:
        tags = parse_wheel_filename(name)[3]
    except (InvalidWheelFilename, InvalidVersion):
        return None  # stamp refuses such a name before the wheel is checked
    version = tuple(int(p) for p in python.rstrip("t").split("."))
    platforms = {t.platform for t in tags}
    installs = {*cpython_tags(version, ["cp" + python.replace(".", "")], platforms),
                *compatible_tags(version, f"cp{version[0]}{version[1]}", platforms)}
    if not installs.isdisjoint(tags):
        return None
    return (f"is tagged {_tag(name)}, which CPython {python} does not install: another "
            "Python built it")


def _tag(name: str) -> str:
    """A wheel file name's tag part: cp311-cp311-linux_x86_64."""
    return "-".join(name.removesuffix(".whl").split("-")[-3:])


def _not_for_every_python(name: str, cell: Cell) -> str | None:
    """Why an abi3 cell's one wheel would not install on every Python the cell tests it on:
    tagged for the builder's Python alone (the build ignored Py_LIMITED_API), or abi3 from a
    Python above the cell's lowest."""
    serves = list(dict.fromkeys((cell.python, *cell.test_pythons)))
    for python in serves:
        if _foreign_python(name, python):
            lowest = min(serves, key=version_key)
            return (f"is tagged {_tag(name)}, which CPython {python} does not install, yet the "
                    f"cell's one wheel serves {', '.join(serves)}: tag it "
                    f"cp{lowest.replace('.', '')}-abi3 (built with Py_LIMITED_API) or py3-none, "
                    "or set extension.abi3: false to build it once per Python")
    return None


def for_every_python(name: str) -> bool:
    """Whether a wheel's tags name no one Python's ABI (py3-none, cp39-abi3)."""
    return all(t.abi in ("none", "abi3") for t in parse_wheel_filename(name)[3])


def no_python_abi(name: str) -> bool:
    """Whether a wheel's tags name no Python ABI at all (py3-none-linux_x86_64): abi3audit,
    which refuses a wheel not tagged abi3, has nothing to audit; _python_free checks it."""
    try:
        return all(t.abi == "none" for t in parse_wheel_filename(name)[3])
    except (InvalidWheelFilename, InvalidVersion):
        return False  # stamp refuses such a name before the wheel is checked


_LIBPYTHON = re.compile(r"libpython\d")


def _python_free(wheel: Path, facts: WheelFacts) -> None:
    """A py3-none wheel installs in every Python: sound only where its binaries need none (a
    TORCH_LIBRARY library that torch.ops.load_library loads), linking no libpython and
    calling no Python C API, whose ABI changes from one Python to the next."""
    with zipfile.ZipFile(wheel) as zf, tempfile.TemporaryDirectory() as tmp:
        for name in _libraries(zf):
            try:
                library = Path(zf.extract(name, tmp))
                linked = [n for n in symbols.needed(library) if _LIBPYTHON.match(n)]
                calls = sorted(s for s in symbols.undefined_symbols(library)
                               if s.startswith(("Py", "_Py")))
            except ValueError as exc:
                facts.problems.append(str(exc))
                continue
            needs = ([f"links {linked[0]}"] if linked else []) + (
                [f"calls the Python C API ({calls[0]})"] if calls else [])
            if needs:
                facts.problems.append(
                    f"is tagged {_tag(wheel.name)}, for every Python, yet {name} "
                    f"{' and '.join(needs)}: tag it cp3X-abi3 "
                    '(wheel.py-api = "cp3X", built with Py_LIMITED_API), or set '
                    "extension.abi3: false to build it once per Python")
                return


def _libraries(zf: zipfile.ZipFile) -> list[str]:
    return [n for n in zf.namelist() if n.endswith(".so") or ".so." in n.rsplit("/", 1)[-1]]


def _stable_abi(wheel: Path, facts: WheelFacts) -> None:
    """Every library of a stable cell's wheel keeps to the stable C shims (symbols.py)."""
    with zipfile.ZipFile(wheel) as zf, tempfile.TemporaryDirectory() as tmp:
        for name in _libraries(zf):
            try:
                result = symbols.audit(Path(zf.extract(name, tmp)), name)
            except ValueError as exc:
                facts.problems.append(str(exc))
                continue
            facts.shims += [s for s in result.shims if s not in facts.shims]
            if not result.ok:
                facts.problems.append(symbols.problem(result))


def stamp(wheel: Path, cell: Cell) -> tuple[Path, list[str]]:
    """Write the cell's identity into `wheel`: the local label (+pt214cu130), the torch pin
    and the flavor's runtime dependencies. Returns the wheel (renamed if its version
    changed) and what was changed; a wheel that already says all this is left alone.

    Raises StepFailed where the wheel contradicts the cell: another local label, or a
    torch requirement that excludes the cell's torch."""
    try:
        name, version, build, tags = parse_wheel_filename(wheel.name)
    except (InvalidWheelFilename, InvalidVersion) as exc:
        raise StepFailed("stamp", f"the build made {wheel.name}, not a valid wheel name "
                                  f"({exc})") from None
    meta_name, msg = read_metadata(wheel)
    changes: list[str] = []
    new_version = _stamped_version(Version(msg["Version"] or str(version)), cell, changes)
    requires = msg.get_all("Requires-Dist") or []
    new_requires = _stamped_requires(requires, cell, changes)
    if not changes:
        return wheel, []
    del msg["Requires-Dist"]
    for req in new_requires:
        msg["Requires-Dist"] = req
    msg.replace_header("Version", str(new_version))
    old_info = meta_name.split("/", 1)[0]
    stem = old_info[: -len(".dist-info")]
    file_name = re.sub(r"[^\w\d.]+", "_", name, flags=re.UNICODE)
    new_stem = f"{file_name}-{new_version}"
    tag_part = wheel.name[:-len(".whl")].split("-")[-3:]
    build_part = [f"{build[0]}{build[1]}"] if build else []
    target = wheel.with_name("-".join([new_stem, *build_part, *tag_part]) + ".whl")
    return _repack(wheel, target, stem, new_stem, msg, meta_name, changes)


def _repack(wheel: Path, target: Path, stem: str, new_stem: str, msg, meta_name: str,
            changes: list[str]) -> tuple[Path, list[str]]:
    """Copy every member under its new dist-info/.data name; WheelFile writes RECORD."""
    tmp_dir = Path(tempfile.mkdtemp(dir=target.parent, prefix=".stamp-"))
    try:
        staged = tmp_dir / target.name
        with zipfile.ZipFile(wheel) as src, WheelFile(staged, "w") as dst:
            for info in src.infolist():
                head, _, rest = info.filename.partition("/")
                if head == f"{stem}.dist-info" and rest == "RECORD":
                    continue
                if head in (f"{stem}.dist-info", f"{stem}.data"):
                    suffix = head[len(stem):]
                    info_name = f"{new_stem}{suffix}/{rest}"
                else:
                    info_name = info.filename
                data = (msg.as_bytes(policy=email.policy.compat32.clone(max_line_length=0))
                        if info.filename == meta_name else src.read(info))
                copy = zipfile.ZipInfo(info_name, date_time=info.date_time)
                copy.external_attr, copy.compress_type = info.external_attr, zipfile.ZIP_DEFLATED
                dst.writestr(copy, data)
        wheel.unlink()
        staged.replace(target)
    finally:
        for leftover in tmp_dir.iterdir():
            leftover.unlink()
        tmp_dir.rmdir()
    return target, changes


def _stamped_version(version: Version, cell: Cell, changes: list[str]) -> Version:
    if version.local == cell.local_version:
        return version
    if version.local is not None:
        raise StepFailed("stamp", f"the wheel's version {version} has its own local label; "
                                  f"the cell's is +{cell.local_version}: drop the label from "
                                  "the extension's version (the engine adds it)")
    changes.append(f"version {version} -> {version}+{cell.local_version}")
    return Version(f"{version}+{cell.local_version}")


def _stamped_requires(requires: list[str], cell: Cell, changes: list[str]) -> list[str]:
    pin = Requirement(cell.requires_torch)
    out: list[str] = []
    pinned = False
    for text, req in zip(requires, _requirements(requires), strict=True):
        if req is None or canonicalize_name(req.name) != "torch":
            out.append(text)
            continue
        if _excludes_cell_torch(req, cell):
            raise StepFailed("stamp", f"the wheel requires {req}, which excludes the cell's "
                                      f"torch {cell.torch}")
        if req.marker is not None:  # kept as written: it does not exclude the cell's torch
            out.append(text)
            continue
        if req.specifier == pin.specifier:
            pinned = True
            out.append(text)
            continue
        changes.append(f"Requires-Dist {text} -> {pin}")
        out.append(str(pin))
        pinned = True
    if not pinned:
        changes.append(f"Requires-Dist + {pin}")
        out.insert(0, str(pin))
    for dep in cell.runtime_deps:
        wanted, current = Requirement(dep), _requirements(out)
        found = _providing(current, wanted)
        if clash := _clash(current, wanted, cell):
            raise StepFailed("stamp", f"the wheel requires {clash}, which the matrix's runtime "
                                      f"dependency {wanted} excludes")
        if not found:
            changes.append(f"Requires-Dist + {dep}")
            out.append(dep)
    return out


def _providing(requires: list[Requirement | None], wanted: Requirement) -> list[Requirement]:
    """The requirements that give the cell the runtime dependency `wanted`: of its name and
    under its marker (none where it has none). One under another marker (platform_system
    == "Linux", an extra) does not, so stamp adds `wanted` as the matrix writes it and
    inspect looks for that."""
    return [r for r in requires if r is not None
            and canonicalize_name(r.name) == canonicalize_name(wanted.name)
            and str(r.marker) == str(wanted.marker)]


def _excludes_cell_torch(r: Requirement, cell: Cell) -> bool:
    return (_applies(r, cell) and bool(r.specifier)
            and not r.specifier.contains(Version(cell.torch), prereleases=True))


def _cell_environment(cell: Cell) -> dict[str, str]:
    """The marker environment the cell's wheel installs into: Linux, the cell's machine and
    Python, no extra."""
    return {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
            "platform_machine": cell.platform, "implementation_name": "cpython",
            "platform_python_implementation": "CPython", "python_version": cell.python,
            "python_full_version": f"{cell.python}.0", "extra": ""}


def _applies(r: Requirement, cell: Cell) -> bool:
    """Whether `r` holds where the cell's wheel installs; a marker that needs what is not
    known here (extras of a lock file) is taken not to."""
    try:
        return r.marker is None or r.marker.evaluate(_cell_environment(cell))
    except UndefinedEnvironmentName:
        return False


def _clash(requires: list[Requirement | None], wanted: Requirement,
           cell: Cell) -> Requirement | None:
    """A requirement of `wanted`'s name that holds where the cell's wheel installs (no
    marker, or one true there) and pins a version that `wanted` excludes, or is pinned
    out of it."""
    for r in requires:
        if (r is not None and canonicalize_name(r.name) == canonicalize_name(wanted.name)
                and _applies(r, cell) and _applies(wanted, cell)
                and _contradicts(r.specifier, wanted.specifier)):
            return r
    return None


def _contradicts(a: SpecifierSet, b: SpecifierSet) -> bool:
    """Whether an exact version one side pins (==X) is one the other side excludes: the
    contradiction that can be told without listing every release."""
    for pins, other in ((a, b), (b, a)):
        for spec in pins:
            if (spec.operator == "==" and not spec.version.endswith(".*")
                    and not other.contains(spec.version, prereleases=True)):
                return True
    return False


def _cuda_archs(wheel: Path, cell: Cell, cuobjdump: Path | None, facts: WheelFacts) -> None:
    with zipfile.ZipFile(wheel) as zf:
        libs = _libraries(zf)
        if not libs:
            return  # pure Python (Triton kernels, say): no device code to look for
        if cuobjdump is None:
            facts.problems.append("cannot check GPU archs: cuobjdump is not available")
            return
        with tempfile.TemporaryDirectory() as tmp:
            for name in libs:
                zf.extract(name, tmp)
                sass, ptx = list_archs(cuobjdump, Path(tmp) / name)
                facts.sass = sorted(set(facts.sass) | sass, key=_arch_key)
                facts.ptx = sorted(set(facts.ptx) | ptx, key=_arch_key)
    if not facts.sass and not facts.ptx:
        facts.problems.append(
            f"holds no GPU code at all (wanted SASS for {' '.join(cell.archs)}): its build made "
            "CPU-only kernels. A build that chooses CUDA from torch.cuda.is_available() gets "
            "False on a builder without a GPU: decide from torch.version.cuda, or honour "
            "FORCE_CUDA=1, which the engine sets for CUDA cells")
        return
    for arch in cell.archs:
        if arch not in facts.sass:
            facts.problems.append(f"no SASS for arch {arch} in the binary")
    for arch in cell.ptx:
        if arch not in facts.ptx:
            facts.problems.append(f"no PTX for arch {arch} in the binary")


def list_archs(cuobjdump: Path, library: Path) -> tuple[set[str], set[str]]:
    """SASS and PTX archs embedded in a shared library, as dotted compute capabilities."""
    result = subprocess.run([str(cuobjdump), "--list-elf", "--list-ptx", str(library)],
                            capture_output=True, text=True)
    return _parse(result.stdout, "elf"), _parse(result.stdout, "ptx")


def _parse(listing: str, kind: str) -> set[str]:
    """Archs as the matrix writes them: sm_90 -> 9.0, sm_90a -> 9.0a, sm_120f -> 12.0f."""
    # ELF file    1: segment_ops._C.1.sm_90.cubin / PTX file    1: segment_ops._C.1.sm_120.ptx
    label = "ELF" if kind == "elf" else "PTX"
    found = re.findall(rf"^{label} file\s+\d+:.*\.sm_(\d+)([af]?)\.", listing, re.MULTILINE)
    return {f"{int(n) // 10}.{int(n) % 10}{suffix}" for n, suffix in found}


def _arch_key(arch: str) -> tuple[int, int, str]:
    major, minor = arch.rstrip("af").split(".")
    return int(major), int(minor), arch[-1] if arch[-1] in "af" else ""
