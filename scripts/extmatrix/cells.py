"""Expanding matrix.yaml into cells: the unit every backend builds and tests.

A cell is one wheel: torch release × flavor × platform (× Python when the
extension is not abi3). Expansion returns the cells *and* every combination it
dropped, each with a reason, so "why is my combination missing?" has an answer.
"""

from __future__ import annotations

import difflib
import fnmatch
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .compat import Compat, same_series, series, span, version_key
from .config import (
    Family,
    FlavorSettings,
    Matrix,
    Rule,
    StableGroup,
    flavor_family,
    flavor_toolkit,
    load_matrix,
)
from .errors import UserError
from .source import Source, printable

DEFAULT_PLATFORM = "x86_64"


@dataclass(frozen=True)
class Cell:
    id: str
    torch: str  # exact release, e.g. 2.11.0
    torch_series: str
    flavor: str
    family: Family
    toolkit: str | None
    archs: tuple[str, ...]
    ptx: tuple[str, ...]
    arch_list: str  # TORCH_CUDA_ARCH_LIST (CUDA) or PYTORCH_ROCM_ARCH (ROCm)
    python: str  # the Python that builds the wheel
    test_pythons: tuple[str, ...]
    platform: str
    runner: str
    gpu_runner: str | None  # where its GPU tests run; None: nowhere (CI says so)
    abi3: bool
    cxx: int
    torch_spec: str  # the requirement that installs this cell's torch
    index: str | None
    base_image: str | None
    image: str
    local_version: str  # the wheel's local version label, e.g. pt211cu130
    requires_torch: str  # written into the wheel: which torch it runs with
    runtime_deps: tuple[str, ...]
    # Stable-ABI cells: the torch series compiled against (TORCH_TARGET_VERSION), and every
    # torch release of the matrix the one wheel must load in and pass its tests beside.
    stable: str | None = None
    serves: tuple[str, ...] = ()
    # Of those, the ones torch publishes a build of this flavor for (2.11.0+cu128): a CUDA
    # 12.8 wheel also serves 2.12, whose CUDA 12 builds are 12.6 and 12.9, but there is no
    # 2.12.1+cu128 to name an index page after.
    serves_builds: tuple[str, ...] = ()

    @property
    def target_version(self) -> str | None:
        """TORCH_TARGET_VERSION as torch's headers spell it: 2.11 -> 0x020b000000000000."""
        if self.stable is None:
            return None
        major, minor = (int(p) for p in self.stable.split(".")[:2])
        return f"0x{major:02x}{minor:02x}000000000000"

    def to_json(self) -> dict:
        data = asdict(self)
        return {"cell": data.pop("id"), **data}


def share_a_python(a: Cell, b: Cell) -> bool:
    """Whether each cell's wheel installs where the other's torch is tested: a cp312 wheel
    has no place in a Python 3.10 environment (a cross check there is skipped, not made)."""
    def pythons(c: Cell) -> set[str]:
        return set(c.test_pythons) if c.abi3 else {c.python}

    return bool(pythons(a) & pythons(b))


@dataclass(frozen=True)
class Dropped:
    combo: str
    reason: str
    # The id its cell would have had (None for part of a cell, such as one arch), and the
    # rule that dropped it with the cell standing in for it, so a subset naming it is told
    # why it is missing rather than offered a look-alike.
    cell: str | None = None
    rule: tuple[str | int, ...] | None = None
    instead: str | None = None


@dataclass
class Plan:
    matrix: Matrix
    source: Source
    compat: Compat
    cells: list[Cell]
    dropped: list[Dropped] = field(default_factory=list)

    def cell(self, cell_id: str) -> Cell:
        for cell in self.cells:
            if cell.id == cell_id:
                return cell
        # A cell the plan left out on purpose is no typo: a look-alike would mislead.
        gone = next((d for d in self.dropped if d.cell == cell_id), None)
        if gone and gone.instead and gone.rule:
            raise UserError(None, f"cell '{cell_id}' is replaced by {gone.instead}, the wheel "
                            f"of stable[{gone.rule[1]}] ({self.source.where(gone.rule)})",
                            f"name '{gone.instead}' instead")
        if gone and gone.rule:
            raise UserError(None, f"cell '{cell_id}' is removed by exclude[{gone.rule[1]}] "
                            f"({self.source.where(gone.rule)})", "narrow the rule to build it")
        if gone:
            raise UserError(None, f"cell '{cell_id}' cannot be built: {gone.reason}",
                            "run 'extmatrix plan --explain' to see the cells")
        raise unknown_cell(cell_id, [c.id for c in self.cells])

    def select(
        self,
        subset: str | None = None,
        cell_ids: list[str] | None = None,
        patterns: list[str] | None = None,
    ) -> list[Cell]:
        """Cells chosen by subset name, exact ids and -k globs (all given filters apply)."""
        chosen = self.cells
        if subset is not None:
            if subset not in self.matrix.subsets:
                names = list(self.matrix.subsets)
                close = difflib.get_close_matches(subset, names, n=1)
                fix = (f"did you mean '{close[0]}'?" if close else f"subsets: {', '.join(names)}"
                       if names else "the matrix names none: add 'subsets:' to it")
                raise UserError(None, printable(f"unknown subset '{subset}'"), printable(fix))
            globs = self.matrix.subsets[subset]
            chosen = [c for c in chosen if any(fnmatch.fnmatchcase(c.id, g) for g in globs)]
        if cell_ids:
            wanted = [self.cell(i) for i in cell_ids]
            outside = [c.id for c in wanted if c not in chosen]
            if outside:  # both filters apply: say which one left the cell out
                raise UserError(None, printable(f"cell '{outside[0]}' is not in subset "
                                                f"'{subset}'"),
                                f"drop --subset {subset}, or name a cell of it")
            chosen = [c for c in chosen if c in wanted]
        if patterns:
            chosen = [c for c in chosen if any(fnmatch.fnmatchcase(c.id, p) for p in patterns)]
        if not chosen:
            raise UserError(
                None, "no cell matches the given filters", "run 'extmatrix plan' to list the cells"
            )
        return chosen


