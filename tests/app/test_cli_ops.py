"""Operations from the command line: snapshots list/inspect/delete, and restore of a wiped Redis."""

from __future__ import annotations

import gc
import os
import uuid
from pathlib import Path

import orjson
import pytest
from fastapi.testclient import TestClient

from app.api import create_app
from app.cli.common import use_store
from app.store.archive import SnapshotDB
from app.store.redis_store import RedisStore
from app.store.sql import sql_engine
from tests.app.conftest import ADMIN, REDIS_URL, service_settings
from tests.cli_in_process import run_cli


def run(env: dict[str, str], *args: str) -> str:
    out = run_cli(*args, env=env)  # in this process (tests/cli_in_process.py)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_snapshot_commands_and_restore_after_redis_wipe(tmp_path: Path) -> None:
    prefix = f"test-cli-{uuid.uuid4().hex[:8]}"
    db_url = f"sqlite:///{tmp_path / 'snapshots.sqlite3'}"
    settings = service_settings(tmp_path, store="redis", redis_prefix=prefix, database_url=db_url)
    env = {"CROWDTALLY_STORE": "redis", "REDIS_URL": REDIS_URL, "CROWDTALLY_REDIS_PREFIX": prefix,
           "CROWDTALLY_DATABASE_URL": db_url, "CROWDTALLY_ADMIN_KEY": ADMIN}  # fmt: skip
    store = RedisStore(REDIS_URL, prefix)
    try:
        with TestClient(create_app(settings), headers={"Authorization": f"Bearer {ADMIN}"}) as c:
            key = {
                "Authorization": f"Bearer {c.post('/v1/projects', json={'name': 'p', 'labels': ['x', 'y']}).json()['api_key']}"
            }
            block = [
                {
                    "item": f"i{n % 40}",
                    "worker": f"w{n % 9}",
                    "label": "xy"[n % 4 == 0],
                    "id": str(n),
                }
                for n in range(400)
            ]
            c.post(
                "/v1/projects/p/labels",
                params={"wait": True},
                content=orjson.dumps(block),
                headers=key,
            )
            assert c.post("/v1/projects/p/snapshots", params={"wait": True}, headers=key).json()[
                "applied"
            ]
            c.post(
                "/v1/projects/p/labels",
                params={"wait": True},
                content=orjson.dumps(block[:10]),
                headers=key,
            )
            before = dict(store.scan_items("p", 0, 1000)[1])
        listing = run(env, "snapshots", "list")
        assert "p" in listing and "400" in listing
        inspected = orjson.loads(run(env, "snapshots", "inspect", "1"))
        assert inspected["position"] == 2 and inspected["state"]["arrays"]["q"] == [40, 2]
        assert inspected["created_at"].endswith("Z")  # (ISO 8601, UTC, as the API gives it)
        store.flush_prefix()  # Redis loses everything
        out = run(env, "restore")
        assert "rebuilt from SQL: p" in out and "replayed to 2" in out
        after = dict(store.scan_items("p", 0, 1000)[1])
        assert after.keys() == before.keys()
        for k in before:
            assert orjson.loads(after[k])["posterior"] == orjson.loads(before[k])["posterior"]
        store.flush_prefix()  # again, restored with --store (it restored into the embedded
        flagged = {k: v for k, v in env.items() if k != "CROWDTALLY_STORE"}  # store silently)
        again = run_cli("restore", "--store", "redis", env=flagged)
        assert again.returncode == 0 and "rebuilt from SQL: p" in again.stdout
        assert again.stderr.startswith(f"restoring into the redis store at {REDIS_URL}\n")
        assert "deleted snapshot 1" in run(env, "snapshots", "delete", "1")
        assert "400" not in run(env, "snapshots", "list")
    finally:
        store.flush_prefix()
        store.close()


def test_a_restore_into_another_deployment_names_the_ones_the_database_holds(
    tmp_path: Path,
) -> None:
    """The embedded store's SQLite file restored into Redis under a prefix it holds nothing
    of: an error naming what it does hold (it restored nothing and said nothing)."""
    from app.store.base import ProjectRecord
    from app.store.sql import upgrade

    db_file = tmp_path / "crowdtally.sqlite3"
    upgrade(f"sqlite:///{db_file}", deployment="")
    db = SnapshotDB(sql_engine(f"sqlite:///{db_file}"), deployment="")
    db.save_project(ProjectRecord("duck", ("0", "1"), {"n_classes": 2}, 1.0))
    db.close()
    prefix = f"test-dep-{uuid.uuid4().hex[:8]}"
    env = {"CROWDTALLY_STORE": "redis", "REDIS_URL": REDIS_URL, "CROWDTALLY_REDIS_PREFIX": prefix,
           "CROWDTALLY_DATABASE_URL": f"sqlite:///{db_file}", "CROWDTALLY_ADMIN_KEY": ADMIN}  # fmt: skip
    try:
        out = run_cli("restore", env=env)
        assert out.returncode == 2, out.stdout + out.stderr
        assert out.stderr.startswith(
            f"error: CROWDTALLY_REDIS_PREFIX: the snapshot database holds no project of this "
            f"deployment ({prefix!r}), only of others (the embedded store: duck): set "
            "CROWDTALLY_REDIS_PREFIX to the one to restore"
        ), out.stderr
    finally:
        RedisStore(REDIS_URL, prefix).flush_prefix()


