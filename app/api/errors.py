"""Errors in one shape: ``{"error": {code, message, entry, field}}``, and the handlers that
give it to request-validation errors too. ``ERRORS`` is every route's ``responses=``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from app.api.schemas import ErrorResponse

ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"model": ErrorResponse} for s in (400, 401, 403, 404, 409, 413, 422)
}


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        entry: int | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.entry, self.field = (
            status,
            code,
            message,
            entry,
            field,
        )

    def response(self) -> JSONResponse:
        body = {
            "code": self.code,
            "message": self.message,
            "entry": self.entry,
            "field": self.field,
        }
        return JSONResponse({"error": body}, status_code=self.status)


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return exc.response()


async def _invalid(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    err = exc.errors()[0]
    field = ".".join(str(x) for x in err["loc"][1:]) or None
    return ApiError(422, "invalid_request", f"{field}: {err['msg']}", None, field).response()


def add_handlers(app: FastAPI) -> None:
    """Answer ``ApiError`` and invalid requests in the one error shape."""
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _invalid)
