"""JSON error bodies for every failure the HTTP API answers, never echoing the request.

422 bodies keep FastAPI's shape, `{"detail": [{"loc", "msg", "type"}]}`, without `input`
(FastAPI's default handler puts the offending value there: for a too-long `instances` list
that was every row of the request) and at most `MAX_ERRORS` entries. Other errors are
`{"detail": "<what went wrong and what is allowed>"}`.
"""

from __future__ import annotations

from typing import Any, Iterable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

__all__ = ["MAX_ERRORS", "clean_errors", "error_response", "validation_response", "install_error_handlers"]

MAX_ERRORS = 20  # a 10,000-row request with one bad feature in each row gets 20 entries, not 10,000


def clean_errors(errors: Iterable[dict[str, Any]], prefix: tuple = ()) -> list[dict[str, Any]]:
    """loc/msg/type of each error (no input, ctx or url), at most MAX_ERRORS and a count of the rest."""
    out: list[dict[str, Any]] = []
    total = 0
    for error in errors:
        total += 1
        if len(out) < MAX_ERRORS:
            out.append({"loc": [*prefix, *error.get("loc", ())], "msg": str(error.get("msg", ""))[:500],
                        "type": error.get("type", "value_error")})
    if total > MAX_ERRORS:
        out.append({"loc": list(prefix), "msg": f"{total - MAX_ERRORS} more errors not shown", "type": "too_many_errors"})
    return out


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": message}, headers=headers)


def validation_response(errors: Iterable[dict[str, Any]], prefix: tuple = ("body",)) -> JSONResponse:
    return JSONResponse(status_code=422, content={"detail": clean_errors(errors, prefix)})


async def _request_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
    return validation_response(exc.errors(), prefix=())  # FastAPI's locs already start with "body"/"query"


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    # Starlette's ServerErrorMiddleware calls this, then re-raises so the replica logs the
    # traceback; the caller gets JSON without it.
    return error_response(500, f"internal error ({type(exc).__name__}); the server log has the details")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _request_validation)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected)
