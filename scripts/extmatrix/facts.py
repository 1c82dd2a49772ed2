"""Wheel-level torch facts read from the package indexes, and how they differ from compat.yaml.

compat.yaml was compiled by hand, partly from memory and from secondary sources. The
package indexes are the primary source for a good part of it: which wheels a release
has (so which CPython versions, free-threaded builds and Linux platforms), when it was
uploaded, and which CUDA the default PyPI wheel pulls in (its nvidia-*/cuda-toolkit
pins). `refresh` puts those facts next to the hand-written ones and returns the
rewritten file plus a unified diff for a person to review; it writes nothing.

Only what an index can vouch for is touched. The C++ standard, the toolkit arch lists
and anything of an index that cannot be reached stay as written, and the reason is
given in the notes.
"""

from __future__ import annotations

import datetime
import difflib
import email.parser
import html.parser
import http.client
import json
import re
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from .errors import UserError

PYPI = "https://pypi.org"
FLAVOR_BASE = "https://download.pytorch.org/whl"
JSON = "application/json"
# PEP 691: ask for JSON, accept the PEP 503 HTML page from indexes that only serve that.
SIMPLE = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
TIMEOUT_S = 30.0

# Linux platforms the engine builds for, named as in config.Platform; wheels for
# Windows and macOS say nothing about them and are skipped.
PLATFORMS = ("x86_64", "aarch64")

Fetch = Callable[[str, str], bytes]
"""fetch(url, accept) -> body; raises OSError (URLError is one) or ValueError when it cannot."""


class FetchError(OSError):
    """An index answered, but not with what was asked for (a cut-off body, a non-PEP 691 page)."""