@pytest.mark.parametrize(
    ("variable", "flag", "default", "chosen"),
    [
        ("redis", "embedded", "redis", "embedded"),  # the flag wins over the variable
        ("embedded", "redis", None, "redis"),
        ("embedded", None, "redis", "embedded"),  # no flag: the variable
        (None, None, "redis", "redis"),  # neither: the command's default
        (None, None, None, None),  # (serve: the settings' own default)
    ],
)
def test_a_command_s_store_flag_wins_over_the_environment(
    monkeypatch: pytest.MonkeyPatch,
    variable: str | None,
    flag: str | None,
    default: str | None,
    chosen: str | None,
) -> None:
    """``crowdtally serve --store`` and ``crowdtally engine --store`` alike (the engine's flag
    used to lose to CROWDTALLY_STORE, which the compose file sets)."""
    monkeypatch.setenv("CROWDTALLY_STORE", "-")  # (recorded: undone after the test)
    if variable is None:
        monkeypatch.delenv("CROWDTALLY_STORE")
    else:
        monkeypatch.setenv("CROWDTALLY_STORE", variable)
    use_store(flag, default)
    assert os.environ.get("CROWDTALLY_STORE") == chosen


def test_an_unknown_store_names_the_flag() -> None:
    """It named CROWDTALLY_STORE, a variable nobody set, with the settings' pattern."""
    for command in (["restore"], ["serve"], ["engine"]):
        run = run_cli(*command, "--store", "bogus")
        assert run.returncode == 2, command
        assert run.stderr == "error: --store: 'bogus': one of embedded, redis\n", command
        assert gc.isenabled()  # (refused before serve and engine pause the collector)


def test_listing_snapshots_where_there_are_none_makes_no_data_folder(tmp_path: Path) -> None:
    data = tmp_path / "nowhere"
    listing = run_cli("snapshots", "list", env={"CROWDTALLY_DATA_DIR": str(data)})
    assert listing.returncode == 2 and "no snapshot database at" in listing.stderr
    assert not data.exists()  # (it made the folder and an empty database)


def test_restore_refuses_a_data_folder_that_is_not_there(tmp_path: Path) -> None:
    """A mistyped data folder was made, with an empty database, and restore exited 0."""
    typo = tmp_path / "typo"
    missing = run_cli("restore", env={"CROWDTALLY_DATA_DIR": str(typo)})
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr == (
        f"error: CROWDTALLY_DATA_DIR: no snapshot database at {typo / 'crowdtally.sqlite3'} "
        "(set CROWDTALLY_DATA_DIR as the service has it)\n"
    )
    assert not typo.exists()
    db = f"sqlite:///{tmp_path / 'snapshots.sqlite3'}"  # (apart from the store's own file)
    settings = service_settings(tmp_path / "data", database_url=db)
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        assert c.post("/v1/projects", json={"name": "p", "labels": ["x", "y"]}).status_code == 201
    no_store = run_cli("restore", env={"CROWDTALLY_DATA_DIR": str(typo),
                                       "CROWDTALLY_DATABASE_URL": db})  # fmt: skip
    assert no_store.returncode == 2 and no_store.stdout == ""
    assert no_store.stderr == (
        f"error: CROWDTALLY_DATA_DIR: no store at {typo / 'crowdtally.sqlite3'} "
        "(set CROWDTALLY_DATA_DIR as the service has it)\n"
    )
    assert not typo.exists()
    env = {"CROWDTALLY_DATA_DIR": str(tmp_path / "data"), "CROWDTALLY_DATABASE_URL": db}
    assert "p: state from position 0" in run(env, "restore")


def test_restore_refuses_a_project_that_is_not_there(tmp_path: Path) -> None:
    """``restore --project nope`` restored nothing and exited 0, silently."""
    settings = service_settings(tmp_path)
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        assert c.post("/v1/projects", json={"name": "p", "labels": ["x", "y"]}).status_code == 201
    env = {"CROWDTALLY_DATA_DIR": str(tmp_path)}
    nope = run_cli("restore", "--project", "nope", env=env)
    assert nope.returncode == 2 and nope.stdout == ""
    assert nope.stderr == "error: --project: no project 'nope' in the store (projects: p)\n"
    assert "p: state from position 0" in run(env, "restore", "--project", "p")