def unknown_cell(cell_id: str, known: list[str]) -> UserError:
    close = difflib.get_close_matches(cell_id, known, n=1, cutoff=0.5)
    fix = f"did you mean '{close[0]}'?" if close else "run 'extmatrix plan' to list the cells"
    # From the command line: a newline there must not split the one-line error.
    return UserError(None, printable(f"unknown cell '{cell_id}'"), printable(fix))


def plan_file(path: str | Path) -> Plan:
    matrix, src = load_matrix(path)
    compat_path = None
    if matrix.compat:
        compat_path = Path(src.file).parent / matrix.compat
        if not compat_path.is_file():
            raise src.error(("compat",), f"compat file '{matrix.compat}' not found",
                            "give a path relative to the matrix file")
    plan = expand(matrix, src, Compat.load(compat_path, flag="the matrix's compat key"))
    check_extension(matrix, src)
    return plan


def repository(matrix_file: Path) -> Path:
    """The nearest folder up from the matrix file that holds .git, else the file's folder."""
    start = matrix_file.resolve().parent
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return start


def check_extension(matrix: Matrix, src: Source) -> None:
    """The extension folder is a Python project inside the repository, with its tests and
    the test sources they read.

    Checked at plan time, so a wrong path fails in a second rather than after an image
    build; a few stats, so `plan` stays fast.
    """
    ext = matrix.extension
    at = ("extension", "path")
    matrix_file = Path(src.file)
    folder = matrix_file.parent / ext.path
    if not folder.exists():
        raise src.error(at, f"extension folder '{ext.path}' not found",
                        "give the project folder relative to the matrix file")
    if not folder.is_dir():
        raise src.error(at, f"extension path '{ext.path}' is not a folder",
                        "give the folder holding pyproject.toml or setup.py")
    resolved = folder.resolve()
    if not ext.allow_outside:
        repo = repository(matrix_file)
        if not resolved.is_relative_to(repo):
            # Images and cells copy the repository; a project beside it would be missed.
            raise src.error(at, f"extension folder '{ext.path}' lies outside the repository",
                            "move it inside, or set 'allow_outside: true' under extension")
    if not ((folder / "pyproject.toml").is_file() or (folder / "setup.py").is_file()):
        raise src.error(at, f"extension folder '{ext.path}' is not a Python project "
                        "(no pyproject.toml or setup.py)", "point it at the project's folder")
    tests = folder / ext.tests
    if not tests.is_dir():
        raise src.error(("extension", "tests"), f"tests folder '{ext.tests}' not found in "
                        f"'{ext.path}'", "give the test folder relative to extension.path")
    if not tests.resolve().is_relative_to(resolved):
        raise src.error(("extension", "tests"), f"tests folder '{ext.tests}' leads outside "
                        f"'{ext.path}' (through a symlink)", "keep the tests inside the project")
    # The import package (or module), flat or src layout: never beside the tests' copy.
    packages = {p: (folder / p).resolve() for top in ("", "src/")
                for p in (f"{top}{ext.import_name}", f"{top}{ext.import_name}.py")
                if (folder / p).exists()}
    for i, rel in enumerate(ext.test_sources):
        at = ("extension", "test_sources", i)
        path = folder / rel
        if not path.exists():
            raise src.error(at, f"test source '{rel}' not found in '{ext.path}'",
                            "give a file or folder relative to extension.path")
        if not path.resolve().is_relative_to(resolved):
            raise src.error(at, f"test source '{rel}' leads outside '{ext.path}' (through a "
                            "symlink)", "keep the test sources inside the project")
        for package, real in packages.items():
            if real == path.resolve():
                raise src.error(at, f"test source '{rel}' is the import package: copied beside "
                                "the tests, it would be imported instead of the wheel",
                                "remove it (the tests import the installed package)")
            if real.is_relative_to(path.resolve()):
                raise src.error(at, f"test source '{rel}' holds the import package '{package}': "
                                "copied beside the tests, it would be imported instead of the "
                                "wheel", "list only the files and folders beside it that the "
                                "tests read")


@dataclass(frozen=True)
class _Flavor:
    name: str
    family: Family
    settings: FlavorSettings


