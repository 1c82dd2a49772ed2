"""`extmatrix index`: the built wheels as a package index per torch release × flavor.

Wheels with a local version label (`+pt214cu130`) cannot go to PyPI, so users get
them the way torch-scatter's and pyg-lib's users do: a find-links page per torch
build, `pip install NAME -f BASE/torch-2.14.1+cu130.html`, or the same wheels as a
PEP 503 simple index, `--extra-index-url BASE/torch-2.14.1+cu130/simple`. Only good
wheels are published: each cell's last good build (the one `last-good.json` names), once
its tests passed (a stable-ABI wheel: on the pages of the torch builds it passed beside),
and only if the engine stamped it for that cell.
"""

from __future__ import annotations

import hashlib
import html
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion

from .cells import Cell
from .errors import UserError, describe_os_error
from .wheels import for_every_python
from .workspace import last_good


@dataclass(frozen=True)
class Entry:
    page: str  # torch-2.14.1+cu130
    wheel: Path
    project: str  # normalised distribution name
    sha256: str


def page_names(cell: Cell) -> list[str]:
    """torch's own version string for each build the wheel serves: torch-2.14.1+cu130; a
    stable-ABI wheel is on the page of every published build of its flavor it serves."""
    if cell.stable:
        return [f"torch-{build}" for build in cell.serves_builds]
    return [f"torch-{cell.torch}+{cell.flavor}"]


def _release(page: str) -> str:
    """torch-2.14.1+cu130 -> 2.14.1"""
    return page.removeprefix("torch-").split("+", 1)[0]


def collect(dist: Path, cells: list[Cell]) -> tuple[list[Entry], list[str]]:
    """The wheels to publish, and why each cell (or torch build) left out is left out."""
    entries, left_out = [], []
    for cell in cells:
        good = last_good(dist / cell.id)
        if good is None:
            left_out.append(f"{cell.id}: no good build")
            continue
        wheel = dist / cell.id / str(good["wheel"])
        try:
            name, version, _, _ = parse_wheel_filename(wheel.name)
        except (InvalidWheelFilename, InvalidVersion) as exc:
            left_out.append(f"{cell.id}: {wheel.name} is not a wheel's file name ({exc}); "
                            "build the cell again")
            continue
        # A wheel the engine did not stamp for this cell (an older engine's, one copied
        # in) may pin another torch, or none: its users would get a broken install.
        if version.local != cell.local_version:
            left_out.append(f"{cell.id}: {wheel.name} is not labelled +{cell.local_version}; "
                            "build the cell again")
            continue
        # The same label with another torch requirement: built before the matrix changed it
        # (a stable group's `below`), and its users would get what the cell no longer says.
        pinned = _torch_pins(good.get("requires"))
        wanted = Requirement(cell.requires_torch)
        if pinned and not any(p.specifier == wanted.specifier for p in pinned):
            left_out.append(f"{cell.id}: {wheel.name} requires {pinned[0]}, the matrix now "
                            f"{wanted}; build the cell again")
            continue
        if good.get("test") != "passed":
            left_out.append(f"{cell.id}: the tests of {wheel.name} "
                            f"{'failed' if good.get('test') == 'failed' else 'have not run'}; "
                            "run test-matrix")
            continue
        junit = good.get("junit") or {}
        if isinstance(junit, dict) and junit.get("skipped") and not junit.get("passed"):
            # "passed" where every test skipped for want of a GPU: nothing was verified here,
            # and no GPU job's result reaches this record.
            left_out.append(f"{cell.id}: no test of {wheel.name} ran (all "
                            f"{junit.get('skipped', 0)} skipped); run its tests where they can "
                            "run: test-matrix --require-gpu on a GPU machine")
            continue
        pages = page_names(cell)
        if cell.stable:  # on the page of each torch release it passed its tests beside
            passed = {s.get("torch") for s in good.get("serves") or []
                      if isinstance(s, dict) and s.get("test") == "passed"}
            left_out += [f"{cell.id}: not tested beside {page}" for page in pages
                         if _release(page) not in passed]
            pages = [page for page in pages if _release(page) in passed]
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        entries += [Entry(page, wheel, canonicalize_name(name), digest) for page in pages]
    return _one_per_name(dist, entries, {c.id: c for c in cells}), left_out


def _torch_pins(requires) -> list[Requirement]:
    """The torch requirements among a build record's Requires-Dist lines."""
    pins = []
    for line in requires if isinstance(requires, list) else []:
        try:
            found = Requirement(str(line))
        except InvalidRequirement:
            continue
        if found.name == "torch":
            pins.append(found)
    return pins


def _one_per_name(dist: Path, entries: list[Entry], cells: dict[str, Cell]) -> list[Entry]:
    """An index holds one file per name. Cells whose wheels are the same bytes publish it
    once; different wheels of one name (a py3-none wheel built per Python) would be one
    file listed with two hashes, and pip refuses whichever it did not download."""
    first: dict[str, Entry] = {}
    for entry in entries:
        seen = first.setdefault(entry.wheel.name, entry)
        if seen.sha256 == entry.sha256:
            continue
        a, b = cells[seen.wheel.parent.name], cells[entry.wheel.parent.name]
        fix = "publish one of them: leave the other cell out with --cell, -k or --subset"
        if for_every_python(entry.wheel.name) and not (a.abi3 or b.abi3):
            fix = ("its tags serve every Python, yet abi3: false builds it once per Python: "
                   "set extension.abi3: true in the matrix to build it once and test it on "
                   "each Python")
        raise UserError(str(dist), f"{a.id} and {b.id} built different wheels named "
                        f"{entry.wheel.name}, and an index holds one file per name", fix)
    # Byte-identical wheels: the first cell's file stands for all, listed once per page.
    return list(dict.fromkeys(replace(e, wheel=first[e.wheel.name].wheel) for e in entries))


