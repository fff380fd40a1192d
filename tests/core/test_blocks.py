import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.blocks import LARGE, WEIGHT_BLOCKS, LabelBlocks, _grouped, canonical_order


def test_total_weight_is_zero_for_blocks_without_labels_anywhere() -> None:
    blocks = LabelBlocks.group(
        np.array([0, 0, 2]),
        np.array([0, 1, 0]),
        np.array([1, 0, 1]),
        weights=np.array([1.0, 2.0, 3.0]),
        n_blocks=4,
    )
    assert blocks.total_weight().tolist() == [3.0, 0.0, 3.0, 0.0]
    assert LabelBlocks.group(
        np.zeros(0, dtype=np.int64),
        np.zeros(0, dtype=np.int64),
        np.zeros(0, dtype=np.int64),
        n_blocks=2,
    ).total_weight().tolist() == [0.0, 0.0]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 3), st.integers(0, 2**32 - 1))
def test_total_weight_by_slices_adds_each_blocks_weights_in_order(extra: int, seed: int) -> None:
    """Blocks taken WEIGHT_BLOCKS at a time (and any chosen blocks, in any order) sum to what
    one bincount over every label gives, bit for bit: each block's weights in label order."""
    rng = np.random.default_rng(seed)
    n_blocks = WEIGHT_BLOCKS * 2 + extra
    sizes = rng.integers(0, 4, n_blocks)
    block = np.repeat(np.arange(n_blocks), sizes)
    weights = rng.uniform(0.01, 3.0, block.size)
    blocks = LabelBlocks.group(block, block % 7, block % 2, weights, n_blocks=n_blocks)
    whole = np.bincount(np.repeat(np.arange(n_blocks), blocks.sizes()), blocks.weights, n_blocks)
    assert np.array_equal(blocks.total_weight(), whole)
    which = rng.permutation(n_blocks)[: WEIGHT_BLOCKS + 5]
    assert np.array_equal(blocks.total_weight(which), whole[which])
    assert blocks.total_weight(np.zeros(0, dtype=np.int64)).size == 0


def test_blocks_hold_one_dtype_whatever_they_are_given() -> None:
    """int64 codes or strided views become int32 slot and label codes (4 bytes an answer: 80 MB
    less than int64 at 10M answers), int64 ends and float64 weights, as C arrays: the kernels
    are compiled once per argument type, and each other type costs seconds of compiling."""
    labels = np.array([0, 1, 0, 1], dtype=np.int64)[::2]
    blocks = LabelBlocks(np.array([0, 2], dtype=np.int32), labels.copy(), labels, [1, 1])
    for a, dtype in ((blocks.ptr, np.int64), (blocks.slots, np.int32),
                     (blocks.labels, np.int32), (blocks.weights, np.float64)):  # fmt: skip
        assert a.dtype == dtype and a.flags.c_contiguous
    assert blocks.labels.tolist() == [0, 0]


@settings(max_examples=80, deadline=None)
@given(
    st.integers(0, 400), st.integers(1, 6), st.integers(1, 5), st.integers(1, 3),
    st.integers(0, 2**32 - 1),
)  # fmt: skip
def test_the_compiled_grouping_is_numpys_stable_sort(
    n: int, n_blocks: int, n_slots: int, n_weights: int, seed: int
) -> None:
    """Long files are grouped by a counting sort and per-block insertion or merge sorts (a
    block of up to 400 labels here): the same permutation as sorting by (block, slot, label,
    weight), ties in input order."""
    rng = np.random.default_rng(seed)
    block, slots = rng.integers(0, n_blocks, n), rng.integers(0, n_slots, n)
    labels, weights = rng.integers(0, 3, n), rng.choice([0.5, 1.0, 2.0][:n_weights], n)
    expected = np.lexsort((weights, labels, slots, block))
    for with_order in (True, False):
        ptr, s, z, w, got = _grouped(
            block, slots, labels, weights, 1.0, np.int64(n_blocks), with_order
        )
        assert np.array_equal(got, expected if with_order else expected[:0])
        assert np.array_equal(ptr, np.r_[0, np.cumsum(np.bincount(block, minlength=n_blocks))])
        assert np.array_equal(s, slots[expected]) and np.array_equal(z, labels[expected])
        assert np.array_equal(w, weights[expected])


