"""The `meshsim` command line. Each command lives in its own module exposing `register(app)`;
this file only assembles them and turns every error into one line without a traceback: user errors (and
usage errors) exit 2, a command that could not finish (CommandFailed: a worker died, a signal) exits with
its own status, 1 by default."""

from __future__ import annotations

import importlib
import os
import sys

import typer

from meshsim.sim.core.errors import EXIT_USER_ERROR, CommandFailed, UserError

COMMAND_MODULES = (
    "meshsim.sim.cli.topologies",  # meshsim topologies
    "meshsim.sim.cli.collective",  # meshsim collective
    "meshsim.sim.cli.run",  # meshsim run, meshsim scenarios
    "meshsim.sim.cli.sweep",  # meshsim sweep, meshsim compare
    "meshsim.sim.cli.validate",  # meshsim validate, meshsim calibrate (torch imported lazily)
)

app = typer.Typer(
    name="meshsim",
    help="Simulate tensor/sequence-parallel training steps and collectives on a device mesh.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

for _module in COMMAND_MODULES:
    importlib.import_module(_module).register(app)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI; UserError -> message on stderr, exit 2, no traceback."""
    try:
        code = app(args=argv, standalone_mode=False)
    except UserError as err:
        typer.echo(f"error: {err}", err=True)
        return EXIT_USER_ERROR
    except CommandFailed as err:
        typer.echo(f"error: {err}", err=True)
        return err.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("aborted", err=True)
        return 130
    except BrokenPipeError:  # `meshsim run | head -3`: the reader left; the files are already written
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except Exception as exc:
        # usage errors (unknown option, missing argument) from click, or the click that typer vendors
        if callable(getattr(exc, "show", None)) and isinstance(getattr(exc, "exit_code", None), int):
            exc.show()
            return EXIT_USER_ERROR
        raise
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
