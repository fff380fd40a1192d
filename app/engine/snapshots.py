"""Snapshots of a project's engine state: capture, encode, restore, and the ``Snapshotter``.

A snapshot is everything ``ProjectEngine`` holds at a log position (parameters with their
online statistics, every label per item, posteriors, gold, worker tallies, id tables), as an
``.npz`` blob compressed by Zstandard (level 1: a 1M-label project's 63 MB of arrays in 0.09 s,
where zlib's level 1 took 0.50 s; snapshots written by zlib, before, are read too). Restoring
one and replaying the log after its position gives bit-identical
state, because the engine is a pure function of the log. Taking one is split in two: a
``capture`` (array copies, in the engine's thread: the only stall) and the encoding and SQL
write (``app.store.archive.SnapshotDB``), in a background thread. A capture learns nothing:
the dyadic model's queued labels (it may lag behind the posteriors) are kept as they are, and
the restored model learns them later, as the live one does.
"""

from __future__ import annotations

import io
import logging
import time
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import orjson
import zstandard

from app.engine.dyadic import DyadicCapture
from app.engine.project import ProjectEngine
from app.engine.queue import QueueSettings
from app.engine.sweeps import Slice
from app.store.archive import SnapshotDB, SnapshotInfo
from app.store.base import LogEntry, ProjectRecord, Store
from core.blocks import CodeArray
from core.evidence import evidence_size
from core.nominal import NominalParams, current_sums
from core.online import OnlineEM

FORMAT = 2  # the .npz's layout (its compression is told by its first bytes)
READS = (1, 2)  # 2: the dyadic model's queued labels kept (1: learned at every capture)
REPLAY_SHARE = 0.1
"""A snapshot is due once the labels since the last one reach this share of the project's
labels at that snapshot (and ``every_labels``): ``Snapshotter.labels_between``."""
TIME_SHARE = 0.1
"""A project's snapshots take at most this share of the time: one that took w seconds
(capture and write) is followed by the next no sooner than w / TIME_SHARE seconds after it
began (``Snapshotter.resting``). Under a heavy load they would else take half a core
(docs/benchmarks.md, "Snapshots within a share of the time"). With Redis, the log entries are
archived to SQL every ``every_labels`` labels all the same (``Snapshotter.maybe_archive``):
that count bounds what a lost Redis volume costs."""
log = logging.getLogger("crowdtally.snapshots")
T = TypeVar("T")


@dataclass
class Capture:
    """Copies of a ProjectEngine's state at ``position`` (cheap to take)."""

    project: str
    position: int
    arrays: dict[str, npt.NDArray[Any]]
    item_names: npt.NDArray[np.object_]
    """(Object arrays, not lists: a list of every item would be walked by each full garbage
    collection while the snapshot is written.)"""
    worker_names: npt.NDArray[np.object_]
    label_rows: CodeArray
    row_slots: npt.NDArray[np.int64]
    """Each label's worker row (a view) and each row's slot: ``encode`` writes each label's
    slot (``label_slot``), a gather over every label that the engine's thread does not wait
    for."""
    queue_settings: dict[str, Any]
    dyadic: DyadicCapture | None = None
    """Copied in the engine's thread, packed to its touched rows by ``encode``."""
    created_at: float | None = None
    """The project's creation time: a snapshot belongs to one project, not to a name."""
    token: int = 1
    """Token of the log entry at ``position`` (``LogEntry.token``): the snapshot belongs to
    the log that holds that entry."""
    refine_due: bool = False
    """Labels or gold applied since the last refinement sweep."""
    last_refit: dict[str, Any] | None = None
    """The last refit's report (``ProjectEngine.last_refit``)."""
    sweep: dict[str, int] | None = None
    """The refinement sweep in progress (``ProjectEngine.sweep``), as its last slice."""

    @property
    def n_labels(self) -> int:
        return int(self.arrays["label_item"].size)


def _model_arrays(model: OnlineEM, rows: int, prefix: str = "") -> dict[str, Any]:
    """One model's parameters and statistics over the engine's ``rows``, at its worker prior."""
    p = model.params
    assert p.counts is not None and p.sums is not None
    return {
        f"{prefix}class_logits": p.class_logits.copy(),
        f"{prefix}population": p.population.copy(),
        f"{prefix}scalars": p.scalars.copy(),
        f"{prefix}sums": p.sums.copy(),
        f"{prefix}evidence": (
            p.evidence if p.evidence is not None else np.zeros(evidence_size())
        ).copy(),
        f"{prefix}worker_rows": p.worker[:rows].copy(),
        f"{prefix}count_rows": p.counts[:rows].copy(),
        f"{prefix}worker_prior": np.array([model.config.worker_prior]),
    }


