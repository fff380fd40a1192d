"""The embedded store: served state in process memory, the label log in a SQLite file.

No server needed. The log (with projects, keys and each block's label ids) is durable in
SQLite (WAL, ``synchronous=NORMAL``: an acknowledged block survives a crash of the process);
the served state is rebuilt on start by replaying the log, and the set of label ids seen
(``core.idset``, 16 bytes a slot) by hashing the log's ids.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import orjson

from app.store.base import (
    AppendResult,
    EngineBehindError,
    EntryKind,
    KeyRecord,
    LeaseLostError,
    LogEntry,
    LogRewoundError,
    Progress,
    ProjectExistsError,
    ProjectRecord,
    QueueHead,
    StateUpdate,
    UnknownProjectError,
)
from app.store.item_records import ItemWrites, grow_lists, render
from app.store.sql import upgrade
from app.store.wal import WalCheckpointer
from core.idset import IdSet, hash_ids, join_ids


class _ProjectState:
    def __init__(self) -> None:
        self.log_end = 0
        self.applied = 0
        self.restoring = 0
        """At start, the log end the served state must reach (0: served, or nothing to serve)."""
        self.globals: bytes | None = None
        self.rows: dict[int, bytes] = {}
        self.items: dict[str, bytes] = {}  # each item's record (app.store.item_records)
        self.labels: dict[str, bytearray] = {}  # and its label list's JSON, open
        self.item_order: list[str] = []
        """The items' names in ``items``' order, for paging (rebuilt when items were added)."""
        self.workers: dict[str, bytes] = {}
        self.queue: dict[str, float] = {}
        self.queue_settings: bytes | None = None
        self.dyadic_shared: bytes | None = None
        self.dyadic_at = 0  # the log position the dyadic model has learned up to
        self.dyadic_raters: dict[int, bytes] = {}
        self.dyadic_tasks: dict[int, bytes] = {}
        self.ids = IdSet()
        """Every label id the log has taken (duplicates are found here, not in SQLite: a block
        of random ids inserted into an index cost up to 25 ms once it held 1M ids)."""
        self.pending: deque[tuple[int, float]] = deque()
        """(position, time.monotonic() at append) of the entries appended since start and not
        applied yet, oldest first: what ``lag`` reads."""
        self.sealed = 0
        """The last position the engine has read (``read_log(seal=True)``): an entry appended
        past an unread one joins it (``LogEntry.joins``)."""
        self.entry_s = 0.0  # the engine's recent seconds per entry (StateUpdate.entry_s)
        self.step_s = 0.0  # and per step of label entries (StateUpdate.step_s)
        self._ranked: tuple[list[str], np.ndarray] | None = None  # cached order of the queue

    def lag(self, now: float) -> float:
        """Seconds the oldest entry past ``applied`` has waited (0: none, or one found in the
        log at start, whose append time is not known), or the seconds the engine will take to
        apply the entries waiting at its recent pace plus one of its recent steps (a new entry
        also waits for the step it joins), whichever is longer."""
        if self.applied >= self.log_end:
            return 0.0
        projected = (self.log_end - self.applied) * self.entry_s + self.step_s
        if not self.pending:
            return projected
        position, at = self.pending[0]
        return max(now - at if position == self.applied + 1 else 0.0, projected, 0.0)

    def applied_up_to(self, position: int) -> None:
        self.applied = max(self.applied, position)
        while self.pending and self.pending[0][0] <= self.applied:
            self.pending.popleft()


WRITE_WAIT_S = 0.001
"""How often an append looks again for the database's write lock while another connection
holds it."""
BUSY_TIMEOUT_MS = 5_000
"""How long the store's other statements wait for that lock (sqlite3's default)."""
READ_LOG = (
    "SELECT position, kind, payload, keep, joins FROM label_log "
    "WHERE deployment = '' AND project = ? AND position > ? ORDER BY position LIMIT ?"
)
"""The engine's read of the log: a range of the primary key (deployment, project, position),
so it costs the same however long the log is (without the deployment it scanned the whole
table: 2.2 ms a read at 5,000 entries of 1,000 labels, growing with the log)."""


def sqlite_full(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite finding no room on its disk (SQLITE_FULL). SQLite rolls the
    transaction back, and this store changes what it holds in memory only after a commit:
    nothing of the write was kept."""
    return isinstance(exc, sqlite3.OperationalError) and exc.sqlite_errorcode == sqlite3.SQLITE_FULL


