"""User text on a terminal: the one sanitizing rule, applied wherever a name or value the user wrote
(scenario, topology, results and trace names, echoed field values, paths) meets the terminal.

- `plain(text)`: control characters (Unicode categories Cc, Cf, Zl, Zp: ESC and every other C0/C1 code,
  DEL, bidi overrides, zero-width marks, line separators) become visible escapes (`\\x1b`, `\\u202e`),
  so no escape sequence reaches the terminal and a name cannot move the cursor, recolour or hide text.
  Newlines and tabs are kept only where meshsim itself lays out lines (`keep_layout=True`).
- `user_text(text)`: `plain`, then rich's markup escaped, for user text interpolated into a string that
  rich parses as markup (tables, headlines): `x[/bold]y` prints literally instead of raising MarkupError.

The rich Console of sim/core/console.py applies `plain(..., keep_layout=True)` to every string it
renders, so a control character is never passed through even where a call site forgot `user_text`;
markup can only be escaped where user text is interpolated, so those sites call `user_text`.
"""

from __future__ import annotations

import unicodedata

import typer
from rich.markup import escape

_CONTROL_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
_LAYOUT = frozenset("\n\t")


def _visible(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def plain(text: object, *, keep_layout: bool = False) -> str:
    """str(text) with every control or format character replaced by a visible escape."""
    text = str(text)
    if text.isprintable():
        return text  # the common case: nothing to replace (isprintable is False for all of the above)
    return "".join(_visible(c) if unicodedata.category(c) in _CONTROL_CATEGORIES
                   and not (keep_layout and c in _LAYOUT) else c for c in text)


def user_text(text: object) -> str:
    """User text for a rich markup string: control characters made visible, markup escaped."""
    return escape(plain(text))


def echo_plain(message: object, *, err: bool = False) -> None:
    """typer.echo of a line that holds user text (paths, names): control characters made visible."""
    typer.echo(plain(message, keep_layout=True), err=err)
