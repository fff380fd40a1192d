"""The engine loop: every project's ``ProjectEngine`` against a store, and the served state.

``EngineLoop`` runs in a thread of the API process (embedded) or as ``crowdtally engine``
beside the API processes (Redis). With a ``Snapshotter`` it restores each project from its
latest snapshot, reads entries the live log no longer has from the archive, and snapshots on
a schedule.

One project's failure (an exception while applying its entries, MemoryError included) does not
stall the others: that project is marked failed in the store (``/readyz`` and ``/metrics`` name
it), its engine is dropped, and it is tried again from its snapshot after a back-off, while the
loop goes on with the rest.

The engine's position is never ahead of the log: it remembers the token of the entry its state
ends at (its anchor), reads the next entries only while the log still holds that entry, and
writes served state only while the log holds the entry that state ends at (both checked
atomically in the store). A log gone back in time (Redis restarted from an AOF that missed its
last second) raises ``LogRewoundError``: the engine is dropped and restored from the latest
snapshot the log still holds (the snapshots past it, and their archive, are dropped), then
replays; the state equals a replay of the log, and the label ids the log lost are gone with
it, so a client's retry of a lost block is applied exactly once.

In a pool (``Pool``: several ``crowdtally engine --pool`` processes, on any machines, over one
Redis or Redis Cluster) each project is applied by one engine at a time, the holder of its
lease (``Store.acquire_lease``), renewed every third of the lease. Every state write carries
the lease's fencing token and is refused once another engine took the project over (an
engine paused past its lease cannot write after that). The engines share the projects by
load, the labels applied per second (app/engine/sharing.py): each takes free projects while
below its share of the pool's load and moves a project to the least loaded engine when that
evens the two out; a dead engine's projects are taken over once its leases lapse
(docs/deploy.md, "A pool of engines").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import orjson

from app.engine.groups import JOIN_CAP, runs
from app.engine.project import ProjectEngine
from app.engine.sharing import UNKNOWN, Rates, acquire, plan_share
from app.engine.snapshots import Snapshotter
from app.store.base import (
    LeaseLostError,
    LogEntry,
    LogRewoundError,
    NodeDownError,
    ProjectRecord,
    StateUpdate,
    Store,
)

log = logging.getLogger("crowdtally.engine")

RETRY_S, RETRY_MAX_S = 1.0, 60.0  # a failed project is tried again after this (doubling)
DYADIC_SLICE = 4096
"""Queued labels the dyadic model learns in a step while the log is drained (about 15 ms,
bench.engine_step), a ``DYADIC_PART`` at a time."""
DYADIC_PART = 512
"""The slice is learned this many labels at a time, the log looked at between parts: a label
posted meanwhile waits for one part (about 2 ms), not for the whole slice, and the slice's
rest waits until its posterior is served."""
DYADIC_BACKLOG = 262_144
"""Labels the dyadic model may lag behind the posteriors (about 8 MB queued): past it, every
step learns the excess, so a load the two cannot keep up with together shows as the engine's
lag (and push-back), not as a queue growing without bound."""
RESCORE_WAIT_S = 0.5
"""A queue being scored again (the calibration moved) takes its slices in steps of their own
while the log is drained; under a load that never lets it drain, a step's posteriors carry one
this long after the last (``EngineLoop._rescore_overdue``)."""
SWEEP_SLICE = 16_384
"""Labels' worth of a refinement sweep's work in one log entry (``app.engine.sweeps``):
about 15 ms of revisits, the most a label arriving meanwhile waits for the sweep."""
SWEEPS_AT_ONCE = 1
"""Idle sweeps' log entries (a refinement sweep's slice, a dyadic pass) waiting to be applied,
over all the projects of an engine: with many projects gone quiet at once, their sweeps'
entries come one after another instead of all in the same steps, ahead of new labels. The
projects take turns, an entry each: the sweep of a project of 45.7M labels (8,000 slices)
held every other project's first sweep back for minutes while it ran whole."""
QUIET_RECHECK_S = 5.0
"""Every project's log is looked at again within this long, moved or not, a share of the
projects at each step (``_recheck_turn``): the bound on how late an append whose record in
the moves was lost is seen."""
RECHECK_SLICES = 50
"""The re-check comes in slices of at least 1/RECHECK_SLICES of the projects (one round trip
each, at most this many every QUIET_RECHECK_S), not one project at a time."""


@dataclass(frozen=True)
class Pool:
    """This engine's part in a pool of engines sharing a deployment's projects."""

    engine_id: str
    lease_s: float = 5.0


@dataclass
class Failure:
    error: str
    retry_at: float
    wait_s: float
    created_at: float


