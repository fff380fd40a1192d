"""API keys: an admin key for projects, per-project keys with read or write scope.

Keys are 32 random bytes (urlsafe base64, prefixed ``ct_``); only their SHA-256 is stored, so
a leaked store does not leak keys. Send one as ``Authorization: Bearer <key>`` or
``X-API-Key: <key>``.
"""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path

from app.store.base import KeyRecord, Scope, Store

_RANK = {"read": 0, "write": 1, "admin": 2}


def new_key() -> str:
    return "ct_" + secrets.token_urlsafe(32)


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def issue_key(store: Store, scope: Scope, project: str | None) -> tuple[str, KeyRecord]:
    key = new_key()
    h = key_hash(key)
    record = KeyRecord(key_id=h[:12], scope=scope, project=project)
    store.put_key(h, record)
    return key, record


def allows(record: KeyRecord, scope: Scope, project: str | None) -> bool:
    """May this key act with ``scope`` on ``project`` (None: the admin endpoints)?"""
    if record.scope == "admin":
        return True
    if project is None or record.project != project:
        return False
    return _RANK[record.scope] >= _RANK[scope]


def ensure_admin_key(store: Store, configured: str | None, key_file: Path | None) -> str | None:
    """Make sure the store knows an admin key. Returns a newly made key (to show once), else None.

    A configured key (``CROWDTALLY_ADMIN_KEY``) is always accepted. Otherwise the first start
    makes one; in the embedded mode it is also written to ``key_file`` (mode 0600).
    """
    if configured:
        h = key_hash(configured)
        if store.get_key(h) is None:
            store.put_key(h, KeyRecord(h[:12], "admin", None))
        return None
    if store.admin_key_hash() is not None:
        return None
    key = new_key()
    if not store.set_admin_key_hash(key_hash(key)):
        return None  # another process made one first
    if key_file is not None:
        key_file.parent.mkdir(parents=True, exist_ok=True)
        key_file.write_text(key + "\n", encoding="utf-8")
        key_file.chmod(0o600)
    return key
