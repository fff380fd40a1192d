"""A pool of engines sharing the projects (leases with fencing tokens): each project applied by
one engine at a time, taken over when its engine stops, and a paused engine's late write
refused. On each store (the real Redis and the embedded one), engines stepped in turn."""

from __future__ import annotations

import time
from collections.abc import Callable
from unittest import mock

import numpy as np
import orjson
import pytest

from app.engine.loop import EngineLoop, Pool
from app.engine.project import ProjectEngine
from app.serving import warmup
from app.store.base import LogEntry, ProjectRecord, Store
from core.nominal import NominalConfig

NAMES = ["p0", "p1", "p2", "p3"]
LEASE_S = 0.4


@pytest.fixture(autouse=True, scope="module")
def kernels_loaded() -> None:
    """The engines here are stepped by hand, with no thread renewing their leases between
    steps: a first step that loaded the kernels (0.7 s on a slow machine) would outlast them."""
    warmup.nominal()


def labels(rng: np.random.Generator, n: int = 50) -> bytes:
    return orjson.dumps({
        "items": [f"i{v}" for v in rng.integers(0, 30, n).tolist()],
        "workers": [f"w{v}" for v in rng.integers(0, 8, n).tolist()],
        "labels": rng.integers(0, 3, n).tolist(),
        "weights": None,
    })  # fmt: skip


def post_everywhere(store: Store, rng: np.random.Generator) -> None:
    for name in NAMES:
        store.append(name, "labels", labels(rng))


def step_all(*loops: EngineLoop) -> None:
    for _ in range(3):
        for loop in loops:
            loop.step()


def settle(loops: tuple[EngineLoop, ...], done: Callable[[], bool]) -> None:
    """Step the engines in turn until ``done`` (each looks at its leases every third of one)."""
    deadline = time.monotonic() + 4 * LEASE_S
    while not done():
        assert time.monotonic() < deadline, [sorted(loop.engines) for loop in loops]
        step_all(*loops)
        time.sleep(LEASE_S / 20)


def full_reads(loads: mock.Mock) -> int:
    """How many of these ``record_loads`` calls read every record back (``read``, its second
    argument, left at its default or True)."""
    return sum(bool(c.args[1] if len(c.args) > 1 else c.kwargs.get("read", True))
               for c in loads.call_args_list)  # fmt: skip


def assert_served_is_a_replay(store: Store, names: list[str] = NAMES) -> None:
    for name in names:
        replay = ProjectEngine(store.get_project(name))  # type: ignore[arg-type]
        replay.apply_all(store.read_log(name, 0, 10**6))
        assert store.applied_position(name) == replay.position == store.log_end(name)
        served = dict(store.scan_items(name, 0, 10**6)[1])
        for item, code in replay.items.code.items():
            assert (
                orjson.loads(served[item])["posterior"]
                == replay.shown(np.array([code]))[0].tolist()
            )


def test_a_pool_shares_projects_takes_over_and_fences_a_paused_engine(store: Store) -> None:
    warm = ProjectEngine(ProjectRecord("warm", ("a", "b", "c"), NominalConfig(3).to_dict(), 1.0))
    warm.apply(LogEntry(1, "labels", labels(np.random.default_rng(9))))  # kernels loaded: a
    warm.state_update()  # first step longer than the lease would lose it
    for name in NAMES:
        store.create_project(ProjectRecord(name, ("a", "b", "c"), NominalConfig(3).to_dict(), 1.0))
    a = EngineLoop(store, refine_passes=0, pool=Pool("A", LEASE_S))
    b = EngineLoop(store, refine_passes=0, pool=Pool("B", LEASE_S))
    rng = np.random.default_rng(0)
    post_everywhere(store, rng)
    settle((a, b), lambda: len(a.engines) == len(b.engines) == 2)  # a share of 2 each
    assert sorted([*a.engines, *b.engines]) == NAMES
    assert_served_is_a_replay(store)

    # A pauses (no renewal) past its lease; B takes its projects over and applies new labels.
    held_by_a = sorted(a.engines)
    a._next_claim = float("inf")  # paused: it will not look at its leases again
    time.sleep(LEASE_S * 1.2)
    post_everywhere(store, rng)
    step_all(b)
    assert sorted(b.engines) == NAMES
    # A resumes mid-work: it applies the entries it finds and writes with its old token.
    post_everywhere(store, rng)
    served_before = {n: store.applied_position(n) for n in held_by_a}
    a.step()
    assert not a.engines and a.leases_lost == 0  # let go on the refused write
    assert {n: store.applied_position(n) for n in held_by_a} == served_before  # nothing landed
    step_all(b)
    assert_served_is_a_replay(store)

    # A comes back (its leases checked again): B gives up what is beyond its share.
    a._next_claim = 0.0
    settle((a, b), lambda: len(a.engines) == len(b.engines) == 2)
    post_everywhere(store, rng)
    step_all(a, b)
    assert_served_is_a_replay(store)
    b.release_leases()  # B stops: A takes everything once B no longer counts as alive
    post_everywhere(store, rng)
    settle((a,), lambda: sorted(a.engines) == NAMES)
    step_all(a)
    assert_served_is_a_replay(store)


