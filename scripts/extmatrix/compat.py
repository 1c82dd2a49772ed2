"""Which combinations exist: the facts table (data/compat.yaml) and the rules over it."""

from __future__ import annotations

import datetime
import functools
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version
from pydantic import Field, model_validator

from . import source as yaml_source
from .config import Family, Platform, _Model, validate

BUILTIN = Path(__file__).parent / "data" / "compat.yaml"


class PythonRange(_Model):
    min: str
    max: str


class TorchFacts(_Model):
    latest: str = Field(description="Newest patch release of the series.")
    released: datetime.date | str | None = None
    python: PythonRange
    # Free-threaded CPython builds with wheels (cp313t -> "3.13t"); not in the range above.
    python_free_threaded: list[str] = Field(default_factory=list)
    cxx: int = Field(description="C++ standard extensions must be compiled with.")
    # Headers take TORCH_TARGET_VERSION, so an op compiled against this release keeps to
    # the LibTorch stable ABI of this release and loads in later ones.
    stable_abi: bool = False
    cuda: list[str] = Field(default_factory=list)
    pypi_cuda: str | None = None
    # Toolkits that only some patch releases of the series ship: {"12.9": ["2.12.1"]}.
    only_in: dict[str, list[str]] = Field(default_factory=dict)
    # The flavor of the plain `pip install torch` wheel per platform: {x86_64: cu130,
    # aarch64: cpu}. Read from PyPI by `extmatrix facts refresh`.
    platforms: dict[Platform, str] = Field(default_factory=dict)
    # CUDA toolkits with aarch64 (sbsa) wheels, where known; unknown: as on x86_64.
    aarch64_cuda: list[str] | None = None
    rocm: list[str] = Field(default_factory=list)
    # ROCm flavor -> the gfx targets this release's wheels of that flavor are built for,
    # where they differ from the ROCm version's own list: PyTorch changes its arch list
    # per release (gfx1102 arrived in 2.7, gfx1103 in 2.13), not per ROCm version.
    rocm_archs: dict[str, list[str]] = Field(default_factory=dict)
    source: str

    @model_validator(mode="after")
    def _archs_of_published_flavors(self) -> TorchFacts:
        # An arch list for a flavor the release does not ship is a typo or a stale entry.
        stray = [v for v in self.rocm_archs if v not in self.rocm]
        if stray:
            raise ValueError(f"rocm_archs names ROCm {', '.join(stray)}, which is not in rocm "
                             f"({', '.join(self.rocm) or 'none'})")
        return self


class ToolkitFacts(_Model):
    archs: list[str]
    # Archs that nvcc of this version also targets as `X.Ya` (arch-specific features, e.g.
    # Hopper's wgmma) and as `X.Yf` (family-portable, from CUDA 12.9 on).
    arch_specific: list[str] = Field(default_factory=list)
    family_specific: list[str] = Field(default_factory=list)
    source: str


class PlatformFacts(_Model):
    families: list[Family]
    source: str


class CompatFile(_Model):
    torch: dict[str, TorchFacts]
    cuda: dict[str, ToolkitFacts] = Field(default_factory=dict)
    rocm: dict[str, ToolkitFacts] = Field(default_factory=dict)
    platforms: dict[Platform, PlatformFacts] = Field(default_factory=dict)


@functools.cache
def version_key(text: str) -> tuple[int, ...]:
    """The release numbers, compared as numbers (7.14 > 7.2; 7.1 is no prefix of 7.14).
    A free-threaded Python (3.13t) sorts with its release."""
    try:
        return Version(text[:-1] if text.endswith("t") else text).release
    except InvalidVersion:
        return ()  # unusable text sorts first instead of failing a plan


def series(version: str) -> str:
    """2.11.0 -> 2.11"""
    return ".".join(version.split(".")[:2])


def span(versions: list[str]) -> str:
    ordered = sorted(versions, key=version_key)
    return ", ".join(ordered) if ordered else "none"


