"""Retries and back-off, with a scripted transport (the other tests use a live service)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from crowdtally_client import ApiError, AsyncClient, Client, CrowdtallyError, TransportError

ACCEPTED = {"accepted": 1, "duplicates": 0, "position": 1, "applied": False}


def scripted(answers: list[object], seen: list[httpx.Request]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, httpx.Response)
        return answer

    return httpx.MockTransport(handler)


def fast(transport: httpx.MockTransport, **kw: object) -> Client:
    return Client("http://ct.test", "k", transport=transport, backoff=0.001, **kw)  # type: ignore[arg-type]


def test_labels_with_ids_are_resent_on_5xx_and_connection_errors() -> None:
    seen: list[httpx.Request] = []
    answers: list[object] = [
        httpx.Response(503),
        httpx.ReadError("reset"),
        httpx.Response(429, headers={"Retry-After": "0"}),
        httpx.Response(202, json=ACCEPTED),
    ]
    with fast(scripted(answers, seen)) as c:
        got = c.post_labels("p", [("i", "w", "a")], ids="auto")
    assert got.accepted == 1 and len(seen) == 4
    bodies = {r.content for r in seen}
    assert len(bodies) == 1  # the very same block, same id, each time
    assert json.loads(seen[0].content)[0]["id"].startswith("auto-")
    assert seen[0].headers["authorization"] == "Bearer k"


def test_each_block_with_ids_is_resent_whatever_the_other_blocks_hold() -> None:
    """A call decided once for all its blocks: one label without an id anywhere made a 5xx on
    a block whose labels all had ids final."""
    seen: list[httpx.Request] = []
    answers: list[object] = [
        httpx.Response(503),
        httpx.Response(202, json=ACCEPTED),
        httpx.Response(202, json=ACCEPTED),
    ]
    labels = [{"item": "i", "worker": "w", "label": "a", "id": "x1"}, ("j", "w", "a")]
    with fast(scripted(answers, seen), batch_size=1) as c:
        assert c.post_labels("p", labels).accepted == 2
    assert len(seen) == 3 and seen[0].content == seen[1].content  # (block 1, sent again)
    answers = [httpx.Response(202, json=ACCEPTED), httpx.Response(503)]
    with fast(scripted(answers, seen), batch_size=1) as c, pytest.raises(ApiError) as err:
        c.post_labels("p", labels)  # (block 2 has no id: its 5xx is final)
    assert err.value.status == 503


def test_labels_without_ids_are_not_resent_after_a_5xx() -> None:
    seen: list[httpx.Request] = []
    with (
        fast(scripted([httpx.Response(500, text="boom")], seen)) as c,
        pytest.raises(ApiError) as err,
    ):
        c.post_labels("p", [("i", "w", "a")])
    assert err.value.status == 500 and len(seen) == 1
    # ... but a refused connection (nothing was sent) and 429 are
    seen.clear()
    answers: list[object] = [
        httpx.ConnectError("refused"),
        httpx.Response(429),
        httpx.Response(202, json=ACCEPTED),
    ]
    with fast(scripted(answers, seen)) as c:
        assert c.post_labels("p", [("i", "w", "a")]).accepted == 1
    assert len(seen) == 3


def test_a_block_a_full_store_kept_nothing_of_is_sent_again_even_without_ids() -> None:
    """507 store_full: the service kept nothing, so a block without ids goes again too."""
    seen: list[httpx.Request] = []
    answers: list[object] = [
        httpx.Response(507, headers={"Retry-After": "0"}),
        httpx.Response(202, json=ACCEPTED),
    ]
    with fast(scripted(answers, seen)) as c:
        assert c.post_labels("p", [("i", "w", "a")]).accepted == 1
    assert len(seen) == 2 and seen[0].content == seen[1].content
    full = [httpx.Response(507)] * 3
    with fast(scripted(full, seen), retries=2) as c, pytest.raises(ApiError) as err:
        c.post_labels("p", [("i", "w", "a")])
    assert err.value.status == 507


def test_gives_up_after_the_retries() -> None:
    seen: list[httpx.Request] = []
    answers: list[object] = [httpx.ConnectError("refused")] * 3
    with fast(scripted(answers, seen), retries=2) as c, pytest.raises(TransportError):
        c.get_project("p")
    assert len(seen) == 3


def test_async_retries_gets() -> None:
    seen: list[httpx.Request] = []
    page = {"items": [], "next_cursor": None}
    answers: list[object] = [httpx.Response(502), httpx.Response(200, json=page)]

    async def run() -> None:
        async with AsyncClient(
            "http://ct.test", "k", transport=scripted(answers, seen), backoff=0.001
        ) as c:
            assert (await c.list_items("p")).items == []

    asyncio.run(run())
    assert len(seen) == 2


def test_batch_size_is_checked() -> None:
    with pytest.raises(ValueError):
        Client("http://ct.test", batch_size=20_000)


def test_retry_after_is_waited_as_seconds_or_a_date_within_max_backoff() -> None:
    from email.utils import formatdate

    from crowdtally_client._core import RetryPolicy

    def wait(value: str) -> float:
        answer = httpx.Response(429, headers={"Retry-After": value})
        return RetryPolicy(max_backoff=8.0, backoff=100.0).delay(0, answer)

    assert wait("3") == 3.0 and wait("0") == 0.0 and wait("-2") == 0.0
    assert wait("60") == 8.0  # capped at max_backoff
    assert 2.0 < wait(formatdate(time.time() + 4, usegmt=True)) <= 4.0
    assert wait(formatdate(time.time() - 4, usegmt=True)) == 0.0
    for unreadable in ("soon", "nan", "inf"):  # the jittered back-off instead: 8 s, halved
        assert 4.0 <= wait(unreadable) < 8.0, unreadable  # to 8 at random


def test_push_back_is_waited_out_without_spending_the_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 429 took nothing: a long import against a busy engine waits (up to ``max_pushback``
    seconds in all) instead of failing after ``retries`` answers."""
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    seen: list[httpx.Request] = []
    answers: list[object] = [httpx.Response(429, headers={"Retry-After": "2"}) for _ in range(9)]
    answers.append(httpx.Response(202, json=ACCEPTED))
    with fast(scripted(answers, seen), retries=1) as c:
        assert c.post_labels("p", [("i", "w", "a")]).accepted == 1
    assert len(seen) == 10 and slept == [2.0] * 9
    slept.clear()
    answers = [httpx.Response(429, headers={"Retry-After": "0"}) for _ in range(31)]
    with (
        fast(scripted(answers, seen), retries=1, max_pushback=2.95) as c,
        pytest.raises(ApiError) as err,
    ):
        c.post_labels("p", [("i", "w", "a")])
    assert err.value.status == 429 and not answers  # 30 waits of 0.1 s: "0" is no spin
    # (it resent at once: 601 requests in 0.6 s at max_pushback 60); the last wait is what is
    # left of max_pushback, which the waits never pass (a whole wait more once went past it)
    assert slept[:29] == [0.1] * 29 and slept[29] == pytest.approx(0.05)
    assert sum(slept) == pytest.approx(2.95)


