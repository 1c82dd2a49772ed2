"""The schema of matrix.yaml, and loading it into typed settings with precise errors."""

from __future__ import annotations

import difflib
import re
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from . import source as yaml_source
from .errors import UserError
from .source import Source

Family = Literal["cpu", "cuda", "rocm"]
Platform = Literal["x86_64", "aarch64"]

_FLAVOR = re.compile(r"^(cpu|cu(\d{2})(\d)|rocm(\d+\.\d+(?:\.\d+)?))$")
_TORCH = re.compile(r"^\d+\.\d+(\.\d+)?$")
_PYTHON = re.compile(r"^3\.\d+$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def flavor_family(name: str) -> Family:
    return "cpu" if name == "cpu" else "cuda" if name.startswith("cu") else "rocm"


def flavor_toolkit(name: str) -> str | None:
    """The toolkit version a flavor name implies: cu130 -> 13.0, rocm6.4 -> 6.4."""
    match = _FLAVOR.match(name)
    if not match or name == "cpu":
        return None
    if match.group(2):
        return f"{int(match.group(2))}.{match.group(3)}"
    return match.group(4)


def _check_flavor(name: str) -> str:
    if not _FLAVOR.match(name):
        raise ValueError(
            f"unknown flavor '{name}'; a flavor is 'cpu', 'cuXYZ' (CUDA X.Y, e.g. cu130) "
            "or 'rocmX.Y' (e.g. rocm7.2)"
        )
    return name


def _check_torch(value: str) -> str:
    if not _TORCH.match(value):
        raise ValueError(f"'{value}' is not a torch release; write X.Y or X.Y.Z, e.g. \"2.11\"")
    return value


def _check_python(value: str) -> str:
    if not _PYTHON.match(value):
        raise ValueError(f"'{value}' is not a Python version; write 3.X, e.g. \"3.12\"")
    return value


def _check_name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError(f"'{value}' is not a valid name; use letters, digits, '.', '_' or '-'")
    return value


FlavorName = Annotated[str, AfterValidator(_check_flavor)]
TorchVersion = Annotated[str, AfterValidator(_check_torch)]
PythonVersion = Annotated[str, AfterValidator(_check_python)]
Name = Annotated[str, AfterValidator(_check_name)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class Extension(_Model):
    """The extension under build; point it at your own project."""

    path: str = Field("ext", description="Project folder holding setup.py/pyproject.toml.")
    name: Name = Field(description="Distribution name, as in the wheel file name.")
    import_name: Name = Field(alias="import", description="Top-level import name.")
    tests: str = Field("tests", description="Test folder, relative to `path`.")
    abi3: bool = Field(
        True,
        description="One cp3X-abi3 wheel serves every Python of a cell; "
        "the Python axis then only multiplies the tests.",
    )
    test_args: list[str] = Field(
        default_factory=list, description="Extra pytest arguments for the matrix tests."
    )
    mismatch_message: str | None = Field(
        None,
        description="Text the ImportError must contain when a wheel is imported beside "
        "another torch (the cross-cell check).",
    )


class FlavorSettings(_Model):
    """Per-flavor settings. Unset keys come from `defaults.<family>`."""

    toolkit: str | None = Field(None, description="CUDA/ROCm version; defaults from the name.")
    archs: list[str] | None = Field(
        None, description="GPU targets compiled to machine code (SASS / gfx). Never detected."
    )
    ptx: list[str] | None = Field(None, description="CUDA archs also embedded as PTX for JIT.")
    index: str | None = Field(None, description="Package index serving this flavor's torch.")
    base_image: str | None = Field(None, description="Upstream image the build image starts from.")
    runtime_deps: list[str] | None = Field(
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


class PlatformSettings(_Model):
    runner: str = Field(description="GitHub Actions runner label that builds this platform.")


class Images(_Model):
    prefix: str = Field("extmatrix", description="Built images are named PREFIX-FAMILY:TAG.")


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
    exclude: list[Rule] = Field(default_factory=list)
    subsets: dict[Name, list[str]] = Field(default_factory=dict)
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
        return source.error(
            loc,
            f"'{_dotted(loc)}' must be {_TYPE_WORDS[kind]}, not {_describe(error.get('input'))}",
        )
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
        problem, _, fix = message.partition("; ")
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
