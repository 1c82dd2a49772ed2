"""`extmatrix plan --outdated`: what the matrix should add or drop, judged by the facts.

torch ships a minor every few weeks, each with its own flavors and Pythons; CPython
versions reach their end of life every October. A matrix written once drifts. This
compares matrix.yaml's axes with the compatibility facts and proposes the change as
a patch to the file, so that a scheduled job can say so (`--check` exits 1). New flavors
are proposed within the families the matrix builds: a CPU-only extension is not told to
add CUDA, nor a CUDA one ROCm.
"""

from __future__ import annotations

import datetime
import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import SpecifierSet

from .cells import Plan
from .compat import series, version_key
from .config import flavor_family
from .project import accepts_python

# PEP 602: five years of support from each October release. A fact of the calendar, not
# of torch: kept here, next to the one rule that reads it.
FIRST_ANNUAL = (8, 2019)  # 3.8, released October 2019


def python_end_of_life(python: str) -> datetime.date:
    minor = int(python.rstrip("t").split(".")[1])
    return datetime.date(FIRST_ANNUAL[1] + (minor - FIRST_ANNUAL[0]) + 5, 10, 31)


@dataclass(frozen=True)
class Change:
    action: str  # add | drop
    axis: str  # torch | flavor | python
    value: str
    why: str

    def __str__(self) -> str:
        return f"{self.action} {self.axis} {self.value}: {self.why}"


def flavors_of(plan: Plan, torch_series: str) -> list[str]:
    facts = plan.compat.facts.torch[torch_series]
    return (["cpu"] + [f"cu{v.replace('.', '')}" for v in facts.cuda]
            + [f"rocm{v}" for v in facts.rocm])


def changes(plan: Plan, today: datetime.date,
            requires_python: SpecifierSet | None = None) -> list[Change]:
    """`requires_python`: the project's; a Python it refuses is never proposed, and a
    listed one is proposed for dropping (its cells could not install the wheel)."""
    axes = plan.matrix.axes
    accepted = requires_python or SpecifierSet()
    compat = plan.compat.facts
    listed = [series(t) for t in axes.torch]
    found: list[Change] = []
    newest = max(compat.torch, key=version_key)
    torches = list(listed)
    def takes_a_python(torch: str) -> bool:  # one the project accepts and still supported
        rng = compat.torch[torch].python
        return any(accepts_python(accepted, p) and python_end_of_life(p) > today
                   for p in (f"3.{m}" for m in range(int(rng.min.split(".")[1]),
                                                      int(rng.max.split(".")[1]) + 1)))

    if listed and version_key(newest) > max(version_key(t) for t in listed) and \
            takes_a_python(newest):
        facts = compat.torch[newest]
        found.append(Change("add", "torch", newest,
                            f"torch {facts.latest} was released {facts.released}, with "
                            f"{', '.join(flavors_of(plan, newest))} and Python "
                            f"{facts.python.min}–{facts.python.max}"))
        torches.append(newest)
    published = {f: [t for t in torches if f in flavors_of(plan, t)]
                 for t in torches for f in flavors_of(plan, t)}
    newest_listed = max(torches, key=version_key)
    # A family the matrix leaves out (CUDA for a CPU-only extension) stays out: its new
    # flavors are proposed only to a matrix that builds that family already.
    families = {flavor_family(f) for f in axes.flavor}
    for flavor in flavors_of(plan, newest_listed):
        if flavor not in axes.flavor and flavor_family(flavor) in families:
            found.append(Change("add", "flavor", flavor,
                                f"torch {newest_listed} publishes it"))
    for flavor in axes.flavor:
        if flavor not in published:
            found.append(Change("drop", "flavor", flavor,
                                f"no torch of the matrix ({', '.join(torches)}) publishes it"))
    supported = set()
    for t in torches:
        rng = compat.torch[t].python
        supported |= {f"3.{m}" for m in range(int(rng.min.split(".")[1]),
                                               int(rng.max.split(".")[1]) + 1)}
    for python in sorted(supported - set(axes.python), key=version_key):
        if python_end_of_life(python) > today and accepts_python(accepted, python):
            found.append(Change("add", "python", python, "a torch of the matrix supports it"))
    for python in axes.python:
        if python_end_of_life(python) <= today:
            found.append(Change("drop", "python", python,
                                f"past its end of life ({python_end_of_life(python)})"))
        elif not python.endswith("t") and python not in supported:
            found.append(Change("drop", "python", python, "no torch of the matrix supports it"))
        elif not accepts_python(accepted, python):
            found.append(Change("drop", "python", python,
                                f"the project requires Python {accepted}"))
    return found


def emptied(plan: Plan, found: list[Change]) -> list[str]:
    """The axes the changes would leave without a value: `patch` keeps those as they are
    (a matrix needs one of each), and says so."""
    axes = plan.matrix.axes
    return [axis for axis in ("torch", "flavor", "python")
            if not _after(axis, getattr(axes, axis), found)]


def _after(axis: str, values: list[str], found: list[Change]) -> list[str]:
    wanted = [v for v in values if not any(
        c.action == "drop" and c.axis == axis and c.value == v for c in found)]
    wanted += [c.value for c in found if c.action == "add" and c.axis == axis]
    if axis != "flavor":
        wanted.sort(key=version_key)
    return wanted


def patch(plan: Plan, found: list[Change]) -> str:
    """The changes as a unified diff of the matrix file (its one-line axis lists rewritten)."""
    path = Path(plan.source.file)
    lines = path.read_text().splitlines(keepends=True)
    new = list(lines)
    axes = plan.matrix.axes
    for axis, values in (("torch", axes.torch), ("flavor", axes.flavor), ("python", axes.python)):
        wanted = _after(axis, values, found)
        if not wanted or wanted == list(values):
            continue
        line = plan.source.where(("axes", axis)).line
        if line is None:
            continue
        text = new[line - 1]
        flow = re.match(r"^(\s*\w+:\s*)\[[^\]]*\](.*)$", text.rstrip("\n"))
        if not flow:
            continue  # a block list: the changes are listed, not patched
        quote = '"' if axis != "flavor" else ""
        items = ", ".join(f"{quote}{v}{quote}" for v in wanted)
        new[line - 1] = f"{flow[1]}[{items}]{flow[2]}\n"
    return "".join(difflib.unified_diff(lines, new, f"a/{path.name}", f"b/{path.name}"))


def refused(plan: Plan, diff: str) -> str | None:
    """Why the matrix the patch makes would be refused (an exclude rule left matching
    nothing, say), planned from a copy beside the file; None when it plans, or when no copy
    can be written there."""
    import tempfile

    from .cells import plan_file
    from .errors import UserError

    path = Path(plan.source.file)
    new = _apply(path.read_text().splitlines(keepends=True), diff)
    try:
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=".outdated-",
                                         suffix=".yaml", delete=True) as copy:
            copy.write("".join(new))
            copy.flush()
            try:
                plan_file(copy.name)
            except UserError as exc:
                return str(exc).replace(copy.name, path.name)
    except OSError:
        return None
    return None


def _apply(lines: list[str], diff: str) -> list[str]:
    """`lines` with the one-line replacements of `patch`'s diff made."""
    minus = [d[1:] for d in diff.splitlines(keepends=True) if d.startswith("-") and
             not d.startswith("---")]
    plus = [d[1:] for d in diff.splitlines(keepends=True) if d.startswith("+") and
            not d.startswith("+++")]
    out = list(lines)
    for old, new in zip(minus, plus, strict=True):
        out[out.index(old)] = new
    return out
