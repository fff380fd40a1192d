"""bench.freshness: its load, and a short run against a real embedded service."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from bench import freshness
from bench.service import Cluster


def test_load_bodies_are_new_labels_on_known_items_in_blocks() -> None:
    items = ["a", "b", "c"]
    bodies = freshness.load_bodies(items, 5, 2500, 1000, seed=7)
    rows = [row for body in bodies for row in orjson.loads(body)]
    assert [len(orjson.loads(b)) for b in bodies] == [1000, 1000, 500]
    assert len({r["id"] for r in rows}) == 2500  # unique ids: none is a duplicate
    assert {r["item"] for r in rows} <= set(items)
    assert {r["label"] for r in rows} <= {"c0", "c1", "c2"}


@pytest.mark.slow
def test_short_run_serves_every_probe(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--stores", "embedded", "--rates", "2000", "--seconds", "1", "--preload", "1000"]
    assert freshness.main([*argv, "--settled"]) == 0
    out = capsys.readouterr().out
    assert "embedded: and learned by the dyadic model" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("embedded ")]
    assert [float(r[1].replace(",", "")) for r in rows] == [2000.0]
    for r in rows:
        probes, p99, unserved = int(r[6]), float(r[8]), int(r[11])
        assert probes > 5 and unserved == 0 and p99 < freshness.UNSERVED_S * 1e3
        assert r[12] == "yes"  # every acknowledged label applied once
    busy = rows[0]
    assert int(busy[2].replace(",", "")) > 1000  # labels acknowledged per second


def test_load_on_new_items_gives_each_its_labels_and_no_known_item_any() -> None:
    bodies = freshness.load_bodies(["a", "b"], 5, 2500, 1000, seed=7, per_new_item=5)
    rows = [row for body in bodies for row in orjson.loads(body)]
    per_item: dict[str, int] = {}
    for r in rows:
        per_item[r["item"]] = per_item.get(r["item"], 0) + 1
    assert set(per_item.values()) == {5} and len(per_item) == 500
    assert not {"a", "b"} & set(per_item)
    assert len({r["id"] for r in rows}) == 2500


def test_a_request_on_a_connection_the_server_closed_is_sent_again_on_a_new_one() -> None:
    """The API closes a connection left idle for 5 s; the bench's clients send again on a
    new one instead of failing the run (asyncio.IncompleteReadError)."""
    import asyncio

    from bench.service import Conn

    async def scenario() -> tuple[tuple[int, bytes], int]:
        connections = 0

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            await reader.readuntil(b"\r\n\r\n")
            if connections > 1:  # the first one is closed under the request, as when idle
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            conn = await Conn(port).open()
            answer = await conn.request_reopening(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            conn.close()
        return answer, connections

    answer, connections = asyncio.run(scenario())
    assert answer == (200, b"ok") and connections == 2


def test_settings_to_compare_are_the_defaults_then_each_setting() -> None:
    vs = freshness.settings_to_compare("CROWDTALLY_JOIN_QUEUED_LABELS=false, CROWDTALLY_X=1")
    assert vs == [{}, {"CROWDTALLY_JOIN_QUEUED_LABELS": "false"}, {"CROWDTALLY_X": "1"}]
    assert freshness.settings_to_compare("") == [{}]
    for bad in ("JOIN=false", "CROWDTALLY_JOIN"):
        with pytest.raises(ValueError, match="CROWDTALLY_NAME=VALUE"):
            freshness.settings_to_compare(bad)


def test_a_peer_tree_s_processes_run_its_code(tmp_path: Path) -> None:
    """``--peer-code DIR``: the service's processes import ``app`` from DIR (a tree whose
    command only says where it was imported from)."""
    tree = tmp_path / "peer"
    (tree / "app" / "cli").mkdir(parents=True)
    (tree / "app" / "__init__.py").write_text("")
    (tree / "app" / "cli" / "__init__.py").write_text(
        "import os, sys\n"
        "def main():\n"
        "    with open(os.environ['BENCH_MARK'], 'w') as f:\n"
        "        f.write(__file__ + ' ' + ' '.join(sys.argv[1:]))\n"
    )
    mark = tmp_path / "mark"
    cluster = Cluster({**freshness.os.environ, "BENCH_MARK": str(mark)}, 0, code=tree)
    try:
        assert cluster.start("api", ["serve", "--no-engine"]).proc.wait(timeout=30) == 0
    finally:
        cluster.stop()
    assert mark.read_text() == f"{tree / 'app' / 'cli' / '__init__.py'} serve --no-engine"
    with pytest.raises(SystemExit):  # not a source tree
        freshness.parse_args(["--peer-code", str(tmp_path)])
    assert freshness.parse_args(["--peer-code", str(tree)]).peer_code == tree


def test_a_probe_polls_every_ms_over_the_targets_range_then_every_5_ms() -> None:
    delays = [freshness.poll_delay(t / 1e3) for t in (0, 10, 49.9, 50, 2000)]
    assert delays == [0.001, 0.001, 0.001, 0.005, 0.005]


@pytest.mark.parametrize(
    ("given", "stores"),
    [
        ("both", ["embedded", "redis"]),
        ("redis", ["redis"]),
        ("redis,embedded,redis", ["redis", "embedded"]),
    ],
)
def test_stores_are_named_one_by_one_or_both(given: str, stores: list[str]) -> None:
    assert freshness.parse_args(["--stores", given]).stores == stores


def test_an_unknown_store_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        freshness.parse_args(["--stores", "disk"])
    assert "not disk" in capsys.readouterr().err


def test_the_p99_interval_holds_the_p99_and_widens_with_a_stall() -> None:
    rng = np.random.default_rng(1)
    steady = rng.gamma(4.0, 2.0, size=300)  # about 8 ms, a few near 25
    low, high = freshness.p99_interval(steady)
    assert low <= np.percentile(steady, 99) <= high
    stalled = steady.copy()
    stalled[150:154] = 120.0  # one stall of four probes in a row
    s_low, s_high = freshness.p99_interval(stalled)
    assert s_low <= np.percentile(stalled, 99) <= s_high
    assert s_high - s_low > 3 * (high - low)  # the stall may or may not recur: much wider
    assert np.isnan(freshness.p99_interval(steady[:39])).all()  # under two blocks: no interval
