"""The served label lists, sent to the store as the labels that came since the engine's last
write and appended there, are the whole lists as JSON, through either store."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterator

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.loop import EngineLoop
from app.engine.project import ProjectEngine
from app.store.base import LogEntry, ProjectRecord, Store
from app.store.item_records import ItemWrites, grow_lists
from core.nominal import NominalConfig
from tests.app.conftest import opened_store

CLASSES = tuple("abcdefghijkl")  # (two-digit class codes too)
RECORD = ProjectRecord("p", CLASSES, NominalConfig(n_classes=12).to_dict(), 1.0)
WORKERS = ["ann", 'q"uote', "back\\slash", "émile", "w4", "w5"]

label = st.tuples(
    st.integers(0, 7),  # item
    st.sampled_from(WORKERS),
    st.integers(0, 11),
    st.one_of(
        st.sampled_from([1.0, 0.5, 2.25]),
        st.floats(0.0, 1e22, allow_nan=False, allow_infinity=False),
    ),
)


def full_list(eng: ProjectEngine, code: int) -> bytes:
    """The item's label list encoded whole, from the engine's stored labels."""
    _, pos = eng.labels.gather(np.array([code]))
    L = eng.labels
    return orjson.dumps(
        [
            [eng.workers.names[w], z, x]
            for w, z, x in zip(
                L.worker[pos].tolist(), L.label[pos].tolist(), L.weight[pos].tolist(), strict=True
            )
        ]
    )


NAMES = (f"p{n}" for n in itertools.count())


@pytest.fixture(scope="module", params=["embedded", "redis"])
def module_store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Store]:
    yield from opened_store(request.param, tmp_path_factory.mktemp("store"))


def served(store: Store, project: str, eng: ProjectEngine, code: int) -> dict[str, object]:
    blob = store.get_item(project, eng.items.names[code])
    assert blob is not None
    assert b'"labels":%b,"gold":' % full_list(eng, code) in blob  # the bytes themselves
    item: dict[str, object] = orjson.loads(blob)
    return item


@settings(max_examples=25, deadline=None)
@given(
    entries=st.lists(st.lists(label, min_size=1, max_size=12), min_size=1, max_size=6),
    restart=st.integers(0, 6),
)
def test_each_served_label_list_is_the_whole_list(
    module_store: Store, entries: list[list[tuple[int, str, int, float]]], restart: int
) -> None:
    project = next(NAMES)
    module_store.create_project(ProjectRecord(project, CLASSES, RECORD.config, 1.0))
    eng = ProjectEngine(RECORD)
    posted: dict[str, list[list[object]]] = defaultdict(list)
    for position, entry in enumerate(entries, start=1):
        body = {
            "items": [f"i{i}" for i, _, _, _ in entry],
            "workers": [w for _, w, _, _ in entry],
            "labels": [z for _, _, z, _ in entry],
            "weights": [x for _, _, _, x in entry],
        }
        for i, w, z, x in entry:
            posted[f"i{i}"].append([w, z, x])
        eng.apply(LogEntry(position, "labels", orjson.dumps(body), b""))
        update = eng.state_update()
        if position == restart:  # a write that failed: the next one carries it all
            eng.not_written()
            continue
        module_store.write_state(project, update)
        for name in update.items.names:  # every item this entry touched
            item = served(module_store, project, eng, eng.items.code[name])
            assert sorted(map(str, item["labels"])) == sorted(map(str, posted[name]))  # type: ignore[call-overload]
    module_store.write_state(project, eng.state_update())  # (after a last write that failed)
    for code in range(eng.items_count):  # (written or not in the last step)
        want = orjson.loads(eng.item_json(code))["labels"]
        assert served(module_store, project, eng, code)["labels"] == want


def test_a_fresh_engine_encodes_the_restored_labels_whole() -> None:
    """An engine whose labels were appended without a write (a restored snapshot)."""
    eng = ProjectEngine(RECORD)
    body = {"items": ["a", "b", "a"], "workers": ["x", "y", "z"], "labels": [0, 1, 2]}
    eng.apply(LogEntry(1, "labels", orjson.dumps({**body, "weights": None}), b""))
    eng.apply(LogEntry(2, "labels", orjson.dumps({**body, "weights": None}), b""))
    item = orjson.loads(eng.item_json(0))
    assert sorted(w for w, _, _ in item["labels"]) == ["x", "x", "z", "z"]
    assert orjson.dumps(item["labels"]) == full_list(eng, 0)
    (text,) = eng.item_writes(np.array([0], dtype=np.int64)).labels
    assert text == full_list(eng, 0)[:-1]  # the whole list, open: it replaces a stored one


class Unreachable:
    """The store, unreachable for the ``fail``-th state write (and its ping)."""

    def __init__(self, store: Store, fail: int) -> None:
        self._store, self._fail, self.writes, self.down = store, fail, 0, False

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def write_state(self, project: str, update: object) -> None:
        self.writes += 1
        self.down = self.writes == self._fail
        if self.down:
            raise ConnectionError("the store went away")
        self._store.write_state(project, update)  # type: ignore[arg-type]

    def ping(self) -> bool:
        return not self.down and self._store.ping()


def test_after_a_write_lost_with_the_store_every_item_is_served_whole(store: Store) -> None:
    """The engine outlives a store that was unreachable during its write (the step fails);
    the write after carries every item, each label list whole, so what the lost write held
    is served too."""
    store.create_project(RECORD)
    flaky = Unreachable(store, fail=2)
    loop = EngineLoop(flaky, refine_passes=0)  # type: ignore[arg-type]
    body = {"items": ["a", "b"], "workers": ["x", "y"], "labels": [0, 1], "weights": None}
    for items in (["a", "b"], ["a", "c"], ["d", "b"]):
        store.append("p", "labels", orjson.dumps({**body, "items": items}))
        if flaky.writes + 1 == flaky._fail:
            with pytest.raises(ConnectionError):
                loop.step()
        else:
            loop.step()
    eng = loop.engines["p"]
    names = list(eng.items.names)
    assert names == ["a", "b", "c", "d"]
    served = store.get_items("p", names)
    assert served == [eng.item_json(code) for code in range(len(names))]


def test_an_engine_that_replays_up_to_the_served_state_adds_no_label_twice(store: Store) -> None:
    """A new engine replays the log silently up to the state another one served, then writes
    over it: each item's list is the whole list, once."""
    store.create_project(RECORD)
    body = {"workers": ["x", "y"], "labels": [0, 1], "weights": None}
    for n in range(3):
        store.append("p", "labels", orjson.dumps({**body, "items": ["a", f"b{n}"]}))
    EngineLoop(store, refine_passes=0).step()
    assert store.applied_position("p") == 3
    store.append("p", "labels", orjson.dumps({**body, "items": ["a", "c"]}))
    again = EngineLoop(store, batch_entries=2, refine_passes=0)
    positions = []
    while store.applied_position("p") < 4:
        again.step()
        positions.append(again.engines["p"].position)
    assert positions[0] < 3  # (replayed without a write, then written again from the state)
    eng = again.engines["p"]
    served = orjson.loads(store.get_item("p", "a") or b"null")["labels"]
    assert served == orjson.loads(eng.item_json(eng.items.code["a"]))["labels"]
    assert len(served) == 4