def test_the_compiled_grouping_carries_equal_weights_as_their_value() -> None:
    """Equal weights (a broadcast) are not passed to the kernel: the grouped blocks still hold
    their value, not 1.0."""
    rng = np.random.default_rng(3)
    n = LARGE + 7
    block, slots, labels = (rng.integers(0, k, n) for k in (n // 5, 300, 4))
    for value in (1.0, 2.5):
        blocks = LabelBlocks.group(block, slots, labels, np.broadcast_to(value, n), n // 5)
        order = np.lexsort((labels, slots, block))
        assert np.array_equal(blocks.slots, slots[order])
        assert np.array_equal(blocks.labels, labels[order])
        assert np.all(blocks.weights == value)


def test_large_inputs_take_the_compiled_grouping_with_the_same_result() -> None:
    rng = np.random.default_rng(1)
    n = LARGE + 5
    block, slots, labels = (rng.integers(0, k, n) for k in (n // 5, 300, 4))
    weights = np.ones(n)
    order = canonical_order(block, slots, labels, weights)
    assert np.array_equal(order, np.lexsort((weights, labels, slots, block)))


def test_weights_of_every_kind_share_one_compiled_grouping() -> None:
    """A file without weights passes a read-only broadcast of 1.0; one with weights, a column
    that may be read-only: the kernel is given weights of one type (or none, when they are
    all equal), so a first long file of either kind compiles the same single signature."""
    rng = np.random.default_rng(2)
    n = LARGE + 5
    block, slots, labels = (rng.integers(0, k, n) for k in (n // 5, 300, 4))
    uneven = rng.choice([0.5, 1.0, 2.0], n)
    read_only = uneven.copy()
    read_only.flags.writeable = False
    cases = [np.ones(n), np.broadcast_to(1.0, n), uneven, read_only, uneven[::1].astype(">f8")]
    for weights in cases:
        expected = np.lexsort((weights, labels, slots, block))
        assert np.array_equal(canonical_order(block, slots, labels, weights), expected)
    weight_types = {signature[3] for signature in _grouped.signatures}
    assert len(weight_types) == 1, _grouped.signatures


def test_a_files_int32_codes_group_as_int64_ones() -> None:
    """A file's item, worker and label codes are int32 and reach the kernel as they are:
    the blocks are those of the same codes as int64, on both the compiled and numpy paths."""
    rng = np.random.default_rng(4)
    for n in (LARGE + 3, 500):
        block, slots, labels = (rng.integers(0, k, n) for k in (n // 5, 300, 4))
        weights = rng.choice([0.5, 1.0], n)
        wide = LabelBlocks.group(block, slots, labels, weights, n // 5)
        narrow = LabelBlocks.group(
            block.astype(np.int32), slots.astype(np.int32), labels.astype(np.int32), weights, n // 5
        )
        for field in ("ptr", "slots", "labels", "weights"):
            assert np.array_equal(getattr(narrow, field), getattr(wide, field)), field


@pytest.mark.parametrize("field", ["slots", "labels"])
@pytest.mark.parametrize("code", [2**31, -1])
def test_codes_that_int32_cannot_hold_are_refused_not_wrapped(field: str, code: int) -> None:
    """A slot of a model of more than 2^31 slots (or a negative code) would wrap to another
    slot if cast: it is an error."""
    codes = {"slots": np.array([0, 1]), "labels": np.array([0, 1])}
    codes[field] = np.array([0, code], dtype=np.int64)
    with pytest.raises(ValueError, match=f"{field} codes must lie in"):
        LabelBlocks(np.array([0, 2]), codes["slots"], codes["labels"], [1.0, 1.0])
