"""crowd-kit-shaped pandas objects from the service's answers (``pip install 'crowdtally-client[pandas]'``).

Shapes follow crowd-kit 1.4.2's aggregators (``DawidSkene().fit(df)``):

- ``probas``: DataFrame, index ``task`` (items, sorted), one column per label (columns name ``label``);
- ``labels``: Series ``agg_label`` indexed by ``task``;
- ``errors``: DataFrame indexed by ``(worker, label)`` (the answer given), one column per true
  label: ``errors.loc[(w, answer), true] = P(answer | true)``, as crowd-kit's ``errors_``.

dtypes. The service keeps items, workers and labels as text. Coming back, each of the three
(``task``, ``worker``, ``label``) becomes ``int64`` when every value of it is an integer
written plainly (``"17"``, ``"-2"``; not ``"017"`` or ``"1.0"``), as ``pandas.read_csv`` would
read that file, and stays text (``object``) otherwise. So a frame read with ``read_csv`` and
posted as it is comes back with its own dtypes. ``like=df`` takes the dtypes of ``df``'s
columns instead (``task`` or ``item``, ``worker``, ``label``), e.g. text ids that look like
numbers; ``dtypes="str"`` keeps everything text.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import pandas as pd

from crowdtally_client.models import Item, Worker

Dtypes = Literal["infer", "str"]
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass
class Aggregation:
    probas: pd.DataFrame
    labels: pd.Series
    errors: pd.DataFrame | None
    gold: pd.Series


def _plain_int(text: str) -> bool:
    """``text`` is an integer as ``str(int)`` writes it (and fits int64)."""
    body = text[1:] if text[:1] == "-" else text
    if not body.isdigit() or not body.isascii() or (body[0] == "0" and body != "0"):
        return False
    return text != "-0" and INT64_MIN <= int(text) <= INT64_MAX


def _converter(values: Sequence[str], like: Any, dtypes: Dtypes) -> Any:
    """The dtype to give ``values``: ``like``'s (a dtype or None), else inferred (``dtypes``)."""
    if like is not None:
        return like
    if dtypes == "infer" and values and all(_plain_int(v) for v in values):
        return np.dtype("int64")
    return None


def _typed(values: Sequence[str], dtype: Any, name: str | None = None) -> pd.Index:
    """``values`` (text) as an Index of ``dtype`` (None: text, ``object``)."""
    if dtype is None:
        return pd.Index(list(values), dtype=object, name=name)
    dtype = pd.api.types.pandas_dtype(dtype)
    if isinstance(dtype, pd.CategoricalDtype):
        inner = dtype.categories.dtype
        cats = _typed(values, None if inner.kind == "O" else inner)
        # values the categories lack are added after them (they became NaN: a frame's head
        # given as ``like`` knows only its own tasks)
        known = set(dtype.categories)
        extra = [v for v in pd.unique(cats) if v not in known]
        full = pd.CategoricalDtype([*dtype.categories, *extra], ordered=dtype.ordered)
        return pd.Index(pd.Categorical(cats, dtype=full), name=name)
    if dtype.kind == "b" or pd.api.types.is_bool_dtype(dtype):
        return pd.Index([v == "True" for v in values], dtype=dtype, name=name)
    if dtype.kind in "iuf" or pd.api.types.is_numeric_dtype(dtype):
        return pd.Index(pd.to_numeric(pd.Series(list(values), dtype=object)), name=name).astype(
            dtype
        )
    return pd.Index(list(values), dtype=dtype, name=name)  # object, string[python], ...


@dataclass(frozen=True)
class IdTypes:
    """The dtypes to give ``task``, ``worker`` and ``label`` (None: infer from the values)."""

    task: Any = None
    worker: Any = None
    label: Any = None
    dtypes: Dtypes = "infer"

    @classmethod
    def of(cls, like: pd.DataFrame | None, dtypes: Dtypes = "infer") -> IdTypes:
        if dtypes not in ("infer", "str"):
            raise ValueError(f"dtypes must be 'infer' or 'str', got {dtypes!r}")
        if like is None:
            return cls(dtypes=dtypes)
        cols = getattr(like, "columns", None)
        if cols is None:
            raise ValueError("like must be a DataFrame with columns task (or item), worker, label")
        task = "task" if "task" in cols else "item" if "item" in cols else None
        return cls(
            task=like[task].dtype if task else None,
            worker=like["worker"].dtype if "worker" in cols else None,
            label=like["label"].dtype if "label" in cols else None,
            dtypes=dtypes,
        )

    def index(self, kind: str, values: Sequence[str], name: str | None = None) -> pd.Index:
        return _typed(values, _converter(values, getattr(self, kind), self.dtypes), name)


