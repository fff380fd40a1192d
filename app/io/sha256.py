"""SHA-256 of many strings at once, compiled (FIPS 180-4, section 6.2): the ids an import gives
answers that have none (``input.hash_id``), a million of them without a Python call each.

The words are 32-bit; numba computes on 64-bit integers, so every sum is masked back to 32
bits and every rotation is written on values below 2**32."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from app.io.triples import string_buffers
from core._numba import jit
from core.threads import block_ranges, in_threads

_K = np.array([
    0x428A2F98, 0x71374491, 0xB5C0FBCF, 0xE9B5DBA5, 0x3956C25B, 0x59F111F1, 0x923F82A4, 0xAB1C5ED5,
    0xD807AA98, 0x12835B01, 0x243185BE, 0x550C7DC3, 0x72BE5D74, 0x80DEB1FE, 0x9BDC06A7, 0xC19BF174,
    0xE49B69C1, 0xEFBE4786, 0x0FC19DC6, 0x240CA1CC, 0x2DE92C6F, 0x4A7484AA, 0x5CB0A9DC, 0x76F988DA,
    0x983E5152, 0xA831C66D, 0xB00327C8, 0xBF597FC7, 0xC6E00BF3, 0xD5A79147, 0x06CA6351, 0x14292967,
    0x27B70A85, 0x2E1B2138, 0x4D2C6DFC, 0x53380D13, 0x650A7354, 0x766A0ABB, 0x81C2C92E, 0x92722C85,
    0xA2BFE8A1, 0xA81A664B, 0xC24B8B70, 0xC76C51A3, 0xD192E819, 0xD6990624, 0xF40E3585, 0x106AA070,
    0x19A4C116, 0x1E376C08, 0x2748774C, 0x34B0BCB5, 0x391C0CB3, 0x4ED8AA4A, 0x5B9CCA4F, 0x682E6FF3,
    0x748F82EE, 0x78A5636F, 0x84C87814, 0x8CC70208, 0x90BEFFFA, 0xA4506CEB, 0xBEF9A3F7, 0xC67178F2,
], dtype=np.uint64)  # fmt: skip
"""The round constants: the first 32 bits of the fractional parts of the cube roots of the
first 64 primes."""
_H0 = np.array([
    0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19,
], dtype=np.uint64)  # fmt: skip
"""The initial hash value: the first 32 bits of the fractional parts of the square roots of
the first 8 primes."""
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def answer_digests(
    columns: tuple[pa.Array, pa.Array, pa.Array],
    rows: npt.NDArray[np.int64],
    occurrence: npt.NDArray[np.int64],
    prefix: str,
    digits: int,
    threads: int = 2,
) -> pa.Array:
    """For each row of ``rows``, ``prefix`` and the first ``digits`` (at most 64) hex digits of
    the SHA-256 of ``item + "\x1f" + worker + "\x1f" + label + "\x1f" + str(n)`` (UTF-8;
    ``columns``: items, workers, labels; ``n``: its ``occurrence``), as a string array: each
    message is put together in the kernel (no string of them is made), long arrays split
    among ``threads`` (the kernel releases the GIL)."""
    (io, idata), (wo, wdata), (lo_, ldata) = (string_buffers(c) for c in columns)
    head = np.frombuffer(prefix.encode(), dtype=np.uint8)
    width = head.size + digits
    out = np.empty(rows.size * width, dtype=np.uint8)

    def part(bounds: tuple[int, int]) -> None:
        lo, hi = bounds
        _answer_digests(
            io, idata, wo, wdata, lo_, ldata, rows[lo:hi], occurrence[lo:hi], head,
            np.int64(digits), out[lo * width : hi * width],
        )  # fmt: skip

    in_threads(part, block_ranges(rows.size, threads))
    ends = np.arange(0, out.size + 1, width, dtype=np.int64)
    kind, ends_type = (pa.string(), np.int32) if out.size < 2**31 else (pa.large_string(), np.int64)
    buffers = [None, pa.py_buffer(ends.astype(ends_type)), pa.py_buffer(out)]
    return pa.Array.from_buffers(kind, rows.size, buffers)


@jit
def _rotr(x, n):  # type: ignore[no-untyped-def]
    return ((x >> np.uint64(n)) | (x << np.uint64(32 - n))) & np.uint64(0xFFFFFFFF)


@jit
def _digest(msg, n, h, w):  # type: ignore[no-untyped-def]
    """The SHA-256 of ``msg[:n]`` into ``h`` (8 words; ``w``: 64 words of scratch)."""
    mask = np.uint64(0xFFFFFFFF)
    total = (n + 8) // 64 * 64 + 64  # the message, 0x80, zeros, its bit length (eq. 5.1.1)
    bits = np.uint64(n) * np.uint64(8)
    h[:] = _H0
    for block in range(0, total, 64):
        for t in range(16):
            word = np.uint64(0)
            for k in range(4):
                at = block + 4 * t + k
                if at < n:
                    byte = np.uint64(msg[at])
                elif at == n:
                    byte = np.uint64(0x80)
                elif at >= total - 8:
                    byte = (bits >> np.uint64(8 * (total - 1 - at))) & np.uint64(0xFF)
                else:
                    byte = np.uint64(0)
                word = (word << np.uint64(8)) | byte
            w[t] = word
        for t in range(16, 64):
            s0 = _rotr(w[t - 15], 7) ^ _rotr(w[t - 15], 18) ^ (w[t - 15] >> np.uint64(3))
            s1 = _rotr(w[t - 2], 17) ^ _rotr(w[t - 2], 19) ^ (w[t - 2] >> np.uint64(10))
            w[t] = (w[t - 16] + s0 + w[t - 7] + s1) & mask
        a, b, c, d, e, f, g, hh = h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]
        for t in range(64):
            big1 = _rotr(e, 6) ^ _rotr(e, 11) ^ _rotr(e, 25)
            choose = (e & f) ^ (~e & mask & g)
            t1 = (hh + big1 + choose + _K[t] + w[t]) & mask
            big0 = _rotr(a, 2) ^ _rotr(a, 13) ^ _rotr(a, 22)
            majority = (a & b) ^ (a & c) ^ (b & c)
            t2 = (big0 + majority) & mask
            hh, g, f, e, d, c, b, a = g, f, e, (d + t1) & mask, c, b, a, (t1 + t2) & mask
        h[0] = (h[0] + a) & mask
        h[1] = (h[1] + b) & mask
        h[2] = (h[2] + c) & mask
        h[3] = (h[3] + d) & mask
        h[4] = (h[4] + e) & mask
        h[5] = (h[5] + f) & mask
        h[6] = (h[6] + g) & mask
        h[7] = (h[7] + hh) & mask


@jit
def _put_hex(h, head, digits, out, at):  # type: ignore[no-untyped-def]
    """``head``, then the first ``digits`` hex digits of the digest ``h``, at ``out[at]``."""
    for k in range(head.size):
        out[at + k] = head[k]
    at += head.size
    for k in range(digits):  # nibble k of the big-endian words
        word = h[k // 8]
        out[at + k] = _HEX[(word >> np.uint64(4 * (7 - k % 8))) & np.uint64(0xF)]


@jit
def _answer_digests(io, idata, wo, wdata, lo, ldata, rows, occurrence, head, digits, out):  # type: ignore[no-untyped-def]
    w = np.empty(64, dtype=np.uint64)
    h = np.empty(8, dtype=np.uint64)
    longest = 0
    for r in rows:
        size = io[r + 1] - io[r] + wo[r + 1] - wo[r] + lo[r + 1] - lo[r]
        longest = max(longest, size)
    msg = np.empty(longest + 3 + 20, dtype=np.uint8)  # three separators, a count's digits
    for k in range(rows.size):
        r = rows[k]
        n = _put_bytes(idata, io[r], io[r + 1], msg, 0)
        msg[n] = 0x1F
        n = _put_bytes(wdata, wo[r], wo[r + 1], msg, n + 1)
        msg[n] = 0x1F
        n = _put_bytes(ldata, lo[r], lo[r + 1], msg, n + 1)
        msg[n] = 0x1F
        n += 1
        count = occurrence[k]
        width = 1
        while count >= 10**width:
            width += 1
        for j in range(width - 1, -1, -1):
            msg[n + j] = 48 + count % 10
            count //= 10
        _digest(msg, n + width, h, w)
        _put_hex(h, head, digits, out, k * (head.size + digits))


@jit
def _put_bytes(src, a, b, dst, at):  # type: ignore[no-untyped-def]
    for k in range(b - a):
        dst[at + k] = src[a + k]
    return at + b - a
