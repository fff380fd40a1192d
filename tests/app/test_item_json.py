"""Served items' JSON, rendered from packed records (a few one at a time, more a column at a
time), is byte for byte what orjson gives for each item's dict, from records with their label
counts or from records written before they had them; the records read as one table."""

from __future__ import annotations

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from app.store.item_records import (
    COLUMNS_FROM,
    as_bytes,
    pack,
    record_dtype,
    record_table,
    render,
)

FLOATS = st.floats(allow_nan=False, allow_infinity=False, width=64)


def one_by_one(
    posterior: np.ndarray, clarity: np.ndarray, labels: list[bytes], gold: np.ndarray,
    held_out: np.ndarray, position: int, computed_at: float,
) -> list[bytes]:  # fmt: skip
    """The reference: a dict per item through orjson."""
    return [
        orjson.dumps(
            {
                "posterior": p.tolist(),
                "clarity": c,
                "labels": orjson.Fragment(lab),
                "gold": g if g >= 0 else None,
                "held_out": h.tolist() if np.any(h != 0.0) else None,
                "position": position,
                "computed_at": computed_at,
            }
        )
        for p, c, lab, g, h in zip(
            posterior, clarity.tolist(), labels, gold.tolist(), held_out, strict=True
        )
    ]


@settings(max_examples=120, deadline=None)
@given(
    st.integers(1, 6).flatmap(
        lambda k: st.integers(0, 2 * COLUMNS_FROM).flatmap(
            lambda n: st.tuples(
                hnp.arrays(np.float64, (n, k), elements=FLOATS),
                hnp.arrays(np.float64, n, elements=FLOATS),
                hnp.arrays(np.int64, n, elements=st.integers(-1, k - 1)),
                hnp.arrays(np.float64, (n, k), elements=st.sampled_from([0.0, -0.0, 0.25, 1e-9])),
                st.lists(st.text(max_size=4), min_size=n, max_size=n),
            )
        )
    ),
    st.lists(st.integers(0, 2**40), min_size=2, max_size=2),
    st.lists(FLOATS, min_size=2, max_size=2),
    st.integers(0, 2 * COLUMNS_FROM),
    st.booleans(),
)
def test_rendered_items_are_orjsons_per_item(
    arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]],
    positions: list[int],
    times: list[float],
    cut: int,
    first_uncounted: bool,
) -> None:
    """Items of two writes (two positions and times) read together; the first write's records
    perhaps from before records carried label counts."""
    posterior, clarity, gold, held_out, workers = arrays
    labels = [orjson.dumps([[w, 0, 1.0]]) for w in workers]  # any JSON array, ids with ],[
    open_labels = [lab[:-1] for lab in labels]  # as the store keeps them: no closing bracket
    cut = min(cut, len(labels))
    records, want = [], []
    halves = (slice(0, cut), slice(cut, None))
    for half, (part, position, computed_at) in enumerate(
        zip(halves, positions, times, strict=True)
    ):
        columns = posterior[part], clarity[part], gold[part], held_out[part]
        n = np.arange(posterior[part].shape[0])
        written = pack(*columns, position, computed_at, n, n / 4)
        if first_uncounted and half == 0:
            written = uncounted(written, posterior.shape[1])
        records += written
        p, c, g, h = columns
        want += one_by_one(p, c, labels[part], g, h, position, computed_at)
    assert render(records, open_labels) == want
    table = record_table(records)
    if not records or (first_uncounted and cut > 0):
        assert table is None  # (none, or their counts are in their label lists)
        return
    assert table is not None and table.shape == (len(records),)
    assert table["posterior"].tobytes() == posterior.tobytes()
    assert table["gold"].tolist() == gold.tolist()
    assert table["n_labels"].tolist() == [*range(cut), *range(len(records) - cut)]


def uncounted(records: list[bytes], k: int) -> list[bytes]:
    """Records as they were written before they carried their item's label count and weight."""
    old = record_dtype(k, counted=False)
    table = np.frombuffer(b"".join(records), dtype=record_dtype(k))
    out = np.empty(table.shape, dtype=old)
    for name in old.names or ():
        out[name] = table[name]
    out["n_classes"] = k
    return [r.tobytes() for r in out]


def test_a_record_carries_its_items_label_count_and_weight() -> None:
    records = pack(
        np.full((3, 2), 0.5), np.zeros(3), np.array([-1, 1, -1]), np.zeros((3, 2)), 9, 1.5,
        np.array([0, 4, 2]), np.array([0.0, 3.5, 2.0]),
    )  # fmt: skip
    table = record_table(records)
    assert table is not None
    assert table["n_labels"].tolist() == [0, 4, 2]
    assert table["weight"].tolist() == [0.0, 3.5, 2.0]
    assert table["position"].tolist() == [9, 9, 9]
    assert record_table([]) is None


@given(
    hnp.arrays(
        np.float64,
        hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=5),
        elements=st.sampled_from([0.0, -0.0, 1.5, 2.0**-1074, np.inf]),
    )
)
def test_rows_as_bytes_are_each_row_s_bytes(rows: np.ndarray) -> None:
    """Rows of any shape (zeros at their ends included: nothing is stripped), and records."""
    assert as_bytes(rows) == [row.tobytes() for row in rows]
    table = np.zeros(len(rows), dtype=record_dtype(3))
    table["position"] = np.arange(len(rows))
    assert as_bytes(table) == [record.tobytes() for record in table]