def _model_params(z: Any, n_classes: int, prefix: str = "") -> NominalParams:
    evidence = (
        z[f"{prefix}evidence"].copy()
        if f"{prefix}evidence" in z.files
        else np.zeros(evidence_size())
    )
    return NominalParams(
        z[f"{prefix}class_logits"],
        z[f"{prefix}population"],
        z[f"{prefix}worker_rows"],
        z[f"{prefix}scalars"].copy(),
        z[f"{prefix}count_rows"],
        current_sums(z[f"{prefix}sums"].copy(), n_classes),
        evidence,
    )


def capture(eng: ProjectEngine, token: int | None = None) -> Capture:
    n, nw, nl = eng.items_count, len(eng.workers.names), eng.labels.n_labels
    # The rows the engine holds, in its row order, under their slots (labels name their slot
    # too: the format is the S-slot model's).
    rows = eng.n_rows
    L = eng.labels
    arrays = {
        "q": eng.q[:n].copy(),
        "held_out": eng.held_out[:n].copy(),
        "b": eng.b[:n].copy(),
        "learned": eng.learned[:n].copy(),
        "gold": eng.gold[:n].copy(),
        "worker_slot": eng.worker_slot[:nw].copy(),
        "worker_labels": eng.worker_labels[:nw].copy(),
        "worker_gold_seen": eng.worker_gold_seen[:nw].copy(),
        "worker_gold_right": eng.worker_gold_right[:nw].copy(),
        # (views: ItemLabels only ever appends past n_labels, or moves to a larger copy)
        "label_item": L.item[:nl],
        "label_label": L.label[:nl],
        "label_weight": L.weight[:nl],
        "label_worker": L.worker[:nl],
        **_model_arrays(eng.online, rows),
        "used_slots": eng.slot_of_row[:rows].copy(),
        "meta": np.array([FORMAT, eng.position, eng.computed_at]),
    }
    if eng.online.twin is not None:  # the pooled twin learning beside the model (eq. 29)
        arrays.update(_model_arrays(eng.online.twin, rows, "twin_"))
        arrays["twin_q"], arrays["twin_b"] = eng.twin_q[:n].copy(), eng.twin_b[:n].copy()
    return Capture(
        eng.record.name, eng.position, arrays, eng.items.names.head(n), eng.workers.names.head(nw),
        L.slot[:nl], eng.slot_of_row[:rows].copy(), eng.queue_settings.to_dict(),
        eng.dyadic.capture() if eng.dyadic is not None else None,
        eng.record.created_at, 1 if token is None else token, eng.refine_due, eng.last_refit,
        eng.sweep.to_dict() if eng.sweep is not None else None,
    )  # fmt: skip


def encode(cap: Capture) -> bytes:
    """The snapshot's blob: the .npz written straight into a Zstandard stream. No copy of the
    uncompressed arrays is made: copying them (into a buffer, then out of it) held the GIL,
    and so the engine's thread, for about a third of an encoding, where the compressor
    releases it while it works."""
    names = orjson.dumps(
        {
            "items": cap.item_names.tolist(),
            "workers": cap.worker_names.tolist(),
            "queue": cap.queue_settings,
            "created_at": cap.created_at,
            "token": cap.token,
            "refine_due": cap.refine_due,
            "last_refit": cap.last_refit,
            "sweep": cap.sweep,
        }
    )
    arrays: dict[str, Any] = {
        **cap.arrays,
        "names": np.frombuffer(names, dtype=np.uint8),
        "label_slot": cap.row_slots[cap.label_rows],
    }
    if cap.dyadic is not None:
        arrays.update(cap.dyadic.pack())
    out = io.BytesIO()
    with zstandard.ZstdCompressor(level=1).stream_writer(out, closefd=False) as stream:
        np.savez(_Unseekable(stream), **arrays)
    return out.getvalue()


