"""YAML documents that remember where every key and value came from.

Errors found long after parsing (an arch the toolkit cannot target, a subset that
matches nothing) still point at the line the user wrote. Numbers are kept as the
text the user typed: `torch: [2.10]` must mean "2.10", not the float 2.1.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import UserError, Where

Path_ = tuple[str | int, ...]

_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_STR = "tag:yaml.org,2002:str"
_MERGE = "tag:yaml.org,2002:merge"
_VALUE = "tag:yaml.org,2002:value"

# A matrix is a few KB; these bound what a hostile or mistaken file can cost.
MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_VALUES = 100_000
_FLATTER = f"keep it within {MAX_DEPTH} levels"

_KINDS = [(stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket")]


@dataclass
class Source:
    """A parsed YAML file plus the position of every node, keyed by its path."""

    file: str
    data: Any
    # yaml's own marks, made into a Where only when an error needs one: aliases can
    # make a file hold 100,000 values, and every one is recorded.
    values: dict[Path_, yaml.Mark] = field(default_factory=dict)
    keys: dict[Path_, yaml.Mark] = field(default_factory=dict)
    # The alias each value written elsewhere was reached through.
    via: dict[Path_, yaml.Mark] = field(default_factory=dict)

    def where(self, path: Path_, *, key: bool = False) -> Where:
        """The position of `path`, or of its nearest ancestor that exists."""
        found = self._found(path, key)
        return _where(self.file, found[1]) if found else Where(printable(self.file))

    def _found(self, path: Path_, key: bool) -> tuple[Path_, yaml.Mark] | None:
        table = self.keys if key else self.values
        for end in range(len(path), -1, -1):
            hit = table.get(path[:end]) or self.values.get(path[:end])
            if hit is not None:
                return path[:end], hit
        return None

    def error(self, path: Path_, problem: str, fix: str | None = None, *, key: bool = False):
        found = self._found(path, key)
        alias = self.via.get(found[0]) if found else None
        if alias is not None:
            # Written at the anchor, where it may be right: wrong where the alias puts it.
            problem += f" (where the alias at line {alias.line + 1} puts it)"
        return UserError(self.where(path, key=key), printable(problem),
                         printable(fix) if fix else fix)


def printable(text: str) -> str:
    """`text` with control characters escaped: a value holding a newline must not
    break the one-line error it is quoted in."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def load(path: str | Path, *, display: str | None = None, flag: str = "--matrix",
         kind: str = "matrix file") -> Source:
    """`path` parsed; `flag` and `kind` name, in errors, the option that chose it."""
    name = display or str(path)
    if not name:
        raise UserError(flag, f"names no {kind} (an empty path)", f"pass a {kind} with {flag}")
    shown = printable(name)  # the file keeps its real name; errors get a one-line one
    try:
        # stat first: opening a FIFO would wait for a writer, /dev/zero never ends.
        _check_kind(os.stat(path), shown, kind)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        with open(fd, "rb") as fh:
            _check_kind(os.fstat(fh.fileno()), shown, kind)  # swapped since the stat?
            data = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        fix = f"pass an existing {kind} with {flag}"
        raise UserError(shown, "file not found", fix) from None
    except OSError as exc:
        raise UserError(shown, f"cannot read file ({exc.strerror or exc})") from None
    except ValueError as exc:  # a NUL in the path
        raise UserError(shown, printable(f"cannot read file ({exc})")) from None
    if len(data) > MAX_BYTES:
        raise _too_large(shown, kind)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise UserError(Where(shown, line, col), f"not UTF-8 text (byte 0x{data[exc.start]:02x})",
                        "save the file as UTF-8") from None
    return parse(text, name)


