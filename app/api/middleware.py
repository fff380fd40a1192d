"""Around every request: its id (``X-Request-ID``, in the logs and the answer), its latency in
Prometheus and the access log, the limit on its body's size and its decompression (``LimitBody``),
no control characters in its path (``PlainPath``), HEAD answered as GET without its body
(``HeadAsGet``); ``TimedStore`` times each store call the API makes. Content codings (bodies
sent compressed, answers gzipped) are in ``app.api.codings``.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
import zlib
from typing import Any

from starlette.exceptions import HTTPException

from app import logs
from app.api import metrics
from app.api.codings import DECOMPRESSORS, ENCODING_HEADERS, corrupt, decompress, unsupported
from app.api.errors import CONTROL, ApiError, not_found, routed_methods
from app.store.base import Store

access = logging.getLogger("crowdtally.access")


def _request_id(scope: Any) -> str:
    """The caller's X-Request-ID (if sane), else a new one."""
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id" and 0 < len(value) <= 128:
            return str(value.decode("latin-1"))
    return uuid.uuid4().hex[:16]


class TimedStore:
    """The store, with each call's latency in ``crowdtally_store_seconds{op}``."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr
        hist = metrics.STORE.labels(name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                hist.observe(time.perf_counter() - t0)

        return timed


class ObserveRequests:
    """Request latency into Prometheus, as plain ASGI (no extra task per request)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = [500]
        rid = _request_id(scope)
        token = logs.request_id.set(rid)

        async def send_status(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message.setdefault("headers", []).append((b"x-request-id", rid.encode()))
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            seconds = time.perf_counter() - t0
            metrics.observe(scope["method"], route, status[0], seconds)
            access.info(
                "request",
                extra={"method": scope["method"], "path": scope["path"], "route": route,
                       "status": status[0], "ms": round(1000 * seconds, 3)},
            )  # fmt: skip
            logs.request_id.reset(token)


class BodyTooLarge(HTTPException):
    """A body grew past the limit while the app was reading it (a 413, whoever reads it)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the body has more than {limit:,} bytes, the limit")


class LimitBody:
    """Bodies of at most ``limit`` bytes, checked before any route parses a body or checks a
    key: a declared ``Content-Length`` above it is answered 413 at once; a body without one
    (chunked) is read here first, up to the limit, and handed on whole. A body sent with
    ``Content-Encoding: gzip`` (or ``deflate``) is read whole and handed on decompressed, as
    if sent plain: the limit holds for it sent and decompressed."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    def too_large(self, size: str) -> Any:
        return ApiError(
            413,
            "body_too_large",
            f"the body has {size} bytes; the limit is {self.limit:,} (CROWDTALLY_MAX_BODY_BYTES)",
            headers={"Connection": "close"},
        ).response()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length: int | None = None
        chunked = False
        encoding = b""
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    length = None
            elif name == b"transfer-encoding":
                chunked = True
            elif name == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
                encoding = value
        if length is not None and length > self.limit:
            await self.too_large(f"{length:,}")(scope, receive, send)
            return
        if encoding:
            await self._decompressed(encoding, scope, receive, send)
            return
        if length is None and chunked:
            body, first = await self._read(receive)
            if body is None:
                await self.too_large(f"more than {self.limit:,}")(scope, receive, send)
                return
            receive = self._replay(body, first, receive)
        seen = [0, False]  # bytes counted; an answer started

        async def counted() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                seen[0] += len(message.get("body", b""))
                if seen[0] > self.limit:  # a body longer than it said
                    raise BodyTooLarge(self.limit)
            return message

        async def started(message: Any) -> None:
            if message["type"] == "http.response.start":
                seen[1] = True
            await send(message)

        try:
            await self.app(scope, counted, started)
        except BodyTooLarge:
            if seen[1]:
                raise
            await self.too_large(f"more than {self.limit:,}")(scope, receive, send)

    async def _decompressed(self, encoding: bytes, scope: Any, receive: Any, send: Any) -> None:
        """The app, given the body decompressed and the headers of a plain body."""
        name = encoding.decode("latin-1").strip()
        if name.lower() not in DECOMPRESSORS:
            await unsupported(name)(scope, receive, send)
            return
        body, first = await self._read(receive)
        if body is None:
            await self.too_large(f"more than {self.limit:,} compressed")(scope, receive, send)
            return
        if first is not None:  # the client left before its body ended
            await self.app(scope, self._replay(b"", first, receive), send)
            return
        try:
            plain = decompress(body, name.lower(), self.limit)
        except zlib.error as exc:
            await corrupt(name, exc)(scope, receive, send)
            return
        if plain is None:
            await self.too_large(f"more than {self.limit:,} decompressed")(scope, receive, send)
            return
        kept = [(k, v) for k, v in scope["headers"] if k not in ENCODING_HEADERS]
        headers = [*kept, (b"content-length", str(len(plain)).encode())]
        await self.app({**scope, "headers": headers}, self._replay(plain, None, receive), send)

    async def _read(self, receive: Any) -> tuple[bytes | None, Any]:
        """The whole body (None: past the limit), and a message that ended it early."""
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left: the app sees it
                return b"".join(parts), message
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return None, None
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts), None

    @staticmethod
    def _replay(body: bytes, first: Any, receive: Any) -> Any:
        pending = (
            [first]
            if first is not None
            else [{"type": "http.request", "body": body, "more_body": False}]
        )

        async def replay() -> Any:
            if pending:
                return pending.pop()
            return await receive()

        return replay


class PlainPath:
    """A path with a control character is a 404 at once: no id holds one, and a trailing
    newline would otherwise match a route as if it were not there."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and CONTROL.search(scope["path"]):
            await not_found(scope["method"], scope["path"]).response()(scope, receive, send)
            return
        await self.app(scope, receive, send)


class _HeadAnsweredError(Exception):
    """A HEAD's answer is sent: the rest of the GET's body is not made."""


class HeadAsGet:
    """HEAD on a path that takes GET answers as GET does, headers only (RFC 9110 section
    9.3.2): FastAPI routes a GET for GET alone, and HEAD was a 405. The GET's handler runs; its
    body is dropped, and a body streamed in parts (an export) stops at its first part. Paths
    with a HEAD route of their own (``/healthz``, ``/readyz``) keep it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD" or not _takes_get(scope):
            await self.app(scope, receive, send)
            return
        done = [False]

        async def headers_only(message: Any) -> None:
            if message["type"] != "http.response.body":
                await send(message)
                return
            if done[0]:
                raise _HeadAnsweredError
            done[0] = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            if message.get("more_body", False):
                raise _HeadAnsweredError

        with contextlib.suppress(_HeadAnsweredError):
            await self.app({**scope, "method": "GET"}, receive, headers_only)


def _takes_get(scope: Any) -> bool:
    """Whether the app routes ``scope``'s path for GET and has no HEAD route of its own."""
    methods = routed_methods(scope)
    return "GET" in methods and "HEAD" not in methods
