"""Against a real ``crowdtally serve`` whose engine is held back: the service refuses blocks
with ``429 engine_behind`` and ``Retry-After``; the client waits that long and sends the same
block again until the engine has caught up and the block is taken, each label once."""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
from crowdtally_client import Client

from app.engine.loop import EngineLoop
from app.store.redis_store import RedisStore
from app.testing import running_service

REDIS_URL = "redis://127.0.0.1:6379/0"
ADMIN = "client-tests-admin-key"


def _block(tag: str, n: int) -> list[tuple[str, str, str]]:
    return [(f"{tag}{k % 5}", f"w{k}", "ab"[k % 2]) for k in range(n)]


def _refused(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    pattern = r'crowdtally_blocks_refused_total\{kind="labels",project="p"\} (\S+)'
    found = re.search(pattern, text)
    return float(found.group(1)) if found else 0.0


def _later(seconds: float, run: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    """``run`` in a thread after ``seconds``; its error, if any, in the list."""
    errors: list[BaseException] = []

    def target() -> None:
        time.sleep(seconds)
        try:
            run()
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    return thread, errors


def test_post_labels_waits_out_engine_behind(tmp_path: Path) -> None:
    prefix = f"client-behind-{uuid.uuid4().hex[:8]}"
    env = {
        "CROWDTALLY_ADMIN_KEY": ADMIN,
        "CROWDTALLY_STORE": "redis",
        "REDIS_URL": REDIS_URL,
        "CROWDTALLY_REDIS_PREFIX": prefix,
        "CROWDTALLY_ENGINE_IN_PROCESS": "false",  # the engine runs here, when the test says
        "CROWDTALLY_MAX_LAG_S": "1",
        "CROWDTALLY_REFINE_PASSES": "0",
    }
    store = RedisStore(REDIS_URL, prefix)
    try:
        with (
            running_service(tmp_path, env) as url,
            Client(url, ADMIN) as c,
        ):  # (the default waits out push-back)
            c.create_project("p", ["a", "b"], worker_slots=64, dyadic={"enabled": False})
            first = c.post_labels("p", _block("x", 40), ids="auto", id_namespace="x")
            assert first.accepted == 40
            time.sleep(1.3)  # the first block has waited past the bound: the next is refused
            thread, errors = _later(1.5, EngineLoop(store, refine_passes=0).run_until_idle)
            t0 = time.monotonic()
            # without ids: a 429 took nothing, so the block is sent again all the same
            second = c.post_labels("p", _block("y", 30))
            waited = time.monotonic() - t0
            thread.join()
            assert not errors, errors
            assert second.accepted == 30 and second.duplicates == 0 and second.blocks == 1
            assert _refused(url) >= 1 and waited >= 1.0  # refused, then Retry-After waited
            EngineLoop(store, refine_passes=0).run_until_idle()
            stats = c.get_project("p").stats
            assert (stats.n_labels, stats.lag, stats.log_end) == (70, 0, 2)
            for item in ("y0", "y4"):
                assert c.get_item("p", item).n_labels == 6
    finally:
        store.flush_prefix()
        store.close()
