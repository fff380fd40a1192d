"""The ``crowdtally`` command line (typer)."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import click
import numpy as np
import typer

from app import extract as job
from app.model_file import ModelFileError, SavedModel, load_model, save_model
from app.settings import Settings
from app.triples import InputError, read_triples, read_truth
from core.nominal import NominalConfig

if TYPE_CHECKING:
    from app.snapshots import SnapshotDB

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Online label aggregation for crowdsourcing."
)

DEFAULTS = NominalConfig(n_classes=2)


def _floats(text: str, option: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise InputError(option, None, f"expected comma-separated numbers, got {text!r}") from None


@app.command()
def extract(
    data: Annotated[
        Path | None,
        typer.Argument(help="Answers file: item,worker,label CSV, or tab/space separated."),
    ] = None,
    data_opt: Annotated[
        Path | None, typer.Option("--data", help="Same as the DATA argument (the seed's flag).")
    ] = None,
    labels: Annotated[
        str | None, typer.Option("--labels", help="Class names in order, comma-separated.")
    ] = None,
    n_labels: Annotated[
        int | None, typer.Option("--n-labels", "--n_labels", help="K: the labels are 0..K-1.")
    ] = None,
    n_worker_slots: Annotated[
        int,
        typer.Option(
            "--n-worker-slots", "--n_worker_slots", "--n_workers", help="Hashed worker slots."
        ),
    ] = DEFAULTS.n_worker_slots,
    eta: Annotated[
        float, typer.Option("--eta", help="eta_0 of eta_t = eta_0 (tau_0 + t)^-rho.")
    ] = DEFAULTS.eta0,
    rho: Annotated[float, typer.Option("--rho", help="Decay exponent rho.")] = DEFAULTS.rho,
    initial_t: Annotated[
        float, typer.Option("--initial-t", "--initial_t", help="tau_0.")
    ] = DEFAULTS.tau0,
    n_items: Annotated[
        float | None,
        typer.Option(
            "--n-items",
            "--n_items",
            help="|I|, the prior's weight is 1/|I| per item [default: items in the file].",
        ),
    ] = None,
    priorz: Annotated[
        str | None,
        typer.Option("--priorz", help="Prior class distribution, comma-separated (normalised)."),
    ] = None,
    passes: Annotated[int, typer.Option("--passes", min=1, help="Passes over the items.")] = 1,
    later_passes: Annotated[
        job.LaterPasses,
        typer.Option(
            "--later-passes",
            help="Passes 2..N: revisit items one by one (progressive-validation table) or "
            "sweep by trust-region Newton toward batch EM's optimum (docs/model.md eq. 17-20).",
        ),
    ] = job.LaterPasses.revisit,
    shuffle: Annotated[
        int | None,
        typer.Option(
            "--shuffle",
            help="Process items in a random order drawn from this seed, anew each pass [default: file order].",
        ),
    ] = None,
    difficulty: Annotated[
        bool, typer.Option("--difficulty/--no-difficulty", help="Model a per-item clarity.")
    ] = DEFAULTS.difficulty,
    model: Annotated[
        Path | None, typer.Option("--model", "--save", help="Write the final model to this file.")
    ] = None,
    load: Annotated[
        Path | None,
        typer.Option("--load", help="Start from this saved model (its configuration wins)."),
    ] = None,
    test_only: Annotated[
        bool,
        typer.Option(
            "--test-only", "--test_only", help="Do not learn: posteriors under the loaded model."
        ),
    ] = False,
    predictions: Annotated[
        Path | None,
        typer.Option("--predictions", help="Write item,label,probability,<one column per class>."),
    ] = None,
    truth: Annotated[
        Path | None, typer.Option("--truth", help="Gold labels (item,label) to report accuracy.")
    ] = None,
    batch: Annotated[
        bool, typer.Option("--batch", help="Batch EM to convergence instead of online EM.")
    ] = False,
) -> None:
    """Aggregate labels: posteriors per item and worker confusion matrices (nominalonlineextract)."""
    path = data or data_opt
    if path is None or (data is not None and data_opt is not None):
        raise InputError("DATA", None, "give the answers file once, as an argument or with --data")
    if test_only and load is None:
        raise InputError("--test-only", None, "needs a model to test: give --load FILE")
    if test_only and batch:
        raise InputError("--test-only", None, "cannot be combined with --batch")
    if later_passes is job.LaterPasses.newton and test_only:
        raise InputError(
            "--later-passes", None, "newton learns: it cannot be used with --test-only"
        )
    out = sys.stdout
    triples = read_triples(path)
    saved = load_model(load) if load is not None else None
    names = [s.strip() for s in labels.split(",")] if labels else None
    if saved is not None:
        names = list(saved.classes)
    classes = job.resolve_classes(triples, names, n_labels, str(path))
    encoded = job.encode(triples, classes, str(path))
    gold = job.truth_codes(read_truth(truth), encoded, str(truth)) if truth else None
    gold_codes = gold if gold is not None else -np.ones(encoded.n_items, dtype="int64")
    if saved is not None:
        config = saved.config
    else:
        config = NominalConfig(
            n_classes=len(classes),
            n_worker_slots=n_worker_slots,
            class_prior=_floats(priorz, "--priorz") if priorz else None,
            eta0=eta,
            tau0=initial_t,
            rho=rho,
            n_items=n_items if n_items is not None else float(encoded.n_items),
            difficulty=difficulty,
        )
    if later_passes is job.LaterPasses.newton and config.difficulty:
        raise InputError("--later-passes", None, "newton needs a model without difficulty")
    print(_settings_line(config, path, passes, test_only, batch), file=out)
    if batch:
        result, params, seconds = job.run_batch(encoded, config, out)
        posteriors = result.probas
        slot_params = job.slot_params_from_batch(params, encoded, config)
        speed = f"batch EM: {result.n_iter} iterations in {seconds:.2f}s"
    else:
        run = job.run_online(
            encoded,
            config,
            saved.params if saved else None,
            passes,
            shuffle,
            gold_codes,
            test_only,
            out,
            later_passes,
        )
        posteriors, slot_params = run.final.posteriors, run.model.params
        rate = len(triples) * passes / run.seconds if run.seconds > 0 else float("inf")
        speed = f"online EM: {len(triples) * passes} labels in {run.seconds:.2f}s ({rate:,.0f} labels/s)"
    print(
        f"{encoded.n_items} items, {len(triples)} labels, {len(classes)} classes; {job.collision_line(encoded, config.n_worker_slots)}",
        file=out,
    )
    print(speed, file=out)
    if gold is not None:
        acc, n = job.accuracy(posteriors.argmax(axis=1), gold)
        print(f"accuracy {acc:.4f} on {n} items with gold", file=out)
    if predictions is not None:
        job.write_predictions(predictions, encoded, posteriors)
        print(f"predictions written to {predictions}", file=out)
    if model is not None:
        save_model(model, SavedModel(config=config, params=slot_params, classes=classes))
        print(f"model written to {model}", file=out)


def _settings_line(
    config: NominalConfig, path: Path, passes: int, test_only: bool, batch: bool
) -> str:
    prior = ",".join(f"{p:.6f}" for p in np.exp(config.class_prior_logits()))
    mode = "batch EM" if batch else f"online EM, {passes} pass(es)"
    return (
        f"data = {path}  mode = {mode}  initial_t = {config.tau0:g}  eta = {config.eta0:g}  "
        f"rho = {config.rho:g}  n_items = {config.n_items:g}  n_labels = {config.n_classes}  "
        f"n_worker_slots = {config.n_worker_slots}  difficulty = {config.difficulty}  "
        f"test_only = {test_only}  priorz = {prior}"
    )


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    store: Annotated[
        str | None, typer.Option(help="embedded (default) or redis; else CROWDTALLY_STORE.")
    ] = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="Embedded store folder; else CROWDTALLY_DATA_DIR.")
    ] = None,
    engine: Annotated[
        bool | None,
        typer.Option(
            "--engine/--no-engine",
            help="Run the engine in this process (default: yes; production runs "
            "'crowdtally engine' beside the API and passes --no-engine).",
        ),
    ] = None,
    workers: Annotated[int, typer.Option(help="API processes (redis store only).")] = 1,
) -> None:
    """Start the HTTP API (and, by default, the engine in the same process)."""
    import os

    import uvicorn

    for name, value in (("STORE", store), ("DATA_DIR", data_dir)):
        if value is not None:
            os.environ[f"CROWDTALLY_{name}"] = str(value)
    if engine is not None:
        os.environ["CROWDTALLY_ENGINE_IN_PROCESS"] = "true" if engine else "false"
    settings = _settings()
    from app import logs

    logs.configure(settings.log_format, settings.log_level)
    if workers > 1 and (settings.store != "redis" or settings.engine_in_process):
        raise InputError("--workers", None, "several API processes need --store redis --no-engine")
    print(
        f"crowdtally: {settings.store} store, engine {'in process' if settings.engine_in_process else 'separate'}, http://{host}:{port}/docs",
        file=sys.stderr,
    )
    uvicorn.run(
        "app.api:create_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_config=None,  # uvicorn's loggers go through ours (JSON by default)
        log_level="warning",
        access_log=False,
    )


@app.command("engine")
def engine_command(
    store: Annotated[str | None, typer.Option(help="redis (default here) or embedded.")] = None,
) -> None:
    """Run the engine on its own: apply every project's label log and write served state."""
    import os

    from app.runtime import make_engine_loop, open_snapshot_db
    from app.snapshots import rebuild_store
    from app.store import open_store

    os.environ.setdefault("CROWDTALLY_STORE", store or "redis")
    settings = _settings()
    from app import logs

    logs.configure(settings.log_format, settings.log_level)
    st = open_store(settings)
    db = open_snapshot_db(settings)
    rebuild_store(st, db)
    loop = make_engine_loop(settings, st, db)
    print(f"crowdtally engine: {settings.store} store", file=sys.stderr)
    with contextlib.suppress(KeyboardInterrupt):
        loop.run_forever()


