"""Saving and loading a fitted nominal model: one ``.npz`` holding arrays, config and class names."""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from core.evidence import evidence_size
from core.nominal import NominalConfig, NominalParams

FORMAT = "crowdtally-nominal/1"


class ModelFileError(ValueError):
    """A model file that cannot be read, or does not fit the data."""


@dataclass(frozen=True)
class SavedModel:
    config: NominalConfig
    params: NominalParams
    classes: tuple[str, ...]


def save_model(path: str | Path, model: SavedModel) -> None:
    """Write atomically (temporary file, then rename) so a crash never leaves half a model."""
    path = Path(path)
    meta = {"format": FORMAT, "config": model.config.to_dict(), "classes": list(model.classes)}
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as fh:
        arrays: dict[str, Any] = {"meta": np.array(json.dumps(meta)), **model.params.arrays()}
        np.savez_compressed(fh, **arrays)
    tmp.replace(path)


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
            if meta.get("format") != FORMAT:
                raise ModelFileError(
                    f"{path}: not a crowdtally model (format {meta.get('format')!r})"
                )
            params = NominalParams.from_arrays(
                {k: data[k] for k in ("class_logits", "population", "worker", "scalars")}
            )
            params.evidence = _evidence(data)
    except FileNotFoundError:
        raise ModelFileError(f"{path}: no such file") from None
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as err:
        if isinstance(err, ModelFileError):
            raise
        raise ModelFileError(f"{path}: not a readable crowdtally model ({err})") from None
    config = NominalConfig.from_dict(meta["config"])
    return SavedModel(config=config, params=params, classes=tuple(meta["classes"]))
