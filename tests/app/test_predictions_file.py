"""The predictions file: CSV byte for byte as Python's csv module writes it (numbers as %.6g),
Parquet with the same columns at full precision."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from app.io import predictions_file
from app.io.predictions_file import arrow_strings, write_predictions
from app.io.triples import string_buffers


def python_csv(path: Path, items: list[str], classes: list[str], posteriors: np.ndarray) -> None:
    """The reference: csv.writer, one row at a time."""
    best = posteriors.argmax(axis=1)
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["item", "label", "probability", *classes])
        for item, k, row in zip(items, best.tolist(), posteriors.tolist(), strict=True):
            writer.writerow([item, classes[k], f"{row[k]:.6g}", *(f"{p:.6g}" for p in row)])


def hard_numbers(rng: np.random.Generator, n: int) -> np.ndarray:
    """Numbers at every magnitude, with the cases %.6g rounds with care: half-way digits,
    carries into the next power of ten, the 1e-4 and 1e+6 notation boundaries, subnormals."""
    spread = 10.0 ** rng.uniform(-320, 8, n) * rng.random(n)
    special = np.array([
        0.0, 1.0, 0.5, 1e-5, 1e-4, 9.999995e-5, 0.00010000049999, 0.1234565, 0.1234575,
        0.9999995, 0.99999949999, 999999.5, 999999.4999, 1e6, 123456.5, 2.5e-7, 5e-324,
        2.2250738585072014e-308, 1e-100, 1.0000005, 0.30000000000000004, 1 / 3,
    ])  # fmt: skip
    halfway = (rng.integers(100000, 999999, n) + 0.5) * 10.0 ** rng.integers(-12, 0, n)
    return np.concatenate([spread, special, halfway])


def test_csv_is_what_python_csv_writes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    numbers = hard_numbers(rng, 3000)
    posteriors = numbers[: numbers.size // 3 * 3].reshape(-1, 3)
    items = [f"i{n}" for n in range(len(posteriors))]
    items[:4] = ["a,b", 'say "hi"', "line\nbreak", "ünï\u00a0cöde"]
    classes = ["x", "y,z", 'q"']
    mine, reference = tmp_path / "mine.csv", tmp_path / "ref.csv"
    write_predictions(mine, arrow_strings(items), tuple(classes), posteriors)
    python_csv(reference, items, classes, posteriors)
    assert mine.read_bytes() == reference.read_bytes()


def test_blocks_of_rows_and_unusual_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(predictions_file, "ROWS_PER_BLOCK", 7)  # several blocks
    rng = np.random.default_rng(1)
    posteriors = rng.dirichlet(np.ones(4), size=50)
    items = [f"item{n}" for n in range(50)]
    # (a slice whose buffer holds a name that needs quotes, outside the slice)
    names = pa.concat_arrays([arrow_strings(['p,"ad']), arrow_strings(items)]).slice(1)
    unusual = np.where(posteriors > 0.5, -0.0, posteriors)
    unusual[3, 1] = np.nan  # negative zeros, NaN, inf: written by Python's formatting
    unusual[4, 2] = np.inf
    for case in (posteriors, unusual):
        mine, reference = tmp_path / "mine.csv", tmp_path / "ref.csv"
        write_predictions(mine, names, ("a", "b", "c", "d"), case)
        python_csv(reference, items, ["a", "b", "c", "d"], case)
        assert mine.read_bytes() == reference.read_bytes()


def test_parquet_keeps_full_precision(tmp_path: Path) -> None:
    posteriors = np.random.default_rng(2).dirichlet(np.ones(3), size=20)
    path = tmp_path / "p.parquet"
    write_predictions(
        path, arrow_strings([f"i{n}" for n in range(20)]), ("a", "b", "c"), posteriors
    )
    table = pq.read_table(path)
    assert table.column_names == ["item", "label", "probability", "a", "b", "c"]
    assert table.column("item").to_pylist() == [f"i{n}" for n in range(20)]
    best = posteriors.argmax(axis=1)
    assert table.column("label").to_pylist() == [("a", "b", "c")[k] for k in best]
    got = np.column_stack([table.column(k).to_numpy() for k in ("a", "b", "c")])
    assert np.array_equal(got, posteriors)
    assert np.array_equal(table.column("probability").to_numpy(), posteriors.max(axis=1))


def test_name_bytes_reach_the_writer_read_only_whatever_their_buffer() -> None:
    """Arrow's buffers are read-only or not by origin; the compiled writer gets one type."""
    for names in (arrow_strings(["a", "bc"]), pa.array(["a", "bc"]), pa.array(["", ""])):
        _, raw = string_buffers(names)
        assert not raw.flags.writeable


@pytest.mark.parametrize("name", ["p.csv", "p.parquet"])
def test_a_full_disk_names_the_output_and_leaves_it_and_no_part_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """ENOSPC comes from the write itself, naming no file (the command line printed a
    traceback and left a half-written ``.tmp``): it is raised naming the output, the
    temporary file goes, and an earlier output stays as it was."""
    path = tmp_path / name
    items, classes = arrow_strings(["a", "b"]), ("x", "y")
    posteriors = np.array([[0.9, 0.1], [0.2, 0.8]])
    write_predictions(path, items, classes, posteriors)
    before = path.read_bytes()

    def disk_full(out: object, *args: object) -> None:
        if hasattr(out, "write"):
            out.write(b"half a row")
        else:
            Path(str(out)).write_bytes(b"half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(predictions_file, "_write_csv", disk_full)
    monkeypatch.setattr(predictions_file, "_write_parquet", disk_full)
    with pytest.raises(OSError) as err:
        write_predictions(path, items, classes, posteriors[::-1])
    assert (err.value.filename, err.value.strerror) == (str(path), "No space left on device")
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
    assert path.read_bytes() == before