@pytest.mark.parametrize("code", ["block_too_large", "body_too_large"])
def test_blocks_too_large_for_the_service_are_sent_again_in_halves(code: str) -> None:
    """A service whose blocks hold at most 50 labels (or as many bytes) answers 413 to blocks
    of 120: they go again as 60, then 30 (nothing of a refused block was taken), every label
    once, and the blocks after them as large."""
    sizes: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        n = len(json.loads(request.content))
        sizes.append(n)
        if n > 50:
            error = {"code": code, "message": f"{n} labels in one block; the limit is 50"}
            return httpx.Response(413, json={"error": {**error, "entry": None, "field": None}})
        return httpx.Response(202, json={**ACCEPTED, "accepted": n})

    labels = [(f"i{k % 40}", f"w{k % 7}", "a") for k in range(230)]
    with fast(httpx.MockTransport(handler)) as c:
        got = c.post_labels("p", labels, ids="auto", batch_size=120)
    assert (got.accepted, got.blocks) == (230, 8)
    assert sizes == [120, 60, 30, 30, 30, 30, 30, 30, 30, 20]


def test_a_short_input_too_large_for_the_service_is_halved_from_its_own_size() -> None:
    """Ten labels to a service that takes at most 3 a block: halved from 10, not from the
    client's 5,000 (which sent the same 10 labels nine times)."""
    sizes: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        n = len(json.loads(request.content))
        sizes.append(n)
        if n > 3:
            error = {"code": "block_too_large", "message": f"{n} labels; the limit is 3"}
            return httpx.Response(413, json={"error": {**error, "entry": None, "field": None}})
        return httpx.Response(202, json={**ACCEPTED, "accepted": n})

    labels = [(f"i{k}", "w", "a") for k in range(10)]
    with fast(httpx.MockTransport(handler)) as c:
        got = c.post_labels("p", labels, ids="auto")
    assert got.accepted == 10
    assert sizes == [10, 5, 2, 2, 2, 2, 2]


