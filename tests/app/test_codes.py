"""Ids as codes: the compiled hash table gives each id its first appearance's number, over
any number of chunks."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from app.io.codes import Codebook


def first_appearance(ids: list[str]) -> list[int]:
    seen: dict[str, int] = {}
    return [seen.setdefault(x, len(seen)) for x in ids]


def test_codes_are_first_appearances_across_chunks_as_the_table_grows() -> None:
    rng = np.random.default_rng(0)
    pool = [f"item-{n}" for n in range(20_000)] + ["é", "猫", "a" * 300, "a" * 301, "x,y"]
    ids = [pool[k] for k in rng.integers(0, len(pool), 60_000)]
    book = Codebook()
    sliced = pa.array(["skipped", *ids], pa.string()).slice(1)  # an offset into its buffers
    got = np.concatenate([book.codes(sliced.slice(lo, 7_000)) for lo in range(0, len(ids), 7_000)])
    assert got.tolist() == first_appearance(ids)
    assert book.names.to_pylist() == list(dict.fromkeys(ids))
    assert len(book) == len(set(ids))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.text(max_size=6), max_size=40), max_size=8))
def test_any_chunks_of_any_ids_get_first_appearance_codes(chunks: list[list[str]]) -> None:
    book = Codebook()
    got = [book.codes(pa.array(c, pa.string())).tolist() for c in chunks]
    flat = [x for c in chunks for x in c]
    assert [code for c in got for code in c] == first_appearance(flat)
    assert book.names.to_pylist() == list(dict.fromkeys(flat))
