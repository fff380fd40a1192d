"""API keys: an admin key for projects, per-project keys with read or write scope.

Keys are 32 random bytes (urlsafe base64, prefixed ``ct_``); only their SHA-256 is stored (and
looked up), so a leaked store does not leak keys. Send one as ``Authorization: Bearer <key>``
or ``X-API-Key: <key>``. Revoking a key deletes its record; an API process keeps key records
for ``app.api.deps.CACHE_S`` (1 s), so a revoked key stops working everywhere within that time.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from pathlib import Path

from app.io.replaced import replaced
from app.store.base import KeyRecord, Scope, Store

_RANK = {"read": 0, "write": 1, "admin": 2}


def new_key() -> str:
    return "ct_" + secrets.token_urlsafe(32)


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def issue_key(store: Store, scope: Scope, project: str | None) -> tuple[str, KeyRecord]:
    key = new_key()
    h = key_hash(key)
    record = KeyRecord(key_id=h[:12], scope=scope, project=project, created_at=time.time())
    store.put_key(h, record)
    return key, record


def revoke_key(store: Store, project: str, key_id: str) -> str | None:
    """Revoke the project's key with this id; its hash, or None when there is none."""
    for h, record in store.list_keys(project).items():
        if record.key_id == key_id:
            return h if store.delete_key(h) else None
    return None


def rotate_admin_key(store: Store, key_file: Path | None) -> tuple[str, KeyRecord, list[str]]:
    """A new admin key that replaces every other: (the key, its record, the hashes revoked).
    In the embedded mode the new key is also written to ``key_file``."""
    key = new_key()
    h = key_hash(key)
    record = KeyRecord(key_id=h[:12], scope="admin", project=None, created_at=time.time())
    revoked = store.replace_admin_key(h, record)
    if key_file is not None:
        _write_key_file(key_file, key)
    return key, record, revoked


def _write_key_file(key_file: Path, key: str) -> None:
    """``key`` in ``key_file``, whole or not at all, readable by its owner alone from the
    moment it exists (created 0600, not narrowed after being written)."""
    key_file.parent.mkdir(parents=True, exist_ok=True)
    with replaced(key_file) as tmp:
        tmp.unlink(missing_ok=True)  # (one left by a crash keeps its rights when reopened)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(key + "\n")


def allows(record: KeyRecord, scope: Scope, project: str | None) -> bool:
    """May this key act with ``scope`` on ``project`` (None: the admin endpoints)?"""
    if record.scope == "admin":
        return True
    if project is None or record.project != project:
        return False
    return _RANK[record.scope] >= _RANK[scope]


def ensure_admin_key(store: Store, configured: str | None, key_file: Path | None) -> str | None:
    """Make sure the store knows an admin key. Returns a newly made key (to show once), else None.

    A configured key (``CROWDTALLY_ADMIN_KEY``) is the only admin key: changing the setting
    and restarting rotates it (the previous admin key is revoked). Otherwise the first start
    makes one; in the embedded mode it is also written to ``key_file`` (mode 0600).
    """
    if configured:
        h = key_hash(configured)
        admins = store.list_keys(None)
        if set(admins) != {h}:
            known = admins.get(h)
            created = known.created_at if known is not None else time.time()
            store.replace_admin_key(h, KeyRecord(h[:12], "admin", None, created))
        return None
    if store.admin_key_hash() is not None:
        return None
    key = new_key()
    if not store.set_admin_key_hash(key_hash(key)):
        return None  # another process made one first
    if key_file is not None:
        _write_key_file(key_file, key)
    return key
