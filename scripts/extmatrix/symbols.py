"""The stable-ABI audit: a stable wheel's libraries reach libtorch only through its C shims.

abi3audit checks a wheel against Python's limited API; this is the same check for
LibTorch's stable ABI. Code built on `torch/csrc/stable` and `torch/headeronly` calls
libtorch through C functions (`aoti_torch_*`, `torch_*`) that keep their signatures
across releases; everything else it needs is inline in headers. An undefined C++
symbol of namespace c10, at, torch or caffe2 is a call into libtorch's C++ internals,
which change between releases: the wheel would load in the torch it was built
against and fail with "undefined symbol" in a later one.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

TORCH_NAMESPACES = frozenset({"c10", "at", "torch", "caffe2"})
# Itanium mangling of a name whose outermost scope is a namespace: _ZN3c10..., _ZNK2at...,
# and the vtable / typeinfo / guard-variable forms _ZTVN3c10..., _ZTIN..., _ZGVN...
_OUTER_SCOPE = re.compile(r"_Z(?:T[VIST]|GV)?N[rVK]*[RO]?(\d+)")
# C functions of the stable surface: libtorch exports them for code built out of tree.
_STABLE_SHIM = re.compile(r"(aoti_torch_|torch_)\w+")


@dataclass(frozen=True)
class Audit:
    library: str
    torch_cxx: tuple[str, ...]  # libtorch C++ symbols used: each one breaks the promise
    shims: tuple[str, ...]  # stable C shims used

    @property
    def ok(self) -> bool:
        return not self.torch_cxx


def undefined_symbols(library: Path) -> set[str]:
    """Names the library expects another library to define (its dynamic imports)."""
    try:
        with library.open("rb") as fh:
            table = ELFFile(fh).get_section_by_name(".dynsym")
            if table is None:
                return set()
            return {s.name for s in table.iter_symbols()
                    if s.name and s["st_shndx"] == "SHN_UNDEF"}
    except ELFError as exc:
        raise ValueError(f"{library.name} is not an ELF shared library ({exc})") from None


def needed(library: Path) -> list[str]:
    """The libraries the library links to (DT_NEEDED)."""
    try:
        with library.open("rb") as fh:
            dynamic = ELFFile(fh).get_section_by_name(".dynamic")
            return [] if dynamic is None else [t.needed for t in dynamic.iter_tags("DT_NEEDED")]
    except ELFError as exc:
        raise ValueError(f"{library.name} is not an ELF shared library ({exc})") from None


def torch_namespace(symbol: str) -> str | None:
    """'c10' for _ZN3c106detail14torchCheckFail..., None for std::, C or other names."""
    match = _OUTER_SCOPE.match(symbol)
    if not match:
        return None
    length, start = int(match.group(1)), match.end()
    scope = symbol[start:start + length]
    return scope if scope in TORCH_NAMESPACES else None


def audit(library: Path, name: str | None = None) -> Audit:
    imports = undefined_symbols(library)
    return Audit(name or library.name,
                 tuple(sorted(s for s in imports if torch_namespace(s))),
                 tuple(sorted(s for s in imports if _STABLE_SHIM.fullmatch(s))))


def demangle(symbols: list[str]) -> list[str]:
    """Readable C++ names through c++filt where binutils is installed, else as mangled."""
    tool = shutil.which("c++filt")
    if not tool or not symbols:
        return list(symbols)
    result = subprocess.run([tool], input="\n".join(symbols), capture_output=True, text=True)
    lines = result.stdout.splitlines()
    return lines if result.returncode == 0 and len(lines) == len(symbols) else list(symbols)


def problem(result: Audit, shown: int = 3) -> str:
    """One sentence naming the offending symbols and the fix."""
    names = demangle(list(result.torch_cxx[:shown]))
    more = len(result.torch_cxx) - len(names)
    listed = "; ".join(names) + (f"; and {more} more" if more > 0 else "")
    return (f"breaks the stable ABI: {result.library} uses {len(result.torch_cxx)} libtorch C++ "
            f"symbol{'s' if len(result.torch_cxx) != 1 else ''} outside the stable C shims "
            f"({listed}); build it on torch/csrc/stable and torch/headeronly only")