class _Unseekable:
    """A stream that only writes: ``zipfile`` then writes each member once, in order, with a
    data descriptor after it, instead of seeking back to its header."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, data: Any) -> int:
        written: int = self._stream.write(data)
        return written

    def flush(self) -> None:
        self._stream.flush()

    def read(self, size: int = -1) -> bytes:  # (numpy takes only objects that have one)
        raise io.UnsupportedOperation("write only")


_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def decompress(blob: bytes) -> bytes:
    """A snapshot's .npz bytes: Zstandard's frame, or zlib's (snapshots written before)."""
    if blob[:4] == _ZSTD_MAGIC:  # (a streamed frame does not record its size: decompressobj)
        return zstandard.ZstdDecompressor().decompressobj().decompress(blob)
    return zlib.decompress(blob)


class StaleSnapshotError(ValueError):
    """The snapshot is of another (deleted) project that had the same name."""


def restore(record: ProjectRecord, blob: bytes) -> ProjectEngine:
    """A ProjectEngine in exactly the state the snapshot was taken in."""
    z = np.load(io.BytesIO(decompress(blob)))
    fmt, position, computed_at = z["meta"]
    if int(fmt) not in READS:
        raise ValueError(f"snapshot format {int(fmt)} is not one of {READS}")
    names = orjson.loads(z["names"].tobytes())
    created = names.get("created_at")  # (older snapshots: not recorded)
    if created is not None and created != record.created_at:
        raise StaleSnapshotError(
            f"the snapshot is of an earlier project named {record.name!r} (created at "
            f"{created}, this one at {record.created_at})"
        )
    eng = ProjectEngine(record)
    K = len(record.labels)
    # (older snapshots: no twin, and the configured worker prior)
    prior = float(z["worker_prior"][0]) if "worker_prior" in z.files else eng.config.worker_prior
    twin = (
        (_model_params(z, K, "twin_"), float(z["twin_worker_prior"][0]))
        if "twin_worker_prior" in z.files
        else None
    )  # only the rows in use:
    eng.load_rows(z["used_slots"].astype(np.int64), _model_params(z, K), prior, twin)
    eng.items.encode(names["items"])
    eng._grow_items(len(names["items"]))
    n = eng.items_count
    eng.q[:n], eng.b[:n], eng.learned[:n], eng.gold[:n] = z["q"], z["b"], z["learned"], z["gold"]
    if "held_out" in z.files:  # (older snapshots: none)
        eng.held_out[:n] = z["held_out"]
    if twin is not None:
        eng.twin_q[:n], eng.twin_b[:n] = z["twin_q"], z["twin_b"]
    eng.workers.encode(names["workers"])
    nw = len(names["workers"])
    eng._grow_workers(names["workers"])
    eng.worker_slot[:nw] = z["worker_slot"]
    eng.worker_labels[:nw] = z["worker_labels"]
    eng.worker_gold_seen[:nw] = z["worker_gold_seen"]
    eng.worker_gold_right[:nw] = z["worker_gold_right"]
    eng.labels.append(  # (every label's slot is a worker's: held since _grow_workers)
        z["label_item"],
        eng.rows_of(z["label_slot"]),
        z["label_label"],
        z["label_weight"],
        z["label_worker"],
    )
    eng.weight[:n] = np.bincount(z["label_item"], z["label_weight"], minlength=n)
    if eng.dyadic is not None and "dyadic_shared" in z.files:  # (older snapshots: none)
        eng.dyadic.restore(z)
    eng.position, eng.computed_at = int(position), float(computed_at)
    eng.queue_settings = QueueSettings(**names["queue"])
    # (older snapshots: not recorded; a sweep is then due once, if there are labels)
    eng.refine_due = bool(names.get("refine_due", eng.labels.n_labels > 0))
    eng.last_refit = names.get("last_refit")  # (older snapshots: not recorded)
    sweep = names.get("sweep")  # (older snapshots: a sweep was one entry, never in progress)
    eng.sweep = Slice.of(sweep, n) if sweep is not None else None
    return eng


def describe(blob: bytes) -> dict[str, Any]:
    """The arrays in a snapshot and their shapes (``crowdtally snapshots inspect``)."""
    z = np.load(io.BytesIO(decompress(blob)))
    fmt, position, _ = z["meta"]
    return {
        "format": int(fmt),
        "position": int(position),
        "arrays": {k: list(z[k].shape) for k in z.files if k != "meta"},
    }


