"""The active-learning queue through the sync and async clients, against a live service."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from crowdtally_client import ApiError, AsyncClient, Client, QueuePage, QueueSettings

if TYPE_CHECKING:
    from conftest import LiveServer

CLASSES = ["asian", "black", "hispanic", "white", "other"]
DEFAULT = {
    "policy": "lookahead",
    "target_confidence": 0.95,
    "max_labels_per_item": None,
    "budget": None,
}
FIVE = [("new0", f"w{j}", "white") for j in range(5)]  # agreeing: new0 is finished
SPLIT = [("new1", "w0", "white"), ("new1", "w1", "asian")]


def new_project(live_server: LiveServer, stem: str) -> tuple[str, str]:
    with Client(live_server.url, live_server.admin_key) as admin:
        name = live_server.project_name(stem)
        return name, admin.create_project(name, CLASSES).api_key


def settings_of(s: QueueSettings) -> dict[str, Any]:
    return s.model_dump(include=set(DEFAULT))


def check_page(page: QueuePage) -> None:
    """Best first; ``progress.open`` counts the items the queue holds."""
    scores = [x.score for x in page.items]
    assert scores == sorted(scores, reverse=True)
    assert page.progress.open == page.size and len(page.items) <= page.size


def test_register_label_and_read_the_queue(live_server: LiveServer) -> None:
    name, key = new_project(live_server, "queue")
    with Client(live_server.url, key) as c:
        got = c.register_items(name, [*(f"new{i}" for i in range(5)), np.int64(7)], wait=True)
        assert (got.accepted, got.duplicates, got.blocks, got.applied) == (6, 0, 1, True)
        page = c.queue(name)
        check_page(page)
        assert (page.size, page.policy, page.worker) == (6, "lookahead", None)
        assert {x.item for x in page.items} == {"new0", "new1", "new2", "new3", "new4", "7"}
        assert all(x.n_labels == 0 and x.label is None for x in page.items)
        assert page.progress.done == 0 and page.progress.expected_accuracy is None

        c.post_labels(name, FIVE + SPLIT, ids="auto", wait=True)
        page = c.queue(name, limit=10)
        check_page(page)
        assert page.size == 5 and "new0" not in {x.item for x in page.items}
        assert [x.n_labels for x in page.items if x.item == "new1"] == [2]
        progress = page.progress
        assert progress.done == 1 and progress.expected_accuracy is not None
        assert progress.expected_accuracy >= 0.95  # the target it was finished at
        assert progress.labels_to_finish is not None and progress.labels_to_finish >= progress.open

        two = c.queue(name, limit=2)
        assert len(two.items) == 2 and two.size == 5

        mine = c.queue(name, worker="w0")  # w0 labelled new0 (finished) and new1
        assert mine.worker == "w0" and mine.progress.open == mine.size == 5
        assert {x.item for x in mine.items} == {"new2", "new3", "new4", "7"}
        assert {x.item for x in c.queue(name, worker="w4").items} == {x.item for x in page.items}


def test_register_items_in_blocks_and_again(live_server: LiveServer) -> None:
    name, key = new_project(live_server, "reg")
    with Client(live_server.url, key, batch_size=2) as c:
        got = c.register_items(name, (f"t{n}" for n in range(5)), wait=True)
        assert (got.accepted, got.blocks) == (5, 3)
        c.register_items(name, ["t0", "t4"], wait=True)  # registering again changes nothing
        assert c.queue(name, limit=100).size == 5
        with pytest.raises(ValueError, match="collection of ids"):
            c.register_items(name, "t9")
        with pytest.raises(ValueError, match="item 1 is missing"):
            c.register_items(name, ["t9", float("nan")])


def test_queue_settings_round_trip(live_server: LiveServer) -> None:
    name, key = new_project(live_server, "settings")
    with Client(live_server.url, key) as c:
        assert settings_of(c.queue_settings(name)) == DEFAULT
        want = {"policy": "uniform", "target_confidence": 0.9, "max_labels_per_item": 3}
        put = c.set_queue_settings(
            name,
            policy="uniform",
            target_confidence=0.9,
            max_labels_per_item=np.int64(3),  # type: ignore[arg-type]
            budget=100,
            wait=True,
        )
        assert settings_of(put) == settings_of(c.queue_settings(name)) == {**want, "budget": 100}
        assert c.queue(name).policy == "uniform"
        # a PUT replaces the settings: what it leaves out takes its default
        put = c.set_queue_settings(name, policy="margin")
        assert settings_of(put) == {**DEFAULT, "policy": "margin"}
        c.refit(name, wait=True)  # the engine has applied the PUT
        assert settings_of(c.queue_settings(name)) == settings_of(put)
        with pytest.raises(ApiError) as err:
            c.set_queue_settings(name, policy="random")  # type: ignore[arg-type]
        assert err.value.status == 422 and err.value.field == "policy"


def test_async_queue(live_server: LiveServer) -> None:
    name, key = new_project(live_server, "aqueue")

    async def run() -> None:
        async with AsyncClient(live_server.url, key) as c:
            got = await c.register_items(name, [f"new{i}" for i in range(4)], wait=True)
            assert (got.accepted, got.applied) == (4, True)
            put = await c.set_queue_settings(name, target_confidence=0.9, wait=True)
            assert settings_of(put) == {**DEFAULT, "target_confidence": 0.9}
            assert settings_of(await c.queue_settings(name)) == settings_of(put)
            await c.post_labels(name, FIVE + SPLIT, ids="auto", wait=True)
            page = await c.queue(name, limit=10)
            check_page(page)
            assert {x.item for x in page.items} == {"new1", "new2", "new3"}
            assert page.progress.done == 1
            mine = await c.queue(name, worker="w1")
            assert {x.item for x in mine.items} == {"new2", "new3"}

    asyncio.run(run())


def test_docs_queue_loop(live_server: LiveServer, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/client.md's queue loop, run as written against a crowd that answers the truth."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "client.md").read_text("utf-8")
    section = doc[doc.index("**The active-learning queue**") :]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    name, key = new_project(live_server, "docloop")
    truth = {"img1": "asian", "img2": "white", "img3": "black"}
    asked: Counter[str] = Counter()

    def ask(item: str) -> tuple[str, str]:
        asked[item] += 1
        return f"w{asked[item]}", truth[item]

    source = code.group(1).replace('"faces"', repr(name))
    source = source.replace("http://127.0.0.1:8000", live_server.url)
    exec(compile(source, "docs/client.md", "exec"), {"Client": Client, "key": key, "ask": ask})
    done, accuracy, left, to_finish = capsys.readouterr().out.split()
    assert (int(done), int(left), float(to_finish)) == (3, 0, 0.0)
    assert float(accuracy) >= 0.95 and 0 < max(asked.values()) <= 5
    with Client(live_server.url, key) as c:
        assert {x: c.get_item(name, x).label for x in truth} == truth
