"""YAML documents that remember where every key and value came from.

Errors found long after parsing (an arch the toolkit cannot target, a subset that
matches nothing) still point at the line the user wrote. Numbers are kept as the
text the user typed: `torch: [2.10]` must mean "2.10", not the float 2.1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import UserError, Where

Path_ = tuple[str | int, ...]

_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"


@dataclass
class Source:
    """A parsed YAML file plus the position of every node, keyed by its path."""

    file: str
    data: Any
    values: dict[Path_, Where] = field(default_factory=dict)
    keys: dict[Path_, Where] = field(default_factory=dict)

    def where(self, path: Path_, *, key: bool = False) -> Where:
        """The position of `path`, or of its nearest ancestor that exists."""
        table = self.keys if key else self.values
        for end in range(len(path), -1, -1):
            hit = table.get(path[:end]) or self.values.get(path[:end])
            if hit is not None:
                return hit
        return Where(self.file)

    def error(self, path: Path_, problem: str, fix: str | None = None, *, key: bool = False):
        return UserError(self.where(path, key=key), problem, fix)


def load(path: str | Path, *, display: str | None = None) -> Source:
    name = display or str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        fix = "pass an existing matrix file with --matrix"
        raise UserError(name, "file not found", fix) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(name, f"cannot read file ({exc})") from None
    return parse(text, name)


def parse(text: str, file: str) -> Source:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = Where(file, mark.line + 1, mark.column + 1) if mark else Where(file)
        what = exc.problem or exc.context or "invalid YAML"
        raise UserError(where, f"YAML syntax error: {what}", "fix the YAML syntax") from None
    except yaml.YAMLError as exc:
        raise UserError(file, f"YAML error: {exc}") from None
    source = Source(file, None)
    if root is None:
        raise UserError(Where(file, 1, 1), "the file is empty", "write a mapping of settings")
    source.data = _build(root, (), source, yaml.SafeLoader(""))
    return source


def _mark(node: yaml.Node, file: str) -> Where:
    return Where(file, node.start_mark.line + 1, node.start_mark.column + 1)


def _build(node: yaml.Node, path: Path_, source: Source, loader: yaml.SafeLoader) -> Any:
    source.values[path] = _mark(node, source.file)
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _build(key_node, path + ("<key>",), source, loader)
            if not isinstance(key, (str, int, float, bool)) or key is None:
                raise UserError(_mark(key_node, source.file), "mapping keys must be plain scalars")
            key = str(key)
            if key in out:
                raise UserError(
                    _mark(key_node, source.file),
                    f"duplicate key '{key}'",
                    "keep only one of them",
                )
            source.keys[path + (key,)] = _mark(key_node, source.file)
            out[key] = _build(value_node, path + (key,), source, loader)
        source.values.pop(path + ("<key>",), None)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, path + (i,), source, loader) for i, item in enumerate(node.value)]
    if node.tag in (_INT, _FLOAT):
        return node.value  # versions are text: 2.10 stays "2.10"
    try:
        return loader.construct_object(node, deep=True)
    except yaml.constructor.ConstructorError as exc:
        raise UserError(_mark(node, source.file), f"cannot read value: {exc.problem}") from None
