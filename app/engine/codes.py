"""Dense codes 0, 1, 2, ... for keys (ids, hashed slots), given in order of first appearance."""

from __future__ import annotations

from collections.abc import Hashable
from itertools import compress, repeat
from operator import is_
from typing import TypeVar

import numpy as np

from core.blocks import IntArray

K = TypeVar("K", bound=Hashable)


def first_seen_codes(code: dict[K, int], keys: list[K]) -> tuple[IntArray, list[K]]:
    """The codes of ``keys`` in ``code`` (key -> code, codes 0..len(code)-1), the keys not in
    it given the next codes in the order they first appear; and those new keys. Looked up,
    picked and added by maps: no Python loop per key."""
    known = list(map(code.get, keys))
    if None not in known:
        return np.array(known, dtype=np.int64), []
    new = list(dict.fromkeys(compress(keys, map(is_, known, repeat(None)))))
    first = len(code)
    code.update(zip(new, range(first, first + len(new)), strict=True))
    return np.fromiter(map(code.__getitem__, keys), np.int64, len(keys)), new
