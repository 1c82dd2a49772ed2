"""A digest of the code the benchmark page measures: the kernels in csrc/ and the
Python package in src/, with comments and layout left out. bench.py records it, and
a test can then tell that docs/benchmarks.json was measured on other code than the
checkout holds, while an edit to a comment leaves the page current.

    python benchmarks/sources.py     # prints the digest of this checkout
"""

from __future__ import annotations

import hashlib
import io
import re
import sys
import tokenize
from pathlib import Path

EXT_ROOT = Path(__file__).resolve().parents[1]
MEASURED = ("csrc", "src")
CXX_SUFFIXES = frozenset({".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh"})

# One C/C++ token at a time: a comment or a literal is taken whole where it starts,
# so a quote inside a comment or "//" inside a string is read as what it is.
CXX_TOKEN = re.compile(
    r"""
      (?P<comment> //[^\n]* | /\*.*?\*/ )
    | (?P<literal> "(?:\\.|[^"\\\n])*" | '(?:\\.|[^'\\\n])*' )
    | (?P<space> \s+ )
    | (?P<other> . )
    """,
    re.S | re.X,
)


def is_word_char(char: str) -> bool:
    return char.isalnum() or char == "_"


def cxx_code(text: str) -> str:
    """The source without comments, and without white space except one blank
    between two words (so that reformatting leaves it as it was)."""
    out: list[str] = []
    gap = False
    for match in CXX_TOKEN.finditer(text):
        token = match.group()
        if match.lastgroup in ("comment", "space"):
            gap = True
            continue
        if gap and out and is_word_char(out[-1][-1]) and is_word_char(token[0]):
            out.append(" ")
        out.append(token)
        gap = False
    return "".join(out)


def python_code(text: str) -> str:
    """The token stream without comments and blank lines (docstrings stay: they are
    code), spelled the same by every Python: 3.12 splits an f-string into parts that
    3.11 reads as one string, so an f-string is taken whole, as written."""
    lines = text.splitlines(keepends=True)

    def source(start: tuple[int, int], end: tuple[int, int]) -> str:
        (row0, col0), (row1, col1) = start, end
        if row0 == row1:
            return lines[row0 - 1][col0:col1]
        return lines[row0 - 1][col0:] + "".join(lines[row0 : row1 - 1]) + lines[row1 - 1][:col1]

    markers = {
        tokenize.NEWLINE: "<newline>",
        tokenize.INDENT: "<indent>",
        tokenize.DEDENT: "<dedent>",
    }
    skipped = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}
    fstring_start = getattr(tokenize, "FSTRING_START", None)
    fstring_end = getattr(tokenize, "FSTRING_END", None)
    out: list[str] = []
    depth, opened = 0, (0, 0)
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if fstring_start is not None and tok.type == fstring_start:
            depth += 1
            if depth == 1:
                opened = tok.start
            continue
        if depth:
            if tok.type == fstring_end:
                depth -= 1
                if depth == 0:
                    out.append(source(opened, tok.end))
            continue
        if tok.type not in skipped:
            out.append(markers.get(tok.type, tok.string))
    return "\n".join(out)


def digest(ext_root: Path = EXT_ROOT) -> str:
    h = hashlib.sha256()
    for folder in MEASURED:
        for path in sorted((ext_root / folder).rglob("*")):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            if path.suffix in CXX_SUFFIXES:
                code = cxx_code(path.read_text(encoding="utf-8"))
            elif path.suffix == ".py":
                code = python_code(path.read_text(encoding="utf-8"))
            else:
                continue
            h.update(path.relative_to(ext_root).as_posix().encode() + b"\0")
            h.update(code.encode() + b"\0")
    return "sha256:" + h.hexdigest()[:16]


if __name__ == "__main__":
    print(digest(Path(sys.argv[1]) if len(sys.argv) > 1 else EXT_ROOT))