class Snapshotter:
    """The engine's side of durability: restore on start, snapshot on a schedule, read
    entries the live log no longer has from the archive."""

    def __init__(
        self,
        db: SnapshotDB,
        store: Store,
        interval_s: float = 60.0,
        every_labels: int = 100_000,
        keep: int = 3,
        time_share: float | None = TIME_SHARE,
    ) -> None:
        self.db, self.store = db, store
        self.interval_s, self.every_labels, self.keep = interval_s, every_labels, keep
        self.time_share = time_share
        """``TIME_SHARE``, or None: snapshots whenever due."""
        self._last: dict[str, tuple[float, int, int]] = {}  # time, labels, position
        self._archived: dict[str, int] = {}  # labels at the last archive (Redis), if since
        self._took: dict[str, float] = {}  # the last snapshot's capture and write, seconds
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="crowdtally-snapshot")
        self._pending: Future[SnapshotInfo | None] | None = None
        self.last_error: str | None = None
        self.stall_s: float = 0.0
        self.write_s: float = 0.0
        self.rewinds = 0
        """Snapshots dropped because the log no longer held their entry (Redis went back)."""

    def load(self, record: ProjectRecord) -> ProjectEngine:
        return self.load_anchored(record)[0]

    def load_anchored(self, record: ProjectRecord) -> tuple[ProjectEngine, int | None]:
        """The project's engine from its latest snapshot that the log still holds (a fresh one
        when there is none), with the token of its log entry (None at position 0).

        What SQL holds of an earlier project of the same name (deleted, perhaps while this
        engine was not running) is dropped first: the new project starts from scratch. So are
        snapshots past the log (Redis went back in time: restarted from an AOF that missed its
        last second) and the archived entries after the snapshot kept: the live log holds what
        is left of them."""
        self._last.pop(record.name, None)
        self._archived.pop(record.name, None)
        if not self.store.log_in_sql:
            saved = self.db.project(record.name)
            if saved is None or saved.created_at != record.created_at:
                # (nothing, or an earlier project's; not the one the API just archived)
                self.db.forget_project(record.name, unless_created_at=record.created_at)
        stale: list[int] = []
        kept: tuple[int, int, int] | None = None
        for anchor in self.db.anchors(record.name):
            if self.store.holds(record.name, anchor[1], anchor[2]):
                kept = anchor
                break
            stale.append(anchor[0])
        # Archived entries past the snapshot kept that the live log does not hold as archived
        # (past its end, or another entry there) are of a lost history (they outlive the
        # snapshots that archived them): they go, from the first one; those it trimmed are of
        # its own (archived before the trim), and so are those it holds with their tokens (an
        # engine of a pool archives, then trims: they are not lost). The archive is appended
        # from its end on, so an entry of a lost history left there would be replayed in place
        # of the log's.
        trimmed = min(self.store.log_start(record.name) - 1, self.store.log_end(record.name))
        at = max(kept[1] if kept is not None else 0, trimmed)
        lost = None if self.store.log_in_sql else self._first_lost(record.name, at)
        if stale or lost is not None:
            cut = lost - 1 if lost is not None else self.db.archived_position(record.name)
            log.warning(
                "%s: the log no longer holds what %d snapshot(s) and the archive past position "
                "%d covered (the store went back in time); restoring from position %d",
                record.name, len(stale), cut, kept[1] if kept is not None else 0,
            )  # fmt: skip
            self.db.rewind(record.name, cut, stale)
            self.rewinds += 1
        # The interval counts from the snapshot (from the project's creation when there is
        # none), not from this restore: an engine restarted over and over, each time killed
        # before its next snapshot, would else replay more of the log at every start; with
        # this, once caught up it snapshots at once.
        self._last[record.name] = (_monotonic_at(record.created_at), 0, 0)
        found = self.db.get(kept[0]) if kept is not None else None
        if kept is None or found is None:
            return ProjectEngine(record), None
        info, blob = found
        try:
            eng = restore(record, blob)
        except StaleSnapshotError as exc:
            log.warning("%s: %s; starting from scratch", record.name, exc)
            self._drop_sql(record.name)
            return ProjectEngine(record), None
        self._last[record.name] = (
            _monotonic_at(info.created_at),
            eng.labels.n_labels,
            eng.position,
        )
        log.info("%s: restored snapshot %d at position %d", record.name, info.id, info.position)
        return eng, kept[2]

    def _first_lost(self, project: str, after: int) -> int | None:
        """The first archived entry past ``after`` that the live log does not hold with its
        token (None: every one is there, or none is archived past ``after``)."""
        while rows := self.db.read_archive(project, after, 10_000):
            live = self.store.read_log(project, after, len(rows))
            tokens = {e.position: e.token for e in live}
            for e in rows:
                if tokens.get(e.position) != e.token:
                    return e.position
            after = rows[-1].position
        return None

    def read_log(
        self,
        project: str,
        after: int,
        limit: int,
        anchor: int | None = None,
        served: int | None = None,
        seal: bool = False,
    ) -> list[LogEntry]:
        """Entries after ``after``: from the live log, or from the archive where trimmed.
        With ``anchor``, the live log must still hold the entry at ``after`` with that token
        (else ``LogRewoundError``); ``seal`` as in ``Store.read_log``."""
        entries = self.store.read_log(project, after, limit, anchor, served, seal)
        if entries and entries[0].position == after + 1:
            return entries
        if not entries and self.store.log_end(project) <= after:
            return entries
        archived = self.db.read_archive(project, after, limit)
        if len(archived) < limit:  # the live log goes on where the archive ends: read on
            last = archived[-1].position if archived else after  # (so that a run the archive
            more = self.store.read_log(project, last, limit - len(archived))  # cuts is whole:
            if more and more[0].position == last + 1:  # the next entry may join its last one)
                archived += more
        return archived

    def covers(self, eng: ProjectEngine) -> bool:
        """A snapshot at the engine's position was taken (so none is due until it moves)."""
        return self._last.get(eng.record.name, (0.0, 0, 0))[2] >= eng.position

    def labels_between(self, labels: int) -> int:
        """New labels after a snapshot of a project with ``labels`` labels that make the next
        one due. A snapshot only saves replay (with Redis the log entries are archived apart
        from it, ``maybe_archive``), and it costs in proportion to the whole project: after
        ``every_labels`` or a ``REPLAY_SHARE`` of the labels it holds, whichever is more, so
        that its cost per label stays constant as a project grows and a restart replays at
        most that share."""
        return max(self.every_labels, int(labels * REPLAY_SHARE))

    def maybe_snapshot(
        self, eng: ProjectEngine, force: bool = False, token: int | None = None
    ) -> Future[SnapshotInfo | None] | None:
        """Snapshot the engine when due; ``token``: that of its log entry (its anchor)."""
        name = eng.record.name
        now = time.monotonic()
        t, labels, position = self._last.setdefault(name, (now, 0, 0))
        new_labels = eng.labels.n_labels - labels
        due = eng.position > position and (
            force or now - t >= self.interval_s or new_labels >= self.labels_between(labels)
        )
        if not due or (not force and self.resting(name, now - t)):
            return self.maybe_archive(eng, token)
        if self._pending is not None and not self._pending.done():
            if not force:
                return None
            self._pending.result()  # an asked-for snapshot waits for the one being written
        t0 = time.perf_counter()
        cap = capture(eng, token)
        self.stall_s = time.perf_counter() - t0
        self._last[name] = (now, eng.labels.n_labels, eng.position)
        self._archived[name] = eng.labels.n_labels
        self._pending = self._pool.submit(self._write, eng.record, cap, self.stall_s)
        return self._pending

    def maybe_archive(
        self, eng: ProjectEngine, token: int | None
    ) -> Future[SnapshotInfo | None] | None:
        """With Redis, the log entries up to the engine's position archived to SQL (and the
        live log trimmed to them) once ``every_labels`` labels came since the last archive or
        snapshot: what a lost Redis volume costs stays bounded while snapshots, which cost in
        proportion to the project, keep to their share of the time."""
        name = eng.record.name
        if self.store.log_in_sql or token is None:
            return None
        since = self._archived.get(name, self._last.get(name, (0.0, 0, 0))[1])
        if eng.labels.n_labels - since < self.every_labels:
            return None
        if self._pending is not None and not self._pending.done():
            return None
        self._archived[name] = eng.labels.n_labels
        self._pending = self._pool.submit(self._archive, eng.record, eng.position, token)
        return self._pending

    def resting(self, project: str, since: float) -> bool:
        """Whether ``project``'s next snapshot waits, ``since`` seconds after its last began,
        to keep snapshots within ``time_share`` of the time (a snapshot only saves replay;
        with Redis the log's archive keeps its count: ``maybe_archive``)."""
        took, share = self._took.get(project), self.time_share
        if took is None or share is None:
            return False
        return since < took / share

    def _write(self, record: ProjectRecord, cap: Capture, stall_s: float) -> SnapshotInfo | None:
        t0 = time.perf_counter()

        def write() -> tuple[SnapshotInfo, int]:
            blob = encode(cap)
            archive = [] if self.store.log_in_sql else self._unarchived(record, cap.position)
            return self.db.write(cap, blob, archive, self.keep), len(archive)

        try:
            done = self._to_sql(record, cap.position, cap.token, write)
            if done is None:
                return None
            info, archived = done
            self.write_s = time.perf_counter() - t0
            self._took[record.name] = stall_s + self.write_s
            self.last_error = None
            log.info(
                "%s: snapshot at position %d written in %.2f s (%d KiB, %d entries archived)",
                cap.project, cap.position, self.write_s, info.size_bytes // 1024, archived,
            )  # fmt: skip
            return info
        except Exception as exc:
            log.exception("snapshot of %s failed", cap.project)
            self.last_error = repr(exc)
            self._last.pop(cap.project, None)  # try again at the next step
            return None

    def _archive(self, record: ProjectRecord, position: int, token: int) -> None:
        """``maybe_archive``'s work, in the background thread."""
        try:

            def write() -> bool:
                self.db.archive(record.name, self._unarchived(record, position))
                return True

            if self._to_sql(record, position, token, write) is not None:
                self.last_error = None
        except Exception as exc:
            log.exception("archiving the log of %s failed", record.name)
            self.last_error = repr(exc)
            self._archived.pop(record.name, None)  # try again at the next step

    def _to_sql(
        self, record: ProjectRecord, position: int, token: int, write: Callable[[], T]
    ) -> T | None:
        """``write()`` (what goes to SQL of the project up to ``position``), then the live log
        trimmed to that position, only once SQL holds it and while the log holds that entry
        (``token``). None, and nothing of it kept, when the project was deleted or replaced
        meanwhile."""
        current = self.store.get_project(record.name)
        if current is None or current.created_at != record.created_at:
            return None  # deleted meanwhile: nothing of it may reach SQL again
        done = write()
        now = self.store.get_project(record.name)
        if now is not None and now.created_at != record.created_at:
            self._drop_sql(record.name)  # replaced while being written: not the new one's
            return None
        self.store.trim(record.name, position, anchor=(position, token))
        return done

    def _unarchived(self, record: ProjectRecord, position: int) -> list[LogEntry]:
        """The log entries up to ``position`` that SQL does not hold yet, the project's record
        and keys saved with them (what rebuilds a lost Redis from SQL)."""
        archive: list[LogEntry] = []
        after = self.db.archived_position(record.name)
        while after < position:
            chunk = [e for e in self.read_log(record.name, after, 1000) if e.position <= position]
            if not chunk:
                break
            archive.extend(chunk)
            after = chunk[-1].position
        self.db.save_project(record)
        self.db.save_keys(record.name, self.store.keys_for(record.name))
        return archive

    def covered(self, project: str) -> int:
        """Log position of the latest snapshot this process has started writing."""
        return self._last.get(project, (0.0, 0, 0))[2]

    def wait(self) -> None:
        """Block until the snapshot being written (if any) is written."""
        if self._pending is not None:
            self._pending.result()

    def unload(self, project: str) -> None:
        """The project left the store (deleted, or the store was wiped: its SQL side is what
        rebuilds it, and stays): drop its schedule once the snapshot being written is."""
        self.wait()
        self._last.pop(project, None)
        self._took.pop(project, None)
        self._archived.pop(project, None)

    def forget(self, project: str) -> None:
        """Another project now has this name: drop the schedule and what SQL holds of the
        earlier one, once the snapshot being written (perhaps of it) is written."""
        self.unload(project)
        self._drop_sql(project)

    def _drop_sql(self, project: str) -> None:
        if self.store.log_in_sql:  # the log and catalogue are the store's own: snapshots only
            self.db.forget_snapshots(project)
        else:  # the archive, seen ids, catalogue and keys of the project too
            self.db.forget_project(project)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _monotonic_at(wall: float) -> float:
    """The monotonic clock's reading at wall-clock time ``wall`` (not after now)."""
    return time.monotonic() - max(0.0, time.time() - wall)