def test_items_are_iterated_in_pages_the_service_takes() -> None:
    """``iter_items(page_size=5000)`` asks for pages of 1,000, the service's most."""
    limits: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        limits.append(int(request.url.params["limit"]))
        return httpx.Response(200, json={"items": [], "next_cursor": None})

    with fast(httpx.MockTransport(handler)) as c:
        assert list(c.iter_items("p", page_size=5000)) == []
    assert limits == [1000]


def test_predictions_too_large_for_the_service_are_asked_again_in_halves() -> None:
    """A service whose body limit holds 3,000 pairs answers 413 body_too_large to requests
    of 10,000: they go again as 5,000, then 2,500, and every pair is answered once, in order."""
    sizes: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        pairs = json.loads(request.content)
        sizes.append(len(pairs))
        if len(pairs) > 3_000:
            error = {"code": "body_too_large", "message": "the body has too many bytes"}
            return httpx.Response(413, json={"error": {**error, "entry": None, "field": None}})
        answers = [{**p, "label": "a", "scores": {"a": 1.0}, "h_min": None, "trained": True}
                   for p in pairs]  # fmt: skip
        return httpx.Response(200, json={"predictions": answers})

    pairs = [(f"w{k % 7}", f"i{k}") for k in range(12_000)]
    with fast(httpx.MockTransport(handler)) as c:
        got = c.predict("p", pairs)
    assert [(p.worker, p.item) for p in got] == pairs
    assert sizes == [10_000, 5_000, 2_500, 2_500, 2_500, 2_500, 2_000]


def test_labels_go_in_blocks_of_5000_by_default() -> None:
    sizes: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sizes.append(len(json.loads(request.content)))
        return httpx.Response(202, json={**ACCEPTED, "accepted": sizes[-1]})

    labels = [(f"i{k}", f"w{k % 7}", "a") for k in range(12_000)]
    with Client("http://ct.test", "k", transport=httpx.MockTransport(handler)) as c:
        assert c.post_labels("p", labels).accepted == 12_000
    assert sizes == [5_000, 5_000, 2_000]

    async def post() -> None:
        transport = httpx.MockTransport(handler)
        async with AsyncClient("http://ct.test", "k", transport=transport) as c:
            await c.post_labels("p", labels)

    sizes.clear()
    asyncio.run(post())
    assert sizes == [5_000, 5_000, 2_000]


def test_bad_settings_and_weights_are_refused_before_any_request() -> None:
    """concurrency 0 made the async listings wait for ever; an infinite weight was sent as
    'Infinity', which is not JSON (the service answered 400 invalid_json); a negative back-off
    or timeout failed at the first retry ("sleep length must be non-negative")."""
    with pytest.raises(ValueError, match="concurrency must be at least 1"):
        AsyncClient("http://127.0.0.1:1", "k", concurrency=0)
    for name in ("timeout", "backoff", "max_backoff", "max_pushback"):
        with pytest.raises(ValueError, match=f"{name} must be a number >= 0, got -1.0"):
            Client("http://127.0.0.1:1", "k", **{name: -1.0})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="retries must be >= 0"):
        AsyncClient("http://127.0.0.1:1", "k", retries=-1)
    with Client("http://127.0.0.1:1", "k", retries=0) as c:
        for weight in (float("inf"), float("nan"), -1.0):
            with pytest.raises(ValueError, match=r"label 0: weight .* is not a finite number"):
                c.post_labels("p", [("i", "w", "a", weight)])


def test_a_delete_whose_answer_was_lost_is_done_when_the_retry_finds_nothing() -> None:
    """The first DELETE did it and its answer was lost: the retry's 404 means done (it raised
    ApiError 404 for a project that was gone). A first answer of 404 still raises."""
    gone = httpx.Response(404, json={"error": {"code": "unknown_project", "message": "no"}})
    seen: list[httpx.Request] = []
    with fast(scripted([httpx.ReadTimeout("lost"), gone], seen)) as c:
        c.delete_project("p")
    assert [r.method for r in seen] == ["DELETE", "DELETE"]
    with fast(scripted([gone], [])) as c, pytest.raises(ApiError) as refused:
        c.delete_project("p")
    assert refused.value.status == 404


def test_a_url_without_scheme_and_a_lone_label_are_refused_at_once() -> None:
    with pytest.raises(ValueError, match="url must start with http://"):
        Client("127.0.0.1:8000")  # (retried for about 6 s before failing)
    with (
        Client("http://127.0.0.1:1", "k", retries=0) as c,
        pytest.raises(ValueError, match="not one label"),
    ):
        c.post_labels("p", {"item": "i", "worker": "w", "label": "a"})  # (it said "got 'item'")