def _check_kind(info: os.stat_result, name: str, kind: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        what = next((k for test, k in _KINDS if test(info.st_mode)), "not a file")
        raise UserError(name, f"not a regular file ({what})", f"pass a {kind}")
    if info.st_size > MAX_BYTES:
        raise _too_large(name, kind)


def _too_large(name: str, kind: str) -> UserError:
    return UserError(name, f"file is larger than {MAX_BYTES >> 20} MiB", f"pass a {kind}")


def parse(text: str, file: str) -> Source:
    shown = printable(file)
    hidden = _HIDDEN_BREAK.search(text)
    if hidden:
        # YAML breaks the line there and most editors do not: every error after it would
        # name a line the user cannot find.
        before = text[: hidden.start()]
        where = Where(shown, before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1)
        code = f"U+{ord(hidden.group()):04X}"
        raise UserError(where, f"character {code} is a line break to YAML, but not to most "
                        "editors", f"remove it, or write it as \\u{code[2:]} in double quotes")
    loader = None
    try:
        loader = _Loader(text, file)  # checks every character up front
        root = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = _where(file, mark) if mark else Where(shown)
        what = printable(exc.problem or exc.context or "invalid YAML")
        raise UserError(where, f"YAML syntax error: {what}", "fix the YAML syntax") from None
    except yaml.reader.ReaderError as exc:
        before = text[: exc.position]
        where = Where(shown, before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1)
        what = f"character U+{exc.character:04X} is not allowed in YAML"
        fix = "remove it, or write it as an escape in double quotes"
        raise UserError(where, what, fix) from None
    except yaml.YAMLError as exc:
        raise UserError(shown, printable(f"YAML error: {exc}")) from None
    except RecursionError:  # the depth bound should make this unreachable
        raise UserError(shown, "the YAML nests too deeply", _FLATTER) from None
    finally:
        if loader is not None:
            loader.dispose()
    source = Source(file, None)
    if root is None:
        raise UserError(Where(shown, 1, 1), "the file is empty", "write a mapping of settings")
    try:
        source.data = _Builder(source, loader.aliases).build(root, (), None)
    except RecursionError:
        raise UserError(shown, "the YAML nests too deeply", _FLATTER) from None
    return source


_HIDDEN_BREAK = re.compile("[\u0085\u2028\u2029]")


def _where(file: str, mark: yaml.Mark) -> Where:
    return Where(printable(file), mark.line + 1, mark.column + 1)


def _mark(node: yaml.Node | yaml.Event, file: str) -> Where:
    return _where(file, node.start_mark)


class _Loader(yaml.SafeLoader):
    """Composes while bounding the nesting depth, so deep input is refused before
    the recursive composer can overflow, and notes where each alias was written:
    the composed tree keeps only the anchored node, and an expansion that grows
    too large should be reported where the user wrote the alias."""

    def __init__(self, text: str, file: str):
        super().__init__(text)
        self.file = file
        self.depth = 0
        self.aliases: dict[tuple[int, Any], yaml.Mark] = {}

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            node = super().compose_node(parent, index)
            if index is None and parent is not None and not isinstance(node, yaml.ScalarNode):
                # a key (composed with index None) that would expand into a collection
                raise UserError(_where(self.file, mark), "mapping keys must be plain scalars")
            self.aliases[_slot(parent, index)] = mark
            return node
        if not self.check_event(yaml.CollectionStartEvent):
            return super().compose_node(parent, index)
        if self.depth >= MAX_DEPTH:
            where = _mark(self.peek_event(), self.file)
            raise UserError(where, f"the YAML nests deeper than {MAX_DEPTH} levels", _FLATTER)
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _slot(parent: yaml.Node | None, index: Any) -> tuple[int, Any]:
    """A child's place in its parent: an item index, or the key node of a mapping value."""
    return (id(parent), index if isinstance(index, int) else id(index))


class _Builder:
    """Turns composed nodes into plain data, recording every position.

    Aliases share nodes, so a small file can stand for an enormous tree ("billion
    laughs"): every value built counts against MAX_VALUES, and the nesting through
    aliases against MAX_DEPTH.
    """

    def __init__(self, source: Source, aliases: dict):
        self.source = source
        self.loader = yaml.SafeLoader("")
        self.aliases = aliases
        self.budget = MAX_VALUES
        self.merged: dict[int, dict | None] = {}

    def build(self, node: yaml.Node, path: Path_, alias: yaml.Mark | None) -> Any:
        source = self.source
        source.values[path] = node.start_mark
        if alias is not None:
            source.via[path] = alias
        self.budget -= 1
        if self.budget < 0 or len(path) > MAX_DEPTH + 1:
            self._refuse(node, alias)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path, alias)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, path + (i,), alias or self.aliases.get((id(node), i)))
                    for i, item in enumerate(node.value)]
        if node.tag in (_INT, _FLOAT):
            return node.value  # versions are text: 2.10 stays "2.10"
        try:
            value = self.loader.construct_object(node, deep=True)
        except yaml.constructor.ConstructorError as exc:
            raise UserError(_mark(node, source.file),
                            printable(f"cannot read value: {exc.problem}")) from None
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:  # "\ud800": half of a UTF-16 pair, no character
                raise UserError(_mark(node, source.file), "the text holds a lone surrogate "
                                "escape, which is no character",
                                "write the character itself") from None
        return value

    def _mapping(self, node: yaml.MappingNode, path: Path_, alias: yaml.Mark | None) -> dict:
        source = self.source
        out: dict[Any, Any] = {}
        for key, (key_node, value_node, at) in self._entries(node, path, alias).items():
            source.keys[path + (key,)] = key_node.start_mark
            out[key] = self.build(value_node, path + (key,), alias or at)
        source.values.pop(path + ("<key>",), None)
        return out

    def _entries(self, node: yaml.MappingNode, path: Path_, alias: yaml.Mark | None) -> dict:
        """`node`'s pairs by key once its `<<` merges are applied, each with the alias
        its value was reached through.

        Not yaml's flatten_mapping: that puts merged pairs in front of the mapping's
        own, and a key the user wrote to override a merged one would then read as a
        duplicate. Kept per node: an anchor merged into many mappings is resolved
        once, and a chain of merges cannot grow with each link.
        """
        if id(node) in self.merged:
            if self.merged[id(node)] is None:  # still being resolved: it merges itself
                raise UserError(_where(self.source.file, alias or node.start_mark),
                                "a mapping cannot merge itself", "an alias must not contain itself")
            return self.merged[id(node)]
        self.merged[id(node)] = None
        merged: dict[str, tuple] = {}
        own: dict[str, tuple] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE:
                via = self.aliases.get((id(node), id(key_node)))
                # Later pairs win, as in yaml: a list is taken last to first, so that the
                # earlier of two maps gives the keys both hold.
                for part, at in reversed(self._merges(value_node, via)):
                    entries = self._entries(part, path, at)
                    self.budget -= len(entries)  # a small file can merge one anchor many times
                    if self.budget < 0:
                        self._refuse(part, at)
                    merged.update({k: (kn, vn, at or a) for k, (kn, vn, a) in entries.items()})
                continue
            if key_node.tag == _VALUE:  # a bare `=` is a plain key here, as yaml has it
                key_node.tag = _STR
            key = self._key(key_node, path, alias)
            if key in own:
                raise UserError(
                    _mark(key_node, self.source.file),
                    printable(f"duplicate key '{key}'"),
                    "keep only one of them",
                )
            own[key] = (key_node, value_node, self.aliases.get((id(node), id(key_node))))
        merged.update(own)
        self.merged[id(node)] = merged
        return merged

    def _merges(self, node: yaml.Node, via: yaml.Mark | None) -> list[tuple[yaml.MappingNode, Any]]:
        """The mappings a `<<` value merges, first to last, with the alias each is
        written as; yaml's own messages for anything else."""
        if isinstance(node, yaml.MappingNode):
            return [(node, via)]
        if isinstance(node, yaml.SequenceNode):
            parts = []
            for i, item in enumerate(node.value):
                if not isinstance(item, yaml.MappingNode):
                    raise UserError(_mark(item, self.source.file), printable(
                        f"cannot merge: expected a mapping for merging, but found {item.id}"))
                parts.append((item, via or self.aliases.get((id(node), i))))
            return parts
        raise UserError(_mark(node, self.source.file), printable(
            "cannot merge: expected a mapping or list of mappings for merging, "
            f"but found {node.id}"))

    def _key(self, key_node: yaml.Node, path: Path_, alias: yaml.Mark | None) -> str:
        if not isinstance(key_node, yaml.ScalarNode):  # before an aliased key expands
            raise UserError(_mark(key_node, self.source.file), "mapping keys must be plain scalars")
        key = self.build(key_node, path + ("<key>",), alias)
        if not isinstance(key, (str, int, float, bool)) or key is None:
            raise UserError(_mark(key_node, self.source.file), "mapping keys must be plain scalars")
        # A key is a name as written: YAML 1.1 reads `on`, `no` or `yes` as booleans.
        return key_node.value if isinstance(key, bool) else str(key)

    def _refuse(self, node: yaml.Node, alias: yaml.Mark | None) -> None:
        file = self.source.file
        where = _where(file, alias) if alias else _mark(node, file)
        if self.budget < 0:
            what = (f"aliases expand to too many values (over {MAX_VALUES:,})" if alias
                    else f"the file holds too many values (over {MAX_VALUES:,})")
            raise UserError(where, what, "write the values out, or use fewer aliases")
        raise UserError(where, f"aliases nest deeper than {MAX_DEPTH} levels",
                        "an alias must not contain itself")
