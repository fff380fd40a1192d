"""``crowdtally snapshots list|inspect|delete`` and ``crowdtally restore``."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer

from app.cli.common import existing_store, load_settings, snapshot_db, use_store
from app.cli.layout import HelpCommand, HelpGroup
from app.io.input import InputError

if TYPE_CHECKING:  # (the SQL side is loaded by the commands that use it)
    from app.store.archive import SnapshotDB

snapshots_app = typer.Typer(
    cls=HelpGroup,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="List, inspect and delete snapshots.",
)


@snapshots_app.command("list", cls=HelpCommand)
def snapshots_list(
    project: Annotated[str | None, typer.Option(help="Only this project.")] = None,
) -> None:
    """Every snapshot: id, project, log position, when it was made (UTC), size."""
    from rich.console import Console
    from rich.table import Table

    table = Table("id", "project", "position", "created", "items", "labels", "MiB")
    for i in snapshot_db(create=False, migrate=False).infos(project):
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(i.created_at))
        table.add_row(str(i.id), i.project, str(i.position), created, f"{i.n_items:,}",
                      f"{i.n_labels:,}", f"{i.size_bytes / 2**20:.1f}")  # fmt: skip
    Console().print(table)


@snapshots_app.command("inspect", cls=HelpCommand)
def snapshots_inspect(
    snapshot_id: Annotated[int, typer.Argument(metavar="SNAPSHOT_ID", help="From snapshots list.")],
) -> None:
    """One snapshot's metadata and the shape of its state."""
    found = snapshot_db(create=False, migrate=False).get(snapshot_id)
    if found is None:
        raise InputError("snapshot", None, f"no snapshot {snapshot_id}")
    from app.engine.snapshots import describe
    from app.serving.nominal import iso

    info, blob = found
    made = iso(info.created_at)  # (as the API gives it)
    print(json.dumps({**info.as_dict(), "created_at": made, "state": describe(blob)}, indent=2))


@snapshots_app.command("delete", cls=HelpCommand)
def snapshots_delete(
    snapshot_id: Annotated[int, typer.Argument(metavar="SNAPSHOT_ID", help="From snapshots list.")],
) -> None:
    """Delete one snapshot (the label archive stays)."""
    if not snapshot_db(create=False, migrate=False).delete(snapshot_id):
        raise InputError("snapshot", None, f"no snapshot {snapshot_id}")
    print(f"deleted snapshot {snapshot_id}")


def restore(
    project: Annotated[str | None, typer.Option(help="Only this project (default: all).")] = None,
    snapshot: Annotated[
        int | None,
        typer.Option(help="Start from this snapshot id, of its project (default: the latest)."),
    ] = None,
    store: Annotated[
        str | None, typer.Option(help="embedded (default) or redis; else CROWDTALLY_STORE.")
    ] = None,
) -> None:
    """Load a snapshot, replay the log after it and write the served state to the store.

    Rebuilds an emptied store (a wiped Redis) from the SQL side first. The service does all
    this by itself on start; this command does it on demand, e.g. from an older snapshot.
    """
    from app.engine.groups import runs
    from app.engine.loop import EngineLoop
    from app.engine.snapshots import Snapshotter
    from app.engine.snapshots import restore as restore_state
    from app.store.archive import rebuild_store

    use_store(store)
    settings = load_settings()
    db = snapshot_db(create=False)  # (a mistyped data folder is refused, not made)
    st = existing_store(settings)
    rebuilt = rebuild_store(st, db)
    if rebuilt:
        print(f"rebuilt from SQL: {', '.join(rebuilt)}")
    found = db.get(snapshot) if snapshot is not None else None
    if snapshot is not None:  # the project it is of, unless --project names another
        if found is None or project not in (None, found[0].project):
            of = f" of project {project!r}" if project is not None else ""
            raise InputError("--snapshot", None, f"no snapshot {snapshot}{of}")
        project = found[0].project
    if not st.project_names() and not db.projects():
        _refuse_other_deployments(db, settings.store)
    if project is not None and project not in (names := st.project_names()):
        listed = f"projects: {', '.join(names)}" if names else "it has none"
        raise InputError("--project", None, f"no project {project!r} in the store ({listed})")
    where = settings.redis_url if settings.store == "redis" else settings.data_dir
    print(f"restoring into the {settings.store} store at {where}", file=sys.stderr)
    snap = Snapshotter(db, st, interval_s=float("inf"), every_labels=2**62)
    loop = EngineLoop(st, refine_passes=0, snapshotter=snap)
    for record in st.list_projects():
        if project is not None and record.name != project:
            continue
        eng = restore_state(record, found[1]) if found is not None else snap.load(record)
        start = eng.position
        while True:
            entries = snap.read_log(record.name, eng.position, 1000)
            if not entries:
                break
            for run in runs(entries, complete=len(entries) < 1000):
                eng.apply_run(run)
        eng.mark_all_dirty()
        st.write_state(record.name, eng.state_update())
        loop.engines[record.name] = eng
        print(f"{record.name}: state from position {start}, replayed to {eng.position}, "
              f"{eng.labels.n_labels:,} labels over {eng.items_count:,} items")  # fmt: skip


def _refuse_other_deployments(db: SnapshotDB, store: str) -> None:
    """An InputError when the database holds nothing of this deployment but projects of
    others: a restore would write nothing (the embedded store's are under the empty prefix)."""
    others = db.other_deployments()
    if not others:
        return
    held = "; ".join(
        f"{'the embedded store' if d == '' else repr(d)}: {', '.join(names)}"
        for d, names in others.items()
    )
    setting = "CROWDTALLY_REDIS_PREFIX" if store == "redis" else "CROWDTALLY_STORE=redis"
    raise InputError(
        "CROWDTALLY_REDIS_PREFIX" if store == "redis" else "CROWDTALLY_STORE",
        None,
        f"the snapshot database holds no project of this deployment ({db.deployment!r}), only "
        f"of others ({held}): set {setting} to the one to restore (the embedded store's is "
        "the empty prefix)",
    )
