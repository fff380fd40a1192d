"""The predictions file of ``crowdtally extract``: item,label,probability,<one column per class>.

CSV is written as Python's csv module writes it (numbers as ``%.6g``, fields quoted only when
they must be, CRLF line ends), but formatted by compiled code a block of rows at a time;
Parquet (a ``.parquet`` path) keeps the posteriors as float64 columns. The CSV always starts
with its header, whose names may repeat (a class named ``item``, ``label`` or
``probability``): its columns are read by position, as its first row says.
"""

from __future__ import annotations

import csv
import io
import math
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from app.io.codebook import arrow_ints
from app.io.csv_fields import csv_field
from app.io.replaced import replaced
from app.io.triples import string_buffers
from core._numba import jit
from core.blocks import FloatArray, IntArray

COLUMNS = ("item", "label", "probability")
"""The columns before the one per class."""
ROWS_PER_BLOCK = 1 << 16
NUMBER_BYTES = 16  # the longest %.6g of a float64: -1.23457e-308


def write_predictions(
    path: Path, item_names: pa.Array, classes: tuple[str, ...], posteriors: FloatArray
) -> None:
    """Each item's most probable class, its probability, and its posterior; written to a
    temporary file first, then renamed over ``path`` (``replaced``)."""
    best = posteriors.argmax(axis=1)
    with replaced(path) as tmp:
        if path.suffix.lower() == ".parquet":
            _write_parquet(tmp, item_names, classes, posteriors, best)
        else:
            with tmp.open("wb") as fh:
                _write_csv(fh, item_names, classes, posteriors, best)


def print_predictions(
    out: BinaryIO, item_names: pa.Array, classes: tuple[str, ...], posteriors: FloatArray
) -> None:
    """``write_predictions``' CSV, written to a stream (standard output)."""
    _write_csv(out, item_names, classes, posteriors, posteriors.argmax(axis=1))
    out.flush()


def _write_parquet(
    path: Path,
    item_names: pa.Array,
    classes: tuple[str, ...],
    posteriors: FloatArray,
    best: IntArray,
) -> None:
    labels = pa.DictionaryArray.from_arrays(arrow_ints(best), arrow_strings(list(classes)))
    rows = np.arange(best.size)
    columns = [item_names, labels, arrow_floats(posteriors[rows, best])]
    columns += [arrow_floats(posteriors[:, k]) for k in range(len(classes))]
    names = [*COLUMNS, *classes]
    import pyarrow.parquet as pq  # (here: writing CSV spares its import)

    pq.write_table(pa.Table.from_arrays(columns, names=names), path)


def _write_csv(
    fh: BinaryIO,
    item_names: pa.Array,
    classes: tuple[str, ...],
    posteriors: FloatArray,
    best: IntArray,
) -> None:
    header = io.StringIO()
    csv.writer(header).writerow([*COLUMNS, *classes])
    items = _csv_fields(item_names)
    labels = _csv_fields(arrow_strings(list(classes)))
    if not _plain_numbers(posteriors):
        return _write_csv_slowly(fh, items, labels, posteriors, best, header.getvalue())
    item_offsets, item_bytes = string_buffers(items)
    label_offsets, label_bytes = string_buffers(labels)
    K = posteriors.shape[1]
    widest = int(np.diff(label_offsets).max()) + (K + 1) * 17 + 4  # a row, but for its item

    def block(lo: int) -> memoryview:
        hi = min(best.size, lo + ROWS_PER_BLOCK)
        mantissa, exponent = _significant_digits(posteriors[lo:hi])
        out = np.empty(int(item_offsets[hi] - item_offsets[lo]) + (hi - lo) * widest, np.uint8)
        n = _format_rows(
            item_offsets[lo : hi + 1], item_bytes, label_offsets, label_bytes,
            best[lo:hi], mantissa, exponent, out,
        )  # fmt: skip
        return out[:n].data  # (written as it is: no copy to bytes)

    # Blocks are formatted two at a time (compiled loops that release the GIL) and written in
    # order; at most two are held.
    with ThreadPoolExecutor(max_workers=2) as pool:
        fh.write(header.getvalue().encode("utf-8"))
        ahead: deque[Future[memoryview]] = deque()
        for lo in range(0, best.size, ROWS_PER_BLOCK):
            if len(ahead) == 2:
                fh.write(ahead.popleft().result())
            ahead.append(pool.submit(block, lo))
        for f in ahead:
            fh.write(f.result())