def expand(matrix: Matrix, src: Source, compat: Compat) -> Plan:
    for axis in ("torch", "flavor", "python", "platform"):
        values, seen = getattr(matrix.axes, axis), set()
        for i, value in enumerate(values):
            if value in seen:  # (an abi3 cell would test that Python twice)
                raise src.error(("axes", axis, i), f"{axis} '{value}' is listed twice",
                                "list each value once")
            seen.add(value)
    flavors = {name: _resolve_flavor(name, matrix, src, compat) for name in matrix.flavors}
    for i, name in enumerate(matrix.axes.flavor):
        if name not in flavors:
            raise src.error(("axes", "flavor", i), f"flavor '{name}' has no settings",
                            f"add 'flavors: {{{name}: {{...}}}}' or remove it from axes.flavor")
    for i, plat in enumerate(matrix.axes.platform):
        if plat not in matrix.platforms:
            raise src.error(("axes", "platform", i), f"platform '{plat}' has no runner",
                            f"add 'platforms: {{{plat}: {{runner: ...}}}}'")
    torches = [_pin_torch(v, ("axes", "torch", i), src, compat)
               for i, v in enumerate(matrix.axes.torch)]

    plan = Plan(matrix, src, compat, [])
    exclude_hits = [0] * len(matrix.exclude)
    shadowed: dict[int, list[int]] = {}
    seen: dict[str, tuple[str | int, ...]] = {}

    def add(cell: Cell, at: tuple[str | int, ...]) -> None:
        if cell.id in seen:
            raise src.error(at, f"duplicate cell '{cell.id}'",
                            "list each torch series, flavor and Python once")
        seen[cell.id] = at
        plan.cells.append(cell)

    # Built before the per-torch cells are expanded, added after them: the ones they
    # replace are dropped with a pointer to them.
    stable_cells: list[tuple[Cell, tuple[str | int, ...]]] = []
    replaced: dict[tuple[str, str, str, str], tuple[str, int]] = {}
    claimed: dict[tuple[str, str, str], int] = {}
    labelled: dict[tuple[str, str], int] = {}
    for i, group in enumerate(matrix.stable):
        for cell, served_by in _stable_cells(matrix, src, compat, flavors, torches, group,
                                             ("stable", i), plan.dropped):
            # Two groups' wheels of one flavor share a name (demo-1.0+cpu-...): whatever
            # `replace` says, a torch both serve would get two different files of it.
            keys = {t: (cell.flavor, cell.platform, series(t)) for t in cell.serves}
            both = [t for t, key in keys.items() if claimed.get(key, i) != i]
            if both:
                other = claimed[keys[both[0]]]
                raise src.error(("stable", i), f"stable[{i}] overlaps stable[{other}] "
                                f"({src.where(('stable', other))}) on {cell.flavor} "
                                f"({cell.platform}) for torch {span([series(t) for t in both])}: "
                                f"both build a +{cell.local_version} wheel for them",
                                "narrow one of them (from, below, flavors or platforms) "
                                "or drop one")
            # Apart in torch, they still build one file name (+cpu): an index holds one.
            other = labelled.setdefault((cell.flavor, cell.platform), i)
            if other != i:
                raise src.error(("stable", i), f"stable[{i}] builds +{cell.local_version} "
                                f"wheels ({cell.platform}) as stable[{other}] "
                                f"({src.where(('stable', other))}) does: their files would "
                                "have one name, and an index holds one file per name",
                                "merge the two groups, or give one another flavor")
            claimed.update(dict.fromkeys(keys.values(), i))
            stable_cells.append((cell, ("stable", i)))
            replaced.update(dict.fromkeys(served_by, (cell.id, i)))

    pythons = matrix.axes.python
    # Axis values that produced a cell (or were excluded on purpose), and why the
    # others were dropped, so a value that can never yield a cell is reported.
    yielded: set[tuple[str, int]] = set()
    first_drop: dict[tuple[str, int], str] = {}
    pythons_yielded: set[str] = set()
    for ti, torch in enumerate(torches):
        for fi, fname in enumerate(matrix.axes.flavor):
            flavor = flavors[fname]
            for plat in matrix.axes.platform:
                for group in python_groups(pythons, matrix.extension.abi3):
                    abi3 = matrix.extension.abi3 and not _free_threaded(group)
                    label = _label(torch, fname, plat, group, abi3)
                    cell_id = _cell_id(series(torch), fname, plat, group, abi3)
                    values = {"torch": torch, "flavor": fname, "platform": plat}
                    served = [p for p in group if (fname, plat, series(torch), p) in replaced]
                    if served:
                        stable, si = replaced[(fname, plat, series(torch), served[0])]
                        # The stable wheel serves only the Pythons every torch of its range
                        # ships: the others keep this cell, so the drop names what it lost.
                        group = [p for p in group if p not in served]
                        keeps = any(compat.supports_python(torch, p) for p in group)
                        plan.dropped.append(Dropped(
                            f"py{', '.join(served)} × {label}" if keeps else label,
                            f"served by the stable-ABI wheel of {stable}", cell_id,
                            ("stable", si), stable))
                        yielded.update({("torch", ti), ("flavor", fi)})
                        pythons_yielded.update(served)
                        if not keeps:
                            continue
                    usable = [p for p in group if compat.supports_python(torch, p)]
                    excluded_by = _excluded_by(matrix.exclude, values,
                                               (usable or group) if abi3 else group,
                                               exclude_hits, shadowed)
                    if abi3:
                        for i, rule in enumerate(matrix.exclude):
                            if not _matches_axes(rule, values) or rule.python is None:
                                continue
                            named = [p for p in group if fnmatch.fnmatchcase(p, rule.python)]
                            if named and not set(named) & set(usable):
                                # It agrees with torch: this cell never served those Pythons.
                                exclude_hits[i] += 1
                            elif not excluded_by and (
                                    partial := _part_of_abi3_group(matrix, src, i, usable)):
                                raise partial
                    reason = excluded_by and _exclusion(matrix.exclude, excluded_by, src)
                    if reason:  # the user chose this: not a value that cannot yield cells
                        yielded.update({("torch", ti), ("flavor", fi)})
                        pythons_yielded.update(group)
                    # Published indexes are named by the flavor (rocm6.2.4, cu129); a
                    # toolkit patch the flavor pins (7.2.1) is still its flavor's.
                    reason = reason or compat.why_not(torch, flavor.family,
                                                      flavor_toolkit(fname), plat)
                    if reason is None and not usable:
                        reason = (f"torch {series(torch)} supports "
                                  f"{_python_support(compat, torch, group)}, "
                                  f"not {', '.join(group)}")
                    archs = None
                    if reason is None:
                        archs, reason = _torch_archs(compat, [torch], flavor, label,
                                                     plan.dropped)
                    if reason:
                        plan.dropped.append(Dropped(label, reason, cell_id, excluded_by))
                        first_drop.setdefault(("torch", ti), reason)
                        first_drop.setdefault(("flavor", fi), reason)
                        continue
                    add(_cell(matrix, src, compat, torch, flavor, plat, usable, archs=archs),
                        ("axes", "torch", ti))
                    yielded.update({("torch", ti), ("flavor", fi)})
                    pythons_yielded.update(usable)

    for i, rule in enumerate(matrix.include):
        for cell in _included(matrix, src, compat, flavors, rule, ("include", i), plan.dropped):
            taken = [p for p in cell.test_pythons
                     if (cell.flavor, cell.platform, cell.torch_series, p) in replaced]
            if taken:  # the wheel of a stable group stands for it: two wheels for one torch
                stable, si = replaced[(cell.flavor, cell.platform, cell.torch_series, taken[0])]
                raise src.error(("include", i), f"include[{i}] adds {cell.id}, which the "
                                f"stable-ABI wheel of {stable} serves (stable[{si}], replace: "
                                "true)", "drop the include, or set replace: false in the group")
            add(cell, ("include", i))
    for cell, at in stable_cells:
        add(cell, at)

    for i, hits in enumerate(exclude_hits):
        if not hits:
            raise _unmatched_exclude(matrix, src, compat, i, torches, replaced,
                                     shadowed.get(i, []))
    if not plan.cells:
        why = plan.dropped[0].reason if plan.dropped else "no combination"
        raise src.error(("axes",), f"the matrix has no cells (first drop: {why})",
                        "widen the axes or loosen the rules")
    for axis, values in (("torch", matrix.axes.torch), ("flavor", matrix.axes.flavor)):
        for i, value in enumerate(values):
            if (axis, i) not in yielded:
                why = first_drop.get((axis, i), "")
                raise src.error(("axes", axis, i), f"{axis} '{value}' yields no cell: {why}",
                                "remove it or add a combination that exists")
    pythons_yielded.update(p for cell in plan.cells for p in (cell.python, *cell.test_pythons))
    for i, python in enumerate(pythons):
        if python not in pythons_yielded:
            served = "; ".join(f"torch {series(t)}: "
                               f"{_python_support(compat, t, [python], short=True)}"
                               for t in dict.fromkeys(torches))
            raise src.error(("axes", "python", i),
                            f"python '{python}' yields no cell: no torch on the axes supports "
                            f"it ({served})", "remove it or add a torch release that ships it")
    _check_subsets(matrix, src, plan.cells, plan.dropped)
    return plan


