"""The compiled SHA-256 of an import's answer ids: ``input.hash_id``'s digests (hashlib's),
for any item, worker and label (any code point, messages of one block or many), any
occurrence, in one thread or several."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.io.input import hash_id
from app.io.sha256 import answer_digests
from core import threads


def made(rows: list[tuple[str, str, str, int]], n_threads: int = 2, pad: bool = False) -> list[str]:
    """``answer_digests`` of the rows (item, worker, label, occurrence); with ``pad``, from
    columns sliced out of longer arrays, and only every other row of them asked for."""
    columns = [[r[k] for r in rows] for k in range(3)]
    picked = np.arange(len(rows), dtype=np.int64)
    if pad:  # (a slice's offsets start past 0; rows asked for skip the padding between)
        columns = [[x for v in c for x in ("pad,\x1f", v)] for c in columns]
        picked = 2 * picked + 1
    arrays = tuple(pa.array(["skip", *c], pa.string()).slice(1) for c in columns)
    occurrence = np.array([r[3] for r in rows], dtype=np.int64)
    got = answer_digests(arrays, picked, occurrence, "row:", 32, threads=n_threads)  # type: ignore[arg-type]
    return got.to_pylist()  # type: ignore[no-any-return]


def expected(rows: list[tuple[str, str, str, int]]) -> list[str]:
    return [hash_id("row", item, worker, label, str(n)) for item, worker, label, n in rows]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.text(max_size=80), st.text(max_size=30), st.text(max_size=10),
                  st.integers(1, 10**12)),
        max_size=30,
    )
)  # fmt: skip
def test_digests_are_hash_ids(rows: list[tuple[str, str, str, int]]) -> None:
    assert made(rows) == expected(rows)


def test_the_padding_at_every_length_around_a_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """Messages of 6 to 206 bytes (the 0x80 byte and the bit length in the same block or the
    next), from sliced columns, split among threads."""
    monkeypatch.setattr(threads, "PARALLEL_FROM", 10)
    rows = [("é" * (n // 2) + "x" * (n % 2), "w", "l", 1 + n % 3) for n in range(201)]
    for n_threads in (1, 2, 3):
        assert made(rows, n_threads, pad=True) == expected(rows)
