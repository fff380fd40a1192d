"""One contract, every backend: the embedded store, the real Redis server and a local Redis
Cluster of 6 nodes (bench/local_cluster.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import numpy as np
import orjson
import pytest
import redis

from app.store import redis_store
from app.store.base import (
    EngineBehindError,
    KeyRecord,
    LeaseLostError,
    ProjectExistsError,
    ProjectRecord,
    QueueHead,
    StateUpdate,
    Store,
    UnknownProjectError,
)
from app.store.item_records import ItemWrites, pack, record_table
from app.store.redis_store import RedisStore
from tests.app.conftest import REDIS_URL, STORES, opened_store


@pytest.fixture(params=[*STORES, "cluster"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    yield from opened_store(request.param, tmp_path)


@pytest.fixture(params=[*STORES, "cluster"])
def own_redis_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """As ``store``, with the Redis one on a server of this test process alone: a test that
    flushes Redis's scripts (server-wide) must not take them from the tests beside it."""
    yield from opened_store(request.param, tmp_path, private=True)


def project(name: str = "p") -> ProjectRecord:
    return ProjectRecord(name, ("a", "b"), {"n_classes": 2, "n_worker_slots": 16}, 1.5)


def test_projects_create_read_list_delete(store: Store) -> None:
    store.create_project(project("p"))
    store.create_project(project("q"))
    with pytest.raises(ProjectExistsError):
        store.create_project(project("p"))
    assert store.get_project("p") == project("p")
    assert [r.name for r in store.list_projects()] == ["p", "q"]
    assert store.project_names() == ["p", "q"]
    assert store.delete_project("p")
    assert not store.delete_project("p")
    assert store.get_project("p") is None
    assert [r.name for r in store.list_projects()] == ["q"]
    assert store.project_names() == ["q"]