def _write_csv_slowly(
    fh: BinaryIO,
    items: pa.Array,
    labels: pa.Array,
    posteriors: FloatArray,
    best: IntArray,
    header: str,
) -> None:
    """Rows with negative, negative-zero or non-finite numbers, by Python's formatting."""
    names = labels.to_pylist()
    fh.write(header.encode("utf-8"))
    for item, k, row in zip(items.to_pylist(), best.tolist(), posteriors.tolist(), strict=True):
        cells = [f"{row[k]:.6g}", *(f"{p:.6g}" for p in row)]
        fh.write((",".join([item, names[k], *cells]) + "\r\n").encode("utf-8"))


@jit
def _plain_numbers(x: FloatArray) -> bool:
    """Every number finite, at least 0 and not -0.0 (one pass, no temporary arrays)."""
    for i in range(x.shape[0]):
        for k in range(x.shape[1]):
            v = x[i, k]
            if not (0.0 <= v < math.inf) or math.copysign(1.0, v) < 0.0:
                return False
    return True


def _csv_fields(names: pa.Array) -> pa.Array:
    """Names as csv.writer writes them: quoted (quotes doubled) if they hold , " CR or LF."""
    offsets, data = string_buffers(names)
    if not _needs_quotes(data[offsets[0] : offsets[-1]]):
        return names
    return arrow_strings([csv_field(name) for name in names.to_pylist()])


@jit
def _needs_quotes(data: npt.NDArray[np.uint8]) -> bool:
    """A comma, a double quote, CR or LF among ``data`` (a compiled scan: a regular
    expression over 2M names took 60 ms)."""
    for byte in data:  # noqa: SIM110 (a loop numba compiles; any() of a generator no)
        if byte == 44 or byte == 34 or byte == 13 or byte == 10:
            return True
    return False


