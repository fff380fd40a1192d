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