def _pin_torch(value: str, at: tuple[str | int, ...], src: Source, compat: Compat) -> str:
    facts = compat.torch(value)
    if facts is None:
        raise src.error(at, f"torch {value} is not a known release",
                        f"known series: {compat.known_torch()} (or add it to a compat file)")
    if value.count(".") == 2:
        if version_key(value) > version_key(facts.latest):
            raise src.error(at, f"torch {value} does not exist",
                            f"the newest {series(value)} release is {facts.latest}")
        return value
    return facts.latest


def _resolve_flavor(name: str, matrix: Matrix, src: Source, compat: Compat) -> _Flavor:
    family = flavor_family(name)
    base = matrix.defaults.get(family, FlavorSettings())
    own = matrix.flavors[name]
    merged = base.model_copy(update=own.model_dump(exclude_none=True))
    at = ("flavors", name)
    implied = flavor_toolkit(name)

    def where_set(key: str) -> tuple[str | int, ...]:
        return at + (key,) if getattr(own, key) is not None else ("defaults", family, key)

    if family == "cpu":
        for key in ("toolkit", "archs", "ptx"):
            if getattr(merged, key):
                raise src.error(where_set(key), f"the cpu flavor takes no '{key}'", "remove it")
        return _Flavor(name, family, merged)

    label = "CUDA" if family == "cuda" else "ROCm"
    toolkit = merged.toolkit or implied
    # By release numbers, not text: flavor rocm7.1 must not take toolkit 7.14.
    if not same_series(toolkit, implied):
        raise src.error(where_set("toolkit"), f"toolkit {toolkit} does not match flavor {name}",
                        f"use a {label} {implied}.x version")
    if compat.toolkit(family, toolkit) is None:
        raise src.error(where_set("toolkit") if merged.toolkit else at,
                        f"{label} {toolkit} is not a known toolkit",
                        f"known: {span(list(compat.toolkits(family)))}")
    if not merged.archs:
        raise src.error(at, f"flavor {name} lists no GPU archs",
                        "add 'archs: [...]' (archs are never detected on a builder)")
    for key, archs in (("archs", merged.archs), ("ptx", merged.ptx or [])):
        seen: set[str] = set()
        for i, arch in enumerate(archs):
            if arch in seen:
                raise src.error(where_set(key) + (i,), f"arch '{arch}' is listed twice",
                                "list each arch once")
            seen.add(arch)
        for bad in compat.unsupported_archs(family, toolkit, archs):
            index = archs.index(bad)
            path = where_set(key) + (index,)
            facts = compat.toolkit(family, toolkit)
            if bad[-1:] in ("a", "f") and bad[:-1] in facts.archs:
                variants = facts.arch_specific if bad.endswith("a") else facts.family_specific
                fix = (f"its '{bad[-1]}' targets are "
                       f"{', '.join(v + bad[-1] for v in variants) or 'none'}")
            else:
                fix = f"it targets {', '.join(compat.toolkit_archs(family, toolkit))}"
            raise src.error(path, f"{label} {implied} cannot target arch '{bad}'", fix)
    if merged.ptx:
        if family == "rocm":
            raise src.error(where_set("ptx"), "ROCm flavors take no 'ptx'", "remove it")
        for i, arch in enumerate(merged.ptx):
            if arch not in merged.archs:
                raise src.error(where_set("ptx") + (i,), f"ptx arch '{arch}' is not in archs",
                                "TORCH_CUDA_ARCH_LIST embeds PTX only beside SASS; add it to archs")
    return _Flavor(name, family, merged.model_copy(update={"toolkit": toolkit}))