def test_growing_the_stored_lists_replaces_appends_and_refuses_a_list_never_written() -> None:
    lists = {"a": bytearray(b'[{"w":1}'), "b": bytearray(b"[")}
    texts = [b',{"w":2}', b'[{"w":3}', b"", b"", b'[{"w":4}']
    grow_lists(lists, ItemWrites(["a", "b", "c", "a", "d"], [b""] * 5, texts))
    assert lists == {"a": b'[{"w":1},{"w":2}', "b": b'[{"w":3}', "d": b'[{"w":4}'}
    grow_lists(lists, ItemWrites(["d"], [b""], [bytearray(b',{"w":5}')]))
    assert lists["d"] == b'[{"w":4},{"w":5}'
    with pytest.raises(LookupError, match="item 'e': labels added to a list that was never"):
        grow_lists(lists, ItemWrites(["a", "e"], [b"", b""], [b',{"w":6}', b',{"w":7}']))
    assert lists["a"] == b'[{"w":1},{"w":2}'  # (nothing of the refused write applied)


_TEXTS = st.sampled_from([b"", b',{"w":1}', b',{"w":22}', b'[{"w":3}', b'[{"w":4},{"w":5}'])


@settings(max_examples=200, deadline=None)
@given(
    start=st.dictionaries(st.sampled_from("abc"), st.binary(max_size=8).map(bytearray)),
    writes=st.lists(st.tuples(st.sampled_from("abcd"), _TEXTS), max_size=12),
)
def test_undoing_a_growth_gives_back_the_lists_as_they_were(
    start: dict[str, bytearray], writes: list[tuple[str, bytes]]
) -> None:
    """A write the store refused: its growth of the engine's copy of the stored lists undone,
    whatever it held (an item appended to, made whole, both, in either order, or new), so the
    same write can be sent again."""
    names = [n for n, _ in writes]
    texts = [t for _, t in writes]
    lists = {k: bytearray(v) for k, v in start.items()}
    try:
        undo = grow_lists(lists, ItemWrites(names, [b""] * len(names), texts))
    except LookupError:
        assert lists == start  # (refused in the middle: nothing applied)
        return
    undo()
    assert lists == start
