"""The served label lists, encoded once per label, are the whole lists as JSON."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.project import ProjectEngine
from app.store.base import LogEntry, ProjectRecord
from core.nominal import NominalConfig

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


@settings(max_examples=40, deadline=None)
@given(entries=st.lists(st.lists(label, min_size=1, max_size=12), min_size=1, max_size=6))
def test_each_served_label_list_is_the_whole_list(
    entries: list[list[tuple[int, str, int, float]]],
) -> None:
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
        served = eng.state_update().items
        for name, blob in served.items():  # every item this entry touched
            item = orjson.loads(blob)
            code = eng.items.code[name]
            assert orjson.dumps(item["labels"]) == full_list(eng, code)
            assert b'"labels":%b,"gold":' % full_list(eng, code) in blob  # the bytes themselves
            assert sorted(map(str, item["labels"])) == sorted(map(str, posted[name]))
    # every item at once, as after a restart (each list already encoded stays as it is)
    everything = np.arange(eng.items_count, dtype=np.int64)
    for name, blob in eng.items_json(everything).items():
        assert orjson.dumps(orjson.loads(blob)["labels"]) == full_list(eng, eng.items.code[name])


def test_a_fresh_engine_encodes_the_restored_labels_whole() -> None:
    """An engine whose labels were appended without a write (a restored snapshot)."""
    eng = ProjectEngine(RECORD)
    body = {"items": ["a", "b", "a"], "workers": ["x", "y", "z"], "labels": [0, 1, 2]}
    eng.apply(LogEntry(1, "labels", orjson.dumps({**body, "weights": None}), b""))
    eng.apply(LogEntry(2, "labels", orjson.dumps({**body, "weights": None}), b""))
    item = orjson.loads(eng.items_json(np.array([0], dtype=np.int64))["a"])
    assert sorted(w for w, _, _ in item["labels"]) == ["x", "x", "z", "z"]
    assert orjson.dumps(item["labels"]) == full_list(eng, 0)