def _label(torch: str, flavor: str, platform: str, pythons: list[str], abi3: bool) -> str:
    py = "" if abi3 else f"py{pythons[0]} × "
    return f"{py}torch {torch} × {flavor} × {platform}"


def _python_support(compat: Compat, torch: str, pythons: list[str],
                    short: bool = False) -> str:
    """What torch ships of the kinds of CPython `pythons` are. A free-threaded build (3.13t)
    is not implied by the release's range: torch lists those one by one."""
    facts = compat.torch(torch)
    regular = f"{facts.python.min}–{facts.python.max}"
    free = [p for p in pythons if p.endswith("t")]
    if not free:
        return regular if short else f"Python {regular}"
    builds = ", ".join(facts.python_free_threaded)
    if short:
        return f"free-threaded {builds}" if builds else "no free-threaded build"
    if len(free) == len(pythons):
        return f"free-threaded Python {builds}" if builds else "no free-threaded Python"
    return f"Python {regular} and " + (f"free-threaded {builds}" if builds
                                       else "no free-threaded build")


def _excluded_by(rules: list[Rule], values: dict[str, str], pythons: list[str],
                 hits: list[int], shadowed: dict[int, list[int]]) -> tuple[str, int] | None:
    """The first rule that removes the combination; later rules that match it too are
    recorded in `shadowed`, so one that never gets a combination of its own is told why."""
    matching = [i for i, rule in enumerate(rules) if _matches(rule, values, pythons)]
    if not matching:
        return None
    first, *later = matching
    hits[first] += 1
    for i in later:
        if first not in shadowed.setdefault(i, []):
            shadowed[i].append(first)
    return ("exclude", first)


def _exclusion(rules: list[Rule], at: tuple[str, int], src: Source) -> str:
    reason = rules[at[1]].reason
    return f"excluded by exclude[{at[1]}] ({src.where(at)})" + (f": {reason}" if reason else "")


def _unmatched_exclude(matrix: Matrix, src: Source, compat: Compat, i: int,
                       torches: list[str],
                       replaced: dict[tuple[str, str, str, str], tuple[str, int]],
                       shadowed: list[int]) -> UserError:
    """exclude[i] removed nothing: say why where its patterns are not simply wrong."""
    rule = matrix.exclude[i]
    named = [p for p in matrix.axes.python
             if rule.python is None or fnmatch.fnmatchcase(p, rule.python)]
    combos = [(t, f, p) for t in torches for f in matrix.axes.flavor
              for p in matrix.axes.platform
              if _matches_axes(rule, {"torch": t, "flavor": f, "platform": p})]
    # Stable wheels replace per-torch cells Python by Python: the rule's own Pythons count.
    keys = [(f, p, series(t), py) for t, f, p in combos for py in named
            if compat.supports_python(t, py)]
    gone = [key for key in keys if key in replaced]
    if gone and len(gone) == len(keys):  # replaced cells are dropped before rules are tried
        stable, si = replaced[gone[0]]
        return src.error(("exclude", i), f"exclude[{i}] matches only cells that stable[{si}] "
                         f"({src.where(('stable', si))}) replaces with {stable}",
                         f"delete the rule or narrow stable[{si}]")
    if shadowed:  # every combination it takes, an earlier rule took first
        rules = " and ".join(f"exclude[{k}] ({src.where(('exclude', k))})" for k in shadowed)
        return src.error(("exclude", i), f"exclude[{i}] removes nothing: {rules} already "
                         f"remove{'s' if len(shadowed) == 1 else ''} every combination it "
                         "matches", "delete it or narrow "
                         + " and ".join(f"exclude[{k}]" for k in shadowed))
    for torch, flavor, platform in combos:
        served = [p for p in matrix.axes.python
                  if not p.endswith("t") and compat.supports_python(torch, p)
                  and (flavor, platform, series(torch), p) not in replaced]
        if partial := _part_of_abi3_group(matrix, src, i, served):
            return partial
    return src.error(("exclude", i), f"exclude[{i}] matches no combination of the axes",
                     "fix its patterns or delete it")


