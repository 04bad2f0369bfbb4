"""User-facing errors: one clear message naming where, what, the value and the fix; exit status 2."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

EXIT_USER_ERROR = 2
EXIT_DOES_NOT_FIT = 3  # meshsim run: the configuration needs more memory than the GPU has (--allow-oom: 0)
EXIT_FAILED = 1
QUOTE_CHARS = 80  # a quoted value is cut to this many characters (a 1 MB string stays one readable line)
PATH_CHARS = 4096  # a file name is shown whole up to PATH_MAX: the user needs all of it to find the file


class FilePath(str):
    """A file or folder name given as an error's value: quoted whole (up to PATH_CHARS), never cut to
    QUOTE_CHARS, so that a long temporary or cluster path still names the file."""


def quote(value: object) -> str:
    """repr(value), cut to QUOTE_CHARS characters (PATH_CHARS for a FilePath) with an ellipsis, on one line."""
    text = repr(str(value) if isinstance(value, FilePath) else value).replace("\n", " ")
    limit = PATH_CHARS if isinstance(value, FilePath) else QUOTE_CHARS
    return text if len(text) <= limit else text[: limit - 3] + "..."


class UserError(Exception):
    """Bad input from the user. The CLI prints `str(err)` without a traceback and exits 2."""

    def __init__(self, field: str, value: object, fix: str, *, source: str | None = None, problem: str = ""):
        self.source = source
        self.field = field
        self.value = value
        self.fix = fix
        self.problem = problem
        super().__init__(self.message())

    def message(self) -> str:
        where = f"{self.source}: " if self.source else ""
        problem = f" {self.problem}." if self.problem else ""
        return f"{where}{self.field} = {quote(self.value)} is invalid.{problem} Fix: {self.fix}"

    def with_source(self, source: str) -> UserError:
        """The same error, attributed to a file."""
        return UserError(self.field, self.value, self.fix, source=source, problem=self.problem)


class CommandFailed(Exception):
    """A command that could not finish for a reason other than its input (a worker died or hung, a signal
    stopped it). The CLI prints `str(err)` on one line without a traceback and exits `exit_code`."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED):
        self.exit_code = exit_code
        super().__init__(" ".join(message.split()))


def family(name: str) -> str:
    """A name's first '-'-separated part, lower case: its family or generation ('h100-80gb' -> 'h100')."""
    return name.strip().lower().replace("_", "-").split("-")[0]


def closest(name: str, choices: Iterable[str]) -> str | None:
    """The closest valid name to a misspelt one, or None: ignoring case, the one name it is a prefix or a
    '-'-separated part of ('H200' -> 'h200-sxm', not the one letter away 'b200'), else the closest of its
    own family when it has one ('h100-80gb' -> 'h100-sxm', not the closer-spelt 'a100-80gb'), else
    difflib's closest."""
    by_lower = {choice.lower(): choice for choice in choices}
    key = name.strip().lower()
    if key in by_lower:
        return by_lower[key]
    for match in (lambda c: c.startswith(key), lambda c: key in c.replace("_", "-").split("-")):
        hits = [choice for low, choice in by_lower.items() if key and match(low)]
        if len(hits) == 1:
            return hits[0]
    kin = [low for low in by_lower if key and family(low) == family(key)]
    if kin:
        found = difflib.get_close_matches(key, kin, n=1, cutoff=0.0)
        return by_lower[found[0]]
    found = difflib.get_close_matches(key, list(by_lower), n=1, cutoff=0.5)
    return by_lower[found[0]] if found else None


def unknown_name_error(field: str, value: str, choices: Iterable[str], *, source: str | None = None) -> UserError:
    """'unknown X' with the closest valid name and the full list."""
    choices = sorted(choices)
    guess = closest(value, choices)
    hint = f"did you mean {guess!r}? " if guess else ""
    return UserError(field, value, f"{hint}valid values: {', '.join(choices)}", source=source,
                     problem="Unknown name")


# optional dependencies -> the pyproject.toml extra that installs them (project.optional-dependencies)
EXTRAS = {"torch": "validate", "ray": "ray"}
# plain `pip install torch` on Linux pulls the CUDA build (several GB, useless without an NVIDIA GPU)
CPU_TORCH = ("; without an NVIDIA GPU, first install torch's CPU build: pip install torch --index-url "
             "https://download.pytorch.org/whl/cpu")


def missing_extra(module: str | None) -> str | None:
    """The one line for an optional dependency that is not installed ('torch', or a submodule of it), naming
    the extra that installs it; None when `module` belongs to no extra (a real bug: let it raise)."""
    top = (module or "").split(".")[0]
    extra = EXTRAS.get(top)
    if extra is None:
        return None
    line = (f"this command needs {top}, which is not installed. Fix: pip install 'meshsim[{extra}]' "
            f"(or, from a checkout, pip install '.[{extra}]')")
    return line + CPU_TORCH if top == "torch" else line