def test_restore_from_a_snapshot_id_restores_its_project(tmp_path: Path) -> None:
    """``restore --snapshot ID`` without ``--project`` stopped at the first project the snapshot
    was not of: with two projects it always failed, whichever the snapshot."""
    settings = service_settings(tmp_path)
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        for name in ("a", "b"):
            assert (
                c.post("/v1/projects", json={"name": name, "labels": ["x", "y"]}).status_code == 201
            )
        labels = [{"item": "i", "worker": "w", "label": "x"}]
        assert c.post("/v1/projects/b/labels?wait=true", json=labels).status_code == 202
        assert c.post("/v1/projects/b/snapshots?wait=true").json()["applied"]
    env = {"CROWDTALLY_DATA_DIR": str(tmp_path)}
    db = SnapshotDB(sql_engine(f"sqlite:///{tmp_path / 'crowdtally.sqlite3'}"))
    snapshot = str(db.anchors("b")[0][0])
    db.close()
    out = run(env, "restore", "--snapshot", snapshot)
    assert out.startswith("b: state from position 2, replayed to 2") and "a:" not in out
    other = run_cli("restore", "--snapshot", snapshot, "--project", "a", env=env)
    assert other.returncode == 2
    assert other.stderr == f"error: --snapshot: no snapshot {snapshot} of project 'a'\n"
    missing = run_cli("restore", "--snapshot", "999", env=env)
    assert missing.stderr == "error: --snapshot: no snapshot 999\n"


def test_a_second_process_on_an_embedded_data_folder_is_refused(tmp_path: Path) -> None:
    """A second ``serve`` on a running service's folder started, appended to the same log,
    and the first one answered 500 (UNIQUE constraint failed) until it was restarted."""
    import subprocess

    from app.testing import cli_command, free_port, running_service

    env = {"CROWDTALLY_ADMIN_KEY": ADMIN}
    with running_service(tmp_path, env):
        second = subprocess.run(
            [*cli_command(), "serve", "--port", str(free_port())],
            env={**os.environ, **env, "CROWDTALLY_DATA_DIR": str(tmp_path)},
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert second.returncode == 2, second.stderr[-2000:]
        assert second.stderr.startswith(f"error: CROWDTALLY_DATA_DIR: {tmp_path} is in use by "
                                        "another crowdtally process (pid ")  # fmt: skip
        restore = run_cli("restore", env={"CROWDTALLY_DATA_DIR": str(tmp_path)})
        assert (
            restore.returncode == 2 and "is in use by another crowdtally process" in restore.stderr
        )
    run({"CROWDTALLY_DATA_DIR": str(tmp_path)}, "restore")  # (the service stopped: taken)


def test_an_unreachable_database_or_redis_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """``snapshots list`` (inspect, delete, restore) printed about 540 lines of traceback for a
    database that does not answer, ``restore`` 189 for a Redis that does not."""
    from app.store.sql import upgrade

    url = "postgresql+psycopg://x@127.0.0.1:1/db"
    listed = run_cli("snapshots", "list", env={"CROWDTALLY_DATABASE_URL": url})
    assert listed.returncode == 2 and "Traceback" not in listed.stderr
    assert listed.stderr.startswith("error: CROWDTALLY_DATABASE_URL: cannot open the snapshot "
                                    "database: ")  # fmt: skip
    assert len(listed.stderr.splitlines()) == 1
    sqlite = f"sqlite:///{tmp_path / 'snapshots.sqlite3'}"
    upgrade(sqlite)
    env = {"CROWDTALLY_STORE": "redis", "REDIS_URL": "redis://127.0.0.1:1/0",
           "CROWDTALLY_DATABASE_URL": sqlite}  # fmt: skip
    restored = run_cli("restore", env=env)
    assert restored.returncode == 2
    assert restored.stderr == "error: REDIS_URL: Redis does not answer at redis://127.0.0.1:1/0\n"


def test_a_listing_leaves_an_older_schema_as_it_is(tmp_path: Path) -> None:
    """``snapshots list``, ``inspect`` and ``delete`` migrated the database to this
    crowdtally's schema: a newer command line run against a database that older services
    still use changed it under them. They now refuse a schema other than the current one and
    change nothing; ``restore`` and the service migrate it, as before."""
    from app.store.sql import HEAD, schema_revision, upgrade

    url = f"sqlite:///{tmp_path / 'snapshots.sqlite3'}"
    upgrade(url, revision="0006")
    env = {"CROWDTALLY_DATABASE_URL": url}
    for command in (["list"], ["inspect", "1"], ["delete", "1"]):
        run = run_cli("snapshots", *command, env=env)
        assert run.returncode == 2 and run.stderr == (
            "error: CROWDTALLY_DATABASE_URL: the snapshot database: it is at schema revision "
            f"0006, and this crowdtally reads revision {HEAD}: run the crowdtally the service "
            "runs, or start this one's service, which migrates it (this command changes no "
            "schema)\n"
        ), command
        assert schema_revision(url) == "0006"
    upgrade(url)
    listed = run_cli("snapshots", "list", env=env)
    assert listed.returncode == 0 and "project" in listed.stdout