def arrow_strings(values: list[str]) -> pa.Array:
    """A list of str as an arrow string array (built from its buffers: no pandas import)."""
    encoded = [v.encode("utf-8") for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    data = pa.py_buffer(b"".join(encoded))
    return pa.Array.from_buffers(pa.string(), len(encoded), [None, pa.py_buffer(offsets), data])


def arrow_floats(values: FloatArray) -> pa.Array:
    values = np.ascontiguousarray(values, dtype=np.float64)
    return pa.Array.from_buffers(pa.float64(), values.size, [None, pa.py_buffer(values)])


def _significant_digits(x: FloatArray) -> tuple[IntArray, IntArray]:
    """%.6g's six significant digits (as an integer, 0 for 0) and decimal exponent of each
    number. The compiled rounding is exact but within 1e-9 of a half-way case, where
    Python's correctly rounded formatting decides."""
    mantissa, exponent, doubtful = _digits(np.ascontiguousarray(x))
    for i, k in zip(*np.nonzero(doubtful), strict=True):
        text = f"{x[i, k]:.5e}"  # d.ddddde+XX: the digits %.6g rounds to
        mantissa[i, k] = int(text[0] + text[2:7])
        exponent[i, k] = int(text[8:])
    return mantissa, exponent


_LOG10_2 = math.log10(2.0)
_POWERS_OF_TEN = np.array([10.0**k for k in range(23)])
"""10**0 to 10**22: the powers of ten that are exact doubles."""


@jit
def _scaled(x: float, k: int) -> float:
    """x * 10**k, with powers of ten that are exact doubles (|k| <= 22 each step)."""
    while k > 22:
        x *= 1e22
        k -= 22
    while k < -22:
        x /= 1e22
        k += 22
    power: float = _POWERS_OF_TEN[abs(k)]
    return x * power if k >= 0 else x / power


@jit
def _digits(
    x: FloatArray,
) -> tuple[IntArray, IntArray, npt.NDArray[np.bool_]]:
    n, K = x.shape
    mantissa = np.zeros((n, K), dtype=np.int64)
    exponent = np.zeros((n, K), dtype=np.int64)
    doubtful = np.zeros((n, K), dtype=np.bool_)
    for i in range(n):
        for k in range(K):
            v = x[i, k]
            if v == 0.0:
                continue
            # the decimal exponent from the binary one, never above floor(log10 v): the first
            # loop then finds the smallest e whose y rounds to at most six digits, as from
            # floor(log10 v) (one log10 a number was a third of this loop's time)
            e = math.floor((math.frexp(v)[1] - 1) * _LOG10_2 - 1e-9)
            y = _scaled(v, 5 - e)
            while y >= 999999.5:  # rounds to 7 digits: one more power of ten
                e += 1
                y = _scaled(v, 5 - e)
            while y < 99999.5:
                e -= 1
                y = _scaled(v, 5 - e)
            whole = np.floor(y)
            # y carries at most a few units of 2^-53 of relative error: near a half-way case
            # (or a boundary of the exponent, itself one) the rounding is left to Python
            doubtful[i, k] = abs(y - whole - 0.5) < 1e-9
            mantissa[i, k] = int(whole) + (1 if y - whole > 0.5 else 0)
            exponent[i, k] = e
    return mantissa, exponent, doubtful


@jit
def _put_number(m: int, e: int, out: npt.NDArray[np.uint8], at: int) -> int:
    """Write %.6g of m * 10**(e-5) (m: six digits, or 0) at ``out[at]``; the new end.
    Digits are written from the last one back, straight from m (no scratch array: an
    allocation per number was half of the formatting's time)."""
    if m == 0:
        out[at] = 48
        return at + 1
    n = 6  # digits kept: %.6g drops trailing zeros
    while n > 1 and m % 10 == 0:
        m //= 10
        n -= 1
    if 0 <= e < 6:  # d.dd or ddd.d or dddd00: e + 1 digits before the point
        if n <= e + 1:
            for j in range(n, e + 1):
                out[at + j] = 48
            end = at + e + 1
        else:
            out[at + e + 1] = 46
            end = at + n + 1
        for j in range(n - 1, -1, -1):
            out[at + j + (1 if j > e else 0)] = 48 + m % 10
            m //= 10
        return end
    if -4 <= e < 0:  # 0.000ddd
        out[at] = 48
        out[at + 1] = 46
        for j in range(-e - 1):
            out[at + 2 + j] = 48
        at += 2 - e - 1
        for j in range(n - 1, -1, -1):
            out[at + j] = 48 + m % 10
            m //= 10
        return at + n
    for j in range(n - 1, 0, -1):  # d.ddde+XX
        out[at + j + 1] = 48 + m % 10
        m //= 10
    out[at] = 48 + m
    if n > 1:
        out[at + 1] = 46
        at += n + 1
    else:
        at += 1
    out[at] = 101
    out[at + 1] = 45 if e < 0 else 43
    at += 2
    a = abs(e)
    width = 3 if a >= 100 else 2
    for j in range(width - 1, -1, -1):
        out[at + j] = 48 + a % 10
        a //= 10
    return at + width


@jit
def _format_rows(
    item_offsets: IntArray,
    item_bytes: npt.NDArray[np.uint8],
    label_offsets: IntArray,
    label_bytes: npt.NDArray[np.uint8],
    best: IntArray,
    mantissa: IntArray,
    exponent: IntArray,
    out: npt.NDArray[np.uint8],
) -> int:
    at = 0
    for i in range(best.size):
        for b in range(item_offsets[i], item_offsets[i + 1]):
            out[at] = item_bytes[b]
            at += 1
        out[at] = 44
        at += 1
        k = best[i]
        for b in range(label_offsets[k], label_offsets[k + 1]):
            out[at] = label_bytes[b]
            at += 1
        out[at] = 44
        at = _put_number(mantissa[i, k], exponent[i, k], out, at + 1)
        for c in range(mantissa.shape[1]):
            out[at] = 44
            at = _put_number(mantissa[i, c], exponent[i, c], out, at + 1)
        out[at] = 13
        out[at + 1] = 10
        at += 2
    return at
