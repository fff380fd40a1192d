"""How the commands look and read their flags: help at the terminal's width, the flags as the
user typed them, and the files they name to write, checked before any work (only typer, click
and ``app.io.input`` here: ``extract`` imports this and stays light)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import click
import typer
from typer.core import TyperCommand, TyperGroup

from app.io.input import InputError

# newer typers carry their own copy of click (typer._click); older ones use click itself
_CLICK = getattr(typer, "_click", click)
_BAD_PARAMETER: tuple[type[Any], ...] = tuple(
    {
        click.BadParameter,
        getattr(getattr(_CLICK, "exceptions", click), "BadParameter", click.BadParameter),
    }
)

HELP_WIDTH_NOT_A_TTY = 120
"""Columns of ``--help`` written to a pipe or a file (no terminal to measure, no ``COLUMNS``)."""
HELP_MAX_WIDTH = 160
"""Help lines stay readable on a very wide terminal."""


def help_width() -> int:
    """Columns for ``--help``: ``$COLUMNS``, else the terminal's width, else 120 (not a terminal);
    at most 160."""
    env = os.environ.get("COLUMNS", "").strip()
    if env.isdigit() and int(env) > 0:
        columns = int(env)
    elif sys.stdout.isatty():
        columns = shutil.get_terminal_size().columns
    else:
        columns = HELP_WIDTH_NOT_A_TTY
    return max(min(columns, HELP_MAX_WIDTH) - 2, 38)


class HelpFormatter(_CLICK.HelpFormatter):  # type: ignore[misc,name-defined]
    """click's plain help, whose option column narrows with the terminal so that the help
    text keeps room to wrap (a long option name goes on a line of its own)."""

    def write_dl(self, rows: Any, col_max: int = 30, col_spacing: int = 2) -> None:
        col_max = min(col_max, max(self.width // 3 - col_spacing, 8))
        super().write_dl(rows, col_max=col_max, col_spacing=col_spacing)


class HelpContext(typer.Context):
    formatter_class = HelpFormatter


class HelpCommand(TyperCommand):
    """A command whose help wraps to the width its group measured (``HelpGroup``)."""

    context_class = HelpContext


class HelpGroup(TyperGroup):
    """A command group whose help uses the terminal's width (its subcommands inherit it) and
    lists each command's whole first sentence, wrapped rather than cut."""

    context_class = HelpContext

    def make_context(
        self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any
    ) -> Any:
        if parent is None:
            extra.setdefault("terminal_width", help_width())
            extra.setdefault("max_content_width", HELP_MAX_WIDTH)
        return super().make_context(info_name, args, parent, **extra)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit=10_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class ArgvCommand(HelpCommand):
    """A command that keeps its raw arguments, so that an error can name a flag the way the
    user spelled it (``--n_labels`` or ``--n-labels``)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        ctx.meta["crowdtally.argv"] = list(args)
        try:
            rest: list[str] = super().parse_args(ctx, args)
        except _BAD_PARAMETER as err:  # "Invalid value for '--n_items'", not every spelling
            spellings = [*getattr(err.param, "opts", ()), *getattr(err.param, "secondary_opts", ())]
            if err.param_hint is None and len(spellings) > 1:
                err.param_hint = f"'{as_typed(ctx, *spellings)}'"
            raise
        return rest


def as_typed(ctx: typer.Context | None, *spellings: str) -> str:
    """The spelling of an option the user typed last (``--opt`` or ``--opt=value``); the first
    spelling when none was typed (or without a context)."""
    argv: list[str] = ctx.meta.get("crowdtally.argv", []) if ctx is not None else []
    if "--" in argv:  # what follows is arguments, not options
        argv = argv[: argv.index("--")]
    for token in reversed(argv):
        flag = token.split("=", 1)[0]
        if flag in spellings:
            return flag
    return spellings[0]


STDOUT = Path("-")
"""An output flag's ``-``: standard output, where a command takes it (else refused, not
written as a file named ``-``)."""


def class_names(flag: str, text: str) -> list[str]:
    """A comma-separated list of class names, none of them empty (``--labels``,
    ``--create-with-labels``)."""
    names = [s.strip() for s in text.split(",")]
    if not all(names):
        raise InputError(flag, None, f"class names cannot be empty, got {text!r}")
    return names


def _through_special(link: Path, hops: int = 40) -> bool:
    """A link whose chain passes through /proc or /dev (``/dev/stdout`` -> /proc/self/fd/1 ->
    whatever the process's standard output is: a pipe, a terminal, a deleted file)."""
    current = link
    for _ in range(hops):
        if any(Path(os.path.abspath(current)).is_relative_to(r) for r in ("/proc", "/dev")):
            return True
        if not current.is_symlink():
            return False
        current = current.parent / os.readlink(current)
    return True  # (a loop, or a chain too long to follow)


def check_output(flag: str, path: Path, inputs: list[Path], why: str = "") -> Path:
    """An output file that can be written, checked before any work: it names a file (not a
    folder, a device or a pipe, nor ``-``: ``why`` says why it cannot go to standard
    output), in a folder that exists, and is none of the inputs. Returns the file to write:
    a symbolic link's target (the output is written beside it and renamed over it, which
    would otherwise replace the link; a link to standard output, as ``/dev/stdout``, is
    refused: give ``-``)."""
    if path == STDOUT:
        raise InputError(flag, None, f"cannot write to standard output{why}: give a file name")
    if not path.name:
        raise InputError(flag, None, "give a file name")
    if path.is_symlink():  # (its target is checked below as a path given itself would be)
        target = Path(os.path.realpath(path))
        if _through_special(path):
            dash = "" if why else ", or - for standard output"
            raise InputError(
                flag,
                None,
                f"{path} leads to a device or a stream ({target}), not to a regular file: "
                f"give a file name{dash}",
            )
        path = target
    if path.is_dir():
        raise InputError(flag, None, f"{path} is a folder: give a file name")
    if not path.parent.is_dir():
        raise InputError(flag, None, f"no folder {path.parent} to write {path.name} in")
    if path.exists() and not path.is_file():  # (written beside, then renamed over it)
        raise InputError(flag, None, f"{path} is not a regular file (a device or a pipe)")
    if any(path.exists() and p.exists() and path.samefile(p) for p in inputs):
        raise InputError(flag, None, f"{path} is an input of this command: it would be overwritten")
    return path
