"""Content codings: request bodies sent compressed (``Content-Encoding: gzip`` or ``deflate``,
read by ``middleware.LimitBody``) and answers gzipped for the clients that accept it
(``CompressAnswers``)."""

from __future__ import annotations

import zlib
from typing import Any

from starlette.middleware.gzip import GZipMiddleware

from app.api.errors import ApiError

DECOMPRESSORS = {
    "gzip": 16 + zlib.MAX_WBITS,
    "x-gzip": 16 + zlib.MAX_WBITS,
    "deflate": zlib.MAX_WBITS,
}
"""The content codings a body may be sent in, as zlib's ``wbits`` (RFC 9110 section 8.4.1:
``deflate`` is the zlib format)."""
ENCODING_HEADERS = (b"content-encoding", b"content-length", b"transfer-encoding")


def decompress(body: bytes, encoding: str, limit: int) -> bytes | None:
    """``body`` decompressed (``encoding`` a key of ``DECOMPRESSORS``), or None past ``limit``
    bytes: never more than ``limit + 1`` bytes are made, whatever the body expands to."""
    inflate = zlib.decompressobj(DECOMPRESSORS[encoding])
    plain = inflate.decompress(body, limit + 1)
    if len(plain) > limit:
        return None
    if not inflate.eof:
        raise zlib.error("the compressed data ends early")
    if inflate.unused_data:
        raise zlib.error("bytes follow the end of the compressed data")
    return plain


def unsupported(name: str) -> Any:
    """415 for a body in a coding not read here: read as it is, it would be refused as text
    that is not UTF-8, which says nothing of the cause."""
    return ApiError(
        415,
        "unsupported_content_encoding",
        f"the body is sent with Content-Encoding {name!r}; the service reads bodies sent plain "
        "or with Content-Encoding gzip or deflate",
        headers={"Connection": "close"},
    ).response()


def corrupt(name: str, exc: zlib.error) -> Any:
    return ApiError(
        400,
        "invalid_body",
        f"the body is sent with Content-Encoding {name!r} but does not decompress: {exc}",
        headers={"Connection": "close"},
    ).response()


class CompressAnswers:
    """The answer to a GET whose client accepts gzip, gzipped (level 1) when it is streamed (an
    export) or at least ``minimum_size`` bytes (a page of items, a project's workers): an
    export of 200,000 items in a quarter of its bytes (JSONL 55.4 -> 13.5 MB). Other requests
    (label blocks among them) pass untouched, without the compressor's look at their answer."""

    def __init__(self, app: Any, minimum_size: int = 64 * 1024) -> None:
        self.app = app
        self.gzip = GZipMiddleware(app, minimum_size=minimum_size, compresslevel=1)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and _accepts_gzip(scope):
            await self.gzip(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _accepts_gzip(scope: Any) -> bool:
    return any(n == b"accept-encoding" and b"gzip" in v.lower() for n, v in scope["headers"])