@dataclass(frozen=True)
class Compat:
    facts: CompatFile
    file: str

    @classmethod
    def load(cls, path: str | Path | None = None, flag: str = "--compat") -> Compat:
        path = Path(path) if path else BUILTIN
        return cls(validate(yaml_source.load(path, flag=flag, kind="compatibility facts file"),
                            CompatFile), str(path))

    def torch(self, version: str) -> TorchFacts | None:
        return self.facts.torch.get(series(version))

    def known_torch(self) -> str:
        return span(list(self.facts.torch))

    def toolkits(self, family: Family) -> dict[str, ToolkitFacts]:
        return self.facts.cuda if family == "cuda" else self.facts.rocm

    def toolkit(self, family: Family, version: str) -> ToolkitFacts | None:
        table = self.toolkits(family)
        return table.get(version) or table.get(series(version))

    def toolkit_archs(self, family: Family, version: str) -> list[str]:
        """Every arch some torch release builds for with this toolkit: the toolkit's own
        list, then what per-release lists add to it."""
        facts = self.toolkit(family, version)
        if facts is None:
            return []
        archs = list(facts.archs)
        if family == "rocm":
            key = version if version in self.facts.rocm else series(version)
            for entry in self.facts.torch.values():
                archs += [a for a in entry.rocm_archs.get(key, []) if a not in archs]
        return archs

    def rocm_archs(self, torch: str, flavor_version: str) -> list[str]:
        """The gfx targets of torch's wheels on the ROCm index `flavor_version` (rocm6.2.4
        -> "6.2.4"): the release's own list where it has one, else the ROCm version's."""
        facts = self.torch(torch)
        if facts is not None and flavor_version in facts.rocm_archs:
            return list(facts.rocm_archs[flavor_version])
        toolkit = self.toolkit("rocm", flavor_version)
        return list(toolkit.archs) if toolkit else []

    def unsupported_archs(self, family: Family, toolkit: str, archs: list[str]) -> list[str]:
        facts = self.toolkit(family, toolkit)
        if facts is None:
            return list(archs)
        allowed = {*self.toolkit_archs(family, toolkit),
                   *(f"{a}a" for a in facts.arch_specific),
                   *(f"{a}f" for a in facts.family_specific)}
        return [a for a in archs if a not in allowed]

    def why_not(
        self, torch: str, family: Family, toolkit: str | None, platform: str
    ) -> str | None:
        """Why torch × flavor × platform does not exist, or None if it does."""
        facts = self.torch(torch)
        if facts is None:
            return f"torch {series(torch)} is not in the compatibility facts"
        plat = self.facts.platforms.get(platform)  # type: ignore[call-overload]
        if plat is not None and family not in plat.families:
            return f"no {family} builds of torch exist for {platform}"
        if family == "cpu":
            return None
        published = facts.cuda if family == "cuda" else facts.rocm
        label = "CUDA" if family == "cuda" else "ROCm"
        arm = facts.aarch64_cuda if family == "cuda" and platform == "aarch64" else None
        if arm is not None and toolkit is not None and not _published(toolkit, arm, family):
            return (f"torch {series(torch)} has no CUDA {series(toolkit)} build for aarch64 "
                    f"(it ships CUDA {span(arm)} there)")
        if toolkit is not None and not _published(toolkit, published, family):
            shown = series(toolkit) if family == "cuda" else toolkit
            return (
                f"torch {series(torch)} has no {label} {shown} build "
                f"(it ships {label} {span(published)})"
            )
        patches = facts.only_in.get(toolkit or "") or facts.only_in.get(series(toolkit or ""))
        if patches and torch not in patches:
            return f"torch {torch} has no {label} {toolkit} build (only {', '.join(patches)})"
        return None

    def python_range(self, torch: str) -> PythonRange | None:
        facts = self.torch(torch)
        return facts.python if facts else None

    def supports_python(self, torch: str, python: str) -> bool:
        facts = self.torch(torch)
        if facts is None:
            return False
        if python.endswith("t"):
            return python in facts.python_free_threaded
        rng = facts.python
        return version_key(rng.min) <= version_key(python) <= version_key(rng.max)


def same_series(found: str, wanted: str | None) -> bool:
    """Does toolkit `found` (13.0.88, 7.1.25424) belong to `wanted` (13.0, 7.1)? By release
    numbers, never by text: ROCm 7.14 is not 7.1."""
    want = version_key(wanted or "")
    return bool(want) and version_key(found)[: len(want)] == want


def _published(toolkit: str, published: list[str], family: str) -> bool:
    """A CUDA flavor may name 12.8 or 12.8.1 for the published "12.8"; a ROCm flavor names
    its index exactly: rocm6.2.4 is another index than rocm6.2."""
    if family == "rocm":
        return toolkit in published
    return toolkit in published or series(toolkit) in published