def urllib_fetch(url: str, accept: str) -> bytes:
    """The real HTTP GET, bounded by TIMEOUT_S so an unreachable index fails fast."""
    request = urllib.request.Request(url, headers={"Accept": accept, "User-Agent": "extmatrix"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return response.read()
    except http.client.HTTPException as err:  # a cut-off body is no OSError of its own
        raise FetchError(f"{url}: {err!r}") from err


# --------------------------------------------------------------------------- wheels


@dataclass(frozen=True)
class Wheel:
    version: Version  # with any local label (+cu129) still on
    platform: str  # x86_64 | aarch64
    python: str  # "3.12", or "3.13t" for the free-threaded ABI


def linux_wheel(filename: str) -> Wheel | None:
    """The CPython/Linux part of a wheel name, or None for sdists, Windows, macOS, junk."""
    if not filename.endswith(".whl"):
        return None
    try:
        _name, version, _build, tags = parse_wheel_filename(filename)
    except (InvalidWheelFilename, InvalidVersion):
        return None
    for tag in sorted(tags, key=str):
        platform = _linux_platform(tag.platform)
        python = _cpython(tag.interpreter, tag.abi)
        if platform and python:
            return Wheel(version, platform, python)
    return None


def _linux_platform(platform_tag: str) -> str | None:
    # manylinux1_x86_64, manylinux2014_aarch64, manylinux_2_28_x86_64, musllinux_1_2_...
    if not platform_tag.startswith(("manylinux", "musllinux")):
        return None
    return next((p for p in PLATFORMS if platform_tag.endswith("_" + p)), None)


def _cpython(interpreter: str, abi: str) -> str | None:
    """cp312/cp312 -> "3.12"; cp313/cp313t -> "3.13t" (PEP 703 marks the ABI, not the
    interpreter, so the abi tag decides); anything else (pp, abi3, none) -> None."""
    match = re.fullmatch(r"cp3(\d+)", interpreter)
    if not match or not abi.startswith(interpreter):
        return None
    suffix = abi[len(interpreter):]
    if suffix not in ("", "t"):
        return None  # cp37m and friends: long gone for torch, and not a build we target
    return f"3.{match.group(1)}{suffix}"


def _python_key(python: str) -> tuple[tuple[int, ...], bool]:
    """3.13 < 3.13t < 3.14: a free-threaded build sorts right after its release."""
    return Version(python.rstrip("t")).release, python.endswith("t")


# ------------------------------------------------------------------- release facts


@dataclass(frozen=True)
class ReleaseFacts:
    version: str
    released: datetime.date  # day of the first upload (UTC), re-uploads do not move it
    pythons: dict[str, tuple[str, ...]]  # platform -> CPython tags of its wheels ("3.13t" too)
    # platform -> major.minor CUDA the PyPI wheel pins, None for a CPU-only wheel. The
    # whole field is None when no metadata of the release could be read: unknown is not CPU.
    cuda: dict[str, str | None] | None
    cuda_evidence: dict[str, str] = field(default_factory=dict)  # platform -> the pin read

    @property
    def platforms(self) -> tuple[str, ...]:
        return tuple(p for p in PLATFORMS if self.pythons.get(p))

    @property
    def python_gil(self) -> list[str]:
        found = {p for tags in self.pythons.values() for p in tags if not p.endswith("t")}
        return sorted(found, key=_python_key)

    @property
    def python_min(self) -> str | None:
        return self.python_gil[0] if self.python_gil else None

    @property
    def python_max(self) -> str | None:
        return self.python_gil[-1] if self.python_gil else None

    @property
    def python_free_threaded(self) -> list[str]:
        found = {p for tags in self.pythons.values() for p in tags if p.endswith("t")}
        return sorted(found, key=_python_key)

    @property
    def pypi_cuda(self) -> str | None:
        """What compat.yaml calls pypi_cuda: the CUDA of the x86_64 wheel."""
        return self.cuda.get("x86_64") if self.cuda else None

    def flavors(self) -> dict[str, str] | None:
        """platform -> flavor of the PyPI wheel in download.pytorch.org terms (cu128, cpu)."""
        if self.cuda is None:
            return None
        return {p: cuda_flavor(self.cuda.get(p)) for p in self.platforms}


def cuda_flavor(cuda: str | None) -> str:
    return "cpu" if cuda is None else "cu" + cuda.replace(".", "")


def pypi_facts(
    main_json: Mapping[str, Any], per_version_jsons: Mapping[str, Mapping[str, Any]]
) -> dict[str, ReleaseFacts]:
    """Facts per exact release ("2.12.1") from PyPI's JSON API.

    `main_json` is https://pypi.org/pypi/torch/json (its releases -> files); each of
    `per_version_jsons` is https://pypi.org/pypi/torch/<version>/json, or anything of
    that shape, keyed by version: only info.requires_dist is read from it. A release
    without one gets cuda=None (unknown). Pre-releases and releases whose files are all
    yanked are skipped: nobody resolves to them.
    """
    facts: dict[str, ReleaseFacts] = {}
    for text, files in (main_json.get("releases") or {}).items():
        try:
            version = Version(text)
        except InvalidVersion:
            continue
        live = [f for f in files if not f.get("yanked")]
        if version.is_prerelease or not live:
            continue
        pythons: dict[str, set[str]] = {}
        for entry in live:
            wheel = linux_wheel(entry.get("filename", ""))
            if wheel:
                pythons.setdefault(wheel.platform, set()).add(wheel.python)
        if not pythons:
            continue  # no Linux wheel at all: nothing the engine could build against
        info = (per_version_jsons.get(text) or {}).get("info")
        cuda, evidence = (None, {}) if info is None else _default_cuda(
            info.get("requires_dist") or [], pythons)
        facts[text] = ReleaseFacts(
            version=text,
            released=min(_upload_day(f) for f in files),
            pythons={p: tuple(sorted(v, key=_python_key)) for p, v in sorted(pythons.items())},
            cuda=cuda,
            cuda_evidence=evidence,
        )
    return dict(sorted(facts.items(), key=lambda kv: Version(kv[0])))


def _upload_day(entry: Mapping[str, Any]) -> datetime.date:
    stamp = entry.get("upload_time_iso_8601") or entry["upload_time"]
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).date()


# The requirement naming the CUDA runtime the wheel was built against: cuda-toolkit[...]
# from 2.11 on (one meta package for all of CUDA), nvidia-cuda-runtime-cuXY before.
# The other nvidia-* pins (cuDNN, NCCL, cuBLAS) carry their own version numbers.
_CUDA_PINS = (re.compile(r"cuda-toolkit"), re.compile(r"nvidia-cuda-runtime(-cu\d+)?"))


def _default_cuda(
    requires_dist: Iterable[str], pythons: Mapping[str, set[str]]
) -> tuple[dict[str, str | None], dict[str, str]]:
    """platform -> CUDA major.minor from the pins whose markers hold on that platform.

    The markers decide, not the file name: through 2.10 every pin says
    platform_machine == "x86_64", so the aarch64 wheel (same metadata) is CPU-only.
    """
    requirements = []
    for line in requires_dist:
        try:
            requirements.append(Requirement(line))
        except InvalidRequirement:
            continue  # one bad line must not hide the rest
    cuda: dict[str, str | None] = {}
    evidence: dict[str, str] = {}
    for platform, tags in sorted(pythons.items()):
        gil = sorted((t for t in tags if not t.endswith("t")), key=_python_key)
        python = (gil or sorted(tags, key=_python_key))[0].rstrip("t")
        environment = {"platform_system": "Linux", "sys_platform": "linux", "os_name": "posix",
                       "platform_machine": platform, "python_version": python,
                       "python_full_version": python + ".0", "implementation_name": "cpython",
                       "platform_python_implementation": "CPython", "extra": ""}
        cuda[platform] = None
        for pattern in _CUDA_PINS:
            hit = next((r for r in requirements if pattern.fullmatch(r.name)
                        and (r.marker is None or r.marker.evaluate(environment))
                        and _pinned_series(r)), None)
            if hit:
                cuda[platform] = _pinned_series(hit)
                evidence[platform] = f"{hit.name}{hit.specifier}"
                break
    return cuda, evidence


def _pinned_series(requirement: Requirement) -> str | None:
    """==12.4.127, ==13.0.*, ~=13.0.2 -> "12.4"/"13.0"; a range pins nothing."""
    for spec in requirement.specifier:
        if spec.operator in ("==", "===", "~="):
            try:
                release = Version(spec.version.removesuffix(".*")).release
            except InvalidVersion:
                continue
            if len(release) >= 2:
                return f"{release[0]}.{release[1]}"
    return None


# -------------------------------------------------------------------- series facts


@dataclass(frozen=True)
class SeriesFacts:
    series: str
    latest: ReleaseFacts
    released: datetime.date  # first upload of the series' first release (X.Y.0)

    def fields(self) -> dict[str, Any]:
        """The compat.yaml keys PyPI vouches for, in compat.yaml's shape. pypi_cuda and
        platforms are left out when the metadata of `latest` could not be read."""
        out: dict[str, Any] = {"latest": self.latest.version, "released": self.released}
        if self.latest.python_min and self.latest.python_max:
            out["python"] = {"min": self.latest.python_min, "max": self.latest.python_max}
        if self.latest.cuda is not None:
            out["pypi_cuda"] = self.latest.pypi_cuda
        out["python_free_threaded"] = self.latest.python_free_threaded
        flavors = self.latest.flavors()
        if flavors is not None:
            out["platforms"] = flavors
        return out


def series_of(version: str) -> str:
    release = Version(version).release
    return f"{release[0]}.{release[1] if len(release) > 1 else 0}"


def series_facts(releases: Mapping[str, ReleaseFacts]) -> dict[str, SeriesFacts]:
    """Per X.Y: the newest patch release's facts, dated by the series' first upload."""
    grouped: dict[str, list[ReleaseFacts]] = {}
    for facts in releases.values():
        grouped.setdefault(series_of(facts.version), []).append(facts)
    out = {}
    for name, members in grouped.items():
        latest = max(members, key=lambda f: Version(f.version))
        out[name] = SeriesFacts(name, latest, min(f.released for f in members))
    return dict(sorted(out.items(), key=lambda kv: Version(kv[0])))


# ------------------------------------------------------------- per-flavor indexes


@dataclass(frozen=True)
class FlavorIndex:
    flavor: str  # cu129, rocm7.2, cpu
    url: str
    # public torch version -> platform -> CPython tags, for wheels of this flavor
    versions: dict[str, dict[str, tuple[str, ...]]]

    def series(self) -> set[str]:
        return {series_of(v) for v in self.versions}

    def releases_of(self, series: str) -> list[str]:
        return sorted((v for v in self.versions if series_of(v) == series), key=Version)


def flavor_url(base: str, flavor: str) -> str:
    return f"{base.rstrip('/')}/{flavor}/torch/"


def flavor_index(url: str, flavor: str, fetch: Fetch = urllib_fetch) -> FlavorIndex:
    """Which torch releases have Linux wheels in PyTorch's index `<url>/<flavor>/torch/`.

    The page may be PEP 691 JSON or PEP 503 HTML, whichever the server chose to
    send: the body tells. A wheel counts when its local label is the flavor
    (2.10.0+cu129) or absent: some CPU/aarch64 wheels there carry no label.
    """
    page = flavor_url(url, flavor)
    body = fetch(page, SIMPLE)
    filenames = _simple_json_files(body) if body.lstrip()[:1] == b"{" else _simple_html_files(body)
    versions: dict[str, dict[str, set[str]]] = {}
    for filename in filenames:
        wheel = linux_wheel(filename)
        if wheel is None or wheel.version.local not in (None, flavor):
            continue
        public = wheel.version.public
        versions.setdefault(public, {}).setdefault(wheel.platform, set()).add(wheel.python)
    return FlavorIndex(flavor, page, {
        v: {p: tuple(sorted(t, key=_python_key)) for p, t in sorted(plats.items())}
        for v, plats in sorted(versions.items(), key=lambda kv: Version(kv[0]))})


def _simple_json_files(body: bytes) -> list[str]:
    """PEP 691: {"meta": {"api-version": "1.x"}, "name": ..., "files": [{"filename": ...}]};
    yanked files (PEP 592: "yanked" true or a reason) are left out."""
    data = json.loads(body)
    if not isinstance(data, dict) or not str(data.get("meta", {}).get("api-version", "")
                                             ).startswith("1."):
        raise FetchError(f"not a PEP 691 v1 project page: {body[:80]!r}")
    return [f["filename"] for f in data.get("files", [])
            if isinstance(f, dict) and "filename" in f and not f.get("yanked")]


class _Anchors(html.parser.HTMLParser):
    """PEP 503: one <a> per file; its text is the file name (the href's last path
    component, which is used when the text is empty); data-yanked marks PEP 592 yanks."""

    def __init__(self) -> None:
        super().__init__()
        self.files: list[str] = []
        self._href: str | None = None
        self._yanked = False
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            named = dict(attrs)
            self._href = named.get("href") or ""
            self._yanked = "data-yanked" in named
            self._text = []

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            text = "".join(self._text).strip()
            if not text:
                path = urllib.parse.urlsplit(self._href).path
                text = urllib.parse.unquote(path.rsplit("/", 1)[-1])
            if not self._yanked:
                self.files.append(text)
            self._href = None


def _simple_html_files(body: bytes) -> list[str]:
    parser = _Anchors()
    parser.feed(body.decode("utf-8", errors="replace"))
    parser.close()
    return parser.files


# ------------------------------------------------------------------------ fetching


@dataclass
class PyPIData:
    main: dict[str, Any]
    per_version: dict[str, dict[str, Any]]
    notes: list[str]


def fetch_pypi(
    fetch: Fetch, series: Iterable[str], *, pypi: str = PYPI, project: str = "torch"
) -> PyPIData:
    """The main JSON and, for each release of `series`, something per-version-JSON shaped.

    Per release: /pypi/<project>/<version>/json first. Where that is not served (this
    mirror answers 404 for every release), the PEP 658 core metadata of one of its Linux
    wheels (<wheel url>.metadata) has the same Requires-Dist (every torch wheel of a
    release carries the same metadata, x86_64 and aarch64 alike); the newest release
    also has it in the main JSON's info. What none of these give stays unknown.
    """
    main = json.loads(fetch(f"{pypi}/pypi/{project}/json", JSON))
    wanted = set(series)
    newest = (main.get("info") or {}).get("version")
    per_version: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for version, files in (main.get("releases") or {}).items():
        try:
            if series_of(version) not in wanted or Version(version).is_prerelease:
                continue
        except InvalidVersion:
            continue
        record = _per_version(fetch, pypi, project, version, files, main, newest)
        if record is None:
            notes.append(f"no metadata reachable for {project} {version}: its default CUDA "
                         "is unknown (per-version JSON and the wheels' .metadata files failed)")
        else:
            per_version[version] = record
    return PyPIData(main, per_version, notes)


def _per_version(
    fetch: Fetch, pypi: str, project: str, version: str, files: Sequence[Mapping[str, Any]],
    main: Mapping[str, Any], newest: str | None,
) -> dict[str, Any] | None:
    main_url = f"{pypi}/pypi/{project}/json"
    try:
        return json.loads(fetch(f"{pypi}/pypi/{project}/{version}/json", JSON))
    except (OSError, ValueError):
        pass
    if version == newest:  # the main JSON's info is the newest release's
        return {"info": dict(main["info"]), "metadata_from": main_url + " info"}
    linux = []
    for entry in files:
        wheel = linux_wheel(entry.get("filename", ""))
        if wheel and entry.get("url"):
            # x86_64 GIL wheels first: the most downloaded kind, so the likeliest to be served.
            linux.append(((wheel.platform != "x86_64", wheel.python.endswith("t"),
                           entry["filename"]), entry))
    for _key, entry in sorted(linux, key=lambda pair: pair[0]):
        url = urllib.parse.urljoin(main_url, entry["url"]) + ".metadata"
        try:
            metadata = email.parser.BytesParser().parsebytes(fetch(url, "*/*"))
        except (OSError, ValueError):
            continue
        if metadata.get("Version") != version:
            continue
        return {"info": {"version": version,
                         "requires_dist": metadata.get_all("Requires-Dist") or [],
                         "requires_python": metadata.get("Requires-Python")},
                "metadata_from": entry["filename"] + ".metadata"}
    return None


# ------------------------------------------------------------------------- refresh

# What compat.py's TorchFacts assumes for a key that is not written.
_DEFAULTS: dict[str, Any] = {"python_free_threaded": [], "cuda": [], "rocm": [], "only_in": {},
                             "rocm_archs": {}}


def refresh(
    compat_path: str | Path,
    fetch: Fetch = urllib_fetch,
    *,
    today: datetime.date | None = None,
    pypi: str = PYPI,
    flavor_base: str = FLAVOR_BASE,
) -> tuple[str, str, list[str]]:
    """(new YAML text, unified diff old -> new, notes). Writes nothing.

    Per series of compat.yaml, from PyPI: latest, released, python, pypi_cuda,
    python_free_threaded and the new key platforms (the PyPI wheel's flavor per Linux
    platform). From download.pytorch.org's per-flavor indexes, one flavor at a time:
    whether the series is in that flavor's cuda/rocm list, and only_in when only some
    of its patch releases are; an index that cannot be read leaves its toolkit's
    entries as written. Hand-written keys (cxx, rocm_archs, aarch64_cuda) stay, except
    the rocm_archs entry of a ROCm flavor the index shows the release does not ship.
    Each changed series gets dated evidence appended to `source`.
    """
    path = Path(compat_path)
    old_text = path.read_text()
    # Plain YAML types on purpose: the rewritten text is checked by parsing it back the same way.
    data = yaml.safe_load(old_text)
    torch: dict[str, dict[str, Any]] = data["torch"]
    numbers = [k for k in torch if not isinstance(k, str)]
    if numbers:  # 2.10 unquoted reads as 2.1: the rewrite would name another series
        raise UserError(str(path), f"torch series written as numbers ({numbers[0]!r} here)",
                        'quote every series key, as in "2.10":')
    if not torch:
        raise UserError(str(path), "lists no torch series", "add one, as in \"2.14\": {...}")
    day = (today or datetime.date.today()).isoformat()

    pypi_data = fetch_pypi(fetch, torch, pypi=pypi)
    notes = list(pypi_data.notes)
    releases = pypi_facts(pypi_data.main, pypi_data.per_version)
    facts = series_facts(releases)
    newest = max(torch, key=Version)
    notes.extend(f"torch {name} is on PyPI but not in {path.name}: add it by hand (cxx, cuda "
                 "and rocm need a person)" for name in facts if Version(name) > Version(newest))
    indexes = _flavor_indexes(torch, fetch, flavor_base, notes)

    edits: dict[str, dict[str, Any]] = {}
    for name, entry in torch.items():
        known = facts.get(name)
        if known is None:
            notes.append(f"torch {name}: no release of it on PyPI with Linux wheels; left as is")
            continue
        changed: dict[str, Any] = {}
        from_pypi = _pypi_changes(name, entry, known, changed, notes)
        patches = sorted((v for v in releases if series_of(v) == name), key=Version)
        from_indexes = _index_changes(name, entry, indexes, patches, changed)
        if changed:
            evidence = []
            if from_pypi:
                evidence.append(f"Refreshed from PyPI JSON {day}: {'; '.join(from_pypi)}.")
            if from_indexes:
                evidence.append(f"Refreshed from {flavor_base} {day}: {'; '.join(from_indexes)}.")
            changed["source"] = " ".join([str(entry.get("source", "")).rstrip(), *evidence])
            edits[name] = changed

    new_text = _rewrite(old_text, data, edits)
    diff = "".join(difflib.unified_diff(
        old_text.splitlines(keepends=True), new_text.splitlines(keepends=True),
        fromfile=f"a/{path.name}", tofile=f"b/{path.name}"))
    return new_text, diff, notes


def _current(entry: Mapping[str, Any], key: str) -> Any:
    return entry.get(key, _DEFAULTS.get(key))


def _pypi_changes(
    name: str, entry: Mapping[str, Any], known: SeriesFacts, changed: dict[str, Any],
    notes: list[str],
) -> list[str]:
    latest = known.latest
    anywhere = {tag for tags in latest.pythons.values() for tag in tags}
    for platform, tags in latest.pythons.items():
        if missing := sorted(anywhere - set(tags), key=_python_key):
            notes.append(f"torch {name}: {latest.version} has no {platform} wheel for "
                         f"{', '.join(missing)} (the python range is the union of platforms)")
    if latest.cuda is None:
        unset = [key for key in ("pypi_cuda", "platforms") if key not in entry]
        notes.append(f"torch {name}: no metadata of {latest.version} could be read, so "
                     "pypi_cuda and platforms are left as written" + (
                         f" ({' and '.join(unset)} unset: read them from one of its wheels)"
                         if unset else ""))
    fields = known.fields()
    # A free-threaded build PyPI lacks may still be on download.pytorch.org (2.6's cp313t
    # was published there only, as experimental): PyPI can add to the list, not shorten it.
    written = list(_current(entry, "python_free_threaded"))
    extra = [p for p in written if p not in fields["python_free_threaded"]]
    if extra:
        notes.append(f"torch {name}: python_free_threaded {', '.join(extra)} has no PyPI wheel "
                     f"of {latest.version}; kept (it may come from download.pytorch.org only)")
    fields["python_free_threaded"] = sorted({*written, *fields["python_free_threaded"]},
                                            key=_python_key)
    evidence = []
    for key, value in fields.items():
        old = _current(entry, key)
        if old != value:
            changed[key] = value
            evidence.append(_evidence(key, old, value, known))
    return evidence


def _evidence(key: str, old: Any, new: Any, facts: SeriesFacts) -> str:
    latest = facts.latest.version

    def shown(value: Any) -> str:
        if value is None:
            return "unset"
        if key == "python" and isinstance(value, dict):
            return f"{value.get('min')}-{value.get('max')}"
        if isinstance(value, dict):
            return ", ".join(f"{k} {v}" for k, v in value.items())
        if isinstance(value, list):
            return ", ".join(map(str, value)) or "none"
        return str(value)

    where = {
        "latest": "newest release with files",
        "released": f"first upload of {facts.series}.0",
        "python": f"cpXY Linux wheels of {latest}",
        "python_free_threaded": f"cpXYt Linux wheels of {latest}",
        "pypi_cuda": f"{latest} requires "
                     f"{facts.latest.cuda_evidence.get('x86_64', 'no CUDA runtime')}",
        "platforms": f"Linux wheels of {latest} and their CUDA pins",
    }[key]
    return f"{key} {shown(old)} -> {shown(new)} ({where})"


@dataclass
class _Indexes:
    cuda: dict[str, FlavorIndex]  # "12.9" -> its cu129 index
    rocm: dict[str, FlavorIndex]  # "6.2.4" -> its rocm6.2.4 index


def _flavor_indexes(
    torch: Mapping[str, Mapping[str, Any]], fetch: Fetch, base: str, notes: list[str]
) -> _Indexes:
    """The indexes of every flavor compat.yaml names; new flavors cannot be discovered
    from a project page, so those still come from a person."""
    found = _Indexes({}, {})
    for family, table, prefix in (("cuda", found.cuda, "cu"), ("rocm", found.rocm, "rocm")):
        names = {str(v) for entry in torch.values() for v in entry.get(family) or []}
        for toolkit in sorted(names, key=Version):
            flavor = prefix + (toolkit.replace(".", "") if family == "cuda" else toolkit)
            try:
                table[toolkit] = flavor_index(base, flavor, fetch)
            except (OSError, ValueError) as err:
                reason = getattr(err, "reason", None) or err
                notes.append(f"not reachable: {flavor_url(base, flavor)} ({reason}); "
                             f"{family} {toolkit} entries left as written")
    return found


def _index_changes(
    series: str, entry: Mapping[str, Any], indexes: _Indexes, patches: list[str],
    changed: dict[str, Any],
) -> list[str]:
    """Each toolkit whose index was read is put in or taken out of the series' list by
    what the index holds; only_in names the patch releases when not all of them have it.
    Toolkits whose index was not read keep their place and their only_in."""
    evidence = []
    only_in = dict(_current(entry, "only_in"))
    for family, table in (("cuda", indexes.cuda), ("rocm", indexes.rocm)):
        wanted = list(_current(entry, family))
        for toolkit, index in table.items():
            has = index.releases_of(series)
            if has and toolkit not in wanted:
                wanted.append(toolkit)
                evidence.append(f"{family} +{toolkit} ({index.flavor} has {', '.join(has)})")
            elif not has and toolkit in wanted:
                wanted.remove(toolkit)
                evidence.append(f"{family} -{toolkit} ({index.flavor} has no {series}.x)")
            partial = has if has and [p for p in patches if p not in has] else None
            if partial and only_in.get(toolkit) != partial:
                only_in[toolkit] = partial
                evidence.append(f"only_in {toolkit}: {', '.join(partial)} "
                                f"(of {', '.join(patches)})")
            elif not partial and toolkit in only_in:
                del only_in[toolkit]
                evidence.append(f"only_in -{toolkit} ({index.flavor}: "
                                f"{'all of ' + ', '.join(has) if has else 'none'})")
        if wanted != list(_current(entry, family)):
            changed[family] = sorted(wanted, key=Version)
    if only_in != _current(entry, "only_in"):
        changed["only_in"] = dict(sorted(only_in.items(), key=lambda kv: Version(kv[0])))
    # The arch list of a ROCm flavor the release turns out not to ship would fail
    # validation; a flavor that appears gets the ROCm version's list until a person adds one.
    archs = dict(_current(entry, "rocm_archs"))
    gone = [v for v in archs if v not in changed.get("rocm", _current(entry, "rocm"))]
    if gone:
        changed["rocm_archs"] = {v: a for v, a in archs.items() if v not in gone}
        evidence.append(f"rocm_archs -{', -'.join(gone)} (flavor gone)")
    return evidence


# --------------------------------------------------------------- text-preserving edit

_SERIES = re.compile(r'^  "?(?P<name>\d+\.\d+)"?:\s*(#.*)?$')
_FIELD = re.compile(r"^    (?P<key>[A-Za-z_]+):")
_COMMENT = re.compile(r"\s+#\s[^\"']*$")  # a trailing comment, no quote in it
_SOURCE_WIDTH = 110  # the longest `source` lines compat.yaml already has


def _rewrite(old_text: str, data: Mapping[str, Any], edits: Mapping[str, Mapping[str, Any]]) -> str:
    """`old_text` with the edited fields of each series replaced in place.

    safe_dump would re-flow every line and drop the comments: the diff would be the
    whole file. Editing lines keeps it to what changed. The result is parsed back and
    must equal the intended data, so a layout this editor does not understand fails
    loudly instead of writing a wrong file.
    """
    lines = old_text.splitlines(keepends=True)
    out: list[str] = []
    in_torch = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith((" ", "#", "\n")) and line.strip():
            in_torch = line.startswith("torch:")
        match = _SERIES.match(line) if in_torch else None
        if match and match.group("name") in edits:
            end = i + 1
            while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
                end += 1
            out.append(line)
            out.extend(_rewrite_series(lines[i + 1:end], edits[match.group("name")]))
            i = end
            continue
        out.append(line)
        i += 1
    new_text = "".join(out)
    expected = json.loads(json.dumps(data, default=str))
    for name, changed in edits.items():
        expected["torch"][name].update(json.loads(json.dumps(changed, default=str)))
    got = json.loads(json.dumps(yaml.safe_load(new_text), default=str))
    if got != expected:
        raise ValueError("compat.yaml layout not understood: the rewritten text does not "
                         "parse back to the refreshed facts")
    return new_text


def _rewrite_series(block: list[str], changed: Mapping[str, Any]) -> list[str]:
    fields: list[tuple[str | None, list[str]]] = []  # (key, its lines) in file order
    for line in block:
        match = _FIELD.match(line)
        if match:
            fields.append((match.group("key"), [line]))
        elif fields:
            fields[-1][1].append(line)
        else:
            fields.append((None, [line]))
    present = {key for key, _ in fields}
    out: list[str] = []
    for key, lines in fields:
        if key == "source":  # new keys go last before it, next to the facts they extend
            for new_key, value in changed.items():
                if new_key not in present and new_key != "source":
                    out.append(f"    {new_key}: {_flow(value)}\n")
        if key in changed and key != "source":
            # A trailing comment stays (only_in: {...}  # why); a comment line after the
            # field belongs to the next one and stays too.
            comment = _COMMENT.search(lines[0].rstrip("\n"))
            out.append(f"    {key}: {_flow(changed[key])}{comment.group(0) if comment else ''}\n")
            out.extend(line for line in lines[1:] if line.lstrip().startswith("#"))
        elif key == "source" and "source" in changed:
            out.extend(_folded_source(lines, changed["source"]))
        else:
            out.extend(lines)
    if "source" not in present:
        out.extend(f"    {k}: {_flow(v)}\n" for k, v in changed.items() if k not in present)
    return out


def _folded_source(lines: list[str], text: str) -> list[str]:
    """The `source: >-` block with the new sentences wrapped onto the end, old lines kept."""
    body = [line for line in lines[1:] if line.strip()]
    trailing = lines[1 + len(body):] if len(lines) > 1 + len(body) else []
    old = " ".join(line.strip() for line in body) if lines[0].rstrip().endswith(">-") else None
    if old is None or not text.startswith(old):
        return [f"    source: {_flow(text)}\n", *trailing]
    words = text[len(old):].split()
    indent = "      "
    out = list(lines[:1 + len(body)])
    current = indent
    for word in words:
        if current.strip() and len(current) + 1 + len(word) > _SOURCE_WIDTH:
            out.append(current.rstrip() + "\n")
            current = indent
        current += ("" if not current.strip() else " ") + word
    if current.strip():
        out.append(current + "\n")
    return out + trailing


def _flow(value: Any) -> str:
    """compat.yaml's own style: quoted version strings, bare dates, flow collections."""
    if value is None:
        return "null"
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_flow(str(k))}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    if isinstance(value, int):
        return str(value)
    text = str(value)
    if re.fullmatch(r"[A-Za-z][A-Za-z0-9_.]*", text) and text not in ("null", "true", "false"):
        return text  # cpu, cu128: plain words, as the rocm arch lists are written
    return json.dumps(text)
