"""How the engines of a pool share the projects: by load, the labels applied per second.

Each engine measures the labels/s of the projects it applies (``Rates``) and records them in
the store with its name; every engine reads every project's record, so all see the same loads
and which engine carries which. A project counts at least ``FLOOR`` labels/s, so idle
projects spread by count; one not measured yet (``UNKNOWN``: its new holder is still
replaying the backlog a takeover leaves) counts as the median of the measured ones. With L
the pool's load and n the engines alive, the target of each is S = L / n, and at each look at
its leases an engine (``plan_share``):

- takes free projects (no live engine carries them) while its load is below S, in its own
  rendezvous order, so that engines taking at the same moment mostly ask for different ones;
- gives one project up when its load is above S, it has measured every project it holds (a
  guess moves nothing), and the gap g between its load and the least loaded engine's
  exceeds (1 + ``SLACK``) times that project's load p; of those, the project that maximises
  p (g - p), the drop of the sum of the engines' squared loads when it moves there.

That sum only falls, so with steady rates the moves end; the slack keeps a move that would
merely swap two engines' loads from happening. A project held for less than a lease is not
moved (each move costs a restore and a replay), and a project given up is not taken back by
the same engine for three leases. A project larger than S stays where it is and the others
spread around it; an engine alone never gives a project up.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

FLOOR = 1.0
"""Labels/s every project counts for, busy or not: idle projects are shared by count."""
SLACK = 0.5
"""A project of load p moves only across a gap of more than (1 + SLACK) p between loads."""
TAU_S = 10.0
"""Time constant of the moving average of a project's labels/s."""
UNKNOWN = -1.0
"""The rate of a project no engine has measured yet: counted as the median of the others'."""


def preference(engine_id: str, project: str) -> int:
    """Rendezvous hashing: each engine ranks the projects in its own pseudo-random order, so
    engines asking for their share at the same time mostly ask for different projects."""
    digest = hashlib.blake2b(f"{engine_id}\0{project}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@dataclass
class Rates:
    """Labels applied per second by each project this engine holds, a moving average."""

    tau_s: float = TAU_S
    _last: dict[str, tuple[int, float]] = field(default_factory=dict)
    _measured: dict[str, float] = field(default_factory=dict)
    rate: dict[str, float] = field(default_factory=dict)

    def observe(
        self, project: str, n_labels: int, now: float, prior: float, settled: bool = True
    ) -> None:
        """The project's count of applied labels at ``now``; ``prior``: its last recorded
        rate (another engine's, before this one took it), served until a first interval.
        Not ``settled``: the engine may still be replaying a backlog (applying faster than
        labels come), so no interval counts yet."""
        last = self._last.get(project)
        self._last[project] = (n_labels, now)
        if last is None or not settled or now <= last[1] or n_labels < last[0]:
            self.rate[project] = self._measured.get(project, prior)
            return
        seen = (n_labels - last[0]) / (now - last[1])
        keep = math.exp(-(now - last[1]) / self.tau_s)
        before = self._measured.get(project, seen)
        self.rate[project] = self._measured[project] = keep * before + (1.0 - keep) * seen

    def forget(self, project: str) -> None:
        for held in (self._last, self._measured, self.rate):
            held.pop(project, None)


@dataclass(frozen=True)
class Plan:
    take: list[str]
    """Free projects to ask for, in order, while the engine's load stays below ``target``
    (``acquire``)."""
    give_up: str | None
    """A project to give up, or None."""
    load: dict[str, float]
    """Each project's load (labels/s, at least ``FLOOR``)."""
    mine: float
    """This engine's load."""
    target: float
    """The pool's load over the engines alive."""


def plan_share(
    me: str,
    alive: Iterable[str],
    records: Mapping[str, tuple[str, float]],
    projects: Iterable[str],
    held: Mapping[str, float],
    movable: Iterable[str],
    blocked: Iterable[str] = (),
) -> Plan:
    """What engine ``me`` should take and give up. ``records``: each project's last recorded
    (engine, labels/s), engine "" when free; ``projects``: every project; ``held``: the
    projects ``me`` holds, with its own measure of their labels/s; ``movable``: those it may
    give up; ``blocked``: free projects it must not take."""
    alive_set = set(alive) | {me}
    load: dict[str, float] = {}
    carried = dict.fromkeys(alive_set, 0.0)
    owner: dict[str, str] = {}
    free = []
    for project in projects:
        holder, rate = records.get(project, ("", UNKNOWN))
        if project in held:
            holder, rate = me, held[project]
        elif holder == me:
            holder = ""  # recorded as this engine's, but no longer held: lost or given up
        load[project] = rate
        owner[project] = holder if holder in alive_set else ""
    known = sorted(r for r in load.values() if r >= 0.0)
    typical = known[len(known) // 2] if known else 0.0  # (a median: one hot project aside)
    for project, rate in load.items():
        load[project] = max(rate if rate >= 0.0 else typical, FLOOR)
        if owner[project]:
            carried[owner[project]] += load[project]
        else:
            free.append(project)
    target = sum(load.values()) / len(alive_set)
    mine = carried[me]
    skip = set(blocked)
    take = sorted((p for p in free if p not in skip), key=lambda p: preference(me, p), reverse=True)
    give_up = None
    others = [carried[e] for e in alive_set if e != me]
    if mine > target and others and all(r >= 0.0 for r in held.values()):
        gap = mine - min(others)
        gains = {
            p: load[p] * (gap - load[p])
            for p in movable
            if p in load and gap > (1.0 + SLACK) * load[p]
        }
        give_up = max(gains, key=lambda p: (gains[p], preference(me, p)), default=None)
    return Plan(take if mine < target else [], give_up, load, mine, target)


def acquire(plan: Plan, lease: Callable[[str], bool]) -> list[str]:
    """Ask for the plan's free projects in order (``lease``: True when taken) until this
    engine's load reaches the target; the projects taken."""
    mine, taken = plan.mine, []
    for project in plan.take:
        if mine >= plan.target:
            break
        if lease(project):
            taken.append(project)
            mine += plan.load[project]
    return taken
