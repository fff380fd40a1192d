"""Random schedules of faults around one project on a private Redis with its AOF: blocks
appended (with ids), engine steps, snapshots, the engine restarted, Redis killed under a state
write, Redis rolled back to an AOF size taken earlier (the client then posts again every block
acknowledged since, as docs/deploy.md tells it to). At the end, once the engine is idle: every
label applied exactly once and the served state that of a fresh replay of the log, and a new
engine restored from SQL agrees too.

Each seed is one schedule (the same one on every run); the seeds below are schedules that
found a defect (a state restored past a lost read; a failed write never written again).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import redis

import app.engine.loop as engine_loop
from app.engine.loop import EngineLoop
from app.engine.snapshots import Snapshotter
from app.store.archive import SnapshotDB
from app.store.base import StateUpdate
from app.store.redis_store import RedisStore
from tests.app.test_redis_rollback import (
    RECORD,
    RedisWithAof,
    block,
    check_against_replay,
    label_ids,
    redis_and_sql,
)


@dataclass
class Schedule:
    redis_: RedisWithAof
    db: SnapshotDB
    store: RedisStore
    rng: np.random.Generator
    interval_s: float
    batch: int
    loop: EngineLoop = field(init=False)
    blocks: list[tuple[bytes, list[str | None]]] = field(default_factory=list)
    acked_at: dict[int, int] = field(default_factory=dict)  # block -> step of the schedule
    marks: list[tuple[int, int]] = field(default_factory=list)  # (step, AOF size)

    def __post_init__(self) -> None:
        self.loop = self.new_loop()

    def new_loop(self) -> EngineLoop:
        snap = Snapshotter(self.db, self.store, interval_s=self.interval_s, keep=3)
        return EngineLoop(self.store, refine_passes=0, snapshotter=snap, batch_entries=self.batch)

    def restart_engine(self) -> None:
        assert self.loop.snapshotter is not None
        self.loop.snapshotter.close()
        self.loop = self.new_loop()

    def append(self, n: int, at: int) -> None:
        self.store.append("p", "labels", *self.blocks[n])
        self.acked_at[n] = at

    def post_new(self, at: int) -> None:
        self.blocks.append(block(len(self.blocks), self.rng, size=int(self.rng.integers(5, 60))))
        self.append(len(self.blocks) - 1, at)

    def step_with_redis_dying_in_the_write(self) -> None:
        write = self.store.write_state

        def crash_first(project: str, update: StateUpdate) -> None:
            self.redis_.crash()
            write(project, update)

        self.store.write_state = crash_first  # type: ignore[method-assign]
        try:
            self.loop.step()
        except redis.ConnectionError:
            pass  # (the step fails when the store does)
        finally:
            self.store.write_state = write  # type: ignore[method-assign]

    def roll_back(self, at: int) -> None:
        """Redis back to a size taken earlier (killed under a write, or not); every block
        acknowledged since is posted again, the engine stepping now and then."""
        mark, size = self.marks[int(self.rng.integers(0, len(self.marks)))]
        self.marks = [m for m in self.marks if m[0] <= mark]
        if self.rng.random() < 0.5:
            self.step_with_redis_dying_in_the_write()
        self.redis_.restart_truncated(size)
        if self.rng.random() < 0.3:
            self.restart_engine()
        for n, t in list(self.acked_at.items()):
            if t >= mark:
                self.append(n, at)
                if self.rng.random() < 0.3:
                    self.loop.step()

    def run(self, steps: int) -> None:
        for at in range(steps):
            r = self.rng.random()
            if r < 0.45:
                self.post_new(at)
            elif r < 0.75:
                self.loop.step()
            elif r < 0.82:
                self.marks.append((at, self.redis_.aof_size()))
            elif r < 0.88 and self.marks:
                self.roll_back(at)
            elif r < 0.93:
                self.restart_engine()
            elif self.loop.snapshotter is not None:
                self.loop.snapshotter.wait()

    def settle(self) -> None:
        for _ in range(3):
            self.loop.run_until_idle()
            assert self.loop.snapshotter is not None
            self.loop.snapshotter.wait()
            self.loop.step()


@pytest.mark.parametrize("seed", [20, 24, 90, 280, 295, 298, 1, 2])
def test_a_schedule_of_faults_ends_in_the_replay_of_the_log(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Time compressed: every step looks at the log again, as a running engine does within
    # QUIET_RECHECK_S (a roll-back that moves no entry is seen there).
    monkeypatch.setattr(engine_loop, "QUIET_RECHECK_S", 1e-6)
    rng = np.random.default_rng(seed)
    with redis_and_sql(tmp_path, join_entries=True) as (redis_, db, store):
        store.create_project(RECORD)
        interval, batch = float(rng.choice([0.0, 0.0, 3600.0])), int(rng.choice([1, 4, 64]))
        schedule = Schedule(redis_, db, store, rng, interval, batch)
        try:
            schedule.run(60)
            schedule.settle()
            want = label_ids(schedule.blocks)
            check_against_replay(store, db, schedule.loop.engines["p"], want)
            schedule.restart_engine()
            schedule.loop.run_until_idle()
            check_against_replay(store, db, schedule.loop.engines["p"], want)
        finally:
            assert schedule.loop.snapshotter is not None
            schedule.loop.snapshotter.close()
