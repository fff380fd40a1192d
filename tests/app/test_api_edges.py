"""The API's edges: its docs pages without internet, answers for items without labels, and
the hardening of what reaches it (body sizes, numbers, malformed JSON, ids, a Redis that is
down, unknown routes, the OpenAPI document's references)."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import gzip
import io
import re
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient

from app.api import create_app
from app.store.redis_store import RedisStore
from tests.app.conftest import ADMIN, REDIS_URL, make_store, service_settings
from tests.app.test_api import LABELS, make_project, post
from tests.tcp_proxy import Proxy


@pytest.fixture
def bare(tmp_path: Path) -> TestClient:
    """The app without its lifespan (no store): enough for pages and routes that need none."""
    return TestClient(create_app(service_settings(tmp_path)))


@pytest.mark.parametrize(
    ("page", "assets"),
    [("/docs", {"text/css", "text/javascript", "image/png"}), ("/redoc", {"text/javascript"})],
)
def test_docs_pages_load_their_assets_from_this_service(
    bare: TestClient, page: str, assets: set[str]
) -> None:
    r = bare.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    assert "//" not in re.sub(r"<!--.*?-->", "", html, flags=re.S).replace("://", ""), html
    assert not re.search(r"https?:", html), "a URL to another host"
    urls = re.findall(r'(?:src|href|spec-url)="([^"]+)"', html)
    urls += re.findall(r"url: '([^']+)'", html)
    assert "/openapi.json" in urls
    seen = set()
    for url in urls:
        assert url.startswith("/"), url
        got = bare.get(url)
        assert got.status_code == 200, url
        kind = got.headers["content-type"].split(";")[0]
        seen.add(kind if kind != "application/javascript" else "text/javascript")
        if url.endswith(".js"):
            assert len(got.content) > 100_000 and b"function" in got.content[:2000], url
        if url.endswith(".css"):
            assert b"{" in got.content and len(got.content) > 10_000, url
    assert assets <= seen, seen


def _post(client: TestClient, key: dict[str, str], what: str, block: Any) -> None:
    r = client.post(
        f"/v1/projects/census/{what}",
        params={"wait": True},
        content=orjson.dumps(block),
        headers=key,
    )
    assert r.status_code == 202 and r.json()["applied"], r.text


def test_an_item_without_labels_has_no_label(client: TestClient) -> None:
    key = make_project(client)
    _post(client, key, "items", [{"item": "fresh"}, {"item": "seen"}])
    _post(
        client,
        key,
        "labels",
        [{"item": "seen", "worker": f"w{j}", "label": "white"} for j in range(3)],
    )
    _post(client, key, "gold", [{"item": "known", "label": "black"}])
    fresh = client.get("/v1/projects/census/items/fresh", headers=key).json()
    assert fresh["label"] is None and fresh["probability"] is None, fresh
    assert fresh["n_labels"] == 0 and fresh["labels"] == [] and fresh["gold"] is None
    assert set(fresh["posterior"]) == set(LABELS)  # the class prior
    assert sum(fresh["posterior"].values()) == pytest.approx(1.0)
    seen = client.get("/v1/projects/census/items/seen", headers=key).json()
    assert seen["label"] == "white" and seen["probability"] > 0.5
    known = client.get("/v1/projects/census/items/known", headers=key).json()
    assert (known["label"], known["probability"], known["n_labels"]) == ("black", 1.0, 0)
    r = client.get("/v1/projects/census/items/never", headers=key)
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_item"

    def listed(**params: Any) -> dict[str, Any]:
        r = client.get("/v1/projects/census/items", params=params, headers=key)
        assert r.status_code == 200, r.text
        return {x["item"]: x for x in r.json()["items"]}

    items = listed()
    assert set(items) == {"fresh", "seen", "known"}
    assert items["fresh"]["label"] is None and items["fresh"]["probability"] is None
    assert items["seen"]["label"] == "white" and items["known"]["label"] == "black"
    # no probability: kept while there is no lower bound
    assert "fresh" in listed(max_probability=0.5) and "fresh" not in listed(min_probability=0.01)
    lines = client.get("/v1/projects/census/export", headers=key).text.splitlines()
    exported = {x["item"]: x for x in map(orjson.loads, lines)}
    assert exported["fresh"]["label"] is None and exported["fresh"]["probability"] is None
    assert exported["seen"]["label"] == "white"
    text = client.get("/v1/projects/census/export", params={"format": "csv"}, headers=key).text
    rows = {r["item"]: r for r in csv.DictReader(io.StringIO(text))}
    assert rows["fresh"]["label"] == "" and rows["fresh"]["probability"] == ""
    assert rows["seen"]["label"] == "white" and float(rows["seen"]["probability"]) > 0.5
    queue = client.get("/v1/projects/census/queue", headers=key).json()["items"]
    queued = {x["item"]: x for x in queue}
    assert queued["fresh"]["label"] is None and queued["fresh"]["probability"] is None
    summary = client.get("/v1/projects/census/summary", headers=key).json()
    assert sum(summary["label_counts"].values()) == 2  # seen and known: fresh has no label
    assert summary["label_counts"]["asian"] == 0
    assert sum(summary["confidence_histogram"]["counts"]) == 2


# --- hardening ---------------------------------------------------------------------------


def _error(r: Any, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json", r.headers
    body = r.json()
    assert set(body) == {"error"} and body["error"]["code"] == code, body
    assert set(body["error"]) == {"code", "message", "entry", "field"}, body
    return dict(body["error"])


@pytest.fixture
def small(tmp_path: Path) -> Iterator[TestClient]:
    """A service (embedded store) whose bodies hold at most 4096 bytes."""
    store = make_store("embedded", tmp_path)
    app = create_app(service_settings(tmp_path, max_body_bytes=4096), store=store)
    with TestClient(app, headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        yield c
    store.close()


def _labels(n: int) -> bytes:
    return orjson.dumps([{"item": f"i{n}", "worker": f"w{n}", "label": "white"} for n in range(n)])


def test_body_limit_comes_before_parsing_and_the_key(small: TestClient) -> None:
    key = make_project(small)
    big, fits = _labels(100), _labels(20)
    assert len(big) > 4096 > len(fits)
    path = "/v1/projects/census/labels"
    nobody = {"Authorization": ""}
    # on its Content-Length, before the key is checked: no key, a wrong key, a good one
    for headers in (nobody, {"Authorization": "Bearer nope"}, key):
        err = _error(small.post(path, content=big, headers=headers), 413, "body_too_large")
        assert "4,096" in err["message"]
    # chunked (no Content-Length): read up to the limit, then refused, before the key too
    for headers in (nobody, key):
        r = small.post(path, content=iter([big[:3000], big[3000:]]), headers=headers)
        assert "content-length" not in r.request.headers
        _error(r, 413, "body_too_large")
    # FastAPI-parsed bodies alike, and a body that fits is served whole, chunked or not
    r = small.post("/v1/projects", content=iter([b'{"name": "x", "labels": [', b"1" * 5000]))
    _error(r, 413, "body_too_large")
    _error(small.post(path, content=fits, headers=nobody), 401, "missing_key")
    r = small.post(path, params={"wait": True}, content=iter([fits[:100], fits[100:]]), headers=key)
    assert r.status_code == 202 and r.json()["accepted"] == 20, r.text
    r = small.put(
        "/v1/projects/census/queue/settings",
        content=iter([b'{"policy": ', b'"margin"}']),
        headers={**key, "content-type": "application/json"},
    )
    assert r.status_code == 202 and r.json()["policy"] == "margin", r.text
    # compressed: the limit holds for the body sent and for it decompressed
    gz = {**key, "content-encoding": "gzip"}
    assert len(gzip.compress(big)) < 4096
    err = _error(small.post(path, content=gzip.compress(big), headers=gz), 413, "body_too_large")
    assert (
        err["message"]
        == "the body has more than 4,096 decompressed bytes; the limit is 4,096 (CROWDTALLY_MAX_BODY_BYTES)"
    )
    noise = gzip.compress(b"x" * 5000, compresslevel=0)
    _error(small.post(path, content=iter([noise]), headers=gz), 413, "body_too_large")
    r = small.post(path, params={"wait": True}, content=gzip.compress(fits), headers=gz)
    assert r.status_code == 202 and r.json()["duplicates"] == 0, r.text


def test_a_chunked_body_is_refused_as_it_arrives(tmp_path: Path) -> None:
    """Driven as the server would: the chunks past the limit are never read."""
    app = create_app(service_settings(tmp_path, max_body_bytes=4096))
    chunks = [b"x" * 1000 for _ in range(100)]
    read: list[bytes] = []
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        read.append(chunks[len(read)])
        return {"type": "http.request", "body": read[-1], "more_body": len(read) < len(chunks)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/v1/projects/census/labels", "raw_path": b"", "root_path": "",
        "query_string": b"", "headers": [(b"transfer-encoding", b"chunked")],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "state": {},
    }  # fmt: skip
    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 413 and len(read) == 5
    assert orjson.loads(sent[1]["body"])["error"]["code"] == "body_too_large"


def test_out_of_range_numbers_in_queue_settings_are_422(client: TestClient) -> None:
    key = make_project(client)
    path = "/v1/projects/census/queue/settings"
    for body in (
        b'{"max_labels_per_item": 18446744073709551616}',
        b'{"max_labels_per_item": 9223372036854775808}',
        b'{"budget": 1000000000000000000000000000000}',
        b'{"target_confidence": 1e400}',
        b'{"target_confidence": NaN}',
        b'{"budget": -1}',
    ):
        field = orjson.loads(body.replace(b"NaN", b"0").replace(b"1e400", b"0")).popitem()[0]
        r = client.put(path, content=body, headers={**key, "content-type": "application/json"})
        assert _error(r, 422, "invalid_request")["field"] == field
    # nothing of it was applied
    assert client.get(path, headers=key).json()["policy"] == "lookahead"
    r = client.put(path, params={"wait": True}, json={"budget": 2**53 - 1}, headers=key)
    assert r.status_code == 202 and r.json()["budget"] == 2**53 - 1


def test_a_nan_probability_in_the_query_is_refused_as_such(client: TestClient) -> None:
    key = make_project(client)
    path = "/v1/projects/census/items"
    for param in ("min_probability", "max_probability"):
        for nan in ("nan", "NaN", "-nan"):
            err = _error(client.get(path, params={param: nan}, headers=key), 422, "invalid_request")
            assert err["field"] == param
            assert err["message"] == f"{param}: must be a number between 0 and 1, not NaN"
        err = _error(client.get(path, params={param: "2"}, headers=key), 422, "invalid_request")
        assert err["message"] == f"{param}: Input should be less than or equal to 1"
        assert client.get(path, params={param: "0.5"}, headers=key).status_code == 200


def test_malformed_bodies_answer_in_the_error_format(client: TestClient) -> None:
    key = make_project(client)
    json_ = {**key, "content-type": "application/json"}
    for path, method in (
        ("/v1/projects", "POST"),
        ("/v1/projects/census/queue/settings", "PUT"),
        ("/v1/projects/census/labels", "POST"),
    ):
        for body in (b"{bad", b'{"policy": "\xff"}', b"[" * 100_000, b"\xff\xfe"):
            r = client.request(method, path, content=body, headers=json_)
            assert "not JSON" in _error(r, 400, "invalid_json")["message"], (path, body[:10])
    for body in (b"", b"[1, 2]", b'"text"'):
        r = client.put("/v1/projects/census/queue/settings", content=body, headers=json_)
        _error(r, 422, "invalid_request")
    r = client.post("/v1/projects", json={"name": "x", "labels": ["a", "b"], "nope": 1})
    assert _error(r, 422, "invalid_request")["field"] == "nope"


def test_an_entry_that_is_no_object_is_told_what_an_entry_is(client: TestClient) -> None:
    key = make_project(client)
    label = {"item": "a", "worker": "w", "label": "white"}
    for what, block, code, message in (
        ("items", ["x"], "invalid_item", 'an item must be a JSON object with "item", not a string'),
        ("gold", [{"item": "a", "label": "white"}, 5], "invalid_label",
         'a gold answer must be a JSON object with "item" and "label", not a number'),
        ("labels", [label, None], "invalid_label",
         'a label must be a JSON object with "item", "worker" and "label" (and optionally "id", '
         '"weight"), not null'),
        ("predictions", [["w", "a"]], "invalid_pair",
         'a pair must be a JSON object with "worker" and "item", not an array'),
    ):  # fmt: skip
        r = client.post(f"/v1/projects/census/{what}", content=orjson.dumps(block), headers=key)
        err = _error(r, 422, code)
        entry = len(block) - 1
        assert err == {"code": code, "message": f"entry {entry}: {message}", "entry": entry,
                       "field": None}, what  # fmt: skip
    # the bodies FastAPI reads: the whole body, or a field that should be an object
    r = client.post("/v1/projects", json=["x"])
    assert (
        _error(r, 422, "invalid_request")["message"] == "body: must be a JSON object, not an array"
    )
    r = client.post("/v1/projects", json={"name": "x", "labels": LABELS, "dyadic": "on"})
    err = _error(r, 422, "invalid_request")
    assert (err["message"], err["field"]) == (
        "dyadic: must be a JSON object, not a string",
        "dyadic",
    )


def test_a_body_that_is_not_utf8_is_told_so(client: TestClient) -> None:
    key = make_project(client)
    json_ = {**key, "content-type": "application/json"}
    for method, path in (
        ("POST", "/v1/projects"),
        ("POST", "/v1/projects/census/keys"),
        ("PUT", "/v1/projects/census/queue/settings"),
        ("POST", "/v1/projects/census/labels"),
        ("POST", "/v1/projects/census/gold"),
        ("POST", "/v1/projects/census/items"),
        ("POST", "/v1/projects/census/predictions"),
    ):
        headers = {**json_, "Authorization": f"Bearer {ADMIN}"} if "keys" in path else json_
        for body, at in ((b"\xff", 0), (b'[{"item": "\xff"}]', 11)):
            r = client.request(method, path, content=body, headers=headers)
            assert _error(r, 400, "invalid_json")["message"] == (
                f"the body is not JSON: it is not valid UTF-8 (byte 0xff at position {at}); "
                "send UTF-8 JSON"
            ), (path, body)


def test_a_compressed_body_is_read_decompressed(client: TestClient) -> None:
    """A block sent with ``Content-Encoding: gzip`` or ``deflate`` is taken as if sent plain;
    ``identity`` is no encoding; another coding is named as the cause, not its bytes as bad
    UTF-8; a body that does not decompress says so."""
    key = make_project(client)
    json_ = {**key, "content-type": "application/json"}
    blocks = [[{"item": f"z{i}", "worker": "w", "label": LABELS[0]}] for i in range(4)]
    for block, (encoding, pack) in zip(
        blocks,
        (("gzip", gzip.compress), ("x-gzip", gzip.compress), ("Deflate", zlib.compress),
         ("identity", bytes)),
        strict=True,
    ):  # fmt: skip
        headers = {**json_, "content-encoding": encoding}
        r = client.post(
            "/v1/projects/census/labels",
            params={"wait": True},
            content=pack(orjson.dumps(block)),
            headers=headers,
        )
        assert r.status_code == 202 and r.json()["accepted"] == 1, (encoding, r.text)
        item = client.get(f"/v1/projects/census/items/{block[0]['item']}", headers=key)
        assert item.json()["labels"] == [{"worker": "w", "label": LABELS[0], "weight": 1.0}]
    raw = orjson.dumps(blocks[0])
    r = client.post(
        "/v1/projects/census/labels", content=raw, headers={**json_, "content-encoding": "br"}
    )
    assert _error(r, 415, "unsupported_content_encoding")["message"] == (
        "the body is sent with Content-Encoding 'br'; the service reads bodies sent plain or "
        "with Content-Encoding gzip or deflate"
    )
    for body, why in (
        (raw, "Error -3 while decompressing data: incorrect header check"),
        (gzip.compress(raw)[:-6], "the compressed data ends early"),
        (gzip.compress(raw) + b"x", "bytes follow the end of the compressed data"),
    ):
        r = client.post(
            "/v1/projects/census/labels",
            content=body,
            headers={**json_, "content-encoding": "gzip"},
        )
        assert _error(r, 400, "invalid_body")["message"] == (
            f"the body is sent with Content-Encoding 'gzip' but does not decompress: {why}"
        )


def test_a_compressed_body_is_held_to_the_limit_decompressed() -> None:
    """A small gzip body that expands past the body limit is refused without being expanded
    further (a zip bomb makes at most limit + 1 bytes)."""
    from app.api.codings import decompress

    bomb = gzip.compress(b" " * 50_000_000)
    assert len(bomb) < 100_000
    assert decompress(bomb, "gzip", 1_000_000) is None
    assert decompress(gzip.compress(b"[]"), "gzip", 2) == b"[]"
    assert decompress(gzip.compress(b"[1]"), "gzip", 2) is None


def test_a_form_body_is_told_to_be_json(client: TestClient) -> None:
    key = make_project(client)
    form = {"content-type": "application/x-www-form-urlencoded"}
    must = "the body must be JSON, sent with Content-Type: application/json (it was sent {})"
    sent_as_form = must.format("as application/x-www-form-urlencoded")
    for method, path in (  # the bodies FastAPI reads: JSON only when sent as JSON
        ("POST", "/v1/projects"),
        ("POST", "/v1/projects/census/keys"),
        ("PUT", "/v1/projects/census/queue/settings"),
    ):
        r = client.request(method, path, content=b"name=x&labels=a", headers=form)
        assert _error(r, 422, "invalid_request")["message"] == sent_as_form, path
        r = client.request(method, path, content=b'{"name": "x", "labels": ["a", "b"]}')
        assert _error(r, 422, "invalid_request")["message"] == must.format(
            "without a Content-Type"
        ), path
    for what in ("labels", "gold", "items", "predictions"):  # blocks: read as JSON whatever
        path = f"/v1/projects/census/{what}"
        r = client.post(path, content=b"item=a&label=white", headers={**key, **form})
        assert _error(r, 400, "invalid_json")["message"].startswith(
            f"{sent_as_form}; the body is not JSON: "
        ), what
    r = client.post(
        "/v1/projects/census/items", content=b'[{"item": "a"}]', headers={**key, **form}
    )
    assert r.status_code == 202 and r.json()["accepted"] == 1, r.text


def test_unknown_routes_and_methods_answer_in_the_error_format(client: TestClient) -> None:
    key = make_project(client)
    _error(client.get("/nope"), 404, "not_found")
    _error(client.get("/v1/projects/census/nope", headers=key), 404, "not_found")
    r = client.delete("/v1/projects/census/queue", headers=key)
    assert _error(r, 405, "method_not_allowed") and r.headers["allow"] == "GET, HEAD"
    _post(client, key, "labels", [{"item": "a", "worker": "w", "label": "white"}])
    assert client.get("/v1/projects/census/items/a", headers=key).json()["label"] == "white"
    # a newline or NUL in an id: no item holds one (a trailing newline is not dropped)
    for item in ("a%0Ab", "a%0A", "a%00", "%0A"):
        r = client.get(f"/v1/projects/census/items/{item}", headers=key)
        assert "control characters" in _error(r, 404, "not_found")["message"], item
    _error(client.get("/v1/projects/census/workers/w%0A", headers=key), 404, "not_found")


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PUT", "/v1/projects/census", "DELETE, GET, HEAD"),
        ("PUT", "/v1/projects", "GET, HEAD, POST"),
        ("DELETE", "/v1/projects/census/keys", "GET, HEAD, POST"),
        ("POST", "/v1/projects/census/queue/settings", "GET, HEAD, PUT"),
        ("PATCH", "/v1/projects/census/snapshots/1", "DELETE, GET, HEAD"),
        ("DELETE", "/v1/projects/census/queue", "GET, HEAD"),
        ("HEAD", "/v1/projects/census/labels", "POST"),
    ],
)
def test_a_405_allows_every_method_of_its_path(
    bare: TestClient, method: str, path: str, allow: str
) -> None:
    r = bare.request(method, path)
    assert r.status_code == 405 and r.headers["allow"] == allow
    if method == "HEAD":
        assert r.content == b""
        return
    err = _error(r, 405, "method_not_allowed")
    assert err["message"] == f"{method} is not allowed on {path!r}: it takes {allow}"


def test_head_answers_as_get_without_the_body(client: TestClient) -> None:
    """HEAD on any path that takes GET: the GET's status and headers (its Content-Length
    included), no body; /healthz and /readyz keep their own HEAD routes."""
    key = make_project(client)
    post(client, key, [{"item": "a", "worker": "w", "label": "white"}])
    for path, status in (
        ("/v1/projects/census", 200),
        ("/v1/projects/census/items/a", 200),
        ("/v1/projects/census/items/nope", 404),
        ("/v1/projects/census/queue", 200),
        ("/openapi.json", 200),
    ):
        plain = {**key, "Accept-Encoding": "identity"}
        got, head = client.get(path, headers=plain), client.head(path, headers=plain)
        assert (head.status_code, head.content) == (status, b""), path
        assert got.status_code == status, path
        for name in ("content-length", "content-type"):
            assert head.headers[name] == got.headers[name], (path, name)
    assert (
        client.head("/v1/projects/census", headers={"Authorization": "Bearer x"}).status_code == 401
    )
    assert client.head("/healthz").status_code == 200


def test_large_answers_are_gzipped_for_clients_that_ask(client: TestClient) -> None:
    """A GET's answer of 64 KiB or more, or streamed (an export), is gzipped when the client
    accepts gzip; small answers, and every answer to a client that does not, go plain."""
    key = make_project(client)
    block = [{"item": f"i{n}", "worker": f"w{n % 5}", "label": LABELS[n % 3]} for n in range(50)]
    post(client, key, block)
    for path, params in (("/openapi.json", {}), ("/v1/projects/census/export", {"format": "csv"})):
        zipped = client.get(path, params=params, headers={**key, "Accept-Encoding": "gzip"})
        plain = client.get(path, params=params, headers={**key, "Accept-Encoding": "identity"})
        assert zipped.headers["content-encoding"] == "gzip", path
        assert "content-encoding" not in plain.headers, path
        assert zipped.content == plain.content and len(zipped.content) > 1000, path
    small = client.get("/v1/projects/census/items/i1", headers={**key, "Accept-Encoding": "gzip"})
    assert small.status_code == 200 and "content-encoding" not in small.headers
    labels = client.post(
        "/v1/projects/census/labels",
        content=orjson.dumps(block),
        headers={**key, "Accept-Encoding": "gzip"},
    )
    assert labels.status_code == 202 and "content-encoding" not in labels.headers


def test_head_stops_a_streamed_body_at_its_first_part() -> None:
    """An answer streamed in parts (an export) is not made whole for a HEAD."""
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    from app.api.middleware import HeadAsGet

    made: list[int] = []

    def parts() -> Iterator[bytes]:
        for n in range(1000):
            made.append(n)
            yield b"x" * 100

    app = FastAPI()
    app.get("/stream")(lambda: StreamingResponse(parts(), media_type="text/plain"))
    app.add_middleware(HeadAsGet)
    with TestClient(app) as c:
        r = c.head("/stream")
        assert (r.status_code, r.content, r.headers["content-type"]) == (
            200, b"", "text/plain; charset=utf-8"
        )  # fmt: skip
        assert len(made) <= 2
        assert len(c.get("/stream").content) == 100_000


@pytest.mark.parametrize("bad", ["a\x00", "a\n", "\ta", "a\x7f", "a\x85"])
def test_ids_with_control_characters_are_refused(client: TestClient, bad: str) -> None:
    key = make_project(client)
    path = "/v1/projects/census"
    ok = {"item": "a", "worker": "w", "label": "white", "id": "L1"}
    for what, block, field in (
        ("labels", [ok, {**ok, "item": bad}], "item"),
        ("labels", [ok, {**ok, "worker": bad}], "worker"),
        ("labels", [ok, {**ok, "id": bad}], "id"),
        ("gold", [{"item": "a", "label": "white"}, {"item": bad, "label": "white"}], "item"),
        ("items", [{"item": "a"}, {"item": bad}], "item"),
    ):
        r = client.post(f"{path}/{what}", content=orjson.dumps(block), headers=key)
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert (err["entry"], err["field"]) == (1, field), err
        assert "control characters" in err["message"]
    assert client.get(path, headers=key).json()["stats"]["log_end"] == 0  # nothing applied


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref":
                yield v
            else:
                yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


def test_every_openapi_ref_resolves(bare: TestClient) -> None:
    doc = bare.get("/openapi.json").json()
    refs = set(_refs(doc))
    assert {f"#/components/schemas/{m}" for m in ("LabelIn", "GoldIn", "ItemIn", "PairIn")} <= refs
    for ref in refs:
        assert ref.startswith("#/"), ref
        node = doc
        for part in ref[2:].split("/"):
            assert isinstance(node, dict) and part in node, f"{ref} does not resolve"
            node = node[part]
    label = doc["components"]["schemas"]["LabelIn"]
    assert set(label["required"]) == {"item", "worker", "label"}
    assert label["properties"]["item"]["maxLength"] == 512


@contextlib.contextmanager
def behind_proxy(
    tmp_path: Path, timeout_s: float = 10.0
) -> Iterator[tuple[TestClient, Proxy, dict[str, str]]]:
    """A service whose Redis is reached through a ``Proxy``, with the project census made:
    (client with the admin key, proxy, the project key's headers)."""
    host, port = REDIS_URL.split("//")[1].split("/")[0].split(":")
    proxy = Proxy(host, int(port))
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    store = RedisStore(f"redis://127.0.0.1:{proxy.port}/0", prefix=prefix, timeout_s=timeout_s)
    settings = service_settings(tmp_path, engine_in_process=False)
    try:
        with TestClient(
            create_app(settings, store=store), headers={"Authorization": f"Bearer {ADMIN}"}
        ) as c:
            key = make_project(c)
            assert c.get("/v1/projects/census", headers=key).status_code == 200
            yield c, proxy, key
    finally:
        proxy.cut()
        store.close()
        RedisStore(REDIS_URL, prefix=prefix).flush_prefix()


def test_a_store_that_cannot_be_reached_is_a_503(tmp_path: Path) -> None:
    with behind_proxy(tmp_path) as (c, proxy, key):
        other = c.post("/v1/projects/census/keys", json={"scope": "read"}).json()["api_key"]
        proxy.cut()  # Redis is gone: nothing listens on the store's port
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", proxy.port)) != 0
        for r in (
            c.get("/v1/projects/census", headers=key),
            c.get("/v1/projects/census", headers={"Authorization": f"Bearer {other}"}),
            c.post("/v1/projects/census/labels", content=_labels(3), headers=key),
            c.put("/v1/projects/census/queue/settings", json={}, headers=key),
            c.get("/v1/projects/census/items/a", headers=key),
        ):
            err = _error(r, 503, "store_unavailable")
            assert int(r.headers["retry-after"]) > 0, err
        assert c.get("/readyz").json()["store"] == "unreachable"


def test_a_redis_that_stops_answering_is_a_503_after_the_timeout(tmp_path: Path) -> None:
    with behind_proxy(tmp_path, timeout_s=0.5) as (c, proxy, key):
        proxy.hung.set()  # connections stay open; nothing comes back
        _answers_within_the_timeout(c, key, proxy)


def _answers_within_the_timeout(c: TestClient, key: dict[str, str], proxy: Proxy) -> None:
    try:
        for send in (
            lambda: c.get("/v1/projects/census/items/a", headers=key),
            lambda: c.post("/v1/projects/census/labels", content=_labels(3), headers=key),
        ):
            answers: list[Any] = []
            worker = threading.Thread(
                target=lambda f=send, out=answers: out.append(f()), daemon=True
            )
            start = time.monotonic()
            worker.start()
            worker.join(10.0)  # a request that hangs fails here, not the whole suite
            assert answers, "the request hung on a Redis that stopped answering"
            err = _error(answers[0], 503, "store_unavailable")
            assert time.monotonic() - start < 5.0, err
    finally:
        proxy.cut()  # frees a request still waiting, so the service can shut down


def test_a_wait_ends_when_its_project_is_deleted(tmp_path: Path) -> None:
    """wait=true went on to its 30 s end while the project was gone."""
    import types

    from app.api.deps import wait_applied
    from app.api.errors import ApiError
    from app.store.base import ProjectRecord
    from app.store.embedded import EmbeddedStore
    from core.nominal import NominalConfig

    store = EmbeddedStore(tmp_path / "s.sqlite3")
    try:
        store.create_project(
            ProjectRecord("p", ("a", "b"), NominalConfig(n_classes=2).to_dict(), 1.0)
        )
        position = store.append("p", "refit", b"{}", None).position  # (no engine applies it)
        svc = types.SimpleNamespace(
            store=store, settings=types.SimpleNamespace(wait_timeout_s=30.0)
        )
        threading.Timer(0.1, store.delete_project, ("p",)).start()
        started = time.monotonic()
        with pytest.raises(ApiError) as refused:
            wait_applied(svc, "p", position)  # type: ignore[arg-type]
        assert refused.value.status == 404 and time.monotonic() - started < 5
    finally:
        store.close()
