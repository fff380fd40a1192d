"""Sharing a pool's projects by load (app/engine/sharing.py): the plan each engine makes at a
look at its leases, simulated over whole pools, and the moving average of a project's rate."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.sharing import FLOOR, SLACK, UNKNOWN, Rates, acquire, plan_share


def simulate(
    loads: dict[str, float], holders: dict[str, str], engines: list[str], rounds: int = 400
) -> tuple[dict[str, str], int]:
    """Every engine looks at its leases in turn, each round, until a whole round changes
    nothing (a project given up is blocked for its giver for 3 rounds, as for 3 leases).
    Returns who holds what and the number of projects moved."""
    holders = dict(holders)
    blocked: dict[str, dict[str, int]] = {e: {} for e in engines}
    moves = 0
    quiet = 0
    for r in range(rounds):
        changed = False
        for e in engines:
            records = {p: (holders.get(p, ""), rate) for p, rate in loads.items()}
            held = {p: loads[p] for p, h in holders.items() if h == e}
            plan = plan_share(e, engines, records, loads, held, held,
                              [p for p, until in blocked[e].items() if until > r])  # fmt: skip
            if plan.give_up is not None:
                holders[plan.give_up] = ""
                blocked[e][plan.give_up] = r + 3
                moves += 1
                changed = True

            def lease(p: str) -> bool:
                return holders.get(p, "") == ""  # its lease is free: acquired

            for p in acquire(plan, lease):
                holders[p] = e
                changed = True
        quiet = 0 if changed else quiet + 1
        if quiet > 3:  # past every block
            return holders, moves
    raise AssertionError(f"no steady sharing after {rounds} rounds: {holders}")


def carried(
    loads: dict[str, float], holders: dict[str, str], engines: list[str]
) -> dict[str, float]:
    out = dict.fromkeys(engines, 0.0)
    for p, e in holders.items():
        out[e] += max(loads[p], FLOOR)
    return out


def test_idle_projects_are_shared_by_count() -> None:
    loads = {f"p{n}": 0.0 for n in range(9)}
    holders, _ = simulate(loads, dict.fromkeys(loads, "A"), ["A", "B", "C"])
    assert sorted(carried(loads, holders, ["A", "B", "C"]).values()) == [3.0, 3.0, 3.0]


def test_a_hot_project_keeps_an_engine_to_itself() -> None:
    loads = {"hot": 5000.0, **{f"p{n}": 50.0 for n in range(8)}}
    holders, _ = simulate(loads, dict.fromkeys(loads, "A"), ["A", "B"])
    hot = holders["hot"]
    assert [p for p, e in holders.items() if e == hot] == ["hot"]


def test_an_engine_alone_gives_nothing_up() -> None:
    loads = {"hot": 5000.0, "p": 1.0}
    held = dict(loads)
    plan = plan_share("A", ["A"], {p: ("A", r) for p, r in loads.items()}, loads, held, held)
    assert plan.give_up is None and plan.take == []


def test_a_project_not_measured_yet_counts_as_the_median_of_the_measured() -> None:
    """B took its projects a moment ago and has not measured them: A, with the same traffic,
    does not take that for an idle engine and gives nothing up."""
    records = {"a1": ("A", 900.0), "a2": ("A", 1000.0), "a3": ("A", 1100.0),
               "b1": ("B", UNKNOWN), "b2": ("B", UNKNOWN), "b3": ("B", 20_000.0)}  # fmt: skip
    held = {"a1": 900.0, "a2": 1000.0, "a3": 1100.0}
    plan = plan_share("A", ["A", "B"], records, records, held, held)
    assert plan.load["b1"] == plan.load["b2"] == 1100.0 and plan.give_up is None
    unmeasured_as_idle = dict(records, b1=("B", 0.0), b2=("B", 0.0), b3=("B", 0.0))
    assert plan_share("A", ["A", "B"], unmeasured_as_idle, records, held, held).give_up
    mine_unmeasured = dict(held, a3=UNKNOWN)
    assert not plan_share(
        "A", ["A", "B"], unmeasured_as_idle, records, mine_unmeasured, held
    ).give_up


def test_a_dead_engines_projects_are_free_to_the_others() -> None:
    loads = {"a": 10.0, "b": 10.0, "c": 10.0}
    records = {"a": ("A", 10.0), "b": ("dead", 10.0), "c": ("dead", 10.0)}
    plan = plan_share("A", ["A", "B"], records, loads, {"a": 10.0}, ["a"])
    assert sorted(plan.take) == ["b", "c"] and plan.give_up is None


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.floats(0.0, 1e5), min_size=1, max_size=14),
    st.integers(1, 4),
    st.data(),
)
def test_any_pool_settles_with_every_project_held_and_no_move_left_worth_making(
    rates: list[float], n_engines: int, data: st.DataObject
) -> None:
    engines = [f"e{k}" for k in range(n_engines)]
    loads = {f"p{n}": r for n, r in enumerate(rates)}
    start = {p: data.draw(st.sampled_from([*engines, ""])) for p in loads}
    holders, moves = simulate(loads, start, engines)
    assert all(holders[p] in engines for p in loads)  # none left free
    assert moves <= 3 * len(loads)
    load = carried(loads, holders, engines)
    target = sum(load.values()) / n_engines
    least = min(load.values())
    for p, e in holders.items():  # no move left that evens the pool out
        if load[e] > target:
            assert load[e] - least <= (1 + SLACK) * max(loads[p], FLOOR) + 1e-9


def test_rates_follow_a_steady_stream() -> None:
    rates = Rates(tau_s=2.0)
    rates.observe("p", 0, 0.0, prior=7.0)
    assert rates.rate["p"] == 7.0  # another engine's figure until a first interval
    for k in range(1, 41):
        rates.observe("p", 300 * k, 0.5 * k, prior=7.0)  # 600 labels/s
    assert math.isclose(rates.rate["p"], 600.0, rel_tol=1e-6)
    rates.observe("p", 12_000, 25.0, prior=7.0)  # idle for 5 s: decays toward 0
    assert rates.rate["p"] < 600.0 * math.exp(-2.0) + 1e-9


def test_acquire_stops_at_the_target_and_skips_a_refused_lease() -> None:
    loads = {p: 10.0 for p in "abcd"}
    plan = plan_share("A", ["A", "B"], {"d": ("B", 10.0)}, loads, {}, [])
    assert plan.target == 20.0 and sorted(plan.take) == ["a", "b", "c"]
    refused = plan.take[0]
    taken = acquire(plan, lambda p: p != refused)
    assert taken == plan.take[1:]  # two of 10 reach the target of 20: no third asked for
    assert acquire(plan, lambda p: True) == plan.take[:2]
