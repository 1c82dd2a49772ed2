"""The `extmatrix` command. The engine's modules take a moment to load (rich, pydantic):
Ctrl-C in that moment is the same one line as later, not a traceback of an import."""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from .cli import main as run
    except KeyboardInterrupt:
        print("extmatrix: interrupted", file=sys.stderr)
        return 130
    return run()