snapshots_app = typer.Typer(no_args_is_help=True, help="List, inspect and delete snapshots.")
app.add_typer(snapshots_app, name="snapshots")


def _snapshot_db() -> SnapshotDB:
    from app.runtime import open_snapshot_db  # imported here: extract stays light

    return open_snapshot_db(_settings())


@snapshots_app.command("list")
def snapshots_list(
    project: Annotated[str | None, typer.Option(help="Only this project.")] = None,
) -> None:
    """Every snapshot: id, project, log position, age, size."""
    from rich.console import Console
    from rich.table import Table

    table = Table("id", "project", "position", "created", "items", "labels", "MiB")
    for i in _snapshot_db().infos(project):
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(i.created_at))
        table.add_row(str(i.id), i.project, str(i.position), created, f"{i.n_items:,}",
                      f"{i.n_labels:,}", f"{i.size_bytes / 2**20:.1f}")  # fmt: skip
    Console().print(table)


@snapshots_app.command("inspect")
def snapshots_inspect(snapshot_id: int) -> None:
    """One snapshot's metadata and the shape of its state."""
    found = _snapshot_db().get(snapshot_id)
    if found is None:
        raise InputError("snapshot", None, f"no snapshot {snapshot_id}")
    from app.snapshots import describe

    info, blob = found
    print(json.dumps({**info.as_dict(), "state": describe(blob)}, indent=2))


