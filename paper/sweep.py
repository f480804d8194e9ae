"""One runner for the paper's sweep tables (budget, depth, policy, join, staleness).

A sweep is a :class:`Sweep`: which runs it reads and in which order, how a group of
seeds becomes one row (and its JSON), the table's title and note, and an optional
figure. :func:`run_sweep` does the rest the same way for every sweep: the command line,
collecting the grid's results, one row per variant, the table (Markdown, CSV, JSON with
the missing cells named) and the figure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from paper.cells import by_variant
from paper.common import Collected, Run, collect, parse_args, scale_note, write_table

Row = tuple[dict, dict]


@dataclass(frozen=True)
class Sweep:
    """What one sweep table is made of (see the module doc)."""

    name: str
    title: str
    note: str
    row: Callable[[Collected, list[Run]], Row]
    order: Callable[[Run], Any]
    select: Callable[[Collected], Iterable[Run]] = lambda got: got.find(method="odb")
    figure: Callable[[Any, list[dict]], None] | None = None


def run_sweep(sweep: Sweep, description: str, argv: list[str] | None = None) -> None:
    """The sweep's table (and figure) from the grid's results, as its command does."""
    args = parse_args(description, argv)
    got = collect(args, sweep.name)
    runs = sorted(sweep.select(got), key=sweep.order)
    made = [sweep.row(got, seeds) for seeds in by_variant(runs)]
    data = [d for _, d in made]
    table = pd.DataFrame([row for row, _ in made])
    notes = [sweep.note, scale_note(got.grid)]
    write_table(args, sweep.name, table, sweep.title, notes, got.missing, data)
    if sweep.figure is not None:
        sweep.figure(args, data)
