"""The one rich Console factory for meshsim's terminal output.

On a terminal rich fits tables to its width. When output is piped or captured (CI logs, `| tee`), rich
would assume 80 columns and truncate every wide table to unreadable ellipses, so we print at a fixed
wide width instead (override with the COLUMNS environment variable).

Tables that could outgrow a terminal go through `fitted_table`: the columns a reader came for are kept,
secondary ones are dropped (rightmost, least important first) and named in a note under the table; a
table whose kept columns alone are too wide is printed as one block per row (`stacked`), never with its
words broken across lines.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console, Group
from rich.errors import MarkupError
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from meshsim.sim.core.text import plain, user_text

PIPED_WIDTH = 160


class SafeConsole(Console):
    """A Console that never passes a control character through: every string it renders goes through
    sim/core/text.py `plain` first (markup in user text is escaped where it is interpolated: user_text)."""

    def render_str(self, text: str, **kwargs) -> Text:
        if self.color_system is None and not self.record:  # piped: no style reaches the output, so rich's
            kwargs["highlight"] = False  # highlighter (regexes compiled on first use) would mark spans unused
        return super().render_str(plain(text, keep_layout=True), **kwargs)


def make_console(*, stderr: bool = False) -> Console:
    """A Console for stdout (or stderr) that stays readable when not attached to a terminal."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty() or "COLUMNS" in os.environ:
        return SafeConsole(stderr=stderr)
    return SafeConsole(stderr=stderr, width=PIPED_WIDTH)


@dataclass(frozen=True)
class Column:
    """A table column: `keep` columns are never dropped; others go, lowest `rank` first, until it fits.
    A `wrap` column (free text: a tensor name, a reason) wraps its cells at spaces instead of widening
    the table: only its longest word counts toward the width."""

    header: str
    justify: str = "right"
    keep: bool = False
    rank: int = 0  # among droppable columns, the lower the sooner dropped
    wrap: bool = False


CELL_OVERHEAD = 3  # rich's default box: one padding space either side plus one border per column
SECTION = None  # a row that is SECTION draws a rule across the table (rich's add_section)


def cell_len(text: object) -> int:
    """Width of a cell on the terminal: rich markup ('[green]ok[/]') takes no room; text that is not
    valid markup counts as it is."""
    text = str(text)
    if text.isascii() and "[" not in text:  # the common case, without parsing (tables of 1,000 rows)
        return len(text)
    try:
        return Text.from_markup(text).cell_len
    except MarkupError:
        return Text(str(text)).cell_len


def _longest_word(text: object) -> int:
    return max((cell_len(w) for w in str(text).split()), default=0)


def _natural(column: Column, cells: Sequence[object]) -> int:
    """The width a column needs: its header's longest word at least (a header is never cut), and its
    longest cell (or, for a wrap column, its longest word)."""
    measure = _longest_word if column.wrap else cell_len
    return max([_longest_word(column.header), *(measure(c) for c in cells)])


def fit_columns(columns: Sequence[Column], rows: Sequence[Sequence[str] | None], width: int) -> list[int]:
    """Indexes of the columns to show so that the table's natural width fits in `width` characters
    (every `keep` column stays; droppable ones leave lowest rank first, rightmost first on ties). A
    header wider than its cells wraps at its spaces, so only its longest word counts."""
    rows = [r for r in rows if r is not SECTION]
    natural = [_natural(c, [r[i] for r in rows]) + CELL_OVERHEAD for i, c in enumerate(columns)]
    shown = list(range(len(columns)))
    droppable = sorted((i for i, c in enumerate(columns) if not c.keep), key=lambda i: (columns[i].rank, -i))
    while sum(natural[i] for i in shown) + 1 > width and droppable:
        shown.remove(droppable.pop(0))
    return shown


