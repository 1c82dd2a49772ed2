"""What a built wheel really contains: its metadata, and the GPU code inside its binaries.

A cell is only good if its wheel says what the cell promised: the local version,
the torch pin, the flavor's runtime dependencies, and machine code for every arch
the cell asked for. Archs are read from the binary with cuobjdump, not trusted
from the build's arguments.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path

from .cells import Cell


@dataclass
class WheelFacts:
    name: str
    size: int
    version: str
    requires: list[str]
    sass: list[str] = field(default_factory=list)  # e.g. ["8.0", "9.0"]
    ptx: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def metadata(wheel: Path) -> tuple[str, list[str]]:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        msg = Parser().parsestr(zf.read(name).decode())
    return msg["Version"], msg.get_all("Requires-Dist") or []


def inspect(wheel: Path, cell: Cell, cuobjdump: Path | None) -> WheelFacts:
    version, requires = metadata(wheel)
    facts = WheelFacts(wheel.name, wheel.stat().st_size, version, requires)
    if not version.endswith(f"+{cell.local_version}"):
        facts.problems.append(f"version {version} lacks the local label +{cell.local_version}")
    names = {re.split(r"[\s;=<>!~\[]", r, maxsplit=1)[0].lower() for r in requires}
    pinned = cell.requires_torch.replace(" ", "")
    if not any(r.replace(" ", "").startswith(pinned) for r in requires):
        facts.problems.append(f"Requires-Dist does not pin {cell.requires_torch}")
    for dep in cell.runtime_deps:
        if re.split(r"[\s;=<>!~\[]", dep, maxsplit=1)[0].lower() not in names:
            facts.problems.append(f"Requires-Dist lacks the runtime dependency {dep}")
    if cell.family == "cuda":
        _cuda_archs(wheel, cell, cuobjdump, facts)
    return facts


def _cuda_archs(wheel: Path, cell: Cell, cuobjdump: Path | None, facts: WheelFacts) -> None:
    if cuobjdump is None:
        facts.problems.append("cannot check GPU archs: cuobjdump is not available")
        return
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as zf:
        libs = [n for n in zf.namelist() if n.endswith(".so")]
        for name in libs:
            zf.extract(name, tmp)
            sass, ptx = list_archs(cuobjdump, Path(tmp) / name)
            facts.sass = sorted(set(facts.sass) | sass, key=_arch_key)
            facts.ptx = sorted(set(facts.ptx) | ptx, key=_arch_key)
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
    # ELF file    1: segment_ops._C.1.sm_90.cubin / PTX file    1: segment_ops._C.1.sm_120.ptx
    label = "ELF" if kind == "elf" else "PTX"
    found = re.findall(rf"^{label} file\s+\d+:.*\.sm_(\d+)[a-z]?\.", listing, re.MULTILINE)
    return {f"{int(n) // 10}.{int(n) % 10}" for n in found}


def _arch_key(arch: str) -> tuple[int, int]:
    major, minor = arch.split(".")
    return int(major), int(minor)