def test_an_engine_in_a_long_step_keeps_its_leases(store: Store) -> None:
    """While a step takes longer than the lease (a restore, a sweep over every label), a
    thread of the running engine renews its leases: no other engine takes the project."""
    store.create_project(ProjectRecord("p0", ("a", "b", "c"), NominalConfig(3).to_dict(), 1.0))
    a = EngineLoop(store, refine_passes=0, pool=Pool("A", LEASE_S))
    quick = a._step_project
    slow = [True]

    def long_step(name: str, record: ProjectRecord) -> int:
        if slow.pop() if slow else False:
            time.sleep(3 * LEASE_S)
        return quick(name, record)

    a._step_project = long_step  # type: ignore[method-assign]
    a.start()
    try:
        time.sleep(1.5 * LEASE_S)  # A is in its long step, past one lease
        b = EngineLoop(store, refine_passes=0, pool=Pool("B", LEASE_S))
        b.step()
        assert not b.engines and store.acquire_lease("p0", "B", LEASE_S) == 0
    finally:
        a.stop()
    assert a.leases_lost == 0


def test_a_pool_of_one_keeps_every_project_whatever_their_loads(store: Store) -> None:
    """Alone, an engine never gives a project up (each give-up costs a restore and a replay),
    whatever traffic its projects get."""
    names = [f"r{n}" for n in range(7)]
    for name in names:
        store.create_project(ProjectRecord(name, ("a", "b", "c"), NominalConfig(3).to_dict(), 1.0))
    a = EngineLoop(store, refine_passes=0, pool=Pool("A", LEASE_S))
    rng = np.random.default_rng(4)
    for k in range(30):
        for n, name in enumerate(names):
            store.append(name, "labels", labels(rng, 1 + (37 * n * (k + 3)) % 301))
        step_all(a)
        time.sleep(LEASE_S / 12)
    assert sorted(a.engines) == names and a.given_up == 0 and a.leases_lost == 0


def test_a_pool_shares_by_load_a_hot_project_gets_an_engine_to_itself(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One project takes 100 times the labels of each of four others: the pool of two ends
    with the hot one alone on one engine and the four on the other (by count it would be
    two and three), every label applied once."""
    names = ["hot", "q0", "q1", "q2", "q3"]
    for name in names:
        store.create_project(ProjectRecord(name, ("a", "b", "c"), NominalConfig(3).to_dict(), 1.0))
    # the engines' looks at their leases (each asks which engines are alive), and their writes
    # of load records
    looks = mock.Mock(wraps=store.engines_alive)
    loads = mock.Mock(wraps=store.record_loads)
    monkeypatch.setattr(store, "engines_alive", looks)
    monkeypatch.setattr(store, "record_loads", loads)
    a = EngineLoop(store, refine_passes=0, pool=Pool("A", LEASE_S))
    b = EngineLoop(store, refine_passes=0, pool=Pool("B", LEASE_S))
    rng = np.random.default_rng(5)
    deadline = time.monotonic() + 25 * LEASE_S
    settled_at = None
    while settled_at is None or time.monotonic() < settled_at + 3 * LEASE_S:  # and stays so
        store.append("hot", "labels", labels(rng, 400))
        for name in names[1:]:
            store.append(name, "labels", labels(rng, 4))
        step_all(a, b)
        hot, cool = (a, b) if "hot" in a.engines else (b, a)
        if sorted(hot.engines) == ["hot"] and sorted(cool.engines) == names[1:]:
            settled_at = settled_at or time.monotonic()
        else:
            assert settled_at is None, "moved again once settled"
            assert time.monotonic() < deadline, (sorted(a.engines), sorted(b.engines))
        time.sleep(LEASE_S / 20)
    step_all(a, b)
    assert_served_is_a_replay(store, names)
    assert a.leases_lost == b.leases_lost == 0
    # every record read once per look at the leases, moves or not (the pool's costliest read)
    assert a.given_up + b.given_up > 0 and full_reads(loads) == looks.call_count > 0


def test_a_project_whose_lease_lapsed_under_a_live_engine_is_taken_over(store: Store) -> None:
    """A lease lost while its engine lives on (its renewals failed while the store was
    unreachable): the engine lets the project go and records it free, and the other engine
    takes it, though the engine that lost it is alive and above its share."""
    for name in NAMES:
        store.create_project(ProjectRecord(name, ("a", "b", "c"), NominalConfig(3).to_dict(), 1.0))
    a = EngineLoop(store, refine_passes=0, pool=Pool("A", LEASE_S))
    rng = np.random.default_rng(2)
    post_everywhere(store, rng)
    step_all(a)
    assert sorted(a.engines) == NAMES
    b = EngineLoop(store, refine_passes=0, pool=Pool("B", LEASE_S))
    b._next_claim = float("inf")  # B is alive and holds nothing, but looks at no lease yet
    b.store.engines_alive("B", LEASE_S)
    lost = NAMES[0]
    a._lapsed.add(lost)  # as a failed renewal finds it
    a._next_claim = 0.0
    a.step()
    assert lost not in a.engines and a.leases_lost == 1
    b._next_claim = 0.0
    settle((a, b), lambda: lost in b.engines)
    post_everywhere(store, rng)
    step_all(a, b)
    assert_served_is_a_replay(store)
