"""The schema of matrix.yaml, and loading it into typed settings with precise errors."""

from __future__ import annotations

import difflib
import keyword
import re
import string
import types
import typing
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from . import source as yaml_source
from .errors import UserError
from .source import Source

Family = Literal["cpu", "cuda", "rocm"]
Platform = Literal["x86_64", "aarch64"]

# Every pattern is applied with fullmatch: `$` would also accept a trailing newline.
_FLAVOR = re.compile(r"cpu|cu(\d{2})(\d)|rocm(\d+\.\d+(?:\.\d+)?)")
_TORCH = re.compile(r"\d+\.\d+(\.\d+)?")
_PYTHON = re.compile(r"3\.\d+t?")  # 3.13t: a free-threaded build
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_TOOLKIT = re.compile(r"\d+(\.\d+){1,2}")
_PLACEHOLDER = re.compile(r"\{(\w*)\}")
# Index URLs and image references reach command lines and environment variables:
# only the characters a URL or an OCI reference needs, never quotes, `$` or spaces.
_URL = re.compile(r"(https?://[A-Za-z0-9.\[\]-]|file:///?[A-Za-z0-9._~%-])"
                  r"[A-Za-z0-9._~%!&()*+,;=:@/?#\[\]-]*")
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_NAME = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_IMAGE = re.compile(
    r"(?:(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"|\[[0-9A-Fa-f:]+\])(?::\d+)?/)?"  # registry[:port]/
    rf"{_COMPONENT}(?:/{_COMPONENT})*"  # name
    r"(?::\w[\w.-]{0,127})?"  # :tag
    r"(?:@sha256:[0-9a-f]{64})?"  # @digest
)
_TESTS = re.compile(r"[A-Za-z0-9._/-]+")
# What each placeholder stands in for while a value is checked, before a cell fills it.
_SAMPLES = {"flavor": "cu130", "toolkit": "13.0", "torch": "2.11.0", "platform": "x86_64"}
# One image serves every torch release of a flavor (it is tagged by toolkit): no {torch}.
_IMAGE_PLACEHOLDERS = ("flavor", "toolkit", "platform")
_TEST_PLACEHOLDERS = ("python", "tests", "junit")


def flavor_family(name: str) -> Family:
    return "cpu" if name == "cpu" else "cuda" if name.startswith("cu") else "rocm"


def flavor_toolkit(name: str) -> str | None:
    """The toolkit version a flavor name implies: cu130 -> 13.0, rocm6.4 -> 6.4."""
    match = _FLAVOR.fullmatch(name)
    if not match or name == "cpu":
        return None
    if match.group(1):
        return f"{int(match.group(1))}.{match.group(2)}"
    return match.group(3)


def _check_flavor(name: str) -> str:
    if not _FLAVOR.fullmatch(name):
        raise ValueError(
            f"unknown flavor '{name}'; a flavor is 'cpu', 'cuXYZ' (CUDA X.Y, e.g. cu130) "
            "or 'rocmX.Y' (e.g. rocm7.2)"
        )
    return name


def _check_torch(value: str) -> str:
    if not _TORCH.fullmatch(value):
        raise ValueError(f"'{value}' is not a torch release; write X.Y or X.Y.Z, e.g. \"2.11\"")
    return value


def _check_python(value: str) -> str:
    if not _PYTHON.fullmatch(value):
        raise ValueError(f"'{value}' is not a Python version; write 3.X or 3.Xt, e.g. \"3.12\"")
    return value


def check_name(value: str) -> str:
    if not _NAME.fullmatch(value):
        raise ValueError(f"'{value}' is not a valid name; use letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit")
    return value


def check_import_name(value: str) -> str:
    def importable(name: str) -> bool:
        return all(p.isidentifier() and not keyword.iskeyword(p) for p in name.split("."))

    if importable(value):
        return value
    guess = ".".join(re.sub(r"\W", "_", p) for p in value.split(".") if p)
    hint = f", as in `import {guess}`" if guess and importable(guess) else ""
    raise ValueError(f"'{value}' is not a Python import name; use identifiers joined by "
                     f"'.'{hint}")


def _with_samples(value: str) -> str:
    # Unknown placeholder names pass here; filling a cell reports them at their line.
    return _PLACEHOLDER.sub(lambda m: _SAMPLES.get(m.group(1), "x"), value)


