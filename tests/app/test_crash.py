"""Crash safety: SIGKILL the engine 10 times while it applies 25,000 labels being posted (on
each snapshot database); SIGKILL the API."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import orjson
import pytest

from app.engine.project import ProjectEngine
from app.store.archive import SnapshotDB
from app.store.base import LogEntry
from app.store.redis_store import RedisStore
from app.store.sql import sql_engine
from tests.app.conftest import REDIS_URL
from tests.app.test_processes import Layout
from tests.conftest import dawid_skene

LABELS = ["a", "b", "c", "d", "e"]
# The dyadic model's passes over each label (the first as labels arrive, then idle sweeps):
# a few sweeps check that they replay bit for bit as well as the default 30 would.
DYADIC_PASSES = 4
# Each kill comes 0-0.2 s after the restarted engine applied its first entry. (Kills on a
# timer, every 0.2-1.2 s, all but the first hit an engine still starting: restoring its
# snapshot takes 1.7-4.5 s, as the project grows.)
KILLS = 10


def blocks_of(n_items: int, seed: int, size: int = 1000) -> list[bytes]:
    data = dawid_skene(n_items=n_items, n_workers=300, per_item=5, n_classes=5, seed=seed)
    order = np.random.default_rng(seed).permutation(data.items.size)
    rows = [
        {
            "item": f"i{data.items[n]}",
            "worker": f"w{data.workers[n]}",
            "label": LABELS[data.labels[n]],
            "id": f"L{n}",
        }
        for n in order.tolist()
    ]
    return [orjson.dumps(rows[lo : lo + size]) for lo in range(0, len(rows), size)]


def post_acknowledged(
    lay: Layout, body: bytes, key: dict[str, str], timeout_s: float = 120
) -> dict[str, int]:
    """POST a block as a client should: sent again after ``Retry-After`` while the engine is
    behind (429 ``engine_behind``: nothing of it was appended), until it is acknowledged."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = lay.client.post("/v1/projects/p/labels", content=body, headers=key)
        if r.status_code != 429 or time.monotonic() > deadline:
            assert r.status_code == 202, r.text
            out: dict[str, int] = r.json()
            return out
        time.sleep(min(float(r.headers.get("Retry-After", "1")), 1.0))


