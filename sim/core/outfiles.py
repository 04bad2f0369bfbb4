"""Where outputs go: checked before any work starts, so a bad --json / --out / --plot never throws away a
finished computation, and written only inside meshsim's own output folder, never through a link.

- `check_output_file` / `check_output_dir`: the path is (made) writable; the files meshsim will write in a
  folder are not symlinks or directories.
- `open_own_file` / `open_own_for_writing`: open such a file with O_NOFOLLOW, so a link put there after
  the checks is refused at the write too.
- `write_output_file(flag, path, data)`: write a whole output file (--json, --out's files) without ever
  following a link: a regular file is written beside it and renamed over it (a failed write leaves the
  old file whole), a character device or FIFO named directly (/dev/null, /dev/full, a pipe) is written
  in place; any OSError (a full disk, /dev/full) is one UserError, exit 2.
- `output_folder_name`: a scenario name made safe to use as one folder name (the name is a label only).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

from meshsim.sim.core.errors import FilePath, UserError


# ----- outputs ---------------------------------------------------------------------------------------
def _probe_directory(flag: str, directory: Path) -> None:
    """Create `directory` (and parents) and prove a file can be written in it."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".meshsim-probe-"):
            pass
    except OSError as exc:
        raise UserError(flag, FilePath(directory), "give a writable directory",
                        problem=f"Cannot write there ({exc.strerror or exc})") from None


def check_output_file(flag: str, path: Path | None) -> None:
    """Before any work: `path` is not a symlink (even dangling) nor a directory, and its folder is (made)
    writable."""
    if path is None:
        return
    path = Path(path)
    if path.is_symlink():
        check_own_file(flag, path)
    if path.is_char_device() or path.is_fifo():  # /dev/null, /dev/full, a pipe: written in place
        if not os.access(path, os.W_OK):
            raise UserError(flag, FilePath(path), "give a writable file", problem="Not writable")
        return
    if path.is_dir():
        raise UserError(flag, FilePath(path), "give a file path, not a directory", problem="Is a directory")
    _probe_directory(flag, path.parent if str(path.parent) else Path("."))
    if path.exists() and not os.access(path, os.W_OK):
        raise UserError(flag, FilePath(path), "give a writable file", problem="The file is not writable")


def check_output_dir(flag: str, path: Path | None, files: Iterable[str] = ()) -> None:
    """Before any work: `path` is (made) a writable directory, and none of the `files` meshsim will write
    in it is a symlink (which would write outside it, even dangling) or a directory."""
    if path is None:
        return
    path = Path(path)
    if path.is_symlink():
        raise UserError(flag, FilePath(path), f"give the folder itself, not a link to it, or choose another {flag}",
                        problem="Is a symlink (meshsim never writes through a link, which could point "
                        "outside the output folder)")
    if path.exists() and not path.is_dir():
        raise UserError(flag, FilePath(path), "give a directory (it is created if missing)",
                        problem="Exists and is not a directory")
    _probe_directory(flag, path)
    for name in files:
        check_own_file(flag, path / name)


def check_own_file(flag: str, path: Path) -> None:
    """UserError if `path` (a file meshsim names inside its output folder) is a symlink or not a regular
    file: meshsim writes only inside --out / meshsim-out, never through a link."""
    fix = f"remove {path} or choose another {flag}"
    if path.is_symlink():
        raise UserError(flag, FilePath(path), fix, problem="Is a symlink (meshsim never writes through a link, "
                        "which could point outside the output folder)")
    if path.exists() and not path.is_file():
        raise UserError(flag, FilePath(path), fix, problem="Exists and is not a regular file (a directory?)")


def open_own_file(flag: str, path: Path, flags: int) -> int:
    """os.open of a file meshsim names inside its output folder, refusing a symlink (O_NOFOLLOW, so a link
    made after the check is refused too) and anything but a regular file; a file descriptor."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0), 0o644)
    except OSError as exc:
        check_own_file(flag, path)  # the one-line reason when it is a link or a directory
        raise UserError(flag, FilePath(path), "give a writable folder", problem=f"Cannot open the file "
                        f"({exc.strerror or exc})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(flag, FilePath(path), f"remove {path} or choose another {flag}",
                        problem="Exists and is not a regular file")
    return fd


def open_own_for_writing(path: Path, mode: str = "w", flag: str = "--out"):
    """open(path, mode) ("w" or "wb") for a file meshsim names inside its output folder, through
    open_own_file: a symlink or directory put there after the checks that ran before the work is refused
    at the write too, never followed."""
    fd = open_own_file(flag, Path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    return os.fdopen(fd, mode)


def write_output_file(flag: str, path: Path, data: str | bytes) -> None:
    """Write `data` as the whole file `path` (module docstring): never through a symlink; a regular file
    replaced atomically; a character device or FIFO written in place; an OSError is one UserError."""
    path = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise _write_error(flag, path, exc) from None
    if mode is not None and (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
        _write_in_place(flag, path, payload)
        return
    if mode is not None and not stat.S_ISREG(mode):
        check_own_file(flag, path)  # a symlink or directory: the one-line reason
        raise UserError(flag, FilePath(path), f"remove {path} or choose another {flag}",
                        problem="Exists and is not a regular file")
    folder = path.parent if str(path.parent) else Path(".")
    tmp = None
    try:
        tmp = folder / f".{path.name[:64]}.{secrets.token_hex(6)}.tmp"
        # 0o666 less the umask, as open() would create it; an existing file keeps its own mode
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        if mode is not None:
            os.fchmod(fd, stat.S_IMODE(mode))
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
        os.replace(tmp, path)  # replaces a link put there meanwhile, never writes through it
        tmp = None
    except OSError as exc:
        raise _write_error(flag, path, exc) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _write_in_place(flag: str, path: Path, payload: bytes) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
    except OSError as exc:
        raise _write_error(flag, path, exc) from None


def _write_error(flag: str, path: Path, exc: OSError) -> UserError:
    return UserError(flag, FilePath(path), "give a writable file on a disk with room for it",
                     problem=f"Cannot write it ({exc.strerror or exc})")


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
MAX_FOLDER_CHARS = 64


def output_folder_name(name: str, suffix: str = "") -> str:
    """A scenario name as one safe folder name: letters, digits, '.', '_' and '-' only, no leading dot,
    at most MAX_FOLDER_CHARS characters ('../../x' -> 'x', '/abs/dir' -> 'abs-dir')."""
    safe = _UNSAFE.sub("-", name).strip(".-")[:MAX_FOLDER_CHARS].strip(".-") or "scenario"
    return safe + suffix