class EmbeddedStore:
    log_in_sql = True
    unreached: frozenset[str] = frozenset()  # (one process: every project answers)

    def __init__(self, path: str | Path, join_entries: bool = False) -> None:
        """``join_entries``: an entry appended while the one before it is unread by the engine
        joins it (``LogEntry.joins``); False logs every entry alone."""
        self.path = str(path)
        self.join_entries = join_entries
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        upgrade(f"sqlite:///{self.path}", deployment="")  # the schema is Alembic's (migrations/)
        self._db = sqlite3.connect(
            self.path, check_same_thread=False, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._checkpointer = None
        if self.path != ":memory:":  # appends leave the log's checkpoints to a thread (wal.py)
            self._db.execute("PRAGMA wal_autocheckpoint=0")
            self._checkpointer = WalCheckpointer(self.path, owner=self)
        self._lock = threading.RLock()
        self._appended = threading.Event()
        self._projects: dict[str, ProjectRecord] = {}
        self._state: dict[str, _ProjectState] = {}
        self._keys: dict[str, KeyRecord] = {}
        self._failed: dict[str, str] = {}  # the engine's: in process, like the served state
        self._leases: dict[str, tuple[str, float, int]] = {}  # project: holder, until, fence
        self._engines: dict[str, float] = {}
        self._loads: dict[str, tuple[str, float]] = {}
        self._catalogue_changes = 0
        self._load()

    def _load(self) -> None:
        for name, labels, config, created in self._db.execute(
            "SELECT name, labels, config, created_at FROM projects"
        ):
            self._projects[name] = ProjectRecord(
                name, tuple(orjson.loads(labels)), orjson.loads(config), created
            )
            self._state[name] = _ProjectState()
        for key_hash, key_id, scope, project, created in self._db.execute(
            "SELECT key_hash, key_id, scope, project, created_at FROM api_keys"
        ):
            self._keys[key_hash] = KeyRecord(key_id, scope, project, created)
        for project, end in self._db.execute(
            "SELECT project, MAX(position) FROM label_log GROUP BY project"
        ):
            if project in self._state:  # (the served state is rebuilt by the engine)
                st = self._state[project]
                st.log_end = st.restoring = st.sealed = end  # (none joins an entry from before)
        for project, st in self._state.items():
            self._load_ids(project, st.ids)

    def _load_ids(self, project: str, ids: IdSet) -> None:
        """The project's seen ids: each log entry's, and those of files written before the log
        kept them (one row per id in label_ids)."""
        blobs = self._db.execute(
            "SELECT ids FROM label_log WHERE deployment = '' AND project = ? AND ids IS NOT NULL",
            (project,),
        )
        for (blob,) in blobs:
            ids.add(*hash_ids(bytes(blob)))
        legacy = self._db.execute(
            "SELECT label_id FROM label_ids WHERE deployment = '' AND project = ?", (project,)
        )
        while rows := legacy.fetchmany(100_000):
            ids.add(*hash_ids(join_ids([r[0] for r in rows]), len(rows)))

    # projects and keys -----------------------------------------------------------------
    def create_project(self, record: ProjectRecord) -> None:
        with self._lock:
            if record.name in self._projects:
                raise ProjectExistsError(record.name)
            self._db.execute(
                "INSERT INTO projects (name, labels, config, created_at) VALUES (?, ?, ?, ?)",
                (
                    record.name,
                    orjson.dumps(record.labels).decode(),
                    orjson.dumps(record.config).decode(),
                    record.created_at,
                ),
            )
            self._projects[record.name] = record
            self._state[record.name] = _ProjectState()
            self._catalogue_changes += 1

    def get_project(self, name: str) -> ProjectRecord | None:
        return self._projects.get(name)

    def list_projects(self) -> list[ProjectRecord]:
        with self._lock:
            return sorted(self._projects.values(), key=lambda r: r.name)

    def project_names(self) -> list[str]:
        with self._lock:
            return sorted(self._projects)

    def delete_project(self, name: str) -> bool:
        with self._lock:
            if name not in self._projects:
                return False
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM projects WHERE name = ?", (name,))
            for table in ("label_log", "label_ids", "snapshots"):
                self._db.execute(f"DELETE FROM {table} WHERE project = ?", (name,))
            doomed = [h for h, k in self._keys.items() if k.project == name]
            self._db.executemany("DELETE FROM api_keys WHERE key_hash = ?", [(h,) for h in doomed])
            self._db.execute("COMMIT")
            for h in doomed:
                del self._keys[h]
            del self._projects[name]
            del self._state[name]
            self._failed.pop(name, None)
            self._catalogue_changes += 1
            return True

    def catalogue_token(self) -> str | None:
        return str(self._catalogue_changes)  # (one process: the engine runs in the API's)

    def put_key(self, key_hash: str, record: KeyRecord) -> None:
        with self._lock:
            self._insert_key(key_hash, record)
            self._keys[key_hash] = record

    def _insert_key(self, key_hash: str, record: KeyRecord) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO api_keys (key_hash, key_id, scope, project, created_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (key_hash, record.key_id, record.scope, record.project, record.created_at),
        )

    def list_keys(self, project: str | None) -> dict[str, KeyRecord]:
        with self._lock:
            return {h: k for h, k in self._keys.items() if k.project == project}

    def delete_key(self, key_hash: str) -> bool:
        with self._lock:
            if key_hash not in self._keys:
                return False
            self._db.execute("DELETE FROM api_keys WHERE key_hash = ?", (key_hash,))
            del self._keys[key_hash]
            return True

    def replace_admin_key(self, key_hash: str, record: KeyRecord) -> list[str]:
        with self._lock:
            doomed = [h for h, k in self._keys.items() if k.project is None and h != key_hash]
            self._db.execute("BEGIN")
            try:
                self._insert_key(key_hash, record)
                self._db.executemany(
                    "DELETE FROM api_keys WHERE key_hash = ?", [(h,) for h in doomed]
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            for h in doomed:
                del self._keys[h]
            self._keys[key_hash] = record
            return doomed

    def get_key(self, key_hash: str) -> KeyRecord | None:
        return self._keys.get(key_hash)

    def admin_key_hash(self) -> str | None:
        return next((h for h, k in self._keys.items() if k.scope == "admin"), None)

    def set_admin_key_hash(self, key_hash: str) -> bool:
        with self._lock:
            if self.admin_key_hash() is not None:
                return False
            self.put_key(key_hash, KeyRecord(key_hash[:12], "admin", None, time.time()))
            return True

    # the log ---------------------------------------------------------------------------
    def append(
        self,
        project: str,
        kind: EntryKind,
        payload: bytes,
        ids: list[str | None] | None = None,
        max_lag_s: float | None = None,
    ) -> AppendResult:
        joined = join_ids(ids) if ids is not None else None
        keys, present = hash_ids(joined or b"", len(ids) if ids is not None else 0)
        give_up = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        while True:
            with self._lock:
                st = self._state.get(project)
                if st is None:
                    raise UnknownProjectError(project)
                now = time.monotonic()
                if max_lag_s is not None and (lag := st.lag(now)) > max_lag_s:
                    raise EngineBehindError(project, lag)
                keep = st.ids.new_in_block(keys, present)  # (b"" without ids)
                accepted = keep.count(b"1")
                if ids is not None and accepted == 0:
                    return AppendResult(st.log_end, 0, len(ids))
                if self._write_begun(wait=time.monotonic() > give_up):
                    position = st.log_end + 1
                    self._commit(
                        "INSERT INTO label_log (project, position, kind, payload, keep, ids, "
                        "joins) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (project, position, kind, payload, keep, joined, self._joins(st)),
                    )
                    st.ids.add(keys, present)
                    st.log_end = position
                    st.pending.append((position, now))
                    break
            # Another connection writes (the snapshots, on the same file): its write is waited
            # for outside the store's lock, which every request and the engine take (waited for
            # inside it, they waited with it: 129 waits of over 15 ms, up to 81 ms, in 15 s at
            # 100,000 labels/s; docs/benchmarks.md).
            time.sleep(WRITE_WAIT_S)
        self._appended.set()
        return AppendResult(position, accepted, len(ids) - accepted if ids is not None else 0)

    def _write_begun(self, wait: bool = False) -> bool:
        """``BEGIN IMMEDIATE`` without waiting: False (nothing begun) while another connection
        holds the database's write lock. With ``wait`` (an append that looked for it for
        ``BUSY_TIMEOUT_MS``), as any statement waits: then "database is locked" is raised."""
        if wait:
            self._db.execute("BEGIN IMMEDIATE")
            return True
        self._db.execute("PRAGMA busy_timeout = 0")
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) and "busy" not in str(err):
                raise
            return False
        finally:
            self._db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        return True

    def _commit(self, sql: str, params: tuple[object, ...]) -> None:
        """``sql`` in the transaction ``_write_begun`` began, committed (rolled back on error)."""
        try:
            self._db.execute(sql, params)
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    def _joins(self, st: _ProjectState) -> bool:
        return self.join_entries and st.log_end > st.sealed

    def read_log(
        self,
        project: str,
        after: int,
        limit: int,
        anchor: int | None = None,
        served: int | None = None,
        seal: bool = False,
    ) -> list[LogEntry]:
        """(The SQLite log never goes back in time: ``anchor`` is checked against its end.)"""
        if anchor is not None and after > self.log_end(project):
            raise LogRewoundError(f"{project}: the log ends before entry {after}")
        with self._lock:
            rows = self._db.execute(READ_LOG, (project, after, limit)).fetchall()
            if seal and rows and (st := self._state.get(project)) is not None:
                st.sealed = max(st.sealed, rows[-1][0])
        return [LogEntry(p, k, bytes(b), bytes(m), 1, bool(j)) for p, k, b, m, j in rows]

    def holds(self, project: str, position: int, token: int) -> bool:
        return position <= self.log_end(project)

    def log_start(self, project: str) -> int:
        return 1  # (never trimmed)

    def trim(self, project: str, upto: int, anchor: tuple[int, int] | None = None) -> None:
        """The SQLite log is the archive: nothing is trimmed."""

    def keys_for(self, project: str) -> dict[str, KeyRecord]:
        return {h: k for h, k in self._keys.items() if k.project in (None, project)}

    def log_end(self, project: str) -> int:
        st = self._state.get(project)
        return st.log_end if st else 0

    def quiet_logs(self, heads: Mapping[str, tuple[int, int | None, int | None]]) -> set[str]:
        return {p for p, (position, _, _) in heads.items() if self.log_end(p) == position}

    def moved_since(self, cursor: str | None) -> tuple[str | None, set[str] | None]:
        return None, None  # no record of appends: quiet_logs is a look at memory here

    def positions(self, projects: Sequence[str]) -> dict[str, tuple[int, int]]:
        return {
            p: (self.log_end(p), self.applied_position(p)) for p in projects if p in self._state
        }

    def progress(self, projects: Sequence[str]) -> dict[str, Progress]:
        out = {}
        for p in projects:
            if p in self._state:
                end, applied, lag_s = self.log_end(p), self.applied_position(p), self.lag_seconds(p)
                out[p] = Progress(
                    end, applied, lag_s, self.queue_size(p), self.get_params(p, [])[0]
                )
        return out

    def lag_seconds(self, project: str) -> float:
        with self._lock:
            st = self._state.get(project)
            return st.lag(time.monotonic()) if st else 0.0

    # served state ----------------------------------------------------------------------
    def write_state(self, project: str, update: StateUpdate) -> None:
        with self._lock:
            st = self._state.get(project)
            if st is None:
                return
            if (
                update.fence is not None
                and self._leases.get(project, ("", 0.0, 0))[2] != update.fence
            ):
                raise LeaseLostError(f"{project}: another engine holds it now")
            st.globals = _fitted(update.globals)
            st.rows.update(update.rows)  # (each value a buffer of its own: StateUpdate)
            _write_items(st, update.items)
            st.workers.update(update.workers)
            if update.queue or update.queue_remove or update.queue_replace:
                if update.queue_replace:
                    st.queue.clear()
                st.queue.update(update.queue)
                for item in update.queue_remove:
                    st.queue.pop(item, None)
                st._ranked = None
            if update.queue_settings is not None:
                st.queue_settings = _fitted(update.queue_settings)
            if update.dyadic is not None:
                st.dyadic_shared = _fitted(update.dyadic.shared)
                st.dyadic_at = update.dyadic.position
                st.dyadic_raters.update(update.dyadic.raters)
                st.dyadic_tasks.update(update.dyadic.tasks)
            if update.entry_s is not None:
                st.entry_s = update.entry_s
            if update.step_s is not None:
                st.step_s = update.step_s
            if update.advance:
                st.applied_up_to(update.position)
                if st.applied >= st.restoring:
                    st.restoring = 0

    def restoring(self) -> dict[str, int]:
        with self._lock:
            return {n: st.restoring for n, st in self._state.items() if st.restoring}

    def restoring_target(self, project: str) -> int:
        st = self._state.get(project)
        return st.restoring if st else 0

    def applied_position(self, project: str) -> int:
        st = self._state.get(project)
        return st.applied if st else 0

    def get_item(self, project: str, item: str) -> bytes | None:
        found = self.get_items(project, [item])
        return found[0]

    def get_params(self, project: str, slots: list[int]) -> tuple[bytes | None, list[bytes | None]]:
        with self._lock:
            st = self._state.get(project)
            if st is None:
                return None, [None] * len(slots)
            return st.globals, [st.rows.get(s) for s in slots]

    def get_dyadic(
        self, project: str, raters: list[int], tasks: list[int]
    ) -> tuple[int, bytes | None, list[bytes | None], list[bytes | None]]:
        with self._lock:
            st = self._state.get(project)
            if st is None:
                return 0, None, [None] * len(raters), [None] * len(tasks)
            r = [st.dyadic_raters.get(s) for s in raters]
            return st.dyadic_at, st.dyadic_shared, r, [st.dyadic_tasks.get(s) for s in tasks]

    def scan_items(
        self, project: str, cursor: int, count: int
    ) -> tuple[int, list[tuple[str, bytes]]]:
        with self._lock:
            st = self._state.get(project)
            if st is None:
                return 0, []
            keys = self._page(st, cursor, count)
            page = list(zip(keys, _rendered(st, keys), strict=True))
            return self._next(st, cursor, keys), page

    def scan_records(
        self, project: str, cursor: int, count: int
    ) -> tuple[int, list[str], list[bytes]]:
        with self._lock:
            st = self._state.get(project)
            if st is None:
                return 0, [], []
            keys = self._page(st, cursor, count)
            return self._next(st, cursor, keys), keys, [st.items[n] for n in keys]

    @staticmethod
    def _page(st: _ProjectState, cursor: int, count: int) -> list[str]:
        """The names of a page of items (the lock held)."""
        if len(st.item_order) != len(st.items):  # (items are only ever added)
            st.item_order = list(st.items)
        return st.item_order[cursor : cursor + count]

    @staticmethod
    def _next(st: _ProjectState, cursor: int, keys: list[str]) -> int:
        nxt = cursor + len(keys)
        return nxt if nxt < len(st.items) else 0

    def get_worker(self, project: str, worker: str) -> bytes | None:
        st = self._state.get(project)
        return st.workers.get(worker) if st else None

    def read_queue(self, project: str, count: int) -> list[tuple[str, float]]:
        with self._lock:
            st = self._state.get(project)
            return self._ranked(st, count) if st is not None else []

    def queue_head(self, project: str, count: int) -> QueueHead:
        with self._lock:
            st = self._state.get(project)
            if st is None:
                return QueueHead([], 0, None, None)
            return QueueHead(self._ranked(st, count), len(st.queue), st.globals, st.queue_settings)

    @staticmethod
    def _ranked(st: _ProjectState, count: int) -> list[tuple[str, float]]:
        """The ``count`` best of the queue (the lock held)."""
        if st._ranked is None:  # rebuilt once per change of the queue
            names = sorted(st.queue, reverse=True)  # ties: by member, descending, as Redis
            values = np.array([st.queue[n] for n in names])
            order = np.argsort(-values, kind="stable")
            st._ranked = ([names[i] for i in order.tolist()], values[order])
        names, values = st._ranked
        return [(names[i], float(values[i])) for i in range(min(count, len(names)))]

    def queue_size(self, project: str) -> int:
        st = self._state.get(project)
        return len(st.queue) if st else 0

    def get_items(self, project: str, items: list[str]) -> list[bytes | None]:
        with self._lock:
            st = self._state.get(project)
            if st is None:
                return [None] * len(items)
            known = [i for i in items if i in st.items]
            rendered = dict(zip(known, _rendered(st, known), strict=True))
            return [rendered.get(i) for i in items]

    def queue_settings(self, project: str) -> bytes | None:
        st = self._state.get(project)
        return st.queue_settings if st else None

    def all_workers(self, project: str) -> list[tuple[str, bytes]]:
        with self._lock:
            st = self._state.get(project)
            return list(st.workers.items()) if st else []

    def set_project_failed(self, project: str, error: str | None) -> None:
        with self._lock:
            if error is None:
                self._failed.pop(project, None)
            elif project in self._projects:
                self._failed[project] = error

    def failed_projects(self) -> dict[str, str]:
        with self._lock:
            return dict(self._failed)

    # engine pools (in one process: threads) ------------------------------------------------
    def acquire_lease(self, project: str, holder: str, ttl_s: float) -> int:
        with self._lock:
            now = time.monotonic()
            who, until, fence = self._leases.get(project, ("", 0.0, 0))
            if who == holder or until <= now:
                fence = fence if who == holder and until > now else fence + 1
                self._leases[project] = (holder, now + ttl_s, fence)
                return fence
            return 0

    def renew_leases(self, projects: list[str], holder: str, ttl_s: float) -> list[int | None]:
        return [self.acquire_lease(p, holder, ttl_s) for p in projects]

    def release_lease(self, project: str, holder: str) -> None:
        with self._lock:
            who, _, fence = self._leases.get(project, ("", 0.0, 0))
            if who == holder:
                self._leases[project] = ("", 0.0, fence)

    def engines_alive(self, holder: str, ttl_s: float) -> list[str]:
        with self._lock:
            now = time.monotonic()
            self._engines[holder] = now
            self._engines = {h: t for h, t in self._engines.items() if now - t < ttl_s}
            return sorted(self._engines)

    def lease_holder(self, project: str) -> str | None:
        with self._lock:
            who, until, _ = self._leases.get(project, ("", 0.0, 0))
            return who if who and until > time.monotonic() else None

    def pool_engines(self, ttl_s: float) -> list[str]:
        with self._lock:
            now = time.monotonic()
            return sorted(h for h, t in self._engines.items() if now - t < ttl_s)

    def record_loads(
        self, changes: Mapping[str, tuple[str, float] | None], read: bool = True
    ) -> dict[str, tuple[str, float]]:
        with self._lock:
            for project, record in changes.items():
                if record is None:
                    self._loads.pop(project, None)
                else:
                    self._loads[project] = record
            return dict(self._loads) if read else {}

    def wait_for_append(self, timeout_s: float) -> None:
        self._appended.wait(timeout_s)  # (one process: the engine runs in the API's)
        self._appended.clear()

    def is_full(self, exc: BaseException) -> bool:
        return sqlite_full(exc)

    def is_moving(self, exc: BaseException) -> bool:
        return False  # (one file: no keys move)

    def node_down(self, exc: BaseException) -> bool:
        return False  # (one process: no nodes)

    def ping(self) -> bool:
        with self._lock:
            return bool(self._db.execute("SELECT 1").fetchone() == (1,))

    def recover(self) -> None:
        pass  # (one process, one file: nothing to find again)

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()
        with self._lock:
            self._db.close()


def _fitted(value: bytes) -> bytes:
    """A copy of ``value`` in a buffer of its own size. orjson (3.12 and later) returns its
    output in a buffer of at least 4 KiB; kept as served state, each item's few hundred bytes
    would hold 4 KiB (about 0.8 KiB per label at five labels per item)."""
    return bytes(memoryview(value))


def _write_items(st: _ProjectState, items: ItemWrites) -> None:
    """An update's items: records replaced, label lists replaced or appended to (the lock
    held: a read sees an item's record and labels of the same write)."""
    st.items.update(zip(items.names, items.records, strict=True))
    grow_lists(st.labels, items)


def _rendered(st: _ProjectState, names: list[str]) -> list[bytes]:
    """The JSON of items held in ``st`` (the lock held)."""
    return render([st.items[n] for n in names], [st.labels.get(n) for n in names])