@snapshots_app.command("delete")
def snapshots_delete(snapshot_id: int) -> None:
    """Delete one snapshot (the label archive stays)."""
    if not _snapshot_db().delete(snapshot_id):
        raise InputError("snapshot", None, f"no snapshot {snapshot_id}")
    print(f"deleted snapshot {snapshot_id}")


@app.command()
def restore(
    project: Annotated[str | None, typer.Option(help="Only this project (default: all).")] = None,
    snapshot: Annotated[
        int | None, typer.Option(help="Start from this snapshot id (default: the latest).")
    ] = None,
) -> None:
    """Load a snapshot, replay the log after it and write the served state to the store.

    Rebuilds an emptied store (a wiped Redis) from the SQL side first. The service does all
    this by itself on start; this command does it on demand, e.g. from an older snapshot.
    """
    from app.engine import EngineLoop
    from app.snapshots import Snapshotter, rebuild_store
    from app.snapshots import restore as restore_state
    from app.store import open_store

    settings = _settings()
    store, db = open_store(settings), _snapshot_db()
    rebuilt = rebuild_store(store, db)
    if rebuilt:
        print(f"rebuilt from SQL: {', '.join(rebuilt)}")
    snap = Snapshotter(db, store, interval_s=float("inf"), every_labels=2**62)
    loop = EngineLoop(store, refine_passes=0, snapshotter=snap)
    for record in store.list_projects():
        if project is not None and record.name != project:
            continue
        if snapshot is not None:
            found = db.get(snapshot)
            if found is None or found[0].project != record.name:
                raise InputError(
                    "--snapshot", None, f"no snapshot {snapshot} of project {record.name!r}"
                )
            eng = restore_state(record, found[1])
        else:
            eng = snap.load(record)
        start = eng.position
        while True:
            entries = snap.read_log(record.name, eng.position, 1000)
            if not entries:
                break
            for e in entries:
                eng.apply(e)
        eng.mark_all_dirty()
        store.write_state(record.name, eng.state_update())
        loop.engines[record.name] = eng
        print(f"{record.name}: state from position {start}, replayed to {eng.position}, "
              f"{eng.labels.n_labels:,} labels over {eng.items_count:,} items")  # fmt: skip


def _settings() -> Settings:
    from pydantic import ValidationError

    try:
        return Settings()
    except ValidationError as exc:
        err = exc.errors()[0]
        raise InputError("CROWDTALLY_" + str(err["loc"][0]).upper(), None, err["msg"]) from None


@app.callback()
def _root() -> None:
    """crowdtally: online label aggregation for crowdsourcing."""


from app.transfer import register  # noqa: E402  (import/export over HTTP)

register(app)

# typer >= 0.29 carries its own copy of click: usage errors may come from either.
_CLICKS = [
    click.exceptions,
    getattr(getattr(typer, "_click", None), "exceptions", click.exceptions),
]
_CLICK_ERRORS = tuple({m.ClickException for m in _CLICKS})
_CLICK_ABORTS = tuple({getattr(m, "Abort", click.exceptions.Abort) for m in _CLICKS})


def main() -> None:
    """Entry point: expected problems print one line and exit 2, never a traceback."""
    try:
        app(standalone_mode=False)
    except (InputError, ModelFileError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except ValueError as err:  # invalid hyperparameters from NominalConfig
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except typer.Exit as err:
        raise SystemExit(err.exit_code) from None
    except _CLICK_ERRORS as err:
        err.show()
        raise SystemExit(err.exit_code) from None
    except _CLICK_ABORTS:
        print("aborted", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