def probas_frame(
    items: Iterable[Item], classes: Sequence[str], types: IdTypes | None = None
) -> pd.DataFrame:
    types = types or IdTypes()
    items = list(items)
    frame = pd.DataFrame(
        [[x.posterior.get(c, 0.0) for c in classes] for x in items],
        index=types.index("task", [x.item for x in items], "task"),
        columns=types.index("label", list(classes), "label"),
        dtype=float,
    )
    return frame.sort_index()


def labels_series(
    items: Iterable[Item], types: IdTypes | None = None, classes: Sequence[str] | None = None
) -> pd.Series:
    pairs = [(x.item, x.label) for x in items if x.label is not None]
    return _series_with_classes(pairs, "agg_label", types or IdTypes(), classes)


def gold_series(
    items: Iterable[Item], types: IdTypes | None = None, classes: Sequence[str] | None = None
) -> pd.Series:
    pairs = [(x.item, x.gold) for x in items if x.gold is not None]
    return _series_with_classes(pairs, "true_label", types or IdTypes(), classes)


def _series_with_classes(
    pairs: list[tuple[str, str]], name: str, types: IdTypes, classes: Sequence[str] | None
) -> pd.Series:
    """A Series of labels whose dtype is decided on all the project's ``classes`` (so that
    ``labels`` and ``probas.columns`` agree even when few labels are present)."""
    label_type = _converter(
        list(classes or sorted({b for _, b in pairs})), types.label, types.dtypes
    )
    return pd.Series(
        _typed([label for _, label in pairs], label_type).array,
        index=types.index("task", [item for item, _ in pairs], "task"),
        name=name,
    ).sort_index()


def errors_frame(
    workers: Iterable[Worker], classes: Sequence[str], types: IdTypes | None = None
) -> pd.DataFrame:
    """Confusion matrices as crowd-kit's ``errors_``; workers without one are skipped."""
    types = types or IdTypes()
    have = [w for w in workers if w.confusion is not None]
    names = types.index("worker", [w.worker for w in have])
    label_index = types.index("label", list(classes))
    worker_level, label_level, rows = [], [], []
    for order in np.argsort(names.to_numpy(), kind="stable") if len(have) else []:
        w, name = have[int(order)], names[int(order)]
        assert w.confusion is not None
        for answer, answer_value in zip(classes, label_index, strict=True):
            worker_level.append(name)
            label_level.append(answer_value)
            rows.append([w.confusion[true].get(answer, 0.0) for true in classes])
    mi = pd.MultiIndex.from_arrays(
        [
            pd.Index(worker_level, dtype=names.dtype),
            pd.Index(label_level, dtype=label_index.dtype),
        ],
        names=["worker", "label"],
    )
    columns = label_index.copy()
    columns.name = None  # as crowd-kit's errors_
    return pd.DataFrame(rows, index=mi, columns=columns, dtype=float)


def labels_frame(labels: Iterable[tuple[str, str, str]]) -> pd.DataFrame:
    """(item, worker, label) triples as crowd-kit's input: columns ``worker, task, label``."""
    rows = [(w, t, lab) for t, w, lab in labels]
    return pd.DataFrame(rows, columns=["worker", "task", "label"])


def aggregation(
    items: Sequence[Item],
    classes: Sequence[str],
    workers: Sequence[Worker] | None,
    types: IdTypes | None = None,
) -> Aggregation:
    types = types or IdTypes()
    # One task dtype for probas, labels and gold, decided on every item (gold alone on "1"
    # read int64 where the answered items, "img-x" among them, read text).
    task = _converter([x.item for x in items], types.task, types.dtypes)
    types = replace(types, task=np.dtype(object) if task is None else task)
    answered = [x for x in items if x.n_labels > 0]  # as crowd-kit: tasks with answers only
    return Aggregation(
        probas=probas_frame(answered, classes, types),
        labels=labels_series(answered, types, classes),
        errors=errors_frame(workers, classes, types) if workers is not None else None,
        gold=gold_series(items, types, classes),
    )