def column_widths(columns: Sequence[Column], cells: Sequence[Sequence[object]], width: int) -> list[int]:
    """Content width of each column: its full width (whole header, longest cell) when the table fits in
    `width`, else each narrowed, widest first, one character at a time, never below its natural width
    (_natural); a table whose natural widths do not fit either stays at them (rich folds what overflows)."""
    full = [max(cell_len(c.header), *(cell_len(x) for x in col)) if col else cell_len(c.header)
            for c, col in zip(columns, cells, strict=True)]
    least = [_natural(c, col) for c, col in zip(columns, cells, strict=True)]
    widths = [max(f, m) for f, m in zip(full, least, strict=True)]
    excess = sum(widths) + CELL_OVERHEAD * len(widths) + 1 - width
    while excess > 0:
        slack = [i for i, w in enumerate(widths) if w > least[i]]
        if not slack:
            break
        widest = max(slack, key=lambda i: (widths[i], i))
        widths[widest] -= 1
        excess -= 1
    return widths


def fitted_table(title: str, columns: Sequence[Column], rows: Sequence[Sequence[str] | None], width: int,
                 *, row_styles: Sequence[str | None] = ()) -> tuple[Table, str]:
    """A rich Table of the columns that fit in `width`, and a note naming those left out ('' if none).
    Every table meshsim prints is built here (tests/test_tables_fit.py). Nothing is cut: each column is
    at least its natural width (fit_columns: its header's longest word, its longest cell or, for a wrap
    column, its longest word), so a header wraps at its spaces and a wrap column's cells at theirs; a
    word longer than that folds onto the next line rather than end in an ellipsis. A row that is
    SECTION draws a rule."""
    shown = fit_columns(columns, rows, width)
    data = [r for r in rows if r is not SECTION]
    natural = sum(_natural(columns[i], [r[i] for r in data]) + CELL_OVERHEAD for i in shown) + 1
    if natural > width:  # the kept columns alone are too wide: rich would break their words ("resul t")
        return stacked(title, columns, rows, width, row_styles=row_styles), ""
    table = Table(title=user_text(title), title_justify="left", header_style="bold")
    widths = column_widths([columns[i] for i in shown], [[r[i] for r in data] for i in shown], width)
    for i, w in zip(shown, widths, strict=True):
        table.add_column(columns[i].header, justify=columns[i].justify, width=w, overflow="fold")
    styles = iter(list(row_styles) + [None] * len(rows))
    for row in rows:
        if row is SECTION:
            table.add_section()
            continue
        table.add_row(*(row[i] if isinstance(row[i], Text) else user_text(row[i]) for i in shown),  # cells: plain text
                      style=next(styles))
    hidden = [columns[i].header for i in range(len(columns)) if i not in shown]
    note = f"(not shown at {width} columns: {', '.join(hidden)}; widen the terminal)" if hidden else ""
    return table, note


def _cell(value: object) -> Text:
    return value if isinstance(value, Text) else Text(plain(str(value)))


def stacked(title: str, columns: Sequence[Column], rows: Sequence[Sequence[str] | None], width: int,
            *, row_styles: Sequence[str | None] = ()) -> Group:
    """A table too wide for `width` even with only its kept columns, as one block per row: each column's
    header beside its value, every column shown; values wrap at their spaces (a word longer than the
    value column, width - the longest header - 1, still folds). Blocks are separated by a blank line, a
    SECTION by a rule."""
    head = min(max(cell_len(c.header) for c in columns), max(8, width // 3))
    parts: list = [Text(plain(title), style="bold")]
    styles = iter(list(row_styles) + [None] * len(rows))
    for row in rows:
        if row is SECTION:
            parts.append(Rule(style="dim"))
            continue
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="bold", width=head, overflow="fold")
        grid.add_column(width=max(1, width - head - 1), overflow="fold")
        style = next(styles)
        for column, value in zip(columns, row, strict=True):
            grid.add_row(Text(column.header), _cell(value), style=style)
        parts += [Text(""), grid]
    return Group(*parts)


def print_fitted(console: Console, fitted: tuple[Table, str]) -> None:
    """Print a fitted_table's table and, under it, its note on the columns left out."""
    table, note = fitted
    console.print(table)
    if note:
        console.print(note, highlight=False)