def test_gold_that_is_not_an_item_and_a_label_is_refused_naming_it() -> None:
    from crowdtally_client._core import prepare_gold

    with pytest.raises(ValueError, match="gold 1: no 'label'"):  # (a raw KeyError)
        prepare_gold([{"item": "a", "label": "x"}, {"item": "b"}])
    with pytest.raises(ValueError, match="gold 0: expected Gold"):
        prepare_gold([("a", "x", "extra")])
    assert prepare_gold({"a": "x"}) == [{"item": "a", "label": "x"}]


def test_a_transport_error_says_what_the_blocks_before_it_did() -> None:
    """After a connection lost mid-call (labels without ids are not re-sent) there was no
    telling how many blocks went in; ``sent`` says, as for an ApiError."""
    seen: list[httpx.Request] = []
    answers: list[object] = [httpx.Response(202, json=ACCEPTED), httpx.ReadError("reset")]
    labels = [("i1", "w", "a"), ("i2", "w", "a")]
    with fast(scripted(answers, seen), batch_size=1) as c, pytest.raises(TransportError) as lost:
        c.post_labels("p", labels)
    assert len(seen) == 2 and lost.value.sent.blocks == 1
    assert lost.value.sent.accepted == ACCEPTED["accepted"]


def test_inputs_the_client_cannot_send_are_refused_before_any_request() -> None:
    """A missing worker in a data frame (None, pandas' NA) was dropped from the entry, so the
    service refused its block after the blocks before it were posted; a DataFrame of pairs was
    iterated as its column names; batch_size 0 fell back to the default."""
    import pandas as pd

    seen: list[httpx.Request] = []
    with fast(scripted([], seen)) as c:
        for missing in (None, pd.NA):
            frame = pd.DataFrame({"task": ["i1", "i2"], "worker": ["w1", missing],
                                  "label": ["a", "b"]})  # fmt: skip
            with pytest.raises(ValueError, match="label 1: worker is missing"):
                c.post_labels("p", frame)
        with pytest.raises(ValueError, match="label 0: weight 'x' is not a number"):
            c.post_labels("p", [("i", "w", "a", "x")])
        with pytest.raises(ValueError, match="pair 0: expected"):
            c.predict("p", [("w1", "i2", "extra")])
        with pytest.raises(ValueError, match="batch_size must be within"):
            c.post_labels("p", [("i", "w", "a")], batch_size=0)
    assert seen == []


def test_pairs_come_from_a_data_frame_and_a_tuple_weight_may_be_none() -> None:
    import pandas as pd

    seen: list[httpx.Request] = []
    answers: list[object] = [
        httpx.Response(200, json={"predictions": []}),
        httpx.Response(202, json=ACCEPTED),
    ]
    with fast(scripted(answers, seen)) as c:
        c.predict("p", pd.DataFrame({"worker": ["w1", "w2"], "item": ["i2", "i1"]}))
        c.post_labels("p", [("i", "w", "a", None)])
    assert json.loads(seen[0].content) == [
        {"worker": "w1", "item": "i2"},
        {"worker": "w2", "item": "i1"},
    ]
    assert json.loads(seen[1].content) == [{"item": "i", "worker": "w", "label": "a"}]


def test_a_retry_policy_of_many_retries_has_a_finite_back_off() -> None:
    from crowdtally_client._core import RetryPolicy

    assert RetryPolicy(retries=10**6, max_backoff=8.0).delay(1024, None) <= 8.0  # (overflowed)


def test_stream_lines_split_at_newlines_only() -> None:
    """Ids may hold U+2028 and U+2029, which str.splitlines (httpx's iter_lines) ends lines at:
    an export's rows were cut in two."""
    from crowdtally_client._core import Lines

    lines = Lines()
    assert lines.feed('{"item":"x\u2028y"}\r\n{"item":'.encode()) == ['{"item":"x\u2028y"}']
    assert lines.feed(b'"z"}\n{"a":1}') == ['{"item":"z"}'] and lines.end() == ['{"a":1}']


def test_an_api_error_not_from_a_split_call_has_sent_none() -> None:
    assert ApiError(404, "unknown_item", "no item 'x'").sent is None


def test_a_closed_client_says_so_in_its_own_error() -> None:
    """It was httpx's bare RuntimeError ("Cannot send a request, as the client has been
    closed"), outside the client's errors."""
    seen: list[httpx.Request] = []
    with fast(scripted([], seen)) as c:
        pass
    with pytest.raises(CrowdtallyError, match="this client is closed"):
        c.get_project("p")
    with pytest.raises(CrowdtallyError, match="this client is closed"):
        list(c.export("p"))

    async def closed_async() -> None:
        a = AsyncClient("http://ct.test", "k")
        await a.aclose()
        with pytest.raises(CrowdtallyError, match="this client is closed"):
            await a.get_project("p")

    asyncio.run(closed_async())
    assert seen == []
