"""Every error the API answers with is JSON of one shape, and never a traceback.

``{"error": CODE, "message": ONE LINE NAMING THE BAD VALUE, "problems": [...]}``
(``problems`` when there are several, as a catalog check or a body check
finds). Lanes' own errors map by their place in :mod:`lanes.errors`:
bad input 400 (an unknown pool, workflow or task 404), a change that met
another writer's 409, a service that did not answer 503, anything else 500;
a body over the limit is 413 (:mod:`lanes.api.gate`), and ``/readyz``'s
503 is this shape too, with its checks beside it. Request bodies and query strings that
do not fit their schema are 422, each problem worded as the catalog file's
(``width: 'four' is not an integer``).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from lanes.catalog.checks import problem_line
from lanes.errors import CatalogInvalid, Conflict, InvalidInput, LanesError, NotFound, ServiceUnavailable
from lanes.redis_conn import REDIS_UNAVAILABLE

log = logging.getLogger("lanes.api")

# The part of a request a problem is in; the body's own fields are named bare.
_PLACES = {"body": "", "query": "query ", "path": "path ", "header": "header "}


def error_body(code: str, message: str, problems: list[str] | None = None) -> dict:
    body = {"error": code, "message": message}
    if problems:
        body["problems"] = problems
    return body


def reply(status: int, code: str, message: str, problems: list[str] | None = None, headers=None) -> JSONResponse:
    return JSONResponse(error_body(code, message, problems), status_code=status, headers=headers)


def validation_problems(exc: RequestValidationError) -> list[str]:
    problems = []
    for error in exc.errors():
        place, *rest = error["loc"] or ("body",)
        path = ".".join(str(part) for part in rest) or "(body)"
        problems.append(_PLACES.get(place, f"{place} ") + problem_line(path, error))
    return problems


def install(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError):
        problems = validation_problems(exc)
        return reply(422, "invalid_request", "; ".join(problems), problems if len(problems) > 1 else None)

    @app.exception_handler(HTTPException)
    async def _http(_request: Request, exc: HTTPException):
        code = {400: "invalid_input", 401: "unauthorized", 403: "forbidden", 404: "not_found",
                405: "method_not_allowed", 409: "conflict", 413: "too_large"}
        return reply(exc.status_code, code.get(exc.status_code, "http_error"), str(exc.detail),
                     headers=getattr(exc, "headers", None))

    @app.exception_handler(LanesError)
    async def _lanes(_request: Request, exc: LanesError):
        return lanes_error_reply(exc)

    async def _redis(_request: Request, exc: Exception):
        return reply(503, "service_unavailable", f"Redis did not answer: {exc}; check that it runs and LANES_REDIS_URL")

    for error in REDIS_UNAVAILABLE:
        app.add_exception_handler(error, _redis)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unexpected error serving %s %s", request.method, request.url.path)
        return reply(500, "internal", f"unexpected {type(exc).__name__}: {exc} (the API's log has the traceback)")


def lanes_error_reply(exc: LanesError) -> JSONResponse:
    if isinstance(exc, CatalogInvalid):
        return reply(400, "invalid_input", "; ".join(exc.problems), exc.problems)
    if isinstance(exc, NotFound):
        return reply(404, "not_found", str(exc))
    if isinstance(exc, InvalidInput):
        return reply(400, "invalid_input", str(exc))
    if isinstance(exc, Conflict):
        return reply(409, "conflict", str(exc))
    if isinstance(exc, ServiceUnavailable):
        return reply(503, "service_unavailable", str(exc))
    return reply(500, "failed", str(exc))
