"""crowd-kit users feel at home: its data frames go in as they are (int or text ids and
labels, numpy labels), and the frames that come back have the dtypes crowd-kit's have."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pytest
from crowdtally_client import Client
from crowdtally_client.frames import IdTypes, aggregation
from crowdtally_client.models import Item, Worker

if TYPE_CHECKING:
    from conftest import LiveServer


def read_crowdkit(folder: Path) -> tuple[pd.DataFrame, pd.Series]:
    """A shared dataset as crowd-kit reads it: ``task, worker, label`` and the gold Series."""
    df = pd.read_csv(folder / "answers.csv").rename(columns={"item": "task"})
    gt = pd.read_csv(folder / "truth.csv").rename(columns={"item": "task"})
    return df, gt.set_index("task")["label"].rename("true_label")


def test_dog_round_trips_with_crowdkits_dtypes(
    live_server: LiveServer, datasets_root: Path
) -> None:
    df, gt = read_crowdkit(datasets_root / "dog")
    assert (df.task.dtype, df.worker.dtype, df.label.dtype) == (np.int64, np.int64, np.int64)
    name = live_server.project_name("dog")
    with Client(live_server.url, live_server.admin_key) as c:
        created = c.create_project(name, np.unique(df.label))  # numpy int64 labels
        assert created.labels == ["0", "1", "2", "3"]
        c.post_labels(name, df, ids="auto", wait=True)  # crowd-kit's frame, as it is
        c.refit(name, wait=True)
        ours = c.to_pandas(name)
        assert c.get_item(name, df.task.iloc[0]).n_labels == 10  # a numpy id
        assert c.get_worker(name, np.int64(df.worker.iloc[0])).n_labels > 0

    import crowdkit.aggregation as crowdkit  # (0.5 s to import: not at every collection)

    ds = crowdkit.DawidSkene(n_iter=100).fit(df)
    mv = crowdkit.MajorityVote().fit(df)
    for theirs in (ds, mv):
        # same index (dtype int64, name task, same order), same columns (int64, name label)
        pd.testing.assert_index_equal(ours.probas.index, theirs.probas_.index)
        pd.testing.assert_index_equal(ours.probas.columns, theirs.probas_.columns)
        pd.testing.assert_index_equal(ours.labels.index, theirs.labels_.index)
        assert ours.labels.dtype == theirs.labels_.dtype == np.int64
        assert ours.labels.name == theirs.labels_.name == "agg_label"
        # the comparison a crowd-kit user writes, element-wise (it raised, or matched nothing,
        # when our ids were text)
        assert (ours.labels == theirs.labels_).mean() > 0.9
    pd.testing.assert_series_equal(
        ours.labels.where(ours.labels == ds.labels_, -1),
        ds.labels_.where(ours.labels == ds.labels_, -1),
    )
    assert ours.errors is not None
    assert ours.errors.index.names == ds.errors_.index.names == ["worker", "label"]
    for level in (0, 1):
        assert ours.errors.index.levels[level].dtype == ds.errors_.index.levels[level].dtype
    assert set(ds.errors_.index) <= set(ours.errors.index)
    assert list(ours.errors.columns) == list(ds.errors_.columns) == [0, 1, 2, 3]
    # accuracy on gold, computed the crowd-kit way, with no conversion
    ours_accuracy = (ours.labels.reindex(gt.index) == gt).mean()
    ds_accuracy = (ds.labels_.reindex(gt.index) == gt).mean()
    assert ours_accuracy > 0.8 and abs(ours_accuracy - ds_accuracy) < 0.03

    with Client(live_server.url, live_server.admin_key) as c:
        c.post_gold(name, gt, wait=True)  # crowd-kit's gold Series, as it is
        back = c.to_pandas(name, errors=False).gold
    pd.testing.assert_series_equal(back, gt.sort_index())


def test_text_ids_stay_text_unless_told(live_server: LiveServer) -> None:
    # a frame of text ids that look like numbers: inferred as numbers, unless like=df
    df = pd.DataFrame(
        {
            "task": ["10", "10", "9", "9", "0070", "0070"],
            "worker": ["w1", "w2", "w1", "w2", "w1", "w2"],
            "label": ["1", "1", "2", "2", "1", "2"],
        }
    )
    name = live_server.project_name("text")
    with Client(live_server.url, live_server.admin_key) as c:
        c.create_project(name, pd.Series(["1", "2"]))
        c.post_labels(name, df, ids="auto", wait=True)
        inferred = c.to_pandas(name)
        kept = c.to_pandas(name, like=df)
        text = c.to_pandas(name, dtypes="str")
    # "0070" is not an integer as written: the items stay text; the labels are integers
    assert inferred.probas.index.dtype == object and list(inferred.probas.index) == [
        "0070",
        "10",
        "9",
    ]
    assert inferred.labels.dtype == np.int64 and list(inferred.probas.columns) == [1, 2]
    assert inferred.errors is not None and inferred.errors.index.levels[0].dtype == object
    for frame in (kept, text):
        assert frame.labels.dtype == object and list(frame.probas.columns) == ["1", "2"]
        assert frame.probas.index.dtype == object
    pd.testing.assert_index_equal(
        kept.labels.index, pd.Index(sorted(set(df.task)), dtype=object, name="task")
    )


def test_labels_and_ids_from_numpy_and_pandas(live_server: LiveServer) -> None:
    name = live_server.project_name("np")
    with Client(live_server.url, live_server.admin_key) as c:
        for labels in (np.array([3, 1]), pd.Index([3, 1]), pd.Series([3, 1]).unique()):
            other = live_server.project_name("np")
            assert c.create_project(other, labels).labels == ["3", "1"]
            c.delete_project(other)
        c.create_project(name, [np.int64(3), np.int64(1)])
        rows = [(np.int64(7), np.int64(1), np.int64(3)), (np.int64(7), "2", 1)]
        got = c.post_labels(name, rows, ids="auto", wait=True)
        assert got.accepted == 2
        assert c.get_item(name, np.int64(7)).n_labels == 2
        c.post_gold(name, {np.int64(7): np.int64(3)}, wait=True)
        assert c.get_item(name, 7).gold == "3"
        with pytest.raises(ValueError, match="list of labels"):
            c.create_project(live_server.project_name("np"), "ab")
        with pytest.raises(ValueError, match="missing"):
            c.post_labels(name, pd.DataFrame({"task": [1.0, np.nan], "worker": 1, "label": 3}))


# ---------------------------------------------------------------------- without a service


def _item(item: str, label: str, gold: str | None = None) -> Item:
    post = {label: 0.9, **{c: 0.1 for c in ("1", "2") if c != label}}
    return Item(item=item, label=label, probability=0.9, posterior=post, n_labels=2,
                gold=gold, computed_at="t", position=1)  # fmt: skip


@pytest.mark.parametrize(
    ("ids", "dtype"),
    [
        (["1", "-2", "30"], np.int64),
        (["1", "2", "007"], object),  # a leading zero is text
        (["1", "2.0"], object),  # not an integer as written
        (["1", "b"], object),
        (["9223372036854775807", "1"], np.int64),
        (["9223372036854775808", "1"], object),  # beyond int64
    ],
)
def test_inferred_id_dtype(ids: list[str], dtype: type) -> None:
    frame = aggregation([_item(i, "1") for i in ids], ["1", "2"], None).probas
    assert frame.index.dtype == dtype and frame.index.name == "task"
    assert sorted(map(str, frame.index)) == sorted(ids)


def test_like_takes_the_frames_dtypes() -> None:
    like = pd.DataFrame(
        {"item": [1.5], "worker": pd.Categorical(["a"]), "label": pd.array(["1"], "string")}
    )
    ws = [Worker(worker="a", accuracy=1.0, informativeness=1.0, n_labels=1, gold_labels=0,
                 slot=0, computed_at="t", confusion={"1": {"1": 1.0}, "2": {"2": 1.0}})]  # fmt: skip
    agg = aggregation([_item("2.5", "2", gold="2")], ["1", "2"], ws, IdTypes.of(like))
    assert agg.probas.index.dtype == np.float64 and agg.probas.index[0] == 2.5
    assert agg.labels.dtype == "string" and agg.gold.dtype == "string"
    assert agg.errors is not None
    assert isinstance(agg.errors.index.levels[0].dtype, pd.CategoricalDtype)


def test_docs_side_by_side_example(live_server: LiveServer, datasets_root: Path) -> None:
    """docs/client.md's crowd-kit / crowdtally example, both cells run as written."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "client.md").read_text("utf-8")
    section = doc[doc.index("**Coming from crowd-kit.**") :]
    cells = [html.unescape(c) for c in re.findall(r"<pre>(.*?)</pre>", section, re.S)[:2]]
    name = live_server.project_name("dog")
    answers = str(datasets_root / "dog" / "answers.csv")
    results = []
    for cell in cells:
        code = cell.replace('"dog/answers.csv"', repr(answers)).replace('"dog"', repr(name))
        code = code.replace("http://127.0.0.1:8000", live_server.url)
        scope: dict[str, object] = {"ADMIN_KEY": live_server.admin_key}
        exec(compile(code, "docs/client.md", "exec"), scope)
        results.append(scope["labels"])
    theirs, ours = results
    assert isinstance(ours, pd.Series) and isinstance(theirs, pd.Series)
    pd.testing.assert_index_equal(ours.index, theirs.index)
    assert ours.dtype == theirs.dtype == np.int64
    assert (ours == theirs).mean() > 0.99  # the doc says 99.5%


def test_like_with_categories_that_lack_some_values_keeps_them() -> None:
    """A frame's head as ``like`` knows only its own tasks: the others became NaN (806 of the
    807 of dog's index); they are added after its categories."""
    like = pd.DataFrame({"task": pd.Categorical(["t1"]), "worker": ["w"], "label": ["1"]})
    agg = aggregation(
        [_item("t1", "1"), _item("t2", "2"), _item("t0", "1")], ["1", "2"], [], IdTypes.of(like)
    )
    assert list(agg.probas.index) == ["t1", "t2", "t0"] and not agg.labels.isna().any()
    assert list(agg.probas.index.categories) == ["t1", "t2", "t0"]