def _check_toolkit(value: str) -> str:
    if not _TOOLKIT.fullmatch(value):
        raise ValueError(f"'{value}' is not a toolkit version; write X.Y or X.Y.Z, e.g. \"13.0\"")
    return ".".join(str(int(part)) for part in value.split("."))  # 13.00 is 13.0


def _check_index(value: str) -> str:
    if not _URL.fullmatch(_with_samples(value)):
        raise ValueError(f"'{value}' is not an index URL; write an http(s):// or file:// URL "
                         "without spaces, quotes or '$', e.g. https://download.pytorch.org/whl/cpu")
    return value


def _check_image(value: str) -> str:
    for name in _PLACEHOLDER.findall(value):
        if name not in _IMAGE_PLACEHOLDERS:
            why = (" (one image serves every torch release of a flavor)" if name == "torch"
                   else "")
            raise ValueError(f"bad placeholder {{{name}}} in '{value}'{why}; base_image "
                             "placeholders are {flavor}, {toolkit} and {platform}")
    if not _IMAGE.fullmatch(_with_samples(value)):
        raise ValueError(f"'{value}' is not an image reference; write "
                         "[registry/]name[:tag][@sha256:digest] in lowercase, e.g. "
                         "quay.io/pypa/manylinux_2_28_{platform}:2025.11.09-1")
    return value


def _check_image_name(value: str) -> str:
    if not _IMAGE_NAME.fullmatch(value):
        raise ValueError(f"'{value}' is not an image name; use lowercase letters and digits, "
                         "joined by '.', '_', '-' or '/'")
    return value


def _check_requirement(value: str) -> str:
    try:
        Requirement(_with_samples(value))
    except InvalidRequirement as exc:
        why = str(exc).splitlines()[0] if str(exc) else "invalid"
        raise ValueError(f"'{value}' is not a requirement ({why}); "
                         "write a PEP 508 requirement, e.g. triton>=3.1") from None
    return value


def _check_relative(value: str) -> str:
    if not value or PurePosixPath(value).is_absolute() or not value.isprintable():
        raise ValueError(f"'{value}' is not a relative path; "
                         "give the project folder relative to the matrix file")
    return value


def _check_inside(value: str, what: str = "folder") -> str:
    if PurePosixPath(value).is_absolute():
        raise ValueError(f"'{value}' is an absolute path; give the {what} relative to "
                         "extension.path")
    if ".." in value.split("/"):
        raise ValueError(f"'{value}' leads out of the extension; give a {what} inside "
                         "extension.path")
    if not _TESTS.fullmatch(value):
        raise ValueError(f"'{value}' is not a plain {what} path; use only letters, digits, "
                         "'.', '_', '-' and '/'")
    return value


def _check_tests(value: str) -> str:
    return _check_inside(value)


def _check_test_source(value: str) -> str:
    path = PurePosixPath(_check_inside(value, "file or folder"))
    if not path.name:
        raise ValueError(f"'{value}' is the extension's whole folder, its sources with it; "
                         "list the files and folders the tests read")
    return path.as_posix()  # the one spelling both backends copy to


def _check_argument(value: str) -> str:
    if any(c in value for c in "\0\n\r"):
        raise ValueError(f"test argument '{value}' holds a NUL or a line break; "
                         "give each argument on one line")
    return value


def _check_test_requirement(value: str) -> str:
    # Nothing fills placeholders here: test_requires is one list for every cell.
    if _PLACEHOLDER.search(value):
        raise ValueError(f"'{value}' holds a placeholder, but test_requires is the same for "
                         "every cell; write a plain requirement, e.g. numpy>=1.26")
    return _check_requirement(value)


def _check_command_argument(value: str) -> str:
    allowed = "{python}, {tests} or {junit}"
    try:
        fields = [(name, conversion, spec) for _, name, spec, conversion
                  in string.Formatter().parse(value) if name is not None]
    except ValueError:
        raise ValueError(f"unmatched brace in test command argument '{value}'; write "
                         f"{{{{ or }}}} for a literal brace, {allowed} for a placeholder") from None
    for name, conversion, spec in fields:
        if name not in _TEST_PLACEHOLDERS or conversion or spec:
            field = name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
            raise ValueError(f"bad placeholder {{{field}}} in test command argument '{value}'; "
                             f"use {allowed}, and {{{{ or }}}} for a literal brace")
    return value