def build(dist: Path, cells: list[Cell], out: Path, base_url: str | None
          ) -> tuple[list[Path], list[str]]:
    """Write OUT/wheels/*.whl, OUT/torch-*.html, OUT/torch-*/simple/…; returns the pages,
    and what was left out and why."""
    entries, left_out = collect(dist, cells)
    if not entries:
        why = f" ({left_out[0]})" if left_out else ""
        raise UserError(str(dist), f"no built and tested wheel to publish{why}",
                        "build the cells and run test-matrix first")
    if out.exists() and not out.is_dir():
        raise UserError(str(out), "not a folder", "pass --output a folder for the index")
    pages: dict[str, list[Entry]] = {}
    for entry in entries:
        pages.setdefault(entry.page, []).append(entry)
    made = sorted({*(f"wheels/{e.wheel.name}" for e in entries), "index.html",
                   *(f"{page}.html" for page in pages),
                   *(f"{page}/simple/index.html" for page in pages),
                   *(f"{e.page}/simple/{e.project}/index.html" for e in entries)})
    _refuse_files_of_others(out, made)
    try:
        written = _write(out, entries, pages, made, base_url)
    except OSError as exc:
        raise UserError(f"--output {out}", f"cannot write the index: {describe_os_error(exc)}",
                        "pass --output a folder you can write to") from None
    return written, left_out


def _refuse_files_of_others(out: Path, made: list[str]) -> None:
    """The index replaces only what the last index wrote: a page of the user's own in the
    folder would be overwritten now, and deleted by the next run."""
    try:
        ours = set((out / MANIFEST).read_text().splitlines())
    except OSError:
        ours = set()
    theirs = [name for name in made if name not in ours and (out / name).exists()]
    if theirs:
        raise UserError(str(out / theirs[0]), f"exists, and no earlier index wrote it "
                        f"({len(theirs)} such file{'s' if len(theirs) > 1 else ''})",
                        "pass --output an empty or new folder, or move those files away")


def _write(out: Path, entries: list[Entry], pages: dict[str, list[Entry]], made: list[str],
           base_url: str | None) -> list[Path]:
    _forget_last_index(out)
    wheels_dir = out / "wheels"
    wheels_dir.mkdir(parents=True, exist_ok=True)
    for wheel in {entry.wheel for entry in entries}:
        shutil.copy2(wheel, wheels_dir / wheel.name)
    written = []
    for page, members in sorted(pages.items()):
        flat = out / f"{page}.html"
        flat.write_text(_html(page, members, _href(base_url, "wheels")))
        written.append(flat)
        simple = out / page / "simple"
        projects = sorted({e.project for e in members})
        simple.mkdir(parents=True, exist_ok=True)
        (simple / "index.html").write_text(_page(
            f"Simple index: {page}",
            [f'<a href="{p}/">{html.escape(p)}</a>' for p in projects]))
        for project in projects:
            (simple / project).mkdir(exist_ok=True)
            prefix = _href(base_url, "wheels", depth=3)
            (simple / project / "index.html").write_text(
                _html(f"{project} for {page}", [e for e in members if e.project == project],
                      prefix))
    (out / "index.html").write_text(_page("Wheels by torch build", [
        f'<a href="{p}.html">{html.escape(p)}</a>' for p in sorted(pages)]))
    (out / MANIFEST).write_text("\n".join(made) + "\n")
    return written


# What the last `index` wrote into its folder: the next one removes those files first, so a
# torch build or wheel left out this time is not uploaded from the folder again. Nothing
# else in the folder is touched.
MANIFEST = ".extmatrix-index"


def _forget_last_index(out: Path) -> None:
    try:
        listed = (out / MANIFEST).read_text().splitlines()
    except OSError:
        return
    root = out.resolve()
    folders = set()
    for name in filter(None, listed):
        path = (out / name).resolve()
        if path.is_relative_to(root) and path.is_file():
            path.unlink()
            folders.update(p for p in path.parents if p.is_relative_to(root) and p != root)
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def _href(base_url: str | None, folder: str, depth: int = 0) -> str:
    if base_url:
        return f"{base_url.rstrip('/')}/{folder}/"
    return "../" * depth + f"{folder}/"


def _html(title: str, entries: list[Entry], prefix: str) -> str:
    ordered = sorted(entries, key=lambda e: e.wheel.name)
    links = [f'<a href="{html.escape(prefix + e.wheel.name)}#sha256={e.sha256}">'
             f"{html.escape(e.wheel.name)}</a>" for e in ordered]
    return _page(title, links)


def _page(title: str, links: list[str]) -> str:
    body = "<br>\n".join(links)
    return (f"<!DOCTYPE html>\n<html><head><meta name=\"pypi:repository-version\" "
            f"content=\"1.0\"><title>{html.escape(title)}</title></head>\n<body>\n"
            f"<h1>{html.escape(title)}</h1>\n{body}\n</body></html>\n")
