"""The one rich Console factory for meshsim's terminal output.

On a terminal rich fits tables to its width. When output is piped or captured (CI logs, `| tee`), rich
would assume 80 columns and truncate every wide table to unreadable ellipses, so we print at a fixed
wide width instead (override with the COLUMNS environment variable).

Tables that could outgrow a terminal go through `fitted_table`: the columns a reader came for are kept,
secondary ones are dropped (rightmost, least important first) and named in a note under the table.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

PIPED_WIDTH = 160


def make_console(*, stderr: bool = False) -> Console:
    """A Console for stdout (or stderr) that stays readable when not attached to a terminal."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty() or "COLUMNS" in os.environ:
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=PIPED_WIDTH)


@dataclass(frozen=True)
class Column:
    """A table column: `keep` columns are never dropped; others go, lowest `rank` first, until it fits."""

    header: str
    justify: str = "right"
    keep: bool = False
    rank: int = 0  # among droppable columns, the lower the sooner dropped


CELL_OVERHEAD = 3  # rich's default box: one padding space either side plus one border per column


def fit_columns(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> list[int]:
    """Indexes of the columns to show so that the table's natural width fits in `width` characters
    (every `keep` column stays; droppable ones leave lowest rank first, rightmost first on ties)."""
    natural = [max([len(c.header)] + [len(str(r[i])) for r in rows]) + CELL_OVERHEAD for i, c in enumerate(columns)]
    shown = list(range(len(columns)))
    droppable = sorted((i for i, c in enumerate(columns) if not c.keep), key=lambda i: (columns[i].rank, -i))
    while sum(natural[i] for i in shown) + 1 > width and droppable:
        shown.remove(droppable.pop(0))
    return shown


def fitted_table(title: str, columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int,
                 *, row_styles: Sequence[str | None] = ()) -> tuple[Table, str]:
    """A rich Table of the columns that fit in `width`, and a note naming those left out ('' if none)."""
    shown = fit_columns(columns, rows, width)
    table = Table(title=title, title_justify="left", header_style="bold")
    for i in shown:
        table.add_column(columns[i].header, justify=columns[i].justify, no_wrap=columns[i].keep)
    styles = list(row_styles) + [None] * (len(rows) - len(row_styles))
    for row, style in zip(rows, styles, strict=True):
        table.add_row(*(str(row[i]) for i in shown), style=style)
    hidden = [columns[i].header for i in range(len(columns)) if i not in shown]
    note = f"(not shown at {width} columns: {', '.join(hidden)}; widen the terminal)" if hidden else ""
    return table, note
