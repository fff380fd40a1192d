"""The id set against Python's set: same members, same keep masks, through growth."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.idset import IdSet, hash_ids, join_ids

ID = st.text(
    st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=12
)  # (ids hold no control characters, so no newline)
BLOCK = st.lists(st.one_of(st.none(), ID, st.sampled_from(["a", "b", "é", "日本"])), max_size=40)


@settings(max_examples=150, deadline=None)
@given(st.lists(BLOCK, max_size=12), st.sampled_from([16, 1024]))
def test_keep_masks_are_those_of_a_python_set(
    blocks: list[list[str | None]], capacity: int
) -> None:
    """With a table of 16 rows to start with, it grows and moves its rows again and again."""
    ids, seen = IdSet(), set()
    ids._table = np.zeros((capacity, 2), dtype=np.uint64)
    for block in blocks:
        keys, present = hash_ids(join_ids(block), len(block))
        expected, fresh = bytearray(), set()
        for i in block:
            new = i is None or (i not in seen and i not in fresh)
            expected += b"1" if new else b"0"
            if i is not None:
                fresh.add(i)
        assert ids.new_in_block(keys, present) == bytes(expected)
        ids.add(keys, present)
        seen |= fresh
        assert ids.size == len(seen)


def test_membership_survives_growth_and_tells_near_ids_apart() -> None:
    first = [f"label-{k}" for k in range(50_000)]  # the table doubles several times
    ids = IdSet()
    ids.add(*hash_ids(join_ids(first), len(first)))
    assert ids.size == 50_000 and ids.nbytes == 131_072 * 16  # (70% full at most)
    probe = [*first[::1000], "label-50000", "label-0 ", "label-00", "abel-0", "", "label-1\u00e9"]
    mask = ids.new_in_block(*hash_ids(join_ids(probe), len(probe)))
    assert mask == b"0" * 50 + b"1" * 6


def test_an_empty_block_and_a_block_of_one_label_without_id_differ() -> None:
    keys, present = hash_ids(join_ids([]), 0)
    assert keys.shape == (0, 2) and IdSet().new_in_block(keys, present) == b""
    keys, present = hash_ids(join_ids([None]), 1)
    assert keys.shape == (1, 2) and not present[0]
    assert IdSet().new_in_block(keys, present) == b"1"


def test_the_two_halves_of_a_key_differ_and_the_first_is_never_zero() -> None:
    keys, _ = hash_ids(join_ids([str(k) for k in range(10_000)]))
    assert (keys[:, 0] & np.uint64(1)).all()
    assert np.unique(keys[:, 0]).size == 10_000 and np.unique(keys[:, 1]).size == 10_000


def test_an_id_with_a_newline_is_refused_not_hashed_out_of_bounds() -> None:
    with pytest.raises(ValueError, match="newline"):
        hash_ids(join_ids(["a\nb", "c"]), 2)


def test_growing_moves_the_outgrown_table_a_few_rows_at_a_time() -> None:
    """A block that makes the table grow does not wait for every id to move: each block
    moves 4 rows per id, and the ids not moved yet are still members."""
    ids = IdSet()
    first = [f"id-{k}" for k in range(100_000)]
    ids.add(*hash_ids(join_ids(first)))
    old_rows = ids._table.shape[0]  # 262,144 rows, 100,000 ids: 38% full
    k = 100_000
    while ids._old.shape[0] == 1:  # until a block makes it grow
        block = [f"id-{k + n}" for n in range(1000)]
        ids.add(*hash_ids(join_ids(block)))
        k += 1000
    assert ids._old.shape[0] == old_rows and ids._moved == 4000
    assert ids.nbytes == (old_rows + 2 * old_rows) * 16
    probe = [*first[::997], "id-0", f"id-{k - 1}", "never"]
    assert ids.new_in_block(*hash_ids(join_ids(probe))) == b"0" * (len(probe) - 1) + b"1"
    while ids._old.shape[0] > 1:
        ids.add(*hash_ids(join_ids([f"id-{k}"])))
        k += 1
    assert ids.size == k and ids.nbytes == 2 * old_rows * 16
    assert ids.new_in_block(*hash_ids(join_ids(probe))) == b"0" * (len(probe) - 1) + b"1"