def _part_of_abi3_group(matrix: Matrix, src: Source, i: int,
                        served: list[str]) -> UserError | None:
    """exclude[i] names some of the Pythons (`served`, those its torch supports) an abi3
    cell's one wheel serves: it cannot leave them out (that cell builds and tests them all),
    so it is an error, not a no-op, even where the rule also takes a free-threaded cell of
    its own."""
    rule = matrix.exclude[i]
    named = [p for p in served if rule.python and fnmatch.fnmatchcase(p, rule.python)]
    if not (matrix.extension.abi3 and named) or len(named) == len(served):
        return None
    threaded = [p for p in matrix.axes.python if p.endswith("t")]
    fix = ((f"name only free-threaded Pythons ({', '.join(threaded)}), which get cells of "
            "their own, or drop 'python' to exclude whole cells") if threaded
           else "drop 'python' to exclude whole cells")
    return src.error(("exclude", i, "python"), f"exclude[{i}] names Python "
                     f"{', '.join(named)}, but the extension is abi3: one wheel per cell "
                     f"serves Python {', '.join(served)}, and a rule leaves it out only by "
                     "naming all of them", fix)


def _matches(rule: Rule, values: dict[str, str], pythons: list[str]) -> bool:
    if not _matches_axes(rule, values):
        return False
    if rule.python is not None:
        # Python rules only split non-abi3 cells; an abi3 cell is excluded only
        # when every Python it would test is.
        return all(fnmatch.fnmatchcase(p, rule.python) for p in pythons)
    return True


def _matches_axes(rule: Rule, values: dict[str, str]) -> bool:
    """Does the rule take torch × flavor × platform, whatever it says of Python?"""
    for key in ("torch", "flavor", "platform"):
        pattern = getattr(rule, key)
        if pattern is None:
            continue
        value = values[key]
        candidates = [value, series(value)] if key == "torch" else [value]
        if not any(fnmatch.fnmatchcase(c, pattern) for c in candidates):
            return False
    return True


def _included(matrix: Matrix, src: Source, compat: Compat, flavors: dict[str, _Flavor],
              rule: Rule, at: tuple[str | int, ...], dropped: list[Dropped]) -> list[Cell]:
    for key in ("torch", "flavor"):
        value = getattr(rule, key)
        if value is None:
            raise src.error(at, f"an include needs '{key}'", f"add '{key}: ...'")
        if any(ch in value for ch in "*?["):
            raise src.error(at + (key,), f"include values are exact, not patterns ('{value}')",
                            "name one release or flavor")
    for key in ("python", "platform"):
        value = getattr(rule, key)
        if value is not None and any(ch in value for ch in "*?["):
            raise src.error(at + (key,), f"include values are exact, not patterns ('{value}')",
                            f"name one {key}, or leave '{key}' out for every one of the axes")
    if rule.flavor not in flavors:
        raise src.error(at + ("flavor",), f"flavor '{rule.flavor}' has no settings",
                        f"add 'flavors: {{{rule.flavor}: {{...}}}}'")
    torch = _pin_torch(rule.torch, at + ("torch",), src, compat)
    flavor = flavors[rule.flavor]
    platforms = [rule.platform] if rule.platform else matrix.axes.platform
    pythons = [rule.python] if rule.python else matrix.axes.python
    cells = []
    for plat in platforms:
        if plat not in matrix.platforms:
            raise src.error(at + ("platform",), f"platform '{plat}' has no runner",
                            f"add 'platforms: {{{plat}: {{runner: ...}}}}'")
        reason = compat.why_not(torch, flavor.family, flavor_toolkit(flavor.name), plat)
        if reason:
            raise src.error(at, f"included combination does not exist: {reason}")
        usable = [p for p in pythons if compat.supports_python(torch, p)]
        if not usable:
            raise src.error(at, f"torch {series(torch)} supports "
                                f"{_python_support(compat, torch, pythons)}, "
                                f"not {', '.join(pythons)}", "pick a supported Python")
        for group in python_groups(usable, matrix.extension.abi3):
            label = _label(torch, flavor.name, plat, group,
                           matrix.extension.abi3 and not _free_threaded(group))
            archs, reason = _torch_archs(compat, [torch], flavor, label, dropped)
            if reason:
                raise src.error(at, f"included combination does not exist: {reason}")
            cells.append(_cell(matrix, src, compat, torch, flavor, plat, group, archs=archs))
    return cells


