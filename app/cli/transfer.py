"""``crowdtally import`` and ``crowdtally export``: files to and from a running service."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Annotated

import typer

from app.cli.layout import STDOUT, check_output, class_names
from app.io import importers, transfer
from app.io.input import PROJECT_NAME, InputError


def _key(key: str | None) -> str | None:
    return key or os.environ.get("CROWDTALLY_KEY") or None


def _project(name: str) -> str:
    """A project name the service accepts (else one line here, not the answer to a request
    for another path: an empty name asked for /v1/projects/)."""
    if not re.fullmatch(PROJECT_NAME, name):
        raise InputError(
            "--project",
            None,
            f"{name!r} is not a project name: a letter or a digit, then up to 63 letters, "
            "digits, '_', '.' or '-'",
        )
    return name


def import_command(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="The file to import.")],
    project: Annotated[
        str, typer.Option("--project", "-p", callback=_project, help="Project to post to.")
    ],
    format: Annotated[
        str, typer.Option("--format", "-f", help=f"One of {', '.join(importers.FORMATS)}.")
    ] = "auto",
    map_: Annotated[
        str | None,
        typer.Option(
            "--map",
            help="Columns: item=COL,worker=COL,label=COL,id=COL,weight=COL,gold=COL "
            "(Label Studio: item=data.FIELD, label=<from_name>).",
        ),
    ] = None,
    header: Annotated[
        bool,
        typer.Option(
            "--header/--no-header",
            help="--no-header: a CSV or TSV file whose first line is an answer too, its fields "
            "item,worker,label[,weight] (as extract reads a file without a header).",
        ),
    ] = True,
    url: Annotated[
        str, typer.Option("--url", envvar="CROWDTALLY_URL", help="The service (or CROWDTALLY_URL).")
    ] = transfer.DEFAULT_URL,
    key: Annotated[
        str | None,
        typer.Option("--key", help="API key (write, or admin to create); else CROWDTALLY_KEY."),
    ] = None,
    create_with_labels: Annotated[
        str | None,
        typer.Option(
            "--create-with-labels",
            help="Create the project (admin key) with these labels, comma-separated; "
            "'auto': the labels the answers use. An existing project is used as it is.",
        ),
    ] = None,
    truth: Annotated[
        Path | None, typer.Option("--truth", help="Also post gold answers from an item,label CSV.")
    ] = None,
    batch_size: Annotated[
        int,
        typer.Option(
            "--batch-size",
            min=1,
            max=10000,
            help="Labels per POST (halved while the service finds a block too large).",
        ),
    ] = transfer.IMPORT_BATCH,
    progress: Annotated[
        bool, typer.Option("--progress/--no-progress", help="Progress bar.")
    ] = True,
    retries: Annotated[
        int,
        typer.Option(
            "--retries",
            min=0,
            help="Re-sends on connection errors and 5xx (a 429 is waited out, up to 10 minutes).",
        ),
    ] = 5,
    compress: Annotated[
        bool,
        typer.Option(
            "--compress",
            help="Send the blocks gzipped (about a third of the bytes): for a remote service.",
        ),
    ] = False,
) -> None:
    """Post a file of answers to a running service (resumable: re-runs count each answer once)."""
    auto = create_with_labels is not None and create_with_labels.strip() == "auto"
    create = (
        class_names("--create-with-labels", create_with_labels)
        if create_with_labels is not None and not auto
        else None
    )
    transfer.RETRIES.set(retries)
    from app.io.codes import use_system_allocator  # (the reader's own modules: loaded anyway)

    use_system_allocator()
    with transfer.compressed(compress), transfer.make_http(url, _key(key)) as http:
        r = transfer.run_import(
            http,
            file,
            project,
            format=format,
            mapping=importers.parse_map(map_),
            create_with=create,
            auto_labels=auto,
            truth=truth,
            batch_size=batch_size,
            progress=progress,
            header=header,
        )
    skipped = f", {r.skipped} rows skipped" if r.skipped else ""
    print(
        f"{file}: {r.format}, {r.labels:,} labels in {r.blocks} blocks: {r.accepted:,} new, "
        f"{r.duplicates:,} already there; {r.gold:,} gold{skipped}; {r.seconds:.2f}s"
    )
    if r.unread:
        print(f"{file}: columns not read: {', '.join(r.unread)}")
    if r.gold_unanswered:
        print(f"{truth}: {r.gold_unanswered:,} items with gold have no answers in {file} "
              "(posted as gold alone: items that no one answered yet)")  # fmt: skip


def export_command(
    project: Annotated[
        str, typer.Option("--project", "-p", callback=_project, help="Project to export.")
    ],
    output: Annotated[
        Path,
        typer.Option(
            "--output",
            "-o",
            help="File to write; '-': standard output (CSV or JSONL; the summary then goes to "
            "standard error).",
        ),
    ],
    what: Annotated[
        str, typer.Option("--what", help="posteriors (every class), labels (best), or workers.")
    ] = "posteriors",
    format: Annotated[
        str,
        typer.Option(
            "--format",
            "-f",
            help="auto (by the file's name: .parquet, .jsonl), csv, jsonl or parquet.",
        ),
    ] = "auto",
    confusion: Annotated[
        bool,
        typer.Option("--confusion", help="Workers: add confusion matrices (a GET per worker)."),
    ] = False,
    url: Annotated[
        str, typer.Option("--url", envvar="CROWDTALLY_URL", help="The service (or CROWDTALLY_URL).")
    ] = transfer.DEFAULT_URL,
    key: Annotated[
        str | None, typer.Option("--key", help="API key (read); else CROWDTALLY_KEY.")
    ] = None,
    retries: Annotated[
        int,
        typer.Option(
            "--retries",
            min=0,
            help="Re-sends on connection errors and 5xx (a 429 is waited out, up to 10 minutes).",
        ),
    ] = 5,
    compress: Annotated[
        bool,
        typer.Option(
            "--compress",
            help="Have the export sent gzipped (a quarter to a third of the bytes): for a remote "
            "service.",
        ),
    ] = False,
) -> None:
    """Write a project's posteriors, labels or workers to a CSV, JSONL or Parquet file."""
    if confusion and what != "workers":  # (it was ignored without a word)
        raise InputError("--confusion", None, f"adds the workers' matrices: it applies to "
                         f"--what workers, not {what}")  # fmt: skip
    to_stdout = output == STDOUT
    if to_stdout:
        transfer.refuse_parquet_to_stdout(format)
    else:
        output = check_output("--output", output, [])
    transfer.RETRIES.set(retries)
    with transfer.compressed(compress), transfer.make_http(url, _key(key)) as http:
        if to_stdout:
            sys.stdout.flush()
            n = transfer.print_export(
                http, project, sys.stdout.buffer, what=what, format=format, confusion=confusion
            )
        else:
            n = transfer.run_export(
                http, project, output, what=what, format=format, confusion=confusion
            )
    where, report = ("standard output", sys.stderr) if to_stdout else (output, sys.stdout)
    print(f"{where}: {n:,} {'workers' if what == 'workers' else 'items'}", file=report)


def calibration_command(
    project: Annotated[
        str, typer.Option("--project", "-p", callback=_project, help="The project.")
    ],
    url: Annotated[
        str, typer.Option("--url", envvar="CROWDTALLY_URL", help="The service (or CROWDTALLY_URL).")
    ] = transfer.DEFAULT_URL,
    key: Annotated[
        str | None, typer.Option("--key", help="API key (read); else CROWDTALLY_KEY.")
    ] = None,
) -> None:
    """How a project's posteriors score on its gold items: accuracy, calibration error (ECE),
    NLL and the reliability bins, each item calibrated without its own gold."""
    with transfer.make_http(url, _key(key)) as http:
        print(transfer.calibration_text(transfer.fetch_calibration(http, project)))
