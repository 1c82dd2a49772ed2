"""Rendering plans for people (rich tables) and for machines (JSON)."""

from __future__ import annotations

import json
from collections.abc import Iterable

from rich.console import Console
from rich.table import Table

from .cells import Cell, Dropped


def plan_json(cells: Iterable[Cell]) -> str:
    """The GitHub Actions form: {"include": [{"cell": ..., ...}, ...]}."""
    return json.dumps({"include": [c.to_json() for c in cells]}, indent=2) + "\n"


def plan_table(cells: list[Cell], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("cell", "torch", "toolkit", "archs", "pythons", "wheel", "requires"):
        table.add_column(column, overflow="fold")
    for c in cells:
        archs = c.arch_list.replace(";", " ") or "-"
        toolkit = f"{c.family} {c.toolkit}" if c.toolkit else c.family
        pythons = _span(c.test_pythons)
        requires = ", ".join((c.requires_torch, *c.runtime_deps))
        wheel = f"+{c.local_version} {'abi3' if c.abi3 else 'cp' + c.python.replace('.', '')}"
        table.add_row(c.id, c.torch, toolkit, archs, pythons, wheel, requires)
    return table


def dropped_table(dropped: list[Dropped]) -> Table:
    table = Table(title=f"{len(dropped)} combinations dropped", title_justify="left")
    table.add_column("combination")
    table.add_column("reason", overflow="fold")
    for d in dropped:
        table.add_row(d.combo, d.reason)
    return table


def print_plan(cells: list[Cell], dropped: list[Dropped] | None, console: Console) -> None:
    console.print(plan_table(cells, f"{len(cells)} cells"))
    if dropped is not None:
        console.print(dropped_table(dropped))


def _span(pythons: tuple[str, ...]) -> str:
    """3.10 3.11 3.12 -> 3.10–3.12; gaps are listed."""
    minors = [int(p.split(".")[1]) for p in pythons]
    if len(minors) > 2 and minors == list(range(minors[0], minors[-1] + 1)):
        return f"{pythons[0]}–{pythons[-1]}"
    return " ".join(pythons)
