"""The engine's per-item sequences are out of the cyclic garbage collector's walk, and behave
as the lists they replace."""

from __future__ import annotations

import gc
import types
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from app.engine.project import ProjectEngine
from app.engine.snapshots import capture
from app.engine.untracked import UntrackedList
from tests.app.test_engine import RECORD, label_entries
from tests.conftest import Synthetic

_NOT_DATA = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)


def tracked_containers_over(root: object, limit: int) -> list[tuple[str, int]]:
    """The containers the collector walks (tracked), reachable from ``root`` through data
    (not through classes, modules or functions), with more than ``limit`` referents."""
    seen: set[int] = set()
    stack: list[Any] = [root]
    big = []
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, _NOT_DATA):
            continue
        seen.add(id(o))
        if not gc.is_tracked(o):
            continue
        referents = gc.get_referents(o)  # what a collection visits in it
        if len(referents) > limit:
            big.append((type(o).__name__, len(referents)))
        stack.extend(referents)
    return big


def test_no_container_the_collector_walks_grows_with_the_items(synthetic: Synthetic) -> None:
    """A project of 3,000 items, and a snapshot's capture of it, hold no tracked container of
    more than 1,000 entries: each full collection would walk it, a stall of every thread that
    grows with the project."""
    eng = ProjectEngine(RECORD)
    for entry in label_entries(synthetic, [5000, 10000]):
        eng.apply(entry)
    eng.mark_all_dirty()
    eng.state_update()  # (served items, label lists, queue members: made for every item)
    assert eng.items_count == 3000
    assert tracked_containers_over(eng, 1000) == []
    assert tracked_containers_over(capture(eng), 1000) == []  # (held while a snapshot is written)


operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.text(max_size=3)),
        st.tuples(st.just("extend"), st.lists(st.text(max_size=3), max_size=40)),
        st.tuples(st.just("set"), st.integers(-50, 50), st.text(max_size=3)),
        st.tuples(st.just("put"), st.lists(st.integers(0, 50), max_size=5), st.text(max_size=3)),
    ),
    max_size=30,
)


@given(operations, st.lists(st.integers(0, 60), max_size=8), st.integers(-70, 70))
def test_it_behaves_as_a_list(ops: list[Any], picks: list[int], at: int) -> None:
    ours: UntrackedList[str] = UntrackedList()
    theirs: list[str] = []
    for op in ops:
        if op[0] == "append":
            ours.append(op[1])
            theirs.append(op[1])
        elif op[0] == "extend":
            ours.extend(op[1])
            theirs.extend(op[1])
        elif op[0] == "set" and -len(theirs) <= op[1] < len(theirs):
            ours[op[1]] = op[2]
            theirs[op[1]] = op[2]
        elif op[0] == "put":
            where = [i for i in op[1] if i < len(theirs)]
            ours.put(np.array(where, dtype=np.int64), [op[2]] * len(where))
            for i in where:
                theirs[i] = op[2]
    assert ours == theirs and len(ours) == len(theirs) and list(ours) == theirs
    assert ours[at // 3 : at] == theirs[at // 3 : at]
    if -len(theirs) <= at < len(theirs):
        assert ours[at] == theirs[at]
    inside = [i for i in picks if i < len(theirs)]
    assert ours.take(np.array(inside, dtype=np.int64)) == [theirs[i] for i in inside]
    assert not gc.is_tracked(ours._a)
