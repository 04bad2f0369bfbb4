"""The `meshsim` command line. Each command lives in its own module exposing `register(app)`;
this file only assembles them and turns every error into one line without a traceback: user errors (and
usage errors) exit 2, a command that could not finish (CommandFailed: a worker died, a signal) exits with
its own status, 1 by default; any other exception is meshsim's own bug (an engine deadlock, say): one
line naming it an internal error, exit 1 (MESHSIM_TRACEBACK=1 re-raises it with its traceback). A command
that needs an optional extra that is not installed (torch for `validate` / `calibrate`) is a user error
too: one line naming the `pip install` that adds it, exit 2.
`meshsim --version` prints the installed package's version and the engine core in use."""

from __future__ import annotations

import atexit
import gc
import importlib
import importlib.util
import os
import sys
import threading
from typing import NoReturn

# importlib.metadata, typer, rich and click make long-lived objects and no garbage cycles: their import runs
# with the cyclic GC off (as the command modules', _app_without_gc), restored once they are in (~4 ms of
# collections that would only rescan them)
_GC_WAS_ENABLED = gc.isenabled()
gc.disable()
try:
    from importlib import metadata

    import typer

    from meshsim.sim.core.errors import (
        EXIT_FAILED,
        EXIT_USER_ERROR,
        CommandFailed,
        UserError,
        closest,
        missing_extra,
    )
    from meshsim.sim.core.text import plain
finally:
    if _GC_WAS_ENABLED:
        gc.enable()

COMMAND_MODULES = {  # command -> the module that registers it (each module registers all of its commands)
    "topologies": "meshsim.sim.cli.topologies",
    "collective": "meshsim.sim.cli.collective",
    "run": "meshsim.sim.cli.run",
    "scenarios": "meshsim.sim.cli.run",
    "sweep": "meshsim.sim.cli.sweep",
    "compare": "meshsim.sim.cli.sweep",
    "search": "meshsim.sim.cli.search",
    "validate": "meshsim.sim.cli.validate",  # torch imported lazily
    "calibrate": "meshsim.sim.cli.calibrate",  # torch imported lazily, none with --from-trace
    "trace": "meshsim.sim.cli.trace",  # meshsim trace summary (Kineto traces; no torch)
}


def engine_core() -> str:
    """The engine core `--engine compiled` (the default) runs on: the built extension, or the Python core
    (found without importing it: --version stays cheap)."""
    if importlib.util.find_spec("meshsim.sim.engine._core") is not None:
        return "engine core: compiled"
    return "engine core: python (the compiled core is not built)"


def version_text() -> str:
    """'meshsim 0.1.0 (engine core: compiled)': the installed distribution's version (pyproject.toml's
    project.version) and the engine core in use."""
    try:
        return f"meshsim {metadata.version('meshsim')} ({engine_core()})"
    except metadata.PackageNotFoundError:  # imported from a source tree that was never installed
        return f"meshsim (not installed: pip install .) ({engine_core()})"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(version_text())
        raise typer.Exit(0)


def _group(version: bool = typer.Option(False, "--version", is_eager=True, callback=_show_version,
                                        help="print meshsim's version and exit")) -> None:
    """Always a command group, even with one command module loaded (typer would run a lone command
    as the whole program)."""


