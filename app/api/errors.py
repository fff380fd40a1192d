"""Errors in one shape: ``{"error": {code, message, entry, field}}``, and the handlers that
give it to every error the app answers: request validation and unparsable bodies, unknown
routes and methods, a store or snapshot database that cannot be reached or a store being
rebuilt (503, ``Retry-After``), a store with no room for a write (507, ``Retry-After``) and
anything unexpected (500). ``ERRORS`` is every route's ``responses=``, ``WRITES`` a writing route's.
"""

from __future__ import annotations

import logging
import math
import re
import sqlite3
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError as RedisOutOfMemoryError
from redis.exceptions import ReadOnlyError
from redis.exceptions import ResponseError as RedisResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy.exc import DBAPIError, InterfaceError
from sqlalchemy.exc import OperationalError as DatabaseOperationalError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.routing import Match, Mount

from app.api.schemas import NO_CONTROL, NO_CONTROL_MESSAGE, ErrorResponse
from app.store.base import StoreWipedError, UnknownProjectError
from app.store.embedded import sqlite_full
from app.store.redis_store import STORE_MOVING, NotReplicatedError, cannot_save

ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"model": ErrorResponse} for s in (400, 401, 403, 404, 409, 413, 422, 503)
}
NOT_APPLIED: dict[str, Any] = {
    "model": ErrorResponse,
    "description": "not_applied: wait=true, and the engine did not apply the change within "
    "CROWDTALLY_WAIT_TIMEOUT_S (it is logged, and comes into force when it does)",
}
RETRY_AFTER_S = 2
"""What a 503 asks the client to wait (``Retry-After``) while the store is unreachable."""
MOVING_RETRY_AFTER_S = 1
"""What a 503 asks the client to wait while Redis moves (a Redis Cluster's slot between nodes,
a failover's primary): a slot settles within moments."""
FULL_RETRY_AFTER_S = 10
"""What a 507 asks the client to wait: room comes back as the engine archives and trims the
log (Redis) or as someone frees the disk, not within a second or two."""
WRITES: dict[int | str, dict[str, Any]] = {
    **ERRORS,
    507: {
        "model": ErrorResponse,
        "description": "store_full: the store had no room for the write (Redis at its "
        "maxmemory, or the embedded store's disk full); nothing of it was kept: send it again "
        "after Retry-After seconds",
        "headers": {
            "Retry-After": {
                "description": "Seconds to wait before sending the request again",
                "schema": {"type": "integer", "minimum": 1},
            }
        },
    },
}
"""The ``responses=`` of the routes that write to the store."""
ENGINE_BEHIND: dict[int | str, dict[str, Any]] = {
    429: {
        "model": ErrorResponse,
        "description": "engine_behind: the project's engine lags more than "
        "CROWDTALLY_MAX_LAG_S; nothing of the block was appended: send it again after "
        "Retry-After seconds",
        "headers": {
            "Retry-After": {
                "description": "Seconds to wait before sending the block again (at least 1)",
                "schema": {"type": "integer", "minimum": 1},
            }
        },
    }
}
"""The 429 of the routes that append label blocks (``engine_behind``)."""
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""Characters no id may hold (Unicode's control characters, Cc)."""

log = logging.getLogger("crowdtally.api")


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        entry: int | None = None,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.entry, self.field = (
            status,
            code,
            message,
            entry,
            field,
        )
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "code": self.code,
                "message": self.message,
                "entry": self.entry,
                "field": self.field,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def media_type(request: Request) -> str:
    """The body's Content-Type without its parameters ("": none given)."""
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def is_json(media: str) -> bool:
    """JSON's media type, as FastAPI tells it (``application/json``, ``application/*+json``)."""
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def must_be_json(request: Request) -> str:
    media = media_type(request)
    how = f"as {media}" if media else "without a Content-Type"
    return f"the body must be JSON, sent with Content-Type: application/json (it was sent {how})"


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    media = media_type(request)
    if exc.code == "invalid_json" and media and not is_json(media):  # a form, say
        exc = ApiError(exc.status, exc.code, f"{must_be_json(request)}; {exc.message}")
    return exc.response()


JSON_TYPES = ((bool, "true or false"), (str, "a string"), (int | float, "a number"),
              (list, "an array"), (dict, "an object"), (type(None), "null"))  # fmt: skip
NOT_AN_OBJECT = ("dict_type", "model_type", "model_attributes_type")
"""Pydantic's errors for a value that is no JSON object where one is expected (their messages
name our classes, "a valid dictionary or instance of ItemIn", or pydantic's own terms)."""


def not_utf8(exc: UnicodeDecodeError) -> ApiError:
    """400 for a body that is not UTF-8, so no JSON (orjson said "surrogates not allowed")."""
    at = exc.start
    return ApiError(
        400,
        "invalid_json",
        f"the body is not JSON: it is not valid UTF-8 (byte {exc.object[at]:#04x} at position "
        f"{at}); send UTF-8 JSON",
    )


def json_type(value: Any) -> str:
    """What a parsed JSON value is: "a string", "an array", "null"..."""
    return next((name for kind, name in JSON_TYPES if isinstance(value, kind)), "something else")


async def _invalid(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    err = exc.errors()[0]
    if err["type"] in NOT_AN_OBJECT and isinstance(err.get("input"), bytes):  # not read as JSON
        return ApiError(422, "invalid_request", must_be_json(request)).response()
    if err["type"] == "json_invalid":  # as the routes that read their body by hand answer
        why = err.get("ctx", {}).get("error", "not JSON")
        at = err["loc"][-1]
        return ApiError(
            400, "invalid_json", f"the body is not JSON: {why} (character {at})"
        ).response()
    loc = [str(x) for x in err["loc"]]
    field = ".".join(loc[1:]) or None
    where = field or loc[0]
    no_control = err.get("ctx", {}).get("pattern") == NO_CONTROL
    msg = NO_CONTROL_MESSAGE if no_control else err["msg"]
    if err["type"] in NOT_AN_OBJECT:
        msg = f"must be a JSON object, not {json_type(err.get('input'))}"
    return ApiError(422, "invalid_request", f"{where}: {msg}", None, field).response()


def engine_behind(project: str, lag_s: float, bound_s: float) -> ApiError:
    """429: the engine lags ``lag_s`` > ``bound_s``. ``Retry-After``: the excess, rounded up,
    at least 1 s and at most the bound (rounded up)."""
    wait = max(1, min(math.ceil(lag_s - bound_s), math.ceil(bound_s)))
    return ApiError(
        429,
        "engine_behind",
        f"the engine of project {project!r} is {lag_s:.1f} s behind (more than {bound_s:g} s); "
        f"nothing was appended: send the block again in {wait} s",
        headers={"Retry-After": str(wait)},
    )


def _shown(path: str) -> str:
    return repr(path if len(path) <= 200 else path[:200] + "...")


def not_found(method: str, path: str, headers: dict[str, str] | None = None) -> ApiError:
    message = f"no route for {method} {_shown(path)}"
    if CONTROL.search(path):
        message += ": ids never hold control characters"
    return ApiError(404, "not_found", message, headers=headers)


METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def routed_methods(scope: Any) -> set[str]:
    """The methods the app has a route for at ``scope``'s path (mounts, which take any
    method, left out)."""
    routes = [r for r in scope["app"].router.routes if not isinstance(r, Mount)]
    return {
        m
        for m in METHODS
        if any(r.matches({**scope, "method": m})[0] is Match.FULL for r in routes)
    }


def allowed_methods(request: Request) -> str | None:
    """Every method the request's path takes, for a 405's ``Allow``: FastAPI makes a route per
    method, and Starlette's 405 names only the first route whose path matched; a path that
    takes GET takes HEAD (``middleware.HeadAsGet``). (Mounts, which take any method, are left
    out.)"""
    takes = routed_methods(request.scope)
    if "GET" in takes:
        takes.add("HEAD")
    return ", ".join(m for m in METHODS if m in takes) or None


async def _http(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's and FastAPI's own errors: unknown routes, methods, unparsable bodies."""
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers) if exc.headers else None
    path = request.scope["path"]  # request.url drops newlines and tabs
    if exc.status_code == 404:
        return not_found(request.method, path, headers).response()
    if exc.status_code == 405:
        message = f"{request.method} is not allowed on {_shown(path)}"
        if allow := allowed_methods(request):
            headers = {**(headers or {}), "Allow": allow}
            message += f": it takes {allow}"
        return ApiError(405, "method_not_allowed", message, headers=headers).response()
    if exc.status_code == 400 and isinstance(exc.__cause__, UnicodeDecodeError):
        return not_utf8(exc.__cause__).response()
    if exc.status_code == 400 and exc.__cause__ is not None:  # FastAPI could not read the body
        why = f"{type(exc.__cause__).__name__}: {exc.__cause__}"[:300]
        return ApiError(400, "invalid_json", f"the body is not JSON: {why}").response()
    if exc.status_code == 413:
        return ApiError(413, "body_too_large", str(exc.detail), headers=headers).response()
    code = re.sub(r"\W+", "_", str(exc.detail)).strip("_").lower() or f"http_{exc.status_code}"
    return ApiError(exc.status_code, code, str(exc.detail), headers=headers).response()


async def _recover(request: Request) -> None:
    """After a store error, what the store needs for the next request (``Store.recover``: a
    cluster's layout read anew, a single Redis's idle connections made anew)."""
    svc = getattr(request.app.state, "service", None)
    if svc is not None:
        await run_in_threadpool(svc.store.recover)


async def _store_down(request: Request, exc: Exception) -> JSONResponse:
    log.warning("store unreachable: %s", exc)
    await _recover(request)
    if isinstance(exc, NotReplicatedError):  # (reached: the write is not confirmed)
        message = f"the store did not confirm the write on its replicas: {exc}"
    else:
        message = f"the store cannot be reached ({type(exc).__name__}); retry later"
    return _retry_later(503, "store_unavailable", message, RETRY_AFTER_S)


async def _database_dropped(request: Request, exc: Exception) -> JSONResponse:
    # an error the snapshot database's engine took as a disconnect (its pool dropped): a
    # PostgreSQL turned standby or read-only by a failover; anything else stays a 500
    assert isinstance(exc, DBAPIError)
    if not exc.connection_invalidated:
        raise exc
    return await _database_down(request, exc)


async def _store_moving(request: Request, exc: Exception) -> JSONResponse:
    # a Redis Cluster resharding (the slot's keys split between two nodes: TRYAGAIN) or
    # electing a primary, or a Redis that a failover made a replica (READONLY): the command
    # was refused whole, so the request changed nothing
    log.warning("store moving: %s", exc)
    await _recover(request)
    if isinstance(exc, ReadOnlyError):
        why = "the store's node no longer takes writes (a failover made it a replica)"
    else:
        why = (
            "the store is moving this project's keys between its nodes (a Redis Cluster "
            f"resharding or failover: {type(exc).__name__})"
        )
    return _retry_later(
        503, "store_unavailable", f"{why}; nothing was changed: retry", MOVING_RETRY_AFTER_S
    )


async def _database_down(_: Request, exc: Exception) -> JSONResponse:
    # the snapshot database (PostgreSQL, or the SQLite file) gone or failing (its other errors
    # stay 500s): a project's record, its keys and its snapshots are archived there; the
    # routes that write both undo what they wrote first
    log.warning("snapshot database failed: %s", exc)
    assert isinstance(exc, DBAPIError)
    why = type(exc.orig).__name__ if exc.orig is not None else type(exc).__name__
    message = f"the snapshot database cannot be used ({why}); nothing was changed: retry later"
    return _retry_later(503, "snapshot_db_unavailable", message, RETRY_AFTER_S)


def _retry_later(status: int, code: str, message: str, seconds: int) -> JSONResponse:
    return ApiError(status, code, message, headers={"Retry-After": str(seconds)}).response()


def _full(why: str) -> JSONResponse:
    log.warning("store full: %s", why)
    message = f"{why}; nothing of the request was kept: send it again once there is room"
    return _retry_later(507, "store_full", message, FULL_RETRY_AFTER_S)


async def _redis_full(_: Request, exc: Exception) -> JSONResponse:
    # Redis refuses a script's first write past maxmemory (noeviction), and then the script
    # has written nothing: the append is atomic (docs/deploy.md, "When the store is full")
    return _full("the store is full: Redis reached its maxmemory (raise it, or free memory)")


async def _redis_refused(_: Request, exc: Exception) -> JSONResponse:
    if not cannot_save(exc):
        raise exc  # (anything else stays a 500, logged with its traceback)
    # refused whole, as past its maxmemory: writes are taken again once Redis can save
    return _full("the store is full: Redis cannot save to its disk (MISCONF; free its disk)")


async def _sqlite_error(_: Request, exc: Exception) -> JSONResponse:
    if not sqlite_full(exc):
        raise exc  # (anything else stays a 500, logged with its traceback)
    return _full("the store is full: the disk of the data folder has no room (free some)")


async def _deleted(_: Request, exc: Exception) -> JSONResponse:
    # a project deleted while a request that had found it was under way
    return ApiError(404, "unknown_project", str(exc)).response()


async def _wiped(_: Request, exc: Exception) -> JSONResponse:
    # a Redis restarted empty: the API puts its projects back from SQL within seconds
    message = f"{exc} from SQL; nothing was changed: send the request again in {RETRY_AFTER_S} s"
    return _retry_later(503, "store_rebuilding", message, RETRY_AFTER_S)


async def _internal(_: Request, exc: Exception) -> JSONResponse:
    # ServerErrorMiddleware re-raises the exception after this answer: the server logs it
    return ApiError(500, "internal_error", "an unexpected error; see the service's log").response()


def add_handlers(app: FastAPI) -> None:
    """Answer every error in the one error shape."""
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(HTTPException, _http)
    app.add_exception_handler(RedisConnectionError, _store_down)
    app.add_exception_handler(RedisTimeoutError, _store_down)
    app.add_exception_handler(RedisOutOfMemoryError, _redis_full)
    app.add_exception_handler(RedisResponseError, _redis_refused)
    for moving in STORE_MOVING:
        app.add_exception_handler(moving, _store_moving)
    app.add_exception_handler(DatabaseOperationalError, _database_down)
    app.add_exception_handler(InterfaceError, _database_down)
    app.add_exception_handler(DBAPIError, _database_dropped)
    app.add_exception_handler(sqlite3.OperationalError, _sqlite_error)
    app.add_exception_handler(UnknownProjectError, _deleted)
    app.add_exception_handler(StoreWipedError, _wiped)
    app.add_exception_handler(Exception, _internal)