def wait_caught_up(lay: Layout, key: dict[str, str], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while lay.client.get("/v1/projects/p", headers=key).json()["stats"]["lag"]:
        assert time.monotonic() < deadline, "the engine did not catch up"
        time.sleep(0.1)


def whole_log(store: RedisStore, db: SnapshotDB) -> list[LogEntry]:
    """Every entry: the live log read first, then the archive (a snapshot being written may
    archive and trim in between; this order sees each entry at least once)."""
    live = store.read_log("p", 0, 10**7)
    by_position = {e.position: e for e in db.read_archive("p", 0, 10**7)}
    by_position.update((e.position, e) for e in live)
    return [by_position[p] for p in sorted(by_position)]


def replay(store: RedisStore, db: SnapshotDB) -> ProjectEngine:
    """A run without kills: a fresh engine over the whole log."""
    eng = ProjectEngine(store.get_project("p"))  # type: ignore[arg-type]
    log = whole_log(store, db)
    assert [e.position for e in log] == list(range(1, store.log_end("p") + 1))
    eng.apply_all(log)
    return eng


def same_dyadic_rows(store: RedisStore, reference: ProjectEngine) -> None:
    """The dyadic rows served, once the model learned every label (it follows the
    posteriors), are those of a run without kills, bit for bit."""
    assert reference.dyadic is not None
    reference.mark_all_dirty()
    want = reference.dyadic.update(reference.position)
    deadline = time.monotonic() + 30
    while store.get_dyadic("p", [], [])[0] < reference.position:
        assert time.monotonic() < deadline, "the dyadic model did not catch up"
        time.sleep(0.05)
    position, shared, raters, tasks = store.get_dyadic("p", list(want.raters), list(want.tasks))
    assert position == reference.position and shared == want.shared
    assert raters == list(want.raters.values()) and tasks == list(want.tasks.values())


@pytest.mark.slow
def test_engine_sigkilled_mid_work_10_times_loses_nothing(tmp_path: Path, sql_url: str) -> None:
    lay = Layout(
        tmp_path,
        CROWDTALLY_DATABASE_URL=sql_url,
        CROWDTALLY_SNAPSHOT_INTERVAL_S="0.5",
        CROWDTALLY_REFINE_PASSES="1",
        CROWDTALLY_REFINE_IDLE_S="0.3",
        # no push-back: the engine is down most of the time, and the poster (which does not
        # retry) must go on posting through the kills
        CROWDTALLY_MAX_LAG_S="0",
    )
    try:
        lay.wait_ready()
        project = {"name": "p", "labels": LABELS, "dyadic": {"passes": DYADIC_PASSES}}
        key = {
            "Authorization": f"Bearer {lay.client.post('/v1/projects', json=project).json()['api_key']}"
        }
        blocks = blocks_of(5_000, seed=5, size=125)  # 25,000 labels in 200 entries
        acked = 0
        kills = 0

        per_kill = len(blocks) // (KILLS + 1)

        def post() -> None:
            nonlocal acked
            for n, body in enumerate(blocks):
                while kills < KILLS and n >= (kills + 1) * per_kill:
                    time.sleep(0.05)  # no further ahead of the kills: each has entries to apply
                acked += post_acknowledged(lay, body, key)["accepted"]
                if kills < KILLS:  # new entries all through the kills
                    time.sleep(0.16)

        def applied() -> int:
            return int(lay.client.get("/v1/projects/p", headers=key).json()["stats"]["applied"])

        poster = threading.Thread(target=post)
        poster.start()
        rng = np.random.default_rng(11)
        while kills < KILLS:  # each kill lands while the engine applies entries
            before, started = applied(), time.monotonic()
            while applied() == before:
                assert time.monotonic() - started < 60, "the restarted engine applied nothing"
                time.sleep(0.05)
            time.sleep(float(rng.uniform(0.0, 0.2)))
            lay.kill_engine()
            lay.start_engine()
            kills += 1
        poster.join()
        assert acked == 25_000
        # The idle sweeps: refinement, then the dyadic passes. Sweeps also run in the gaps while
        # the poster waits on the kills, over the labels then stored, so the average number of
        # passes may end above DYADIC_PASSES; the engine is done once it has at least that many
        # and its log stays still for longer than the refinement's idle wait.
        deadline, still = time.monotonic() + 180, None
        while True:
            stats = lay.client.get("/v1/projects/p", headers=key).json()["stats"]
            done = stats["dyadic_passes"] >= DYADIC_PASSES and not stats["lag"]
            if done and stats["log_end"] == still:
                break
            still = stats["log_end"] if done else None
            assert time.monotonic() < deadline, stats
            time.sleep(1.5)

        store = RedisStore(REDIS_URL, lay.prefix)
        db = SnapshotDB(sql_engine(sql_url), lay.prefix)
        try:
            # Killed 0-0.2 s after it starts applying, an engine rarely finishes a snapshot
            # (each restart then replays more of the log): the last one writes it once idle.
            deadline = time.monotonic() + 60
            while not db.infos("p"):
                assert time.monotonic() < deadline, "no snapshot was written"
                time.sleep(0.1)
            reference = replay(store, db)
            assert reference.labels.n_labels == 25_000  # every acknowledged label, once
            served = dict(store.scan_items("p", 0, 10**7)[1])
            assert len(served) == reference.items_count == 5_000
            for name, code in reference.items.code.items():
                item = orjson.loads(served[name])
                assert item["posterior"] == reference.shown(np.array([code]))[0].tolist(), (
                    name
                )  # bit-identical
            stats = lay.client.get("/v1/projects/p", headers=key).json()["stats"]
            assert stats["n_labels"] == 25_000
            same_dyadic_rows(store, reference)
        finally:
            db.close()
            store.close()
    finally:
        lay.close()


@pytest.mark.slow
def test_api_sigkilled_mid_request_then_retried(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    try:
        lay.wait_ready()
        key = {
            "Authorization": f"Bearer {lay.client.post('/v1/projects', json={'name': 'p', 'labels': LABELS}).json()['api_key']}"
        }
        blocks = blocks_of(4000, seed=6)  # 20 blocks of 1,000
        results: list[int] = []

        def post() -> None:
            for body in blocks:
                try:
                    results.append(post_acknowledged(lay, body, key)["accepted"])
                except Exception:  # the API died under this request
                    return

        poster = threading.Thread(target=post)
        poster.start()
        time.sleep(0.15)
        lay.api.kill()
        lay.api.wait()
        poster.join()
        lay.api = lay._spawn("serve", "--no-engine", "--port", str(lay.client.base_url.port))
        lay.wait_ready()
        # The client retries everything it did not see acknowledged (and, to be safe, all).
        retried = [post_acknowledged(lay, b, key) for b in blocks]
        new = sum(r["accepted"] for r in retried)
        assert new + sum(r["duplicates"] for r in retried) == 20_000
        # A block whose answer was lost with the API may or may not have been logged; either
        # way its labels are in the log exactly once (checked on the state below).
        assert sum(results) + new <= 20_000
        wait_caught_up(lay, key)
        assert lay.client.get("/v1/projects/p", headers=key).json()["stats"]["n_labels"] == 20_000
    finally:
        lay.close()