FlavorName = Annotated[str, AfterValidator(_check_flavor)]
TorchVersion = Annotated[str, AfterValidator(_check_torch)]
PythonVersion = Annotated[str, AfterValidator(_check_python)]
Name = Annotated[str, AfterValidator(check_name)]
ImportName = Annotated[str, AfterValidator(check_import_name)]
ToolkitVersion = Annotated[str, AfterValidator(_check_toolkit)]
IndexUrl = Annotated[str, AfterValidator(_check_index)]
ImageRef = Annotated[str, AfterValidator(_check_image)]
ImageName = Annotated[str, AfterValidator(_check_image_name)]
RequirementText = Annotated[str, AfterValidator(_check_requirement)]
TestRequirement = Annotated[str, AfterValidator(_check_test_requirement)]
RelativePath = Annotated[str, AfterValidator(_check_relative)]
TestsPath = Annotated[str, AfterValidator(_check_tests)]
TestSource = Annotated[str, AfterValidator(_check_test_source)]
TestArgument = Annotated[str, AfterValidator(_check_argument)]
CommandArgument = Annotated[TestArgument, AfterValidator(_check_command_argument)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class Extension(_Model):
    """The extension under build; point it at your own project."""

    path: RelativePath = Field(
        "ext",
        description="Project folder holding setup.py/pyproject.toml, relative to the matrix "
        "file. It must lie inside the repository (the nearest folder up from the matrix file "
        "that holds .git, else the matrix file's folder) unless `allow_outside` is set.",
    )
    allow_outside: bool = Field(
        False,
        description="Let `path` lead outside the repository (e.g. a project checked out "
        "beside it). Lifts only that rule: the folder must still be a Python project.",
    )
    name: Name = Field(description="Distribution name, as in the wheel file name.")
    import_name: ImportName = Field(alias="import", description="Top-level import name.")
    tests: TestsPath = Field(
        "tests", description="Test folder, relative to `path` and inside it (no '..')."
    )
    test_sources: list[TestSource] = Field(
        default_factory=list,
        description="Files and folders outside `tests` the tests read (kernel sources, data, "
        "scripts), relative to `path` (no '..'): the tests run from a copy of their folder, "
        "and these are copied to their places beside it (cibuildwheel's test-sources). Never "
        "the import package: the tests would import it instead of the wheel.",
    )
    abi3: bool = Field(
        True,
        description="One wheel serves every Python of a cell: cp3X-abi3, or py3-none where its "
        "binaries link no libpython (a TORCH_LIBRARY library); the Python axis then only "
        "multiplies the tests: the wheel is tested under each of its Pythons installed on the "
        "machine, and the report names those that are not (a stable-ABI cell's wheel: under "
        "one of them, beside each torch release it serves).",
    )
    test_args: list[TestArgument] = Field(
        default_factory=list, description="Extra pytest arguments for the matrix tests."
    )
    test_requires: list[TestRequirement] = Field(
        default_factory=list,
        description="Installed beside the wheel for its tests (the wheel's own `test` extra "
        "is installed too when it has one).",
    )
    test_command: Annotated[list[CommandArgument], Field(min_length=1)] | None = Field(
        None,
        description="The test command, one argument per item, run in the test environment; "
        "{python}, {tests} and {junit} are filled in ({{ and }} for a literal brace). Default: "
        "pytest on `tests` (with the engine's plugin, so --require-gpu works for any suite).",
    )
    cross_torch: Literal["refuse", "report"] = Field(
        "report",
        description="A wheel imported beside another cell's torch: 'refuse' fails the cell "
        "unless the import is refused with a clear ImportError; 'report' only says that it "
        "loads (a crash or an undefined symbol fails either way).",
    )
    mismatch_message: str | None = Field(
        None,
        description="Text the ImportError must contain when a wheel is imported beside "
        "another torch (the cross-cell check).",
    )

    @property
    def test_requirements(self) -> list[str]:
        """test_requires, and pytest when the engine runs the tests with pytest."""
        named = {canonicalize_name(Requirement(r).name) for r in self.test_requires}
        runs_pytest = self.test_command is None and "pytest" not in named
        return [*self.test_requires, *(["pytest"] if runs_pytest else [])]


class FlavorSettings(_Model):
    """Per-flavor settings. Unset keys come from `defaults.<family>`."""

    toolkit: ToolkitVersion | None = Field(
        None, description="CUDA/ROCm version; defaults from the name."
    )
    archs: list[str] | None = Field(
        None, description="GPU targets compiled to machine code (SASS / gfx). Never detected."
    )
    ptx: list[str] | None = Field(None, description="CUDA archs also embedded as PTX for JIT.")
    index: IndexUrl | None = Field(
        None, description="Package index serving this flavor's torch: an http(s):// or file:// "
        "URL; placeholders {flavor}, {toolkit}, {torch}, {platform}."
    )
    base_image: ImageRef | None = Field(
        None, description="Upstream image the build image starts from: "
        "[registry/]name[:tag][@sha256:digest]; placeholders {flavor}, {toolkit}, {platform} "
        "(not {torch}: one image serves every torch release of a flavor)."
    )
    runner: Name | None = Field(
        None, description="GitHub Actions runner label that builds this flavor's x86_64 cells "
        "(e.g. a larger one for CUDA); default: the platform's runner.")
    gpu_runner: Name | None = Field(
        None, description="Runner label with a GPU of this flavor: its x86_64 cells' tests run "
        "there with --require-gpu (like `runner`, it is not used for aarch64 cells). Unset: GPU "
        "tests are not run, and CI says so.")
    runtime_deps: list[RequirementText] | None = Field(
        None, description="Requirements written into the wheel for this flavor (e.g. triton)."
    )


class Axes(_Model):
    torch: list[TorchVersion] = Field(min_length=1)
    flavor: list[FlavorName] = Field(min_length=1)
    python: list[PythonVersion] = Field(min_length=1)
    platform: list[Platform] = Field(["x86_64"], min_length=1)


class Rule(_Model):
    """Selects combinations by glob over axis values: {torch: "2.1*", flavor: "rocm*"}."""

    torch: str | None = None
    flavor: str | None = None
    python: str | None = None
    platform: str | None = None
    reason: str | None = None


class StableGroup(_Model):
    """Wheels built once against the LibTorch stable ABI of torch `from`, loaded by every
    later torch in the range: one cell per flavor instead of one per torch release."""

    from_: TorchVersion = Field(
        alias="from", description="Oldest torch the wheels serve: they are compiled against "
        "it with TORCH_TARGET_VERSION set to it, and require torch>=X.Y.")
    below: TorchVersion | None = Field(
        None, description="First torch release the wheels do not claim: written into them as "
        "torch<X.Y. Unset: no upper bound.")
    flavors: list[FlavorName] = Field(
        min_length=1, description="Flavors built this way (each needs its `flavors` entry).")
    platforms: list[Platform] | None = Field(
        None, description="Platforms built this way; default: axes.platform.")
    replace: bool = Field(
        True, description="Drop the per-torch cells these wheels serve (same flavor and "
        "platform, torch in the range); false keeps both. The wheels serve only the Pythons "
        "every torch of the range ships: per-torch cells keep the others.")


class PlatformSettings(_Model):
    runner: Name = Field(description="GitHub Actions runner label that builds this platform.")


class Images(_Model):
    prefix: ImageName = Field(
        "extmatrix", description="Built images are named PREFIX-FAMILY:TAG."
    )


class Matrix(_Model):
    extension: Extension
    compat: str | None = Field(
        None, description="A compatibility facts file replacing the built-in one."
    )
    axes: Axes
    defaults: dict[Family, FlavorSettings] = Field(default_factory=dict)
    flavors: dict[FlavorName, FlavorSettings]
    platforms: dict[Platform, PlatformSettings] = Field(
        default_factory=lambda: {"x86_64": PlatformSettings(runner="ubuntu-24.04")}
    )
    include: list[Rule] = Field(default_factory=list)
    stable: list[StableGroup] = Field(
        default_factory=list, description="Stable-ABI cells: named stableX.Y-FLAVOR, built "
        "once, tested beside every torch of the matrix they serve.")
    exclude: list[Rule] = Field(default_factory=list)
    subsets: dict[Name, Annotated[list[str], Field(min_length=1)]] = Field(default_factory=dict)
    images: Images = Field(default_factory=Images)


def validate(source: Source, model: type[_Model]) -> Any:
    """Validate a parsed file against `model`, turning the first error into a UserError."""
    if not isinstance(source.data, dict):
        raise source.error((), "expected a mapping of settings at the top level")
    try:
        return model.model_validate(source.data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        # A misspelt key also shows up as a missing one; the misspelling is the news.
        first = min(errors, key=lambda e: (e["type"] != "extra_forbidden", *_order(source, e)))
        raise _user_error(source, model, first) from None


def load_matrix(path: str | Path) -> tuple[Matrix, Source]:
    src = yaml_source.load(path)
    return validate(src, Matrix), src


def _order(source: Source, error: dict) -> tuple[int, int]:
    where = source.where(_loc(error), key=error["type"] == "extra_forbidden")
    return (where.line or 0, where.col or 0)


def _loc(error: dict) -> tuple[str | int, ...]:
    return tuple(p for p in error["loc"] if p != "[key]")


_TYPE_WORDS = {
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "int_type": "an integer",
    "int_parsing": "an integer",
}


def _describe(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return f"{str(value).lower()}"
    return f"'{value}'"


def _user_error(source: Source, model: type[_Model], error: dict) -> UserError:
    loc = _loc(error)
    kind = error["type"]
    name = loc[-1] if loc else ""
    if kind == "extra_forbidden":
        allowed = _allowed_keys(model, loc[:-1])
        close = difflib.get_close_matches(str(name), allowed, n=1, cutoff=0.6)
        fix = f"did you mean '{close[0]}'?" if close else f"allowed keys: {', '.join(allowed)}"
        return source.error(loc, f"unknown key '{name}'", fix, key=True)
    if kind == "missing":
        return source.error(loc[:-1], f"missing required key '{name}'", f"add '{name}: ...'")
    if kind in _TYPE_WORDS:
        given = error.get("input")
        # `name: no` or `import: null` read as a boolean or nothing: the word was meant.
        fix = ("write the word in quotes: YAML reads yes, no, on, off, true, false and null "
               "unquoted as true, false or nothing"
               if kind == "string_type" and (given is None or isinstance(given, bool)) else None)
        return source.error(
            loc, f"'{_dotted(loc)}' must be {_TYPE_WORDS[kind]}, not {_describe(given)}", fix)
    if kind == "literal_error":
        expected = error.get("ctx", {}).get("expected", "")
        if error["loc"][-1:] == ("[key]",):
            return source.error(loc, f"'{error.get('input')}' is not allowed under "
                                f"'{_dotted(loc[:-1])}'", f"use {expected}", key=True)
        return source.error(
            loc, f"'{_dotted(loc)}' cannot be {_describe(error.get('input'))}", f"use {expected}"
        )
    if kind == "too_short":
        return source.error(loc, f"'{_dotted(loc)}' is empty", "list at least one value")
    if kind == "value_error":
        message = str(error.get("ctx", {}).get("error", error["msg"]))
        # The value is quoted in the problem and may hold "; " itself: split at the last.
        problem, sep, fix = message.rpartition("; ")
        if not sep:
            problem, fix = message, ""
        return source.error(loc, problem, fix or None, key=error["loc"][-1:] == ("[key]",))
    return source.error(loc, f"'{_dotted(loc)}': {error['msg']}")


def _dotted(loc: tuple[str | int, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<top>"


def _allowed_keys(model: type[_Model], loc: tuple[str | int, ...]) -> list[str]:
    """Walk the schema along `loc` to the mapping the unknown key sits in."""
    annotation: Any = model
    for part in loc:
        annotation = _unwrap(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = _field_by_key(annotation, str(part))
            if field is None:
                return []
            annotation = field.annotation
        else:  # dict value or list item: step into the element type
            args = typing.get_args(annotation)
            annotation = args[-1] if args else Any
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [f.alias or name for name, f in annotation.model_fields.items()]
    return []


def _field_by_key(model: type[BaseModel], key: str):
    for name, field in model.model_fields.items():
        if key in (name, field.alias):
            return field
    return None


def _unwrap(annotation: Any) -> Any:
    """Strip Optional[...] and Annotated[...] down to the meaningful type."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            annotation = args[0] if len(args) == 1 else annotation
            if len(args) != 1:
                return annotation
        else:
            return annotation
