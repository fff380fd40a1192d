"""Ids as codes: the compiled hash table, or the array by number while every id is a plain
number, gives each id its first appearance's number, over any number of chunks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.io import codebook
from app.io.codebook import Codebook


def first_appearance(ids: list[str]) -> list[int]:
    seen: dict[str, int] = {}
    return [seen.setdefault(x, len(seen)) for x in ids]


def assert_coded_in_chunks(chunks: list[list[str]]) -> None:
    """One codebook codes the chunks in turn: first appearances, and the ids in that order."""
    book = Codebook()
    got = [book.codes(pa.array(c, pa.string())).tolist() for c in chunks]
    flat = [x for c in chunks for x in c]
    assert [code for c in got for code in c] == first_appearance(flat)
    assert book.names.to_pylist() == list(dict.fromkeys(flat))


def test_codes_are_first_appearances_across_chunks_as_the_table_grows() -> None:
    rng = np.random.default_rng(0)
    pool = [f"item-{n}" for n in range(20_000)] + ["é", "猫", "a" * 300, "a" * 301, "x,y"]
    ids = [pool[k] for k in rng.integers(0, len(pool), 60_000)]
    book = Codebook()
    sliced = pa.array(["skipped", *ids], pa.string()).slice(1)  # an offset into its buffers
    got = np.concatenate([book.codes(sliced.slice(lo, 7_000)) for lo in range(0, len(ids), 7_000)])
    assert got.tolist() == first_appearance(ids)
    assert book.names.to_pylist() == list(dict.fromkeys(ids))
    assert len(book) == len(set(ids))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.text(max_size=6), max_size=40), max_size=8))
def test_any_chunks_of_any_ids_get_first_appearance_codes(chunks: list[list[str]]) -> None:
    assert_coded_in_chunks(chunks)


def test_plain_numbers_keep_their_codes_when_other_ids_come() -> None:
    """Numbers are coded by the array until an id that is not one (a leading zero, a sign, ten
    digits, a word) or a number too large for it: from there the hash table, built from every
    id so far, codes them all the same way."""
    rng = np.random.default_rng(1)
    numbers = [str(k) for k in rng.integers(0, 50_000, 30_000)]
    others = ["012", "0", "00", "+5", "-5", "1234567890", "word", "5 ", "999999999", "7"]
    ids = numbers + others + numbers[:5_000] + [str(k) for k in rng.integers(0, 60_000, 9_000)]
    book = Codebook()
    got = np.concatenate(
        [book.codes(pa.array(ids[lo : lo + 4_000])) for lo in range(0, len(ids), 4_000)]
    )
    assert got.tolist() == first_appearance(ids)
    assert book.names.to_pylist() == list(dict.fromkeys(ids))


def test_large_or_sparse_numbers_go_to_the_hash_table(monkeypatch: pytest.MonkeyPatch) -> None:
    book = Codebook()
    ids = ["3", "999999999", "3", "5", "999999999"]  # a number far past 8 slots an id
    assert book.codes(pa.array(ids)).tolist() == [0, 1, 0, 2, 1]
    assert book._by_number is None  # (the hash table took over)
    monkeypatch.setattr(codebook, "NUMBER_LIMIT", 100)
    small = Codebook()
    assert small.codes(pa.array(["99", "100", "99", "7"])).tolist() == [0, 1, 0, 2]
    assert small._by_number is None


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.lists(
            st.from_regex(r"(0|[1-9][0-9]{0,10}|0[0-9]{1,2}|-?[0-9]{1,3}|x[0-9])", fullmatch=True),
            max_size=40,
        ),
        max_size=8,
    )
)
def test_any_chunks_of_number_like_ids_get_first_appearance_codes(chunks: list[list[str]]) -> None:
    assert_coded_in_chunks(chunks)


FREED_AND_KEPT = """
import sys
import numpy as np
from app.io.codes import release_unused_memory

def resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

large = np.ones(16 << 17)  # 16 MiB mapped and freed: glibc raises its mmap threshold past it
del large
if sys.argv[1] == "from-now-on":
    release_unused_memory(from_now_on=True)
before = resident()
block = np.ones(4 << 17)  # 4 MiB written and freed
del block
print((resident() - before) / 2**20)
"""


def test_after_the_file_is_read_freed_blocks_go_back_to_the_system() -> None:
    """``extract`` asks malloc to map blocks of 1 MiB or more once the file is read, so the
    temporaries freed while it learns do not stay in the peak (10M answers, batch: 230 MB)."""
    if not Path("/proc/self/statm").exists():
        pytest.skip("reads the resident size from /proc")

    def kept_mib(mode: str) -> float:
        run = subprocess.run([sys.executable, "-c", FREED_AND_KEPT, mode], capture_output=True,
                             text=True, check=True)  # fmt: skip
        return float(run.stdout)

    if kept_mib("as-is") < 3.0:  # (a malloc that gives such blocks back anyway: not glibc's)
        pytest.skip("this malloc does not keep a freed 4 MiB block")
    assert kept_mib("from-now-on") < 1.0
