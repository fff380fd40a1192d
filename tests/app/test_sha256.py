"""The compiled SHA-256 of an import's answer ids: hashlib's digests, for any strings (empty,
one block, many blocks, any code point), in one thread or several."""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.io.input import hash_id
from app.io.sha256 import hex_digests
from core import threads


def hashlib_digests(values: list[str], prefix: str, digits: int) -> list[str]:
    return [prefix + hashlib.sha256(v.encode()).hexdigest()[:digits] for v in values]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=150), max_size=30), st.integers(1, 64))
def test_digests_are_hashlibs(values: list[str], digits: int) -> None:
    assert hex_digests(pa.array(values, pa.string()), "row:", digits).to_pylist() == (
        hashlib_digests(values, "row:", digits)
    )


def test_the_padding_at_every_length_around_a_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lengths 0-200 bytes (the 0x80 byte and the bit length fall in the same block or the
    next), in a slice of a larger array, split among threads."""
    monkeypatch.setattr(threads, "PARALLEL_FROM", 10)
    values = ["é" * (n // 2) + "x" * (n % 2) for n in range(201)]
    sliced = pa.array(["pad", *values], pa.string()).slice(1)
    for n_threads in (1, 2, 3):
        got = hex_digests(sliced, "", 64, threads=n_threads).to_pylist()
        assert got == hashlib_digests(values, "", 64)


def test_an_answers_id_is_the_one_hash_id_gives() -> None:
    key = "\x1f".join(["item 1", "wörker", "cat", "2"])
    assert hex_digests(pa.array([key]), "row:", 32).to_pylist() == [
        hash_id("row", "item 1", "wörker", "cat", "2")
    ]
