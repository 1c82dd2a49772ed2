"""`extmatrix`: the command line. Each subcommand mirrors a nox session."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from . import report, schema
from .cells import Cell, Plan, plan_file
from .errors import UserError

Handler = Callable[[argparse.Namespace], int]
_COMMANDS: dict[str, Handler] = {}


def _selection_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--matrix", default=os.environ.get("EXTMATRIX_MATRIX", "matrix.yaml"),
                        help="matrix file (default: matrix.yaml, or $EXTMATRIX_MATRIX)")
    parser.add_argument("--subset", help="a named subset from the matrix file (e.g. pr, local)")
    parser.add_argument("--cell", action="append", default=[], metavar="ID",
                        help="one cell by id; repeat for several")
    parser.add_argument("-k", dest="patterns", action="append", default=[], metavar="GLOB",
                        help="cells whose id matches GLOB, e.g. 'torch2.1*-cu13*'")


def selected(args: argparse.Namespace) -> tuple[Plan, list[Cell]]:
    plan = plan_file(args.matrix)
    return plan, plan.select(args.subset, args.cell, args.patterns)


def _plan(args: argparse.Namespace) -> int:
    plan, cells = selected(args)
    if args.json:
        sys.stdout.write(report.plan_json(cells))
    else:
        report.print_plan(cells, plan.dropped if args.explain else None, Console())
    return 0


def _schema(args: argparse.Namespace) -> int:
    text = schema.render()
    target = Path(args.output)
    if args.check:
        if not target.is_file() or target.read_text() != text:
            raise UserError(str(target), "the JSON Schema is stale",
                            "run 'extmatrix schema' to regenerate it")
        return 0
    target.write_text(text)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="extmatrix",
        description="Build and test a PyTorch extension across a matrix of torch versions "
        "and CPU/CUDA/ROCm flavors.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="show the cells the matrix expands to")
    _selection_args(p)
    p.add_argument("--json", action="store_true",
                   help='print the GitHub Actions form {"include": [...]} on stdout')
    p.add_argument("--explain", action="store_true",
                   help="also list every dropped combination with its reason")
    _COMMANDS["plan"] = _plan

    p = sub.add_parser("schema", help="write the JSON Schema of matrix.yaml for editors")
    p.add_argument("--output", default="matrix.schema.json")
    p.add_argument("--check", action="store_true", help="fail if the file on disk is stale")
    _COMMANDS["schema"] = _schema
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except UserError as exc:
        print(f"extmatrix: {exc}" if exc.where is None else str(exc), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
