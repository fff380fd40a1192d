"""The AsyncClient against a live service."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import pytest
from crowdtally_client import ApiError, AsyncClient, parse_jsonl

if TYPE_CHECKING:
    from conftest import LiveServer


def test_async_round_trip(live_server: LiveServer) -> None:
    async def run() -> None:
        async with AsyncClient(live_server.url, live_server.admin_key) as admin:
            name = live_server.project_name("async")
            key = (await admin.create_project(name, ["yes", "no"])).api_key
        labels = [
            {"item": f"q{n}", "worker": f"w{n % 5}", "label": "yes" if n % 3 else "no"}
            for n in range(120)
        ]
        async with AsyncClient(live_server.url, key, batch_size=50, concurrency=4) as c:
            got = await c.post_labels(name, labels, ids="auto", id_namespace="run1", wait=True)
            assert (got.accepted, got.blocks) == (120, 3)
            again = await c.post_labels(name, labels, ids="auto", id_namespace="run1", wait=True)
            assert again.duplicates == 120 and again.accepted == 0
            items = [x async for x in c.iter_items(name, page_size=16)]
            assert len(items) == 120
            one = await c.get_item(name, "q1")
            assert one.label == "yes"
            workers = await c.worker_confusions(name)
            assert sorted(w.worker for w in workers) == [f"w{n}" for n in range(5)]
            assert all(w.confusion is not None for w in workers)
            lines = [ln async for ln in c.export(name)]
            assert {r["item"] for r in parse_jsonl(lines)} == {x.item for x in items}
            await c.post_gold(name, [{"item": "q0", "label": "no"}], wait=True)
            assert (await c.get_item(name, "q0")).gold == "no"
            with pytest.raises(ApiError) as err:
                await c.post_labels(name, [("q1", "w1", "maybe")])
            assert err.value.code == "unknown_label" and err.value.entry == 0
            assert (await c.get_project(name)).stats.n_labels == 120
            deadline = time.monotonic() + 30  # the predictions' model follows the posteriors
            while ((await c.get_project(name)).stats.dyadic_position or 0) < got.position:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            sync_like = await c.predict(name, [("w1", "q1"), ("w2", "q7")])
            assert [p.trained for p in sync_like] == [True, True]
            page = await c.boundary(name, worker="w1", limit=3, candidates=50)
            assert page.worker == "w1" and len(page.pairs) <= 3
            hs = [p.h_min for p in page.pairs]
            assert all(h is not None for h in hs) and hs == sorted(hs)  # type: ignore[type-var]

    asyncio.run(run())


def test_async_concurrent_posts_with_ids_are_idempotent(live_server: LiveServer) -> None:
    async def run() -> None:
        async with AsyncClient(live_server.url, live_server.admin_key) as admin:
            name = live_server.project_name("conc")
            key = (await admin.create_project(name, ["a", "b"])).api_key
        labels = [(f"t{n}", f"w{n % 3}", "ab"[n % 2]) for n in range(30)]
        async with AsyncClient(live_server.url, key) as c:
            results = await asyncio.gather(
                *(c.post_labels(name, labels, ids="auto", wait=True) for _ in range(4))
            )
            assert sum(r.accepted for r in results) == 30
            assert sum(r.duplicates for r in results) == 90

    asyncio.run(run())


def test_a_failed_fan_out_stops_the_other_requests(live_server: LiveServer) -> None:
    """``worker_confusions`` raised the first 404 and left the other GETs running (unclosed
    sockets at ``aclose``); ``wait_ready`` was the sync client's only."""

    async def run() -> None:
        async with AsyncClient(live_server.url, live_server.admin_key) as admin:
            await admin.wait_ready(timeout=5)
            name = live_server.project_name("fanout")
            key = (await admin.create_project(name, ["yes", "no"])).api_key
        labels = [{"item": f"q{n}", "worker": f"w{n}", "label": "yes"} for n in range(40)]
        async with AsyncClient(live_server.url, key, concurrency=2) as c:
            await c.post_labels(name, labels, wait=True)
            with pytest.raises(ApiError) as err:
                await c.worker_confusions(name, ["nope", *(f"w{n}" for n in range(40))])
            assert err.value.status == 404
            assert asyncio.all_tasks() == {asyncio.current_task()}  # nothing left running

    asyncio.run(run())
