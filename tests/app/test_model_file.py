"""A model file keeps the rows of the worker slots in use (``crowdtally-nominal/2``) and gives
every slot's row back; files of the first format, every slot's row kept, still load alike."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app.io.model_file import ModelFileError, SavedModel, load_model, save_model, slots_in_use
from core.nominal import NominalConfig, NominalParams
from core.online import statistics_for

CONFIG = NominalConfig(n_classes=3, n_worker_slots=64)


def fitted() -> NominalParams:
    """Parameters with a few slots in use, their statistics and evidence."""
    rng = np.random.default_rng(3)
    params = NominalParams.initial(CONFIG)
    used = np.array([2, 17, 40, 63])
    params.worker[used] = rng.normal(size=(4, 3, 3))
    assert params.counts is not None and params.sums is not None
    params.counts[used] = rng.random((4, 3, 3))  # (statistics: a file does not keep them)
    params.class_logits[:] = rng.normal(size=3)
    params.scalars[:] = [0.7, 123.0]
    return params


def test_a_model_file_keeps_the_slots_in_use_and_gives_every_row_back(tmp_path: Path) -> None:
    params = fitted()
    save_model(tmp_path / "m.npz", SavedModel(CONFIG, params, ("a", "b", "c")))
    with np.load(tmp_path / "m.npz") as data:
        assert data["slots"].tolist() == [2, 17, 40, 63]
        assert data["worker"].shape == (4, 3, 3) and "counts" not in data.files
    loaded = load_model(tmp_path / "m.npz")
    assert loaded.classes == ("a", "b", "c") and loaded.config == CONFIG
    assert loaded.slots is not None and loaded.slots.tolist() == [2, 17, 40, 63]
    assert np.array_equal(every_row(loaded), params.worker)
    for name in ("class_logits", "population", "scalars"):
        assert np.array_equal(getattr(loaded.params, name), getattr(params, name)), name
    # statistics start empty, as for any model without them: the worker table's sum kept
    _, sums = statistics_for(params)
    assert loaded.params.counts is None
    assert np.array_equal(loaded.params.sums, sums)


def every_row(model: SavedModel) -> np.ndarray:
    """A loaded model's worker table over every slot."""
    if model.slots is None:
        return model.params.worker
    S, K = model.config.n_worker_slots, model.config.n_classes
    out = np.zeros((S, K, K))
    out[model.slots] = model.params.worker
    return out


def test_rows_of_the_slots_in_use_save_as_the_whole_table(tmp_path: Path) -> None:
    params = fitted()
    used = slots_in_use(params.worker)
    rows = NominalParams(
        params.class_logits, params.population, params.worker[used], params.scalars,
        None, params.sums, params.evidence,
    )  # fmt: skip
    save_model(tmp_path / "whole.npz", SavedModel(CONFIG, params, ("a", "b", "c")))
    save_model(tmp_path / "rows.npz", SavedModel(CONFIG, rows, ("a", "b", "c")), used)
    with np.load(tmp_path / "whole.npz") as a, np.load(tmp_path / "rows.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for name in a.files:
            assert np.array_equal(a[name], b[name]), name


def test_a_file_of_the_first_format_still_loads(tmp_path: Path) -> None:
    params = fitted()
    meta = {
        "format": "crowdtally-nominal/1",
        "config": CONFIG.to_dict(),
        "classes": ["a", "b", "c"],
    }
    np.savez_compressed(tmp_path / "old.npz", meta=np.array(json.dumps(meta)), **params.arrays())
    loaded = load_model(tmp_path / "old.npz")
    assert loaded.slots is None and np.array_equal(loaded.params.worker, params.worker)
    assert loaded.params.counts is None  # (made on first use, as it always was)


def test_slots_outside_the_table_are_refused(tmp_path: Path) -> None:
    params = fitted()
    save_model(tmp_path / "m.npz", SavedModel(CONFIG, params, ("a", "b", "c")))
    with np.load(tmp_path / "m.npz") as data:
        arrays = {k: data[k] for k in data.files}
    arrays["slots"] = arrays["slots"] + 1  # the last one past slot 63
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ModelFileError, match=r"slots not ascending in 0\.\.63"):
        load_model(tmp_path / "bad.npz")