def test_quiet_logs_are_those_ending_at_the_entry_the_engine_is_at(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.create_project(project("p"))
    store.create_project(project("q"))
    assert store.quiet_logs({}) == set()
    assert store.quiet_logs({"p": (0, None, None), "q": (0, None, None)}) == {"p", "q"}
    store.append("p", "labels", b"{}")
    store.append("p", "labels", b"{}")
    first, last = store.read_log("p", 0, 10)
    heads = {"p": (2, last.token, None), "q": (0, None, None)}
    assert store.quiet_logs(heads) == {"p", "q"}
    assert store.quiet_logs({"p": (1, first.token, None)}) == set()  # entries to read
    assert store.quiet_logs({"p": (0, None, None)}) == set()
    if isinstance(store, RedisStore):  # the checks of its anchored read_log
        assert store.quiet_logs({"p": (2, last.token ^ 4, None)}) == set()  # another entry 2
        assert store.quiet_logs({"p": (2, last.token, 2)}) == set()  # state not served at 2
        monkeypatch.setattr(redis_store, "QUIET_BATCH", 1)  # a script call per project
        assert store.quiet_logs({**heads, "r": (0, None, None)}) == {"p", "q", "r"}


def test_the_catalogue_token_changes_with_the_projects_and_only_with_them(store: Store) -> None:
    seen = [store.catalogue_token()]
    store.create_project(project("p"))
    seen.append(store.catalogue_token())
    store.append("p", "labels", b"{}")
    store.set_project_failed("p", "boom")
    assert store.catalogue_token() == seen[-1]  # the records unchanged: still valid
    with pytest.raises(ProjectExistsError):
        store.create_project(project("p"))
    store.create_project(project("q"))
    seen.append(store.catalogue_token())
    assert not store.delete_project("absent")
    assert store.catalogue_token() == seen[-1]
    assert store.delete_project("p")
    seen.append(store.catalogue_token())
    assert None not in seen[1:] and len(set(seen)) == len(seen), seen


def test_moved_since_names_the_projects_appended_to_since_the_cursor(store: Store) -> None:
    store.create_project(project("p"))
    store.create_project(project("q"))
    cursor, moved = store.moved_since(None)
    assert moved is None  # a first look: anything may have moved
    if not isinstance(store, RedisStore):
        assert store.moved_since(cursor) == (None, None)  # no record kept: always unknown
        return
    assert store.moved_since(cursor) == (cursor, set())  # nothing appended: none moved
    store.append("p", "labels", b"{}")
    cursor, moved = store.moved_since(cursor)
    assert moved is None  # the stream's first records: those before them cannot be told
    store.append("p", "labels", b"{}")
    store.append("q", "labels", b"{}", ["x"])
    store.append("p", "labels", b"{}")
    cursor, moved = store.moved_since(cursor)
    assert moved == {"p", "q"}
    assert store.moved_since(cursor) == (cursor, set())
    store.append("q", "labels", b"{}", ["x"])  # a duplicate still reads as a move (harmless)
    assert store.moved_since(cursor)[1] == {"q"}
    # a cursor older than half of what the stream keeps may have missed trimmed records
    assert store.moved_since("1-0")[1] is None
    store.r.delete(store._moves_key)  # a Redis that lost the stream
    assert store.moved_since(cursor)[1] is None


def test_keys_and_admin_key(store: Store) -> None:
    assert store.admin_key_hash() is None
    assert store.set_admin_key_hash("h-admin")
    assert not store.set_admin_key_hash("h-other")
    assert store.admin_key_hash() == "h-admin"
    assert store.get_key("h-admin") == KeyRecord("h-admin"[:12], "admin", None)
    store.create_project(project("p"))
    store.put_key("h-read", KeyRecord("r", "read", "p"))
    assert store.get_key("h-read") == KeyRecord("r", "read", "p")
    assert store.get_key("nope") is None
    store.delete_project("p")
    assert store.get_key("h-read") is None  # a deleted project's keys go with it


def test_append_positions_and_duplicate_ids(store: Store) -> None:
    store.create_project(project())
    r1 = store.append("p", "labels", b"one", ["a", "b", None])
    assert (r1.position, r1.accepted, r1.duplicates) == (1, 3, 0)
    r2 = store.append("p", "labels", b"two", ["b", "c", "c", None])
    assert (r2.position, r2.accepted, r2.duplicates) == (2, 2, 2)
    r3 = store.append("p", "labels", b"three", ["a", "c"])  # nothing new: no entry
    assert (r3.position, r3.accepted, r3.duplicates) == (2, 0, 2)
    r4 = store.append("p", "refine", b"{}")
    assert r4.position == 3
    assert store.log_end("p") == 3
    entries = store.read_log("p", 0, 10)
    assert [(e.position, e.kind, e.payload, e.keep) for e in entries] == [
        (1, "labels", b"one", b"111"),
        (2, "labels", b"two", b"0101"),
        (3, "refine", b"{}", b""),
    ]
    assert [e.position for e in store.read_log("p", 1, 1)] == [2]
    assert store.read_log("p", 3, 10) == []


def test_a_long_block_keeps_each_new_id_once_wherever_it_repeats(store: Store) -> None:
    """Blocks past the 1,000 ids the Redis script asks and adds at a time: an id seen in an
    earlier block, or earlier in this one (across that cut too), is a repeat; no id, never."""
    store.create_project(project())
    store.append("p", "labels", b"first", [f"old{k}" for k in range(1500)])
    ids: list[str | None] = [f"new{k % 1200}" for k in range(2400)]  # each twice, 1,200 apart
    ids[5] = ids[1999] = None
    ids[10], ids[2300] = "old7", "old1499"  # from the first block
    ids[700] = "ünï ćode ✓"
    result = store.append("p", "labels", b"second", ids)
    seen: set[str] = {f"old{k}" for k in range(1500)}
    keep = []
    for i in ids:
        keep.append(i is None or i not in seen)
        if i is not None:
            seen.add(i)
    assert (result.accepted, result.duplicates) == (sum(keep), len(ids) - sum(keep))
    assert store.read_log("p", 1, 1)[0].keep == b"".join(b"1" if k else b"0" for k in keep)


def test_random_blocks_keep_exactly_the_labels_whose_id_is_new(store: Store) -> None:
    """Blocks of every make-up (all ids new and distinct, the Redis script's short way; some
    seen before; repeats within the block; labels without an id; past the 1,000 cut), each
    against a plain reading of the rule: a label is kept unless its id was seen before."""
    store.create_project(project())
    rng = np.random.default_rng(11)
    seen: set[str] = set()
    fresh = 0
    for n in range(40):
        size = int(rng.choice([1, 7, 999, 1000, 1001, 2300]))
        if n % 3 == 0:  # every id new and distinct
            ids: list[str | None] = [f"f{fresh + k}" for k in range(size)]
            fresh += size
        else:
            pool = int(rng.integers(1, 4 * size + 2))
            ids = [None if rng.random() < 0.1 else f"r{rng.integers(pool)}" for _ in range(size)]
        keep = []
        for i in ids:
            keep.append(i is None or i not in seen)
            if i is not None:
                seen.add(i)
        before = store.log_end("p")
        result = store.append("p", "labels", b"x", ids)
        assert (result.accepted, result.duplicates) == (sum(keep), len(ids) - sum(keep))
        if sum(keep):
            assert store.read_log("p", before, 1)[0].keep == bytes(b"01"[k] for k in keep)
        else:
            assert store.log_end("p") == before


@pytest.mark.parametrize("kind", ["redis", "cluster"])
def test_redis_refuses_an_id_with_a_line_break_whole(kind: str, tmp_path: Path) -> None:
    """The append script reads a block's ids from one text, a line break between them (the
    API refuses control characters in ids): an id that holds one is refused, not split, and
    nothing is appended; labels without an id still count one each."""
    for store in opened_store(kind, tmp_path):
        store.create_project(project())
        with pytest.raises(ValueError, match="line break"):
            store.append("p", "labels", b"x", ["a", "b\nc"])
        assert store.log_end("p") == 0
        assert store.append("p", "labels", b"y", [None, "a", None]).accepted == 3


@pytest.mark.parametrize("kind", ["redis", "cluster"])
def test_a_block_appended_as_its_project_is_deleted_is_refused_and_dropped(
    kind: str, tmp_path: Path
) -> None:
    """A deletion under way (the record gone, the keys not yet) when a block is appended: the
    append answers UnknownProjectError and drops what it wrote, which a project created later
    under the name would else read."""
    for store in opened_store(kind, tmp_path):
        assert isinstance(store, RedisStore)
        store.create_project(project())
        store.append("p", "labels", b"before", ["a"])
        store.r.hdel(store._projects_key, "p")
        with pytest.raises(UnknownProjectError):
            store.append("p", "labels", b"during", ["b"])
        store.create_project(project())
        store.open_logs(["p"])
        assert store.read_log("p", 0, 10) == []
        assert store.append("p", "labels", b"again", ["a", "b"]).accepted == 2


def test_ids_are_per_project(store: Store) -> None:
    store.create_project(project("p"))
    store.create_project(project("q"))
    store.append("p", "labels", b"x", ["same"])
    assert store.append("q", "labels", b"x", ["same"]).accepted == 1


def writes(
    names: list[str],
    texts: list[bytes],
    position: int = 1,
    written: dict[str, bytearray] | None = None,
) -> ItemWrites:
    """Items whose posterior is (i, 1 - i) / 1000 for item ``i``, their label lists' texts
    (``written``: the writer's lists, kept from one write to the next)."""
    i = np.array([int(n.split()[1].split("/")[0]) for n in names], dtype=np.float64)
    posterior = np.stack([i / 1000, 1 - i / 1000], axis=1)
    gold = np.where(i % 2 == 0, -1, 1)
    records = pack(
        posterior,
        i / 10,
        gold,
        np.zeros_like(posterior),
        position,
        1.5,
        np.ones(i.size, np.int64),
        np.ones(i.size),
    )
    return ItemWrites(names, records, texts, {} if written is None else written)


def item_dict(i: int, labels: list[object], position: int = 1) -> dict[str, object]:
    return {
        "posterior": [i / 1000, 1 - i / 1000], "clarity": i / 10, "labels": labels,
        "gold": None if i % 2 == 0 else 1, "held_out": None, "position": position,
        "computed_at": 1.5,
    }  # fmt: skip


def test_served_state(store: Store) -> None:
    store.create_project(project())
    assert store.applied_position("p") == 0
    assert store.get_params("p", [3]) == (None, [None])
    names = [f"item {i}/é" for i in range(250)]
    texts = [b'[["w",%d,1.0]' % i if i % 3 else b"[" for i in range(250)]
    store.write_state("p", StateUpdate(7, b"g1", {3: b"row3"}, writes(names, texts), {"w": b"ws"}))
    store.write_state("p", StateUpdate(8, b"g2", {5: b"row5"}, ItemWrites(), {}))
    assert store.applied_position("p") == 8
    assert store.get_params("p", [3, 4, 5]) == (b"g2", [b"row3", None, b"row5"])
    assert store.get_item("p", "item 7/é") == orjson.dumps(item_dict(7, [["w", 7, 1.0]]))
    assert store.get_item("p", "item 3/é") == orjson.dumps(item_dict(3, []))
    assert store.get_item("p", "missing") is None
    assert store.get_worker("p", "w") == b"ws"
    assert store.all_workers("p") == [("w", b"ws")]
    seen: dict[str, bytes] = {}
    cursor = 0
    while True:
        cursor, page = store.scan_items("p", cursor, 40)
        for k, v in page:
            seen.setdefault(k, v)
        if cursor == 0:
            break
    assert seen == dict(zip(names, store.get_items("p", names), strict=True))
    assert orjson.loads(seen["item 4/é"]) == item_dict(4, [["w", 4, 1.0]])
    records: dict[str, bytes] = {}
    cursor = 0
    while True:  # the same pages as packed records alone
        cursor, page_names, page_records = store.scan_records("p", cursor, 40)
        records.update(zip(page_names, page_records, strict=True))
        if cursor == 0:
            break
    assert sorted(records) == sorted(names)
    table = record_table([records[n] for n in names])
    assert table is not None
    assert table["posterior"][:, 0].tolist() == [i / 1000 for i in range(250)]
    assert table["position"].tolist() == [1] * 250  # (as ``writes`` packs them)


def test_label_lists_grow_by_what_each_write_brings(store: Store) -> None:
    """A text that starts with ``[`` replaces an item's list, a comma one adds rows, an empty
    one leaves it; the item's record is replaced by each write."""
    store.create_project(project())
    names, sent = ["item 1", "item 2", "item 3"], dict[str, bytearray]()
    first = [b'[["a",0,1.0]', b"[", b'[["d",0,1.0]']
    store.write_state("p", StateUpdate(1, b"g", items=writes(names, first, 1, sent)))
    more = [b',["b",1,0.5]', b'[["c",1,1.0]', b',["e",1,1.0],["f",0,1.0]']
    store.write_state("p", StateUpdate(2, b"g", items=writes(names, more, 2, sent)))
    store.write_state("p", StateUpdate(3, b"g", items=writes(names[:1], [b""], 3, sent)))
    assert store.get_items("p", [*names, "item 4"]) == [
        orjson.dumps(item_dict(1, [["a", 0, 1.0], ["b", 1, 0.5]], 3)),
        orjson.dumps(item_dict(2, [["c", 1, 1.0]], 2)),
        orjson.dumps(item_dict(3, [["d", 0, 1.0], ["e", 1, 1.0], ["f", 0, 1.0]], 2)),
        None,
    ]


def test_progress_of_many_projects_is_what_each_read_gives(store: Store) -> None:
    store.create_project(project("p"))
    store.create_project(project("q"))
    for _ in range(3):
        store.append("p", "labels", b"{}")
    items = writes(["item 1"], [b"["])
    store.write_state("p", StateUpdate(2, b"g2", {}, items, {}, queue={"i": 0.5}))
    got = store.progress(["p", "q", "absent"])
    assert sorted(got) == ["p", "q"]  # an unknown project is left out
    for name, p in got.items():
        assert (p.log_end, p.applied) == (store.log_end(name), store.applied_position(name))
        assert (p.queue_size, p.globals) == (store.queue_size(name), store.get_params(name, [])[0])
        assert abs(p.lag_s - store.lag_seconds(name)) < 1.0
    assert (got["p"].log_end, got["p"].applied, got["p"].queue_size) == (3, 2, 1)
    assert got["p"].globals == b"g2" and got["q"].globals is None
    assert store.progress([]) == {}
    assert store.positions(["p", "q", "absent"]) == {"p": (3, 2), "q": (0, 0)}
    assert store.positions([]) == {}


def test_queue_orders_ties_by_member_descending_and_can_be_replaced(store: Store) -> None:
    store.create_project(project())
    store.write_state("p", StateUpdate(1, b"g", queue={"b": 0.5, "c": 0.5, "a": 0.9, "d": 0.1}))
    assert store.read_queue("p", 3) == [("a", 0.9), ("c", 0.5), ("b", 0.5)]
    store.write_state("p", StateUpdate(2, b"g", queue={"e": 0.2}, queue_remove=["a"]))
    assert [m for m, _ in store.read_queue("p", 10)] == ["c", "b", "e", "d"]
    store.write_state("p", StateUpdate(3, b"g", queue={"x": 0.3, "y": 0.4}, queue_replace=True))
    assert store.read_queue("p", 10) == [("y", 0.4), ("x", 0.3)]
    assert store.queue_size("p") == 2
    store.write_state("p", StateUpdate(4, b"g", queue_replace=True))  # nothing queued
    assert store.read_queue("p", 10) == [] and store.queue_size("p") == 0


def test_queue_head_is_the_queue_its_size_parameters_and_settings_of_one_write(
    store: Store,
) -> None:
    store.create_project(project())
    assert store.queue_head("p", 2) == QueueHead([], 0, None, None)
    queue = {"b": 0.5, "c": 0.5, "a": 0.9}
    store.write_state("p", StateUpdate(1, b"g1", queue=queue, queue_settings=b'{"policy":"voi"}'))
    head = store.queue_head("p", 2)
    assert head == QueueHead([("a", 0.9), ("c", 0.5)], 3, b"g1", b'{"policy":"voi"}')
    assert head.top == store.read_queue("p", 2) and head.size == store.queue_size("p")
    store.write_state("p", StateUpdate(2, b"g2", queue={"d": 1.0}, queue_remove=["a", "b"]))
    assert store.queue_head("p", 5) == QueueHead(
        [("d", 1.0), ("c", 0.5)], 2, b"g2", b'{"policy":"voi"}'
    )
    assert store.queue_head("absent", 5) == QueueHead([], 0, None, None)


def test_delete_project_drops_log_and_state(store: Store) -> None:
    store.create_project(project())
    store.append("p", "labels", b"x", ["id1"])
    store.write_state("p", StateUpdate(1, b"g", {1: b"r"}, writes(["item 1"], [b"["]), {}))
    store.delete_project("p")
    store.create_project(project())
    assert store.log_end("p") == 0
    assert store.read_log("p", 0, 10) == []
    assert store.get_item("p", "item 1") is None
    assert store.append("p", "labels", b"x", ["id1"]).accepted == 1  # ids forgotten too


def test_state_of_a_deleted_project_is_not_written(store: Store) -> None:
    store.create_project(project())
    store.delete_project("p")
    store.write_state("p", StateUpdate(1, b"g", {}, writes(["item 1"], [b"["]), {}))
    assert store.get_item("p", "item 1") is None


def test_state_of_a_project_deleted_after_its_read_is_not_written(store: Store) -> None:
    """An engine's write anchored on the entry it read, after the project was deleted: nothing
    written, no error (the engine drops the project at its next step)."""
    store.create_project(project())
    store.append("p", "labels", b"{}", None)
    token = store.read_log("p", 0, 1)[0].token
    store.delete_project("p")
    update = StateUpdate(1, b"g", {}, writes(["item 1"], [b"["]), {})
    update.anchor, update.served = token, 0
    store.write_state("p", update)
    assert store.get_item("p", "item 1") is None
    assert store.get_project("p") is None


def test_lag_counts_the_wait_the_engine_s_pace_projects(store: Store) -> None:
    """The lag is the oldest waiting entry's age, or the time the entries waiting will take at
    the engine's recent pace (``entry_s``), whichever is longer: a backlog admitted in a
    burst is refused once it would take longer than the bound to apply, however fresh."""
    store.create_project(project())
    for n in range(3):
        store.append("p", "labels", orjson.dumps({"n": n}), None)
    store.write_state("p", StateUpdate(1, b"g", entry_s=0.5))
    assert store.lag_seconds("p") == pytest.approx(1.0, abs=0.05)  # 2 waiting x 0.5 s
    for n in range(9):  # taken while the 2-10 waiting would take at most 5 s
        store.append("p", "labels", orjson.dumps({"n": n}), None, max_lag_s=5.0)
    assert store.lag_seconds("p") == pytest.approx(5.5, abs=0.05)  # 11 waiting: over 5 s
    with pytest.raises(EngineBehindError):
        store.append("p", "labels", b"{}", None, max_lag_s=5.0)
    store.write_state("p", StateUpdate(12, b"g"))  # (entry_s None: the pace is kept)
    assert store.lag_seconds("p") == 0


def test_lag_adds_the_engine_s_step_while_entries_wait(store: Store) -> None:
    """An entry appended now waits for the step under way and then for the step it joins,
    which holds the entries appended meanwhile: the projected wait adds the engine's recent
    step (``step_s``) while entries wait, and none once it has applied them all."""
    store.create_project(project())
    for n in range(3):
        store.append("p", "labels", orjson.dumps({"n": n}), None)
    store.write_state("p", StateUpdate(1, b"g", entry_s=0.5, step_s=2.0))
    assert store.lag_seconds("p") == pytest.approx(3.0, abs=0.05)  # 2 x 0.5 s, then 2 s
    taken = 0
    with pytest.raises(EngineBehindError):
        for n in range(20):
            store.append("p", "labels", orjson.dumps({"n": n}), None, max_lag_s=4.5)
            taken += 1
    assert taken == 4  # while 2-5 waiting + the step project at most 4.5 s (without it: 8)
    store.write_state("p", StateUpdate(store.log_end("p"), b"g"))  # (pace and step kept)
    assert store.lag_seconds("p") == 0


def test_an_append_ends_the_idle_engine_s_wait(store: Store) -> None:
    """The engine, idle, waits on the store: an append (from any thread or process) ends the
    wait at once; without one it lasts its timeout."""
    store.create_project(project())
    store.wait_for_append(0.01)  # (a notice left from earlier appends, if any)
    t0 = time.monotonic()
    store.wait_for_append(0.2)
    assert time.monotonic() - t0 >= 0.15  # nothing appended: the whole timeout

    def append_soon() -> None:
        time.sleep(0.05)
        store.append("p", "labels", b"{}")

    poster = threading.Thread(target=append_soon)
    t0 = time.monotonic()
    poster.start()
    store.wait_for_append(5.0)
    waited = time.monotonic() - t0
    poster.join()
    assert 0.04 <= waited < 1.0, waited


def test_append_after_redis_lost_its_scripts(own_redis_store: Store) -> None:
    """A restarted Redis has no scripts: the append loads its own and goes on."""
    store = own_redis_store
    store.create_project(project())
    with closing(redis.Redis.from_url(REDIS_URL)) as shared:
        sentinel = shared.script_load("return 1")
        if isinstance(store, RedisStore):
            store.r.script_flush()
        assert shared.script_exists(sentinel) == [True]  # the other workers' server untouched
    assert store.append("p", "labels", b"{}", ["x"]).accepted == 1
    assert store.append("p", "labels", b"{}", ["x"]).duplicates == 1


def test_pipelined_reads_survive_redis_losing_its_scripts(own_redis_store: Store) -> None:
    """The engine's look at the logs and the stats send their scripts by hash: scripts lost
    (a restart, a failover) are loaded and the reads sent again, not failed."""
    store = own_redis_store
    store.create_project(project())
    store.append("p", "labels", b"{}")
    (entry,) = store.read_log("p", 0, 10)
    if isinstance(store, RedisStore):
        store.r.script_flush()
    assert store.quiet_logs({"p": (1, entry.token, None)}) == {"p"}
    if isinstance(store, RedisStore):
        store.r.script_flush()
    assert store.progress(["p"])["p"].log_end == 1


def test_one_engine_of_a_pool_holds_a_project_and_only_its_writes_land(store: Store) -> None:
    """A lease per project with a fencing token: renewed by its holder, taken by another
    engine once it lapses (or is given up), and a write with an old token refused."""
    store.create_project(project())
    a = store.acquire_lease("p", "A", 0.3)
    assert a > 0 and store.acquire_lease("p", "B", 0.3) == 0
    assert store.acquire_lease("p", "A", 0.3) == a  # renewed: the same token
    store.write_state("p", StateUpdate(1, b"g1", fence=a))
    time.sleep(0.4)  # A paused past its lease
    b = store.acquire_lease("p", "B", 5.0)
    assert b > a
    with pytest.raises(LeaseLostError):  # A's late write
        store.write_state("p", StateUpdate(2, b"late", fence=a))
    assert store.applied_position("p") == 1 and store.get_params("p", [])[0] == b"g1"
    store.write_state("p", StateUpdate(2, b"g2", fence=b))
    store.release_lease("p", "A")  # not A's: nothing happens
    assert store.acquire_lease("p", "A", 5.0) == 0
    store.release_lease("p", "B")
    assert store.acquire_lease("p", "A", 5.0) > b
    assert store.engines_alive("A", 5.0) == ["A"]
    assert store.engines_alive("B", 5.0) == ["A", "B"]
    time.sleep(0.3)
    assert store.engines_alive("B", 0.2) == ["B"]  # A silent for longer than that


def test_pool_load_records_are_shared_changed_and_forgotten(store: Store) -> None:
    assert store.record_loads({}) == {}
    seen = store.record_loads({"p": ("A", 1500.5), "q": ("", -1.0)})
    assert seen == {"p": ("A", 1500.5), "q": ("", -1.0)}
    seen = store.record_loads({"p": ("B", 20.0), "q": None})  # taken over; q deleted
    assert seen == {"p": ("B", 20.0)}
    assert store.record_loads({"gone": None}) == {"p": ("B", 20.0)}
    assert store.record_loads({"r": ("C", 3.0), "p": None}, read=False) == {}  # written only
    assert store.record_loads({}) == {"r": ("C", 3.0)}
