"""to_pandas() has crowd-kit 1.4.2's shapes (DawidSkene().fit(df).probas_ / labels_ / errors_)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import numpy as np
import pytest
from crowdtally_client import AsyncClient, Client

CLASSES = ["neg", "neu", "pos"]

if TYPE_CHECKING:
    from conftest import LiveServer


def synthetic(seed: int = 3) -> list[tuple[str, str, str]]:
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, 3, size=60)
    skill = rng.uniform(0.6, 0.95, size=8)
    out = []
    for i, z in enumerate(truth):
        for w in rng.choice(8, size=5, replace=False):
            answer = z if rng.random() < skill[w] else rng.integers(0, 3)
            out.append((f"task{i:02d}", f"worker{w}", CLASSES[answer]))
    return out


def test_to_pandas_matches_crowdkit_shapes(live_server: LiveServer) -> None:
    import crowdkit.aggregation as crowdkit  # (0.5 s to import: not at every collection)
    from crowdtally_client.frames import labels_frame

    triples = synthetic()
    with Client(live_server.url, live_server.admin_key) as admin:
        name = live_server.project_name("pandas")
        key = admin.create_project(name, CLASSES).api_key
    df = labels_frame(triples)
    with Client(live_server.url, key) as c:
        c.post_labels(name, df, ids="auto", wait=True)  # a crowd-kit frame posts as it is
        c.refit(name, wait=True)
        ours = c.to_pandas(name)
    ds = crowdkit.DawidSkene(n_iter=100).fit(df)

    theirs_p = ds.probas_.reindex(columns=CLASSES)
    assert ours.probas.shape == theirs_p.shape
    assert ours.probas.index.name == ds.probas_.index.name == "task"
    assert ours.probas.columns.name == ds.probas_.columns.name
    assert list(ours.probas.index) == sorted(ds.probas_.index)
    np.testing.assert_allclose(ours.probas.sum(axis=1), 1.0, rtol=1e-6)

    assert ours.labels.name == ds.labels_.name == "agg_label"
    assert ours.labels.index.name == ds.labels_.index.name == "task"
    agree = (ours.labels == ds.labels_.reindex(ours.labels.index)).mean()
    assert agree >= 0.9

    assert ours.errors is not None
    assert list(ours.errors.index.names) == list(ds.errors_.index.names) == ["worker", "label"]
    assert sorted(ours.errors.columns) == sorted(ds.errors_.columns)
    assert set(ds.errors_.index) <= set(ours.errors.index)
    # columns are P(answer | true): each sums to one over a worker's answers, as in crowd-kit
    np.testing.assert_allclose(ours.errors.groupby(level="worker").sum(), 1.0, rtol=1e-6)
    np.testing.assert_allclose(ds.errors_.groupby(level="worker").sum(), 1.0, rtol=1e-6)


def test_async_to_pandas(live_server: LiveServer) -> None:
    triples = synthetic(5)[:60]

    async def run() -> None:
        async with AsyncClient(live_server.url, live_server.admin_key) as admin:
            name = live_server.project_name("apandas")
            key = (await admin.create_project(name, CLASSES)).api_key
        async with AsyncClient(live_server.url, key) as c:
            await c.post_labels(name, triples, ids="auto", wait=True)
            agg = await c.to_pandas(name, errors=False)
        assert agg.errors is None
        assert agg.probas.shape == (len({t for t, _, _ in triples}), 3)
        assert list(agg.probas.columns) == CLASSES

    asyncio.run(run())


def test_probas_labels_and_gold_share_one_task_dtype(live_server: LiveServer) -> None:
    """The task dtype was inferred for each part alone: gold on item "1" came back int64 while
    the answered items ("img-x" among them) were text, and ``labels.reindex(gold.index)`` gave
    NaN (accuracy on gold 0)."""
    with Client(live_server.url, live_server.admin_key) as admin:
        name = live_server.project_name("dtypes")
        key = admin.create_project(name, CLASSES).api_key
    with Client(live_server.url, key) as c:
        c.post_labels(name, [("1", "w1", CLASSES[0]), ("1", "w2", CLASSES[0]),
                             ("img-x", "w1", CLASSES[1])], wait=True)  # fmt: skip
        c.post_gold(name, [("1", CLASSES[0])], wait=True)
        agg = c.to_pandas(name, errors=False)
    assert agg.probas.index.dtype == agg.labels.index.dtype == agg.gold.index.dtype == object
    assert agg.labels.reindex(agg.gold.index).tolist() == [CLASSES[0]]


def test_a_frame_read_a_slice_at_a_time_gives_the_labels_of_its_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Slices of 7 rows (a frame's rows are read FRAME_ROWS at a time): the same labels, ids
    and errors as the frame's rows one by one, crowd-kit's ``task`` column too."""
    import pandas as pd
    from crowdtally_client import _core

    monkeypatch.setattr(_core, "FRAME_ROWS", 7)
    rows = synthetic()
    frame = pd.DataFrame(rows, columns=["task", "worker", "label"])
    frame["weight"] = [1.0 + (k % 3) for k in range(len(rows))]
    tuples = [(*r, 1.0 + (k % 3)) for k, r in enumerate(rows)]
    assert _core.prepare_labels(frame, ids="auto") == _core.prepare_labels(tuples, ids="auto")
    frame.loc[30, "weight"] = -1.0
    with pytest.raises(ValueError, match=r"label 30: weight -1\.0"):
        _core.prepare_labels(frame)