def give_back_freed_memory() -> None:
    """Return the C heap's free pages to the system (glibc's ``malloc_trim``; elsewhere
    nothing). glibc keeps freed memory for reuse, and a dropped project's arrays (its dyadic
    tables alone are about 24 MB) come from that heap once an earlier one was freed: without
    this the process's resident memory would not shrink when a project is deleted."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


class EngineLoop:
    """Applies every project's log to its ``ProjectEngine`` and writes the served state."""

    def __init__(
        self,
        store: Store,
        batch_entries: int = 256,
        refine_passes: int = 3,
        refine_idle_s: float = 1.0,
        poll_s: float = 0.002,
        snapshotter: Snapshotter | None = None,
        pool: Pool | None = None,
        dyadic_ready: Callable[[], bool] = lambda: True,
    ) -> None:
        self.store = store
        self.dyadic_ready = dyadic_ready
        """Whether the dyadic model's kernels are loaded (a first start compiles them after
        the posteriors' in another process): until then its labels stay queued."""
        self.pool = pool
        self._leases: dict[str, int] = {}
        """The projects this engine of a pool holds, with their fencing tokens."""
        self._lapsed: set[str] = set()
        """Held projects whose lease a renewal found lost (let go at the next step)."""
        self._lease_lock = threading.Lock()
        self._renewer: threading.Thread | None = None
        self.halted: str | None = None
        """Why the loop stopped for good (``halt``), else None."""
        self._next_claim = 0.0
        self._rates = Rates()
        """Labels/s of each project held (the load the pool shares)."""
        self._records: dict[str, tuple[str, float]] = {}
        """Each project's engine and labels/s, as the store last returned them."""
        self._held_since: dict[str, float] = {}
        self._blocked: dict[str, float] = {}
        """Projects this engine gave up, not to be taken back before the time given."""
        self._freed: dict[str, float] = {}
        """Projects let go since the last record of the loads, with their labels/s."""
        self.given_up = 0
        """Projects this engine of a pool gave up to share the load."""
        self.leases_lost = 0
        """Projects this engine of a pool had to let go (their lease lapsed and was taken)."""
        self.snapshotter = snapshotter
        self.batch_entries = batch_entries
        self.refine_passes = refine_passes
        self.refine_idle_s = refine_idle_s
        self.poll_s = poll_s
        self.dyadic_learned = 0
        """Labels the dyadic models learned in the last step (work, even with no entry)."""
        self.queue_slices = 0
        """Slices of a queue scored again in the last step without an entry (work too)."""
        self.engines: dict[str, ProjectEngine] = {}
        self._catch_up: dict[str, int] = {}
        self._anchor: dict[str, int | None] = {}
        """Token of the log entry each engine's state ends at (None: position 0)."""
        self._entry_s: dict[str, float] = {}
        """Seconds per entry applied (and its state written), a moving average of steps of
        label entries: the pace push-back projects the backlog's wait from (``_pace``)."""
        self._step_s: dict[str, float] = {}
        """Seconds per step of label entries, from its first entry applied to its end (the
        dyadic model's learning and a snapshot included), a moving average: a new entry waits
        for the step under way and then for the one it joins (``Store.lag``)."""
        self._dyadic_s: dict[str, float] = {}
        """The dyadic model's recent seconds per label learned, per project."""
        self._served: dict[str, int] = {}
        """The applied position each project's served state is at (found, then written)."""
        self._unwritten: set[str] = set()
        """Projects whose last state write failed (the store was unreachable): written again
        at their next step, new entries or not (a quiet log would else leave the served state
        behind the engine's until the next label)."""
        self._refused: dict[str, list[StateUpdate]] = {}
        """Per project, the writes the store refused whole (full, moving: ``_write``), to be
        written again as they were, in their order, before anything new."""
        self.rewinds = 0
        """Engines dropped because the log went back in time (restored, then replayed)."""
        self._last_label: dict[str, float] = {}
        self._refine_due: dict[str, bool] = {}
        self._dyadic_pending: set[str] = set()  # a dyadic pass logged and not applied yet
        self._sweeping: set[str] = set()
        self._slice_pending: set[str] = set()  # a sweep's slice logged and not applied yet
        self._turn = 0  # slices logged so far; a project's last one in _turns (who goes next)
        self._turns: dict[str, int] = {}
        self._slice_at: dict[str, float] = {}  # a rescored queue's last slice (or its start)
        self.failed: dict[str, Failure] = {}
        self._cleared: set[str] = set()
        """Projects this loop has applied since it took them, their failure in the store
        cleared: another engine's mark (one that failed on it and let it go, or stopped) is
        cleared by the engine that applies it next."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None
        self.store_refused = False
        """The last step failed waiting for the store or the snapshot database (full, moving,
        a node or the database down): the state served is the last one written, and reads go
        on (``/readyz`` stays ready)."""
        self._projects: dict[str, ProjectRecord] = {}
        self._catalogue_token: str | None = None
        self._quiet: set[str] = set()
        # (project -> the heads it was found quiet at; the moves' cursor; every log looked at
        # in the next step; the rolling re-check: its clock, the projects owed, the next one)
        self._known_quiet: dict[str, tuple[int, int | None, int | None]] = {}
        self._moves_cursor: str | None = None
        self._look_at_all = True
        self._recheck_clock: float | None = None
        self._recheck_owed = 0.0
        self._recheck_next = 0
        self._dormant: set[str] = set()  # quiet, with nothing to do until its log moves

    def _catalogue(self) -> Mapping[str, ProjectRecord]:
        """Every project's record, read again only when a project was created or deleted
        (reading them costs with their number: 0.14 s for 10,000 on Redis). Held, not
        copied: read it only."""
        try:
            token = self.store.catalogue_token()  # (before the records: a change after it is
        except Exception as exc:  # seen at the next step)
            if self._catalogue_token is None or not self._store_waits(exc):
                raise
            return self._projects  # (its node down: the projects known go on meanwhile)
        if token is None or token != self._catalogue_token:
            self._projects = {r.name: r for r in self.store.list_projects()}
            self._catalogue_token = token
            self._look_at_all = True  # (a restored store: every log looked at)
        return self._projects

    def _quiet_logs(self, projects: Mapping[str, ProjectRecord]) -> set[str]:
        """The projects whose log has nothing new past the entry this loop is at
        (``Store.quiet_logs``, in one round trip). The store is asked only about those that
        moved since the last step (``Store.moved_since``, read first: an append after it is
        among the next step's moves) or whose position, anchor or served state changed here;
        one found quiet with the same ones, and not moved since, still is. Every project is
        asked when the store cannot tell what moved or the catalogue changed, and each one in
        its turn, within every QUIET_RECHECK_S, as if it moved. A dormant project that did not
        move is not even looked at."""
        try:
            self._moves_cursor, moved = self.store.moved_since(self._moves_cursor)
        except Exception as exc:
            if not self._store_waits(exc):
                raise
            moved = None  # (the record of moves on a node down: every log looked at)
        full = moved is None or self._look_at_all
        if full:
            self._look_at_all, self._known_quiet = False, {}
        turn = set() if full else self._recheck_turn(projects, time.monotonic())
        changed = (moved or set()) | turn
        asleep = set() if full else {
            n for n in self._dormant if n not in changed and n in projects
        }  # fmt: skip
        heads = {
            n: (eng.position, self._anchor.get(n), self._served.get(n))
            for n in projects
            if n not in asleep
            and (eng := self.engines.get(n))
            and (n in self._anchor or not eng.position)
        }
        known = self._known_quiet
        ask = (
            heads if full else {n: h for n, h in heads.items() if n in changed or known.get(n) != h}
        )
        quiet = self.store.quiet_logs(ask)
        for n, h in heads.items():
            if n in quiet or n not in ask:
                known[n] = h
                quiet.add(n)
            else:
                known.pop(n, None)
        return quiet | asleep

    def _recheck_turn(self, projects: Mapping[str, ProjectRecord], now: float) -> set[str]:
        """The projects whose periodic re-check falls in this step: all of them in turn, as
        many a step as the time since the last one owes (every project once every
        QUIET_RECHECK_S). Looking at all of them at once cost a whole step's worth every
        QUIET_RECHECK_S (0.13 s at 10,000 projects)."""
        n, last = len(projects), self._recheck_clock
        self._recheck_clock = now
        if not n or last is None:
            return set()
        self._recheck_owed = min(n, self._recheck_owed + n * (now - last) / QUIET_RECHECK_S)
        take = int(self._recheck_owed)
        if take < max(1, n // RECHECK_SLICES):
            return set()
        self._recheck_owed -= take
        start = self._recheck_next % n
        self._recheck_next = (start + take) % n
        names = list(projects)
        return set(names[start : start + take] + names[: max(0, start + take - n)])

    # ------------------------------------------------------------------ one step
    def step(self) -> int:
        """Apply what is waiting in every project's log; return how many entries."""
        projects = self._catalogue()
        dropped = set(self.engines) - set(projects)
        for name in dropped:
            # Deleted (the API drops its SQL side), or a wiped Redis, which SQL must rebuild:
            # only what this loop holds goes.
            self._drop(name, forget_sql=False)
        if dropped:
            give_back_freed_memory()
        for gone in set(self.failed) - set(projects):
            del self.failed[gone]
            self.store.set_project_failed(gone, None)
        if self.pool is not None:
            projects = self._claim(projects, self.pool)
            projects = {n: r for n, r in projects.items() if n not in self._lapsed}
        self._quiet = self._quiet_logs(projects)
        done = 0
        self.dyadic_learned = self.queue_slices = 0
        now = time.monotonic()
        refused: Exception | None = None
        for name, record in projects.items():
            if name in self.store.unreached:  # (its node down: the others go on, the step
                refused = refused or NodeDownError(name)  # fails once they are done)
                continue
            if name in self._dormant and name in self._quiet:
                continue  # nothing to do until its log moves
            self._dormant.discard(name)
            failure = self.failed.get(name)
            recreated = failure is not None and failure.created_at != record.created_at
            if failure is not None and not recreated and now < failure.retry_at:
                continue  # failed: tried again after its back-off
            try:
                applied = self._step_project(name, record)
                done += applied
            except LeaseLostError as exc:
                log.warning("%s: %s; let go", name, exc)
                self._let_go(name)
                continue
            except LogRewoundError as exc:
                self._rewind(name, exc)
                continue
            except Exception as exc:
                if self.store.is_full(exc) or self._store_waits(exc):
                    refused = exc  # (its node's: on a cluster, the other nodes' projects go
                    continue  # on; the step fails once they are done)
                if not self.store.ping():
                    raise  # the store, not the project: the whole step failed (the engines
                    # kept, their state written again once the store takes it)
                self._fail(name, record, exc)
                continue
            if failure is not None:
                self.failed.pop(name, None)
                log.warning("%s: applies its log again", name)
            if failure is not None or name not in self._cleared:
                self.store.set_project_failed(name, None)
                self._cleared.add(name)
            if not applied and name in self._quiet and self._nothing_due(name):
                self._dormant.add(name)
        if refused is not None:
            raise refused
        return done

    def _nothing_due(self, name: str) -> bool:
        """Nothing for this loop to do for the project until its log moves: no sweep due,
        waiting or still wanted, no replay up to served state, its snapshot at its position
        (a quiet project's step is then skipped: with thousands of quiet projects, visiting
        each cost about 4 us a step)."""
        eng = self.engines.get(name)
        if eng is None or name in self._sweeping or eng.position < self._catch_up.get(name, 0):
            return False
        if name in self._unwritten or name in self._refused:
            return False
        if eng.sweep is not None and self.refine_passes > 0:  # (a sweep to go on with)
            return False
        if self._refine_due.get(name) or name in self._dyadic_pending:
            return False
        if eng.dyadic_unpublished or eng.queue_rescoring:
            return False
        if self.refine_passes > 0 and eng.wants_dyadic_sweep():
            return False
        return self.snapshotter is None or self.snapshotter.covers(eng)

    def _claim(self, projects: Mapping[str, ProjectRecord], pool: Pool) -> dict[str, ProjectRecord]:
        """The projects this engine holds the lease of: renewed, and taken or given up toward
        its share of the pool's load, every third of the lease."""
        now = time.monotonic()
        if now >= self._next_claim:
            self._next_claim = now + pool.lease_s / 3
            alive = self.store.engines_alive(pool.engine_id, pool.lease_s)
            with self._lease_lock:
                for name in [n for n in self._leases if n not in projects]:  # deleted
                    del self._leases[name]
            self.renew_leases()
            for name in list(self._lapsed):  # another may have written since: what this
                log.warning("%s: its lease lapsed; let go", name)  # engine holds is stale
                self.leases_lost += 1
                self._let_go(name)
            self._share(projects, alive, pool, now)
        return {n: r for n, r in projects.items() if n in self._leases}

    def _share(
        self, projects: Mapping[str, ProjectRecord], alive: list[str], pool: Pool, now: float
    ) -> None:
        """Record the load of the projects held; take free ones and give one up toward this
        engine's share of the pool's load (app/engine/sharing.py)."""
        me = pool.engine_id
        for name in self._leases:
            eng = self.engines.get(name)
            if eng is not None:
                prior = self._records.get(name, ("", UNKNOWN))[1]
                settled = now - self._held_since.get(name, now) >= 2 * pool.lease_s
                self._rates.observe(name, eng.labels.n_labels, now, prior, settled)
        held = {  # (a failed project applies nothing)
            n: 0.0 if n in self.failed else self._rates.rate.get(n, UNKNOWN) for n in self._leases
        }
        changes: dict[str, tuple[str, float] | None] = {n: (me, r) for n, r in held.items()}
        changes.update((n, None) for n in self._records if n not in projects)  # deleted
        self._records = records = self._record_freed(changes)
        self._blocked = {n: t for n, t in self._blocked.items() if t > now}
        plan = plan_share(
            me, alive, records, projects, held,
            movable=[n for n in held if now - self._held_since.get(n, now) >= pool.lease_s],
            blocked=self._blocked,
        )  # fmt: skip
        moved: dict[str, tuple[str, float] | None] = {}
        if plan.give_up is not None:
            name = plan.give_up
            log.info("%s: given up (%.0f labels/s; load %.0f, share %.0f)", name,
                     plan.load[name], plan.mine, plan.target)  # fmt: skip
            self.given_up += 1
            self.store.release_lease(name, me)
            self._let_go(name)  # (recorded free below)
            self._blocked[name] = now + 3 * pool.lease_s

        def lease(name: str) -> bool:
            token = self.store.acquire_lease(name, me, pool.lease_s)
            if token:
                with self._lease_lock:
                    self._leases[name] = token
                self._held_since[name] = now
                moved[name] = (me, records.get(name, ("", UNKNOWN))[1])
            return bool(token)

        acquire(plan, lease)
        if moved or self._freed:  # written, and kept here: the next look reads them all
            self._records.update(self._record_freed(moved, read=False))

    def _record_freed(
        self, changes: dict[str, tuple[str, float] | None], read: bool = True
    ) -> dict[str, tuple[str, float]]:
        """``store.record_loads`` of the changes and of the projects let go since the last
        record, as free: a project whose record still named this live engine would be taken
        by no other (a lease lapsed while the store was unreachable, say). Returns every
        project's record, or with ``read=False`` only those written."""
        freed = {n: ("", r) for n, r in self._freed.items() if n not in self._leases}
        written = {**freed, **changes}
        records = self.store.record_loads(written, read)
        self._freed.clear()
        return records if read else {n: r for n, r in written.items() if r is not None}

    def renew_leases(self) -> None:
        """Renew every lease held, in one round trip; note the ones found lost. Called by each
        look at the leases and, while the loop runs, by a thread every third of a lease, so
        that a long step (a restore, a sweep over every label) does not let them lapse."""
        if self.pool is None:
            return
        with self._lease_lock:
            held = dict(self._leases)
            tokens = self.store.renew_leases(list(held), self.pool.engine_id, self.pool.lease_s)
            for (name, token), now in zip(held.items(), tokens, strict=True):
                if now is not None and now != token and self._leases.get(name) == token:
                    self._lapsed.add(name)  # (None: its node down or its slot moving)

    def _renew_while_running(self, lease_s: float) -> None:
        while not self._stop.wait(lease_s / 3):
            try:
                self.renew_leases()
            except Exception:  # the store unreachable: the next look at the leases decides
                log.exception("renewing the leases failed")
                self.store.recover()

    def _let_go(self, name: str) -> None:
        """Forget a project another engine of the pool applies now (SQL keeps its side)."""
        with self._lease_lock:
            self._leases.pop(name, None)
            self._lapsed.discard(name)
        self._held_since.pop(name, None)
        self._freed[name] = self._rates.rate.get(name, UNKNOWN)
        self._rates.forget(name)
        self._drop(name, forget_sql=False)

    def release_leases(self) -> None:
        """Give up every lease held (a pool engine stopping: the others take over at once)."""
        if self.pool is not None:
            for name in list(self._leases):
                self.store.release_lease(name, self.pool.engine_id)
                self._let_go(name)
            self._record_freed({}, read=False)

    def _fail(self, name: str, record: ProjectRecord, exc: Exception) -> None:
        """Mark the project failed, drop its (partly updated) engine, retry later."""
        log.error("%s: applying its log failed", name, exc_info=exc)
        before = self.failed.get(name)
        wait_s = RETRY_S if before is None else min(2 * before.wait_s, RETRY_MAX_S)
        error = f"{type(exc).__name__}: {exc}"[:500]
        self.failed[name] = Failure(error, time.monotonic() + wait_s, wait_s, record.created_at)
        self._let_go_engine(name)  # frees its memory; rebuilt from its snapshot and log
        self._unwritten.discard(name)  # (the engine rebuilt writes what it restores)
        self._sweeping.discard(name)
        self._slice_pending.discard(name)
        self._dyadic_pending.discard(name)
        self._catch_up.pop(name, None)
        give_back_freed_memory()
        self.store.set_project_failed(name, error)

    def _rewind(self, name: str, exc: LogRewoundError) -> None:
        """The log went back in time under this engine: drop it (the next step restores the
        latest snapshot the log still holds and replays)."""
        log.warning("%s: %s; restoring from a snapshot the log holds", name, exc)
        self.rewinds += 1
        self._let_go_engine(name)
        for held in (self._catch_up, self._anchor, self._served):
            held.pop(name, None)
        self._unwritten.discard(name)
        self._sweeping.discard(name)  # (its sweep's entry may be among those lost)
        self._slice_pending.discard(name)
        self._dyadic_pending.discard(name)
        if self.snapshotter is not None:
            self.snapshotter.unload(name)  # (waits for the snapshot being written)

    def _let_go_engine(self, name: str) -> None:
        """Forget the project's engine (its memory goes back once the heap is trimmed: a label
        table being grown on a thread is waited for, which holds its columns until then)."""
        eng = self.engines.pop(name, None)
        self._refused.pop(name, None)
        if eng is not None:
            eng.labels.let_go()

    def _drop(self, name: str, forget_sql: bool = True) -> None:
        """Forget a project this loop held: its engine and schedule; with ``forget_sql`` (it
        was deleted and created again) also what SQL holds of it, snapshots and archive."""
        self._let_go_engine(name)
        self._dormant.discard(name)
        for held in (self._catch_up, self._last_label, self._refine_due):
            held.pop(name, None)
        self._dyadic_pending.discard(name)
        self._anchor.pop(name, None)
        self._served.pop(name, None)
        self._slice_at.pop(name, None)
        self._turns.pop(name, None)
        self._unwritten.discard(name)
        self._sweeping.discard(name)
        self._slice_pending.discard(name)
        self.failed.pop(name, None)
        self._cleared.discard(name)
        if self.snapshotter is not None:
            if forget_sql:
                self.snapshotter.forget(name)
            else:
                self.snapshotter.unload(name)

    def _step_project(self, name: str, record: ProjectRecord) -> int:
        eng = self.engines.get(name)
        snap = self.snapshotter
        if eng is not None and eng.record.created_at != record.created_at:
            self._drop(name)  # another project under the same name: nothing of the old one
            eng = None
        quiet = eng is not None and name in self._quiet  # (as the step began)
        if eng is None:
            eng, anchor = (
                snap.load_anchored(record) if snap is not None else (ProjectEngine(record), None)
            )
            self.engines[name] = eng
            self._anchor[name] = anchor
            # Its idle sweeps count from now: an engine restored at the log's end applies no
            # labels, and without this it would never sweep until new labels came; a
            # refinement its snapshot still needed is due.
            self._last_label[name] = time.monotonic()
            self._refine_due[name] = self.refine_passes > 0 and eng.refine_due
            # State already served (another engine, before a restart): replay silently up to it.
            self._catch_up[name] = served = self.store.applied_position(name)
            self._served[name] = served
            if served < eng.position:  # a restored snapshot the store has not seen: serve it all
                eng.mark_all_dirty()
                self._write(name, eng.state_update(), anchor, served)
                self._served[name] = eng.position
        if name in self._refused:
            self._write_refused(name, eng)
        anchor = self._anchor.get(name)
        # (quiet: entries appended since the step began wait for the next one)
        step_runs = [] if quiet else self._read_runs(name, eng, anchor)
        entries = [e for run in step_runs for e in run]
        now = time.monotonic()
        if not entries:
            served = eng.position >= self._catch_up.get(name, 0)
            if served and name in self._unwritten:  # (written before anything else)
                self._write(name, eng.state_update(dyadic=False), anchor, self._served.get(name))
                self._served[name] = eng.position
            if served and eng.queue_rescoring:
                self._write_queue_slice(name, eng, anchor)
            if served and (limit := self._dyadic_limit(name, eng, True)) is not None:
                self._write_dyadic(name, eng, anchor, limit)
            if snap is not None and served:
                snap.maybe_snapshot(eng, token=anchor)  # the last entries before a quiet spell
            if eng.sweep is not None:
                self._next_slice(name, eng)  # (labels that came meanwhile are applied first)
            elif now - self._last_label.get(name, now) >= self.refine_idle_s:
                self._idle_sweeps(name, eng)
            return 0
        force_snapshot = False
        started, labels_before = time.perf_counter(), eng.labels.n_labels
        for run in step_runs:
            eng.apply_run(run)
        for entry in entries:
            force_snapshot |= entry.kind == "snapshot"
            if entry.kind == "dyadic":
                self._dyadic_pending.discard(name)
            if entry.kind == "refine":
                self._slice_pending.discard(name)
            if entry.kind == "dyadic" or (entry.kind == "refine" and eng.sweep is None):
                self._sweeping.discard(name)
            if entry.kind in ("labels", "gold"):
                self._last_label[name] = now
        self._refine_due[name] = self.refine_passes > 0 and eng.refine_due
        self._anchor[name] = anchor = entries[-1].token
        # The posteriors first, with the applied position; then a slice of a queue being
        # scored again and the dyadic model's learning, each in its turn (_rescore_overdue,
        # _dyadic_limit), with their writes.
        maybe_drained = len(entries) < self.batch_entries
        update = eng.state_update(dyadic=False, rescore=self._rescore_overdue(name, eng))
        if eng.position < self._catch_up.get(name, 0):  # replaying up to the state already
            eng.not_written(served=True)  # (another engine's write holds it)
            limit = self._dyadic_limit(name, eng, maybe_drained)
            if limit is not None:  # served: nothing to write
                before = eng.dyadic_backlog
                eng.dyadic_update(limit)
                self.dyadic_learned += before - eng.dyadic_backlog
            return len(entries)
        # (this step's pace goes with the next write)
        self._write(name, update, anchor, self._served.get(name), pace=True)
        self._served[name] = eng.position
        labels_only = all(e.kind == "labels" for e in entries)  # (the steps the paces follow)
        if labels_only:
            self._pace(name, started, len(entries), eng.labels.n_labels - labels_before)
        if eng.queue_rescoring and maybe_drained and self._nothing_waits(name, eng):
            self._write_queue_slice(name, eng, anchor)
        limit = self._dyadic_limit(name, eng, maybe_drained)  # (what came during the write
        if limit is not None:  # counts: the posteriors of the entries waiting go first)
            self._write_dyadic(name, eng, anchor, limit)
        if snap is not None:
            snap.maybe_snapshot(eng, force=force_snapshot, token=anchor)
        if labels_only:
            _smooth(self._step_s, name, time.perf_counter() - started)
        return len(entries)

    def _read_runs(self, name: str, eng: ProjectEngine, anchor: int | None) -> list[list[LogEntry]]:
        """The runs this step applies (``app.engine.groups``): up to ``batch_entries`` entries,
        read with the seal (entries appended from now on start a new run), ending where a run
        ends: a read that fills its limit may stop inside a run, whose rest is read first."""
        snap = self.snapshotter
        read = snap.read_log if snap is not None else self.store.read_log
        served = self._served.get(name)
        entries = read(name, eng.position, self.batch_entries, anchor, served, seal=True)
        whole = runs(entries, complete=len(entries) < self.batch_entries)
        if whole or not entries:
            return whole
        # one run fills the read: all of it, and the entry after it (or the end of the log)
        entries = read(name, eng.position, JOIN_CAP + 1, anchor, served, seal=True)
        return runs(entries, complete=len(entries) <= JOIN_CAP)[:1]

    def _pace(self, name: str, started: float, entries: int, labels: int) -> None:
        """The pace push-back projects from (a moving average of seconds per label entry):
        this step's time to serve the entries' posteriors, its write included, plus what the
        dyadic model's learning of their labels costs at its recent rate, learned now or
        later: under a load the engine cannot keep up with, its queue reaches its bound and
        every step then learns what the step brought, before the entries waiting (tried:
        counting only the share of the queue's bound in use let a probe wait 5.4 s past the
        5 s bound where this kept it to 4.8 s; docs/benchmarks.md)."""
        took = time.perf_counter() - started + labels * self._dyadic_s.get(name, 0.0)
        _smooth(self._entry_s, name, took / entries)

    # ------------------------------------------------------------------ the dyadic model
    def _dyadic_limit(self, name: str, eng: ProjectEngine, maybe_drained: bool) -> int | None:
        """How many queued labels the dyadic model learns in this step, its rows then written
        (None: no dyadic write). Once its kernels are loaded: ``DYADIC_SLICE`` when the log
        has nothing new past the posteriors just written (no posterior waits; the next step
        looks at the log again), and any excess over ``DYADIC_BACKLOG`` whatever waits (a
        dyadic sweep's labels, queued all at once, left out of that count: they are learned a
        slice at a time). With nothing queued, the rows a sweep changed are written when the
        log is drained."""
        if not eng.dyadic_unpublished or not self.dyadic_ready():
            return None
        over = _dyadic_over(eng)
        if maybe_drained and self._nothing_waits(name, eng):
            return max(over, DYADIC_SLICE)
        return over if over > 0 else None

    def _nothing_waits(self, name: str, eng: ProjectEngine) -> bool:
        """No log entry past the engine's position (asked anew: one may have come since)."""
        return self.store.log_end(name) <= eng.position

    def _write_queue_slice(self, name: str, eng: ProjectEngine, anchor: int | None) -> None:
        """The queue's next slice scored again (``ProjectEngine.queue_rescoring``) while no
        entry waits: a write at the position already served."""
        self._write(name, eng.state_update(dyadic=False), anchor, self._served.get(name))
        self._slice_at[name] = time.monotonic()
        self.queue_slices += 1

    def _rescore_overdue(self, name: str, eng: ProjectEngine) -> bool:
        """Whether a step's posteriors carry the next slice of a queue being scored again:
        only once ``RESCORE_WAIT_S`` passed without one, the log never drained meanwhile (a
        slice costs 10-25 ms, which every posterior of the step would else wait for)."""
        if not eng.queue_rescoring:
            self._slice_at.pop(name, None)
            return False
        now = time.monotonic()
        last = self._slice_at.setdefault(name, now)
        if now - last < RESCORE_WAIT_S:
            return False
        self._slice_at[name] = now
        return True

    def _write_dyadic(self, name: str, eng: ProjectEngine, anchor: int | None, limit: int) -> None:
        """Learn up to ``limit`` queued labels and write the dyadic rows they changed (with
        the pace, and the dyadic model's recent seconds per label noted for it): the excess
        over ``DYADIC_BACKLOG`` at once, the rest ``DYADIC_PART`` at a time while the log has
        nothing new."""
        before, started = eng.dyadic_backlog, time.perf_counter()
        learned = eng.dyadic_learn(min(max(_dyadic_over(eng), 0), limit))
        while learned < limit and eng.dyadic_backlog and self._nothing_waits(name, eng):
            learned += eng.dyadic_learn(min(DYADIC_PART, limit - learned))
        update = eng.dyadic_update(0)  # (the rows of what it learned)
        learned = before - eng.dyadic_backlog
        if learned:
            _smooth(self._dyadic_s, name, (time.perf_counter() - started) / learned)
        self.dyadic_learned += learned
        self._write(name, update, anchor, eng.position, pace=True)

    def _write(
        self, name: str, update: StateUpdate, anchor: int | None, served: int | None,
        pace: bool = False,
    ) -> None:  # fmt: skip
        """Write ``update``: the state after the log entry of token ``anchor``, over the
        state served at ``served``, under this engine's lease (its fence); with ``pace``, the
        project's recent paces go with it (what push-back projects from)."""
        update.anchor, update.served, update.fence = anchor, served, self._leases.get(name)
        if pace:
            update.entry_s, update.step_s = self._entry_s.get(name), self._step_s.get(name)
        try:
            self.store.write_state(name, update)
        except BaseException as exc:
            if (eng := self.engines.get(name)) is not None:
                self._not_written(name, eng, update, exc)
            raise
        self._unwritten.discard(name)

    def _not_written(
        self, name: str, eng: ProjectEngine, update: StateUpdate, exc: BaseException
    ) -> None:
        """A write failed. Refused whole (the store full or moving: it holds what it held), it
        is kept and written again as it is (``_write_refused``); else (the store unreachable:
        written or not, who knows) everything is written anew."""
        if self._refused_whole(exc) and name not in self._unwritten:
            self._refused.setdefault(name, []).append(update)
            return
        self._refused.pop(name, None)
        eng.not_written()
        self._unwritten.add(name)

    def _store_waits(self, exc: BaseException) -> bool:
        """The step waits for what it reads or writes, not for itself: Redis moving (a Redis
        Cluster's slot, a failover's primary), a cluster node down, or the snapshot database
        not answering. The engine keeps what it holds; the projects elsewhere go on; the step
        is tried again a second later."""
        snap = self.snapshotter
        return (
            isinstance(exc, NodeDownError)
            or self.store.is_moving(exc)
            or self.store.node_down(exc)
            or (snap is not None and snap.db.is_down(exc))
        )

    def _refused_whole(self, exc: BaseException) -> bool:
        """The store refused a write and kept nothing of it: full, or moving (a Redis Cluster's
        slot, a failover's primary)."""
        return isinstance(exc, Exception) and (self.store.is_full(exc) or self.store.is_moving(exc))

    def _write_refused(self, name: str, eng: ProjectEngine) -> None:
        """Write again, in their order, the writes the store refused whole; raises while it
        still refuses them (nothing new is applied meanwhile: each of them carries what
        changed since the one before, and the store holds what it held before the first)."""
        pending = self._refused[name]
        while pending:
            update = pending[0]
            try:
                self.store.write_state(name, update)
            except BaseException as exc:
                if not self._refused_whole(exc):  # (written or not, who knows: all anew)
                    self._not_written(name, eng, update, exc)
                raise
            pending.pop(0)
            if update.advance:
                self._served[name] = update.position
        del self._refused[name]

    def _idle_sweeps(self, name: str, eng: ProjectEngine) -> None:
        """Quiet for refine_idle_s: log a refinement sweep (after new labels), else one dyadic
        pass while its labels have had fewer passes than configured (one entry at a time;
        ``SWEEPS_AT_ONCE`` over all the projects)."""
        if self.refine_passes <= 0 or self._sweep_entries() >= SWEEPS_AT_ONCE:
            return
        if self._refine_due.get(name):
            self._refine_due[name] = False
            self._next_slice(name, eng)
        elif (
            name not in self._dyadic_pending
            and not eng.dyadic_sweep_backlog  # (the last sweep's labels are learned)
            and self.dyadic_ready()
            and eng.wants_dyadic_sweep()
        ):
            self._dyadic_pending.add(name)
            self.store.append(name, "dyadic", b"{}")
            self._sweeping.add(name)

    def _next_slice(self, name: str, eng: ProjectEngine) -> None:
        """Log the next slice of the project's refinement sweep (the first of a new one if
        none is in progress), once the one before is applied and no other project sweeps."""
        if self.refine_passes <= 0 or name in self._slice_pending:
            return
        if self._sweep_entries() >= SWEEPS_AT_ONCE or self._turn_of_another(name):
            return
        cut = eng.next_sweep_slice(self.refine_passes, SWEEP_SLICE)
        self.store.append(name, "refine", orjson.dumps(cut.to_dict()))
        self._slice_pending.add(name)
        self._sweeping.add(name)
        self._turns[name] = self._turn = self._turn + 1

    def _sweep_entries(self) -> int:
        """Sweep entries logged and not applied yet, over all the projects."""
        return len(self._slice_pending) + len(self._dyadic_pending)

    def _turn_of_another(self, name: str) -> bool:
        """Another project mid-sweep had its last slice before this one's: it goes first."""
        mine = self._turns.get(name, 0)
        return any(self._turns.get(other, 0) < mine for other in self._sweeping if other != name)

    def sweeps_pending(self) -> bool:
        """Idle sweeps still to come or logged and not applied yet (what ``run_until_idle``
        waits for)."""
        if self.refine_passes <= 0:
            return False
        return (
            bool(self._sweeping)
            or any(self._refine_due.values())
            or any(e.sweep is not None for e in self.engines.values())
            or any(
                n in self._dyadic_pending or e.wants_dyadic_sweep() for n, e in self.engines.items()
            )
        )

    # ------------------------------------------------------------------ running
    def run_until_idle(self, timeout_s: float = 120.0) -> None:
        """Apply entries, refinement sweeps included, until nothing is left (tests, CLI)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            rewinds = self.rewinds  # a project dropped at a rewind is reloaded at the next step
            applied = self.step()  # (then what it did without an entry)
            busy = applied or self.dyadic_learned or self.queue_slices
            if not busy and self.rewinds == rewinds:
                if not self.sweeps_pending():
                    return
                time.sleep(self.poll_s)
        raise TimeoutError("the engine did not become idle")

    def run_forever(self) -> None:
        if self.pool is not None and self._renewer is None:
            self._renewer = threading.Thread(
                target=self._renew_while_running,
                args=(self.pool.lease_s,),
                name="crowdtally-leases",
                daemon=True,
            )
            self._renewer.start()
        idle_wait, waited = self.poll_s, False
        while not self._stop.is_set():
            try:
                done = self.step()
                self.last_error = self.halted  # (None but after a halt)
                self.store_refused = False
                done += self.dyadic_learned + self.queue_slices
                if done == 0:  # back off while idle (up to 20 ms); an append cuts it short
                    self.store.wait_for_append(idle_wait)
            except Exception as exc:  # keep serving; report in /readyz and the log
                waited, done = self._step_failed(exc, waited), 0
            else:
                waited = False
            idle_wait = min(2 * idle_wait, 0.02) if done == 0 else self.poll_s

    def _step_failed(self, exc: Exception, waited: bool) -> bool:
        """Log a failed step, then wait a second before the next. Waiting for what it needs
        (Redis moving a slot or a primary, a cluster node down, the snapshot database) is one
        line for the whole wait (``waited``: the step before failed so too), a full store one
        line a second, anything else its traceback. Returns whether the step waited."""
        waits, full = self._store_waits(exc), self.store.is_full(exc)
        if waits:
            if not waited:
                log.warning("engine step waits for the store to answer again: %s", exc)
        elif full:
            log.error("engine step failed, tried again in a second: %s", exc)
        else:
            log.exception("engine step failed")
        self.last_error, self.store_refused = repr(exc), waits or full
        self.store.recover()
        self._stop.wait(1.0)
        return waits

    def halt(self, reason: str) -> None:
        """Stop applying for good (another engine applies the projects now): the reason is
        logged and reported as ``/readyz``'s engine error."""
        log.error("%s", reason)
        self.last_error = self.halted = reason
        self._stop.set()

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.run_forever, name="crowdtally-engine", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.release_leases()


def _smooth(averages: dict[str, float], name: str, value: float) -> None:
    """Fold ``value`` into the moving average ``averages[name]`` (the first value as is)."""
    was = averages.get(name)
    averages[name] = value if was is None else 0.7 * was + 0.3 * value


def _dyadic_over(eng: ProjectEngine) -> int:
    """Queued dyadic labels past ``DYADIC_BACKLOG`` (a sweep's left out), learned whatever
    waits (negative: room left)."""
    return eng.dyadic_backlog - eng.dyadic_sweep_backlog - DYADIC_BACKLOG
