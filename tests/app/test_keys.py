"""API keys: listed (never their secrets), revoked, the admin key rotated; stored hashed; a
revoked key stays revoked across API processes (within the 1 s cache) and a rebuilt Redis."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.api import create_app
from app.api.auth import key_hash, rotate_admin_key
from app.api.deps import CACHE_S
from app.store.base import Store
from app.store.embedded import EmbeddedStore
from app.store.redis_store import RedisStore
from app.store.sql import upgrade
from tests.app.conftest import ADMIN, REDIS_URL, make_store, service_settings


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_list_and_revoke_project_keys(client: TestClient, store: Store) -> None:
    made = client.post("/v1/projects", json={"name": "p", "labels": ["a", "b"], "worker_slots": 8})
    writer = made.json()["api_key"]
    r = client.post("/v1/projects/p/keys", json={"scope": "read"})
    reader, reader_id = r.json()["api_key"], r.json()["key_id"]
    client.post("/v1/projects", json={"name": "q", "labels": ["a", "b"], "worker_slots": 8})
    listed = client.get("/v1/projects/p/keys")
    assert listed.status_code == 200
    keys = listed.json()
    assert [(k["scope"], k["project"]) for k in keys] == [("write", "p"), ("read", "p")]
    assert keys[1]["key_id"] == reader_id and keys[1]["created_at"].endswith("Z")
    assert writer not in listed.text and reader not in listed.text  # ids only, never a key
    for secret in (writer, reader):  # stored as SHA-256: looked up by hash, never in clear
        assert store.get_key(key_hash(secret)) is not None
        if isinstance(store, RedisStore):
            raw = store.r.hgetall(f"{store.prefix}:keys")
            assert not any(secret.encode() in k + v for k, v in raw.items())
    assert client.get("/v1/projects/p", headers=bearer(reader)).status_code == 200
    assert client.get("/v1/projects/p/keys", headers=bearer(writer)).status_code == 403
    assert client.delete(f"/v1/projects/q/keys/{reader_id}").status_code == 404  # not q's
    assert client.delete(f"/v1/projects/p/keys/{reader_id}").status_code == 204
    r = client.get("/v1/projects/p", headers=bearer(reader))
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_key"
    assert client.delete(f"/v1/projects/p/keys/{reader_id}").json()["error"]["code"] == (
        "unknown_key"
    )
    assert [k["scope"] for k in client.get("/v1/projects/p/keys").json()] == ["write"]
    assert client.get("/v1/projects/p", headers=bearer(writer)).status_code == 200
    assert client.get("/v1/projects/nope/keys").status_code == 404


def test_revoked_key_stops_working_in_another_api_process(tmp_path: Path) -> None:
    store = make_store("redis", tmp_path)
    assert isinstance(store, RedisStore)
    other = RedisStore(REDIS_URL, store.prefix)  # a second API process's own connection
    settings = service_settings(tmp_path, engine_in_process=False)
    head = bearer(ADMIN)
    try:
        with (
            TestClient(create_app(settings, store=store), headers=head) as one,
            TestClient(create_app(settings, store=other), headers=head) as two,
        ):
            made = one.post("/v1/projects", json={"name": "p", "labels": ["a", "b"]})
            key = made.json()["api_key"]
            key_id = one.get("/v1/projects/p/keys").json()[0]["key_id"]
            assert two.get("/v1/projects/p", headers=bearer(key)).status_code == 200  # cached
            assert one.delete(f"/v1/projects/p/keys/{key_id}").status_code == 204
            t0 = time.monotonic()
            while two.get("/v1/projects/p", headers=bearer(key)).status_code == 200:
                time.sleep(0.02)
            assert time.monotonic() - t0 <= CACHE_S + 0.5
    finally:
        store.flush_prefix()
        store.close()
        other.close()


def test_rotating_the_admin_key_revokes_the_old_one(tmp_path: Path) -> None:
    settings = service_settings(tmp_path, admin_key=None)
    with TestClient(create_app(settings)) as c:
        first = (tmp_path / "admin.key").read_text().strip()
        assert (
            c.post(
                "/v1/projects", json={"name": "p", "labels": ["a", "b"]}, headers=bearer(first)
            ).status_code
            == 201
        )
        r = c.post("/v1/admin/key/rotate", headers=bearer(first))
        assert r.status_code == 200
        second = r.json()["api_key"]
        assert (
            r.json()["revoked"] == [key_hash(first)[:12]]
            and r.json()["key_id"] == key_hash(second)[:12]
        )
        assert (tmp_path / "admin.key").read_text().strip() == second
        assert (tmp_path / "admin.key").stat().st_mode & 0o777 == 0o600
        assert c.get("/v1/projects", headers=bearer(first)).status_code == 401
        assert c.get("/v1/projects", headers=bearer(second)).status_code == 200
    with TestClient(create_app(settings)) as c:  # a restart keeps the rotated key
        assert c.get("/v1/projects", headers=bearer(first)).status_code == 401
        assert c.get("/v1/projects", headers=bearer(second)).status_code == 200


def test_a_changed_configured_admin_key_revokes_the_old_one(tmp_path: Path) -> None:
    with TestClient(create_app(service_settings(tmp_path))) as c:
        assert c.get("/v1/projects", headers=bearer(ADMIN)).status_code == 200
        r = c.post("/v1/admin/key/rotate", headers=bearer(ADMIN))
        assert r.status_code == 409 and r.json()["error"]["code"] == "admin_key_configured"
    with TestClient(create_app(service_settings(tmp_path, admin_key="rotated-admin"))) as c:
        assert c.get("/v1/projects", headers=bearer(ADMIN)).status_code == 401
        assert c.get("/v1/projects", headers=bearer("rotated-admin")).status_code == 200


def test_revoked_keys_stay_revoked_after_a_redis_wipe(tmp_path: Path) -> None:
    store = make_store("redis", tmp_path)
    assert isinstance(store, RedisStore)
    settings = service_settings(tmp_path, admin_key=None, snapshot_interval_s=0.0)
    old_admin, _, _ = rotate_admin_key(store, None)  # (as the first start would print it)
    try:
        with TestClient(create_app(settings, store=store), headers=bearer(old_admin)) as c:
            keep = c.post("/v1/projects", json={"name": "p", "labels": ["a", "b"]}).json()[
                "api_key"
            ]
            gone = c.post("/v1/projects/p/keys", json={"scope": "read"}).json()
            body = [{"item": "i", "worker": "w", "label": "a", "id": "1"}]
            c.post("/v1/projects/p/labels?wait=true", json=body, headers=bearer(keep))
            assert c.post("/v1/projects/p/snapshots?wait=true", headers=bearer(keep)).json()[
                "applied"
            ]
            assert c.delete(f"/v1/projects/p/keys/{gone['key_id']}").status_code == 204
            new_admin = c.post("/v1/admin/key/rotate").json()["api_key"]
        store.flush_prefix()  # Redis loses everything; SQL brings back what it holds
        with TestClient(create_app(settings, store=store)) as c:
            assert c.get("/v1/projects/p", headers=bearer(keep)).status_code == 200
            assert c.get("/v1/projects/p", headers=bearer(gone["api_key"])).status_code == 401
            assert c.get("/v1/projects", headers=bearer(old_admin)).status_code == 401
            assert c.get("/v1/projects", headers=bearer(new_admin)).status_code == 200
    finally:
        store.flush_prefix()
        store.close()


def test_keys_table_migrates_and_holds_no_secret(tmp_path: Path) -> None:
    """A database made before keys recorded their creation time: upgraded in place, its keys
    listed with no time. Nothing in the file is a key in clear."""
    path = tmp_path / "crowdtally.sqlite3"
    upgrade(f"sqlite:///{path}", "0001")
    db = sqlite3.connect(path)
    db.execute(
        "INSERT INTO projects (name, labels, config, created_at) VALUES ('p', '[\"a\",\"b\"]', "
        '\'{"n_classes": 2, "n_worker_slots": 8}\', 1.0)'
    )
    db.execute("INSERT INTO api_keys VALUES ('h-old', 'h-old', 'read', 'p')")
    db.commit()
    db.close()
    store = EmbeddedStore(path)  # runs the migrations
    assert [(k.key_id, k.created_at) for k in store.list_keys("p").values()] == [("h-old", None)]
    store.close()
    with TestClient(create_app(service_settings(tmp_path)), headers=bearer(ADMIN)) as c:
        assert c.get("/v1/projects/p/keys").json() == [
            {"key_id": "h-old", "scope": "read", "project": "p", "created_at": None}
        ]
        secret = c.post("/v1/projects/p/keys", json={"scope": "write"}).json()["api_key"]
    files = b"".join(f.read_bytes() for f in tmp_path.glob("crowdtally.sqlite3*"))
    assert secret.encode() not in files and key_hash(secret).encode() in files


def test_the_admin_key_file_is_its_owner_s_alone_from_its_first_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key file (and the temporary it is written to first) is created readable by its
    owner only, whatever the umask: not written world-readable and narrowed afterwards, which
    left another user of the machine an instant to read the new admin key (with chmod out of
    play, as that instant would find it, the file must still be 0600). A temporary left by a
    crash with looser rights is not written into."""
    store = make_store("embedded", tmp_path)
    key_file = tmp_path / "data" / "admin.key"
    key_file.parent.mkdir()
    left = key_file.with_name(key_file.name + ".tmp")
    left.write_text("stale\n", encoding="utf-8")
    left.chmod(0o644)
    monkeypatch.setattr(os, "chmod", lambda *_a, **_k: None)
    monkeypatch.setattr(Path, "chmod", lambda *_a, **_k: None)
    old = os.umask(0)
    try:
        key, _, _ = rotate_admin_key(store, key_file)
    finally:
        os.umask(old)
        store.close()
    assert key_file.read_text(encoding="utf-8") == key + "\n"
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert not left.exists()
