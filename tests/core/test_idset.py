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
@given(st.lists(BLOCK, max_size=12))
def test_keep_masks_are_those_of_a_python_set(blocks: list[list[str | None]]) -> None:
    ids, seen = IdSet(), set()
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
