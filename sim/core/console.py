"""The one rich Console factory for meshsim's terminal output.

On a terminal rich fits tables to its width. When output is piped or captured (CI logs, `| tee`), rich
would assume 80 columns and truncate every wide table to unreadable ellipses, so we print at a fixed
wide width instead (override with the COLUMNS environment variable).
"""

from __future__ import annotations

import os
import sys

from rich.console import Console

PIPED_WIDTH = 160


def make_console(*, stderr: bool = False) -> Console:
    """A Console for stdout (or stderr) that stays readable when not attached to a terminal."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty() or "COLUMNS" in os.environ:
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=PIPED_WIDTH)