def build_app(argv: list[str] | None = None) -> typer.Typer:
    """The app with the command modules `argv` needs: only the named command's module when argv starts with
    a command (a module costs its imports: `meshsim run` loads neither the sweep's nor validate's), else
    every module (help, usage errors and close-match suggestions list every command)."""
    args = sys.argv[1:] if argv is None else argv
    wanted = COMMAND_MODULES.get(args[0]) if args else None
    if args[:1] == ["--version"]:
        wanted = ""  # no command module: the version needs none of their imports
    app = typer.Typer(
        name="meshsim",
        help="Simulate tensor/sequence-parallel training steps and collectives on a device mesh.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    app.callback()(_group)
    for module in dict.fromkeys(COMMAND_MODULES.values()):
        if wanted in (None, module):
            importlib.import_module(module).register(app)
    return app


def given_value(exc: Exception, args: list[str]) -> str | None:
    """The value the user gave the option a BadParameter names (`--nodes abc` or `--nodes=abc`), read back
    from the command line: click's message names the option but not always what was given."""
    for opt in getattr(getattr(exc, "param", None), "opts", None) or ():
        for i, arg in enumerate(args):
            if arg == opt and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith(opt + "="):
                return arg[len(opt) + 1:]
    return None


def usage_line(exc: Exception, args: list[str] = ()) -> str:
    """A click usage error as one line: its message (with the value given, when click's leaves it out),
    then the fix (the command's --help; for an unknown command, the closest one and the list)."""
    ctx = getattr(exc, "ctx", None)
    path = ctx.command_path if ctx is not None else "meshsim"
    message = " ".join(plain(exc.format_message()).split())
    value = given_value(exc, list(args))
    if value is not None and repr(value) not in message and message.count(":") >= 1:
        head, rest = message.split(":", 1)
        message = f"{head}: {value!r} is not valid:{rest}"
    commands = sorted(getattr(ctx.command, "commands", {}) or {}) if ctx is not None else []
    if message.startswith("No such command") and commands:
        name = message.split("'")[1] if "'" in message else ""
        guess = closest(name, commands)
        hint = f"did you mean {guess!r}? " if guess else ""
        return f"{message.split('.')[0]}. Fix: {hint}use one of {', '.join(commands)} (meshsim --help)"
    module = COMMAND_MODULES.get(ctx.command.name) if ctx is not None else None
    if message.startswith("No such option") and module is not None:  # a command module may name the way
        hint = getattr(importlib.import_module(module), "unknown_option_fix", None)  # loaded: its command ran
        fix = hint(message.split(":", 1)[1].split()[0]) if hint is not None and ":" in message else None
        if fix:
            return f"{message.split('.')[0].rstrip('.')}. Fix: {fix}, or see `{path} --help`"
    return f"{message.rstrip('.')}. Fix: see `{path} --help`"


def _app_without_gc(argv: list[str] | None):
    """build_app with the cyclic garbage collector off, and what it imported frozen: importing a command
    module makes ~10^5 long-lived objects (schemas, classes, numpy) and no garbage cycles, so the collections
    it would trigger, and the first ones after it, only rescan them (~10% of `meshsim run`'s start-up)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return build_app(argv)
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


def main(argv: list[str] | None = None, *, program: bool = False) -> int:
    """Entry point: run the CLI; UserError -> message on stderr, exit 2, no traceback. `program` (the
    `meshsim` process itself, not a caller in a longer-lived one): build the app without the cyclic GC and
    freeze what it imported (_app_without_gc)."""
    try:
        app = _app_without_gc(argv) if program else build_app(argv)
        code = app(args=argv, standalone_mode=False, obj=program)  # ctx.obj: the process ends after (run.py)
    except UserError as err:
        typer.echo(f"error: {plain(err)}", err=True)
        return EXIT_USER_ERROR
    except CommandFailed as err:
        typer.echo(f"error: {plain(err)}", err=True)
        return err.exit_code
    except ModuleNotFoundError as err:
        extra = missing_extra(err.name)
        if extra is None:
            raise
        typer.echo(f"error: {extra}", err=True)
        return EXIT_USER_ERROR
    except typer.Exit as exc:
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("aborted", err=True)
        return 130
    except BrokenPipeError:  # `meshsim run | head -3`: the reader left; the files are already written
        return _reader_left()
    except SystemExit as exc:  # click turns a broken pipe into sys.exit(1) (core.py, `errno.EPIPE`)
        if isinstance(exc.__context__, BrokenPipeError):
            return _reader_left()
        raise
    except Exception as exc:
        # usage errors (unknown option or command, a bad value, a missing argument) from click, or the
        # click that typer vendors: one line with the fix, like every other bad input
        if callable(getattr(exc, "format_message", None)) and isinstance(getattr(exc, "exit_code", None), int):
            typer.echo(f"error: {usage_line(exc, sys.argv[1:] if argv is None else argv)}", err=True)
            return EXIT_USER_ERROR
        if os.environ.get(TRACEBACK_ENV):
            raise
        typer.echo(f"error: {internal_error_line(exc)}", err=True)
        return EXIT_FAILED
    return code if isinstance(code, int) else 0


TRACEBACK_ENV = "MESHSIM_TRACEBACK"  # set (to anything) to see an internal error's traceback


def internal_error_line(exc: BaseException) -> str:
    """One line for an error that is meshsim's own fault, not the input's (an engine deadlock, a broken
    invariant): named as an internal error, with its type and first line, and how to get the traceback."""
    first = " ".join(str(exc).split())[:400] or "(no message)"
    return (f"internal error (a meshsim bug, not a problem with your input): {type(exc).__name__}: {first}; "
            f"rerun with {TRACEBACK_ENV}=1 for the traceback and report it with the scenario")


def _reader_left() -> int:
    """Exit status 0 once the reader of stdout has gone (`meshsim run | head`): what was to be written to
    files is written, so nothing failed; stdout points at /dev/null so the final flush raises nothing."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def cli() -> NoReturn:
    """The `meshsim` program: main(), then exit without tearing the interpreter down object by object
    (freeing a run's ops, events, schemas and modules costs 30-80 ms, a tenth of `meshsim run`). Exit
    handlers still run (atexit: logging, temporary folders, coverage; they are cleared once run) and both
    streams are flushed after them; if another thread is alive, a profiler or tracer is set (python -m
    cProfile writes its report after the program returns), or a stream cannot be flushed, the ordinary
    exit does the rest."""
    code = main(program=True)
    if threading.active_count() > 1 or sys.getprofile() is not None or sys.gettrace() is not None:
        sys.exit(code)  # a thread to join, or a profiler / debugger that reports after the program returns
    atexit._run_exitfuncs()  # what the interpreter's own exit runs first (CPython)
    try:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    except BrokenPipeError:  # the reader of stdout left before this last flush; the files are written
        os._exit(_reader_left() or code)
    except OSError:  # another stream failure: the interpreter's exit reports it as it always has
        sys.exit(code)
    os._exit(code)


if __name__ == "__main__":
    cli()
