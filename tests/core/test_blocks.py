import numpy as np

from core.blocks import LabelBlocks


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


def test_blocks_hold_one_dtype_whatever_they_are_given() -> None:
    """int32 codes (a file's) or strided views become int64/float64 C arrays: the kernels are
    compiled once per argument type, and each other type costs seconds of compiling."""
    labels = np.array([0, 1, 0, 1], dtype=np.int32)[::2]
    blocks = LabelBlocks(np.array([0, 2], dtype=np.int32), labels.copy(), labels, [1, 1])
    for a, dtype in ((blocks.ptr, np.int64), (blocks.slots, np.int64),
                     (blocks.labels, np.int64), (blocks.weights, np.float64)):  # fmt: skip
        assert a.dtype == dtype and a.flags.c_contiguous
    assert blocks.labels.tolist() == [0, 0]