def _stable_cells(matrix: Matrix, src: Source, compat: Compat, flavors: dict[str, _Flavor],
                  torches: list[str], group: StableGroup, at: tuple[str | int, ...],
                  dropped: list[Dropped]
                  ) -> list[tuple[Cell, list[tuple[str, str, str, str]]]]:
    """One group's cells, each with the per-torch cells it stands in for: flavor, platform,
    torch series and Python, since it serves only the Pythons every torch of its range
    ships, and the per-torch cells keep the others."""
    torch = _pin_torch(group.from_, at + ("from",), src, compat)
    if not compat.torch(torch).stable_abi:
        known = [s for s, f in compat.facts.torch.items() if f.stable_abi]
        raise src.error(at + ("from",), f"torch {series(torch)} has no versioned stable ABI "
                        "(TORCH_TARGET_VERSION)",
                        f"start from {min(known, key=version_key)} or later")
    if group.below and group.below.count(".") > 1:
        # torch<2.12.1 would take 2.12.0 and leave out 2.12.1, the release the group tests.
        raise src.error(at + ("below",), f"'below: {group.below}' names a release, not a "
                        "release series", "give the first series the wheels do not serve, "
                        f"such as '{_next_series(group.below)}'")
    if group.below and version_key(group.below) <= version_key(series(torch)):
        raise src.error(at + ("below",), f"'below: {group.below}' leaves no torch release "
                        f"from {series(torch)} on", f"give a release after {series(torch)}")
    results = []
    for j, name in enumerate(group.flavors):
        if name not in flavors:
            raise src.error(at + ("flavors", j), f"flavor '{name}' has no settings",
                            f"add 'flavors: {{{name}: {{...}}}}'")
        flavor = flavors[name]
        for plat in group.platforms or matrix.axes.platform:
            if plat not in matrix.platforms:
                raise src.error(at + ("platforms",), f"platform '{plat}' has no runner",
                                f"add 'platforms: {{{plat}: {{runner: ...}}}}'")
            reason = compat.why_not(torch, flavor.family, flavor_toolkit(name), plat)
            if reason:
                raise src.error(at + ("flavors", j), f"stable {name} wheels are compiled "
                                f"against torch {torch}, but {reason}",
                                "start the group at a release that has this flavor")
            serves = [t for t in dict.fromkeys([torch, *torches])
                      if _in_range(t, torch, group.below)
                      and _same_toolkit_major(compat, t, flavor, plat)]
            usable = [p for p in matrix.axes.python
                      if all(compat.supports_python(t, p) for t in serves)]
            if not usable:
                raise src.error(at + ("from",), "no Python of axes.python is supported by "
                                f"every torch from {series(torch)} on", "widen axes.python")
            for pythons in python_groups(usable, matrix.extension.abi3):
                label = _label(torch, name, plat, pythons,
                               matrix.extension.abi3 and not _free_threaded(pythons))
                # One wheel runs beside every torch it serves: an arch earns its place
                # when any of them has kernels for it.
                archs, reason = _torch_archs(compat, serves, flavor, f"stable {label}", dropped)
                if reason:
                    raise src.error(at + ("flavors", j), f"stable {name} wheels: {reason}",
                                    "list an arch those torch releases are built for")
                serves = sorted(serves, key=version_key)
                builds = [f"{t}+{name}" for t in serves
                          if compat.why_not(t, flavor.family, flavor_toolkit(name), plat) is None]
                cell = _cell(matrix, src, compat, torch, flavor, plat, pythons,
                             stable=group, serves=tuple(serves), serves_builds=tuple(builds),
                             archs=archs)
                served = ([(name, plat, series(t), p) for t in serves for p in pythons]
                          if group.replace else [])
                results.append((cell, served))
    return results


def _next_series(version: str) -> str:
    major, minor = version.split(".")[:2]
    return f"{major}.{int(minor) + 1}"


def _in_range(torch: str, start: str, below: str | None) -> bool:
    key = version_key(series(torch))
    return key >= version_key(series(start)) and (below is None or key < version_key(below))


def toolkit_series_depth(family: str) -> int:
    """How much of a toolkit version a GPU wheel must share with the torch it runs beside:
    CUDA's major (13.0 code runs on 13.2: minor version compatibility), ROCm's major.minor
    (HIP promises nothing across minors, and torch ships a build per minor)."""
    return 1 if family == "cuda" else 2


def _same_toolkit_major(compat: Compat, torch: str, flavor: _Flavor, platform: str) -> bool:
    """Can a wheel of this flavor run beside some build of `torch`? A CPU wheel beside any;
    a GPU wheel beside a build of the same toolkit series (toolkit_series_depth)."""
    if compat.why_not(torch, flavor.family, None, platform):
        return False
    facts = compat.torch(torch)
    if flavor.family == "cpu":
        return True
    depth = toolkit_series_depth(flavor.family)
    wanted = version_key(flavor.settings.toolkit or "")[:depth]
    published = facts.cuda if flavor.family == "cuda" else facts.rocm
    return any(version_key(t)[:depth] == wanted for t in published)


def python_groups(pythons: list[str], abi3: bool) -> list[list[str]]:
    """The Pythons each cell serves: an abi3 wheel serves every regular CPython, but the
    stable ABI does not cover free-threaded builds (3.13t): each of those is a cell."""
    if not abi3:
        return [[p] for p in pythons]
    regular = [p for p in pythons if not p.endswith("t")]
    return ([regular] if regular else []) + [[p] for p in pythons if p.endswith("t")]


def _free_threaded(pythons: list[str]) -> bool:
    return any(p.endswith("t") for p in pythons)


def _torch_archs(compat: Compat, torches: list[str], flavor: _Flavor, label: str,
                 dropped: list[Dropped]) -> tuple[tuple[str, ...], str | None]:
    """The flavor's archs that torch's own wheels of this flavor are built for, with the
    others recorded in `dropped`; a reason instead when none is left.

    PyTorch's ROCm arch list changes per torch release, so one rocmX.Y flavor spans
    releases with different lists. Code for an arch torch has no kernels for cannot run
    beside it; the cell is built for the rest. CUDA archs do not depend on the release.
    """
    archs = tuple(flavor.settings.archs or ())
    if flavor.family != "rocm":
        return archs, None
    index = flavor_toolkit(flavor.name) or ""
    built = {a for t in torches for a in compat.rocm_archs(t, index)}
    kept = tuple(a for a in archs if a in built)
    names = span(list({series(t) for t in torches}))
    if not kept:
        return kept, (f"torch {names} {flavor.name} wheels are built for none of "
                      f"{', '.join(archs)}")
    for arch in archs:
        if arch not in built:
            dropped.append(Dropped(f"{label} × {arch}", f"torch {names} {flavor.name} wheels "
                                                        f"are not built for {arch}"))
    return kept, None


