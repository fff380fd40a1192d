"""The ``crowdtally`` command line (typer): one module per command group.

``extract`` (the seed's job on a file; imports neither the web stack nor SQL), ``service``
(``serve``, ``engine``), ``snapshots`` (``snapshots list|inspect|delete``, ``restore``) and
``transfer`` (``import``, ``export``, ``calibration`` over HTTP). Commands import what they run when they run.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys

import click
import typer

from app.cli import extract, service, snapshots, transfer
from app.cli.layout import HELP_MAX_WIDTH, ArgvCommand, HelpCommand, HelpGroup
from app.io.input import InputError
from app.io.model_file import ModelFileError

# Plain (click) help, not rich panels: it wraps to the terminal's width (HelpGroup; 120 columns
# when not a terminal) instead of cutting option names and help with "…", shows boolean flags
# as --flag/--no-flag (rich panels added a <bool> column) and prints "[default: ...]" as written.
app = typer.Typer(
    cls=HelpGroup,
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": HELP_MAX_WIDTH},
    help="Online label aggregation for crowdsourcing.",
)
app.command(cls=ArgvCommand)(extract.extract)
app.command(cls=HelpCommand)(service.serve)
app.command("engine", cls=HelpCommand)(service.engine_command)
app.add_typer(snapshots.snapshots_app, name="snapshots")
app.command(cls=HelpCommand)(snapshots.restore)
app.command("import", cls=HelpCommand)(transfer.import_command)
app.command("export", cls=HelpCommand)(transfer.export_command)
app.command("calibration", cls=HelpCommand)(transfer.calibration_command)


@app.callback()
def _root() -> None:
    """crowdtally: online label aggregation for crowdsourcing."""


_CLICKS = [
    click.exceptions,
    getattr(getattr(typer, "_click", None), "exceptions", click.exceptions),
]
_CLICK_ERRORS = tuple({m.ClickException for m in _CLICKS})
_CLICK_ABORTS = tuple({getattr(m, "Abort", click.exceptions.Abort) for m in _CLICKS})


def main() -> None:
    """The installed script's entry point (and ``python -m app.cli``): ``run``, and a command
    that ends with an error status ends the process there, its output flushed, without the
    interpreter's teardown: pyarrow's thread pool, started by a read a moment before (the
    file read again to name a bad line), could abort that teardown ("terminate called
    without an active exception", status 134, in about 1 run in 150 on a busy machine)."""
    try:
        run()
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        if status == 0:
            raise
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def run() -> None:
    """The command line: expected problems print one line and exit 2, never a traceback."""
    # The interpreter's last garbage collection at exit walks every object alive, and numba's
    # typing and lowering registries hold hundreds of thousands once a kernel has loaded: 0.2 s
    # of every command that ran one. Frozen at exit (after the atexit hooks, before that
    # collection), they are left to their reference counts.
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
    _run()


def _run() -> None:
    try:
        app(standalone_mode=False)
    except (InputError, ModelFileError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except ValueError as err:  # invalid hyperparameters from NominalConfig
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except OSError as err:
        if err.filename is None:  # (not a file's: e.g. the network)
            raise
        print(f"error: {err.filename}: {err.strerror}", file=sys.stderr)
        raise SystemExit(2) from None
    except typer.Exit as err:
        raise SystemExit(err.exit_code) from None
    except _CLICK_ERRORS as err:
        err.show()
        raise SystemExit(err.exit_code) from None
    except _CLICK_ABORTS:
        print("aborted", file=sys.stderr)
        raise SystemExit(130) from None
