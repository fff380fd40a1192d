"""Saving and loading a fitted nominal model: one ``.npz`` holding arrays, config and class names.

The worker table and its statistics have a K x K row per hashed slot (65,536 by default), most
of them never used: a file keeps the rows of the slots in use and their numbers
(``crowdtally-nominal/2``), and a loaded model keeps them so (``SavedModel.slots``), every other
row 0. A 100-class model was 5 GB of zeros a table to compress and to read back
(``crowdtally-nominal/1``, still read).
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from app.io.replaced import replaced
from core.evidence import evidence_size
from core.nominal import NominalConfig, NominalParams, sums_size

FORMAT = "crowdtally-nominal/2"
FORMATS = ("crowdtally-nominal/1", FORMAT)
"""What ``load_model`` reads: /1 kept every slot's row, /2 those of the slots in use."""
_KEPT = ("class_logits", "population", "worker", "scalars", "evidence")
"""What a file keeps: the parameters and the calibration's evidence. A loaded model's
statistics start empty (``_parameters``), so the statistics are not written."""
_SCAN_FLOATS = 1 << 22
"""Numbers of a table looked at a time when finding the slots in use (bounded temporaries)."""


class ModelFileError(ValueError):
    """A model file that cannot be read, or does not fit the data."""


@dataclass(frozen=True)
class SavedModel:
    config: NominalConfig
    params: NominalParams
    classes: tuple[str, ...]
    slots: npt.NDArray[np.int64] | None = None
    """Loaded from a file of the slots in use: ``params``' worker table holds the rows of these
    slots only, every other slot's row is 0; None: a row for every slot."""


def save_model(
    path: str | Path, model: SavedModel, slots: npt.NDArray[np.int64] | None = None
) -> None:
    """Write atomically (temporary file, then rename) so a crash never leaves half a model.
    ``slots``: the model's worker table holds the rows of these slots only (ascending; every
    other slot's row is 0); None: a row for every slot, those in use found by looking at
    them."""
    path = Path(path)
    meta = {"format": FORMAT, "config": model.config.to_dict(), "classes": list(model.classes)}
    kept = {k: v for k, v in model.params.arrays().items() if k in _KEPT}
    if slots is None:
        slots = slots_in_use(kept["worker"])
        kept["worker"] = kept["worker"][slots]
    arrays: dict[str, Any] = {"meta": np.array(json.dumps(meta)), **kept}
    arrays["slots"] = np.asarray(slots, dtype=np.int64)
    with replaced(path) as tmp, tmp.open("wb") as fh:
        np.savez_compressed(fh, **arrays)


def slots_in_use(table: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """The slots (first axis) whose row of ``table`` is not all 0, ascending; looked at
    ``_SCAN_FLOATS`` numbers at a time."""
    n, row = table.shape[0], int(np.prod(table.shape[1:]))
    step = max(1, _SCAN_FLOATS // max(row, 1))
    used = np.zeros(n, dtype=bool)
    for lo in range(0, n, step):
        used[lo : lo + step] = np.any(table[lo : lo + step].reshape(-1, row) != 0, axis=1)
    return np.flatnonzero(used).astype(np.int64)


def _parameters(data: Any, config: NominalConfig) -> NominalParams:
    """The file's parameters: every slot's row (/1), or the rows of its slots (/2). Statistics
    start empty, as for any model that comes without them (``core.online.statistics_for``): no
    label counted, the worker table's sum over slots (in slot order) that of its rows (/2:
    given here, the table being only the rows)."""
    arrays = {k: data[k] for k in ("class_logits", "population", "scalars")}
    if "slots" not in data.files:  # /1: every slot's row (statistics made on first use)
        return NominalParams.from_arrays({**arrays, "worker": data["worker"]})
    slots = np.asarray(data["slots"], dtype=np.int64)
    K, S = config.n_classes, config.n_worker_slots
    if slots.size and (slots.min() < 0 or slots.max() >= S or np.any(np.diff(slots) <= 0)):
        raise ValueError(f"slots not ascending in 0..{S - 1}")
    params = NominalParams.from_arrays({**arrays, "worker": data["worker"]})
    if params.worker.shape != (slots.size, K, K):
        raise ValueError(f"worker rows of shape {params.worker.shape} for {slots.size} slots")
    params.sums = np.zeros(sums_size(K))
    params.sums[: K * K] = params.worker.sum(axis=0).ravel()
    return params


def _evidence(data: Any) -> npt.NDArray[np.float64] | None:
    """The calibration's prequential evidence (docs/model.md eq. 22), when the file has it on
    the tempering grid in force (a model saved before it, or on another grid, has none)."""
    if "evidence" not in data.files or data["evidence"].shape != (evidence_size(),):
        return None
    return np.array(data["evidence"], dtype=np.float64)


def load_model(path: str | Path) -> SavedModel:
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            if meta.get("format") not in FORMATS:
                raise ModelFileError(
                    f"{path}: not a crowdtally model (format {meta.get('format')!r})"
                )
            config = NominalConfig.from_dict(meta["config"])
            params = _parameters(data, config)
            params.evidence = _evidence(data)
            slots = np.asarray(data["slots"], dtype=np.int64) if "slots" in data.files else None
    except FileNotFoundError:
        raise ModelFileError(f"{path}: no such file") from None
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as err:
        if isinstance(err, ModelFileError):
            raise
        # (numpy's advice to load a pickle unsafely is not ours to give)
        why = "not a .npz archive of arrays" if "pickled" in str(err) else str(err)
        raise ModelFileError(
            f"{path}: not a readable crowdtally model ({why}; models are written by --model)"
        ) from None
    return SavedModel(config=config, params=params, classes=tuple(meta["classes"]), slots=slots)