def _cell(matrix: Matrix, src: Source, compat: Compat, torch: str, flavor: _Flavor,
          platform: str, pythons: list[str], stable: StableGroup | None = None,
          serves: tuple[str, ...] = (), serves_builds: tuple[str, ...] = (),
          archs: tuple[str, ...] | None = None) -> Cell:
    abi3 = matrix.extension.abi3 and not _free_threaded(pythons)
    torch_series = series(torch)
    s = flavor.settings
    pythons = sorted(pythons, key=version_key)
    cell_id = _cell_id(torch_series, flavor.name, platform, pythons, abi3, stable is not None)
    archs = tuple(s.archs or ()) if archs is None else archs
    ptx = tuple(s.ptx or ())
    if flavor.family == "cuda":
        arch_list = ";".join(a + ("+PTX" if a in ptx else "") for a in archs)
    else:
        arch_list = ";".join(archs)
    major, minor = torch_series.split(".")
    fill = {"flavor": flavor.name, "toolkit": s.toolkit or "", "torch": torch,
            "platform": platform}

    def expand_text(key: str, text: str) -> str:
        at = ("flavors", flavor.name, key)
        if getattr(matrix.flavors[flavor.name], key) is None:
            at = ("defaults", flavor.family, key)
        if not s.toolkit and "{toolkit}" in text:
            # A CPU flavor has no toolkit: the text would be cut where it stood.
            raise src.error(at, f"'{text}' names {{toolkit}}, which flavor '{flavor.name}' has "
                            "none of", "write the value out for this flavor")
        try:
            return text.format(**fill)
        except (KeyError, IndexError, ValueError):
            fix = "placeholders are {flavor}, {toolkit}, {torch} and {platform}"
            raise src.error(at, f"bad placeholder in '{text}'", fix) from None
    tag = s.toolkit if flavor.family != "cpu" else "latest"
    if platform != DEFAULT_PLATFORM:
        tag += f"-{platform}"
    return Cell(
        id=cell_id,
        torch=torch,
        torch_series=torch_series,
        flavor=flavor.name,
        family=flavor.family,
        toolkit=s.toolkit,
        archs=archs,
        ptx=ptx,
        arch_list=arch_list,
        python=pythons[0],
        test_pythons=tuple(pythons),
        platform=platform,
        runner=(s.runner if s.runner and platform == DEFAULT_PLATFORM
                else matrix.platforms[platform].runner),
        # Like `runner`, a flavor's GPU machine is an x86_64 one: an aarch64 cell's tests
        # would run on a machine that cannot install its wheel.
        gpu_runner=(s.gpu_runner if flavor.family != "cpu" and platform == DEFAULT_PLATFORM
                    else None),
        abi3=abi3,
        cxx=compat.torch(torch).cxx,
        # A stable CPU build needs only the headers and C shims every build of the release
        # has: the cpu index still wins where reachable (2.11.0+cpu sorts above 2.11.0).
        torch_spec=f"torch=={torch}" + ("+cpu" if flavor.family == "cpu" and not stable else ""),
        index=expand_text("index", s.index) if s.index else None,
        base_image=expand_text("base_image", s.base_image) if s.base_image else None,
        image=f"{matrix.images.prefix}-{flavor.family}:{tag}",
        local_version=flavor.name if stable else f"pt{major}{minor}{flavor.name}",
        requires_torch=(f"torch>={torch_series}" + (f",<{stable.below}" if stable.below else "")
                        if stable else f"torch=={torch_series}.*"),
        runtime_deps=tuple(expand_text("runtime_deps", d) for d in (s.runtime_deps or ())),
        stable=torch_series if stable else None,
        serves=serves,
        serves_builds=serves_builds,
    )


def _cell_id(torch_series: str, flavor: str, platform: str, pythons: list[str], abi3: bool,
             stable: bool = False) -> str:
    cell_id = f"{'stable' if stable else 'torch'}{torch_series}-{flavor}"
    if not abi3:
        cell_id = f"py{min(pythons, key=version_key)}-{cell_id}"
    if platform != DEFAULT_PLATFORM:
        cell_id += f"-{platform}"
    return cell_id


def _check_subsets(matrix: Matrix, src: Source, cells: list[Cell],
                   dropped: list[Dropped]) -> None:
    ids = [c.id for c in cells]
    for name, globs in matrix.subsets.items():
        for i, glob in enumerate(globs):
            if any(fnmatch.fnmatchcase(cid, glob) for cid in ids):
                continue
            at = ("subsets", name, i)
            # A cell the plan left out on purpose is no typo: a look-alike would mislead.
            gone = next((d for d in dropped if d.cell and fnmatch.fnmatchcase(d.cell, glob)),
                        None)
            if gone and gone.instead and gone.rule:
                raise src.error(at, f"subset '{name}' names {gone.cell}, which stable"
                                f"[{gone.rule[1]}] ({src.where(gone.rule)}) replaces",
                                f"name '{gone.instead}' instead")
            if gone and gone.rule:
                raise src.error(at, f"subset '{name}' names {gone.cell}, which exclude"
                                f"[{gone.rule[1]}] ({src.where(gone.rule)}) removes",
                                "drop it from the subset or narrow the rule")
            if gone:
                raise src.error(at, f"subset '{name}' names {gone.cell}, which cannot be "
                                f"built: {gone.reason}", "drop it from the subset")
            close = difflib.get_close_matches(glob, ids, n=1, cutoff=0.5)
            fix = f"did you mean '{close[0]}'?" if close else "run 'extmatrix plan' for ids"
            raise src.error(at, f"subset '{name}': '{glob}' matches no cell", fix)
