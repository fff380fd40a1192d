"""crowd-kit-shaped pandas objects from the service's answers (``pip install 'crowdtally-client[pandas]'``).

Shapes follow crowd-kit 1.4.2's aggregators (``DawidSkene().fit(df)``):

- ``probas``: DataFrame, index ``task`` (items, sorted), one column per label (columns name ``label``);
- ``labels``: Series ``agg_label`` indexed by ``task``;
- ``errors``: DataFrame indexed by ``(worker, label)`` (the answer given), one column per true
  label: ``errors.loc[(w, answer), true] = P(answer | true)``, as crowd-kit's ``errors_``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pandas as pd

from crowdtally_client.models import Item, Worker


@dataclass
class Aggregation:
    probas: pd.DataFrame
    labels: pd.Series
    errors: pd.DataFrame | None
    gold: pd.Series


def probas_frame(items: Iterable[Item], classes: Sequence[str]) -> pd.DataFrame:
    rows = {x.item: [x.posterior.get(c, 0.0) for c in classes] for x in items}
    frame = pd.DataFrame.from_dict(rows, orient="index", columns=list(classes), dtype=float)
    frame = frame.sort_index()
    frame.index.name = "task"
    frame.columns.name = "label"
    return frame


def labels_series(items: Iterable[Item]) -> pd.Series:
    data = {x.item: x.label for x in items}
    s = pd.Series(data, name="agg_label", dtype=object).sort_index()
    s.index.name = "task"
    return s


def gold_series(items: Iterable[Item]) -> pd.Series:
    data = {x.item: x.gold for x in items if x.gold is not None}
    s = pd.Series(data, name="true_label", dtype=object).sort_index()
    s.index.name = "task"
    return s


def errors_frame(workers: Iterable[Worker], classes: Sequence[str]) -> pd.DataFrame:
    """Confusion matrices as crowd-kit's ``errors_``; workers without one are skipped."""
    index: list[tuple[str, str]] = []
    rows: list[list[float]] = []
    for w in sorted(workers, key=lambda w: w.worker):
        if w.confusion is None:
            continue
        for answer in classes:
            index.append((w.worker, answer))
            rows.append([w.confusion[true].get(answer, 0.0) for true in classes])
    mi = pd.MultiIndex.from_tuples(index, names=["worker", "label"])
    return pd.DataFrame(rows, index=mi, columns=pd.Index(list(classes)), dtype=float)


def labels_frame(labels: Iterable[tuple[str, str, str]]) -> pd.DataFrame:
    """(item, worker, label) triples as crowd-kit's input: columns ``worker, task, label``."""
    rows = [(w, t, lab) for t, w, lab in labels]
    return pd.DataFrame(rows, columns=["worker", "task", "label"])


def aggregation(
    items: Sequence[Item], classes: Sequence[str], workers: Sequence[Worker] | None
) -> Aggregation:
    return Aggregation(
        probas=probas_frame(items, classes),
        labels=labels_series(items),
        errors=errors_frame(workers, classes) if workers is not None else None,
        gold=gold_series(items),
    )
