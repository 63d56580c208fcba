"""The request gate: a request is refused before its body is read, where it can be.

An ASGI middleware in front of everything else, in this order:

1. a declared ``Content-Length`` over the limit: 413 at once, nothing read;
2. an endpoint that needs a scope (:mod:`lanes.api.auth`) and a request
   whose token does not hold it: 401/403 at once, nothing read;
3. the body is read chunk by chunk, counting: past the limit (a chunked
   upload, or a length header that lied) reading stops and the answer is 413.

Only then is the request passed on, its body replayed from the one bounded
buffer. So an anonymous 100 MB upload costs a header's worth of memory, and
a token holder's at most the limit (``LANES_API_MAX_BODY_BYTES``, by default
the payload limit plus 64 KiB for the rest of the request).
"""

from __future__ import annotations

from starlette.routing import Match

from lanes.api.auth import refusal, required_scope
from lanes.api.errors import error_body

_WRITES_BODY = ("POST", "PUT", "PATCH", "DELETE")


class RequestGate:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        settings = scope["app"].state.client.settings
        limit = settings.api_body_limit
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}

        declared = headers.get("content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                return await _answer(send, 400, "invalid_request",
                                     f"Content-Length {declared[:40]!r} is not a number of bytes")
            if size > limit:
                return await _too_large(send, f"a body of {size} bytes", limit)

        needed = _scope_needed(scope)
        if needed is not None:
            refused = refusal(settings, headers.get("authorization"), needed)
            if refused is not None:
                codes = {401: "unauthorized", 403: "forbidden"}
                pending = (declared not in (None, "0")) or "transfer-encoding" in headers
                return await _answer(send, refused.status_code, codes[refused.status_code], refused.detail,
                                     headers=refused.headers, close=pending)

        if scope["method"] not in _WRITES_BODY and declared is None and "transfer-encoding" not in headers:
            return await self.app(scope, receive, send)  # nothing to read

        chunks, total = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > limit:
                return await _too_large(send, f"more than {limit} bytes of body", limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # a disconnect, for a handler that listens for one

        await self.app(scope, replay, send)


def _scope_needed(scope) -> str | None:
    for route in _routes(scope["app"].router.routes):
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return required_scope(route)
    return None


def _routes(routes):
    """Every route, also those of included routers (which newer FastAPI keeps nested).

    Lanes' routers carry their prefixes themselves and are included bare, so
    each route's own path is the path it serves.
    """
    for route in routes:
        nested = getattr(route, "original_router", None)
        if nested is not None:
            yield from _routes(nested.routes)
        else:
            yield route


async def _too_large(send, what: str, limit: int) -> None:
    await _answer(send, 413, "too_large",
                  f"request refused: {what}, over the API's limit of {limit} bytes; send less "
                  "(the payload limit is LANES_MAX_PAYLOAD_BYTES, the body's LANES_API_MAX_BODY_BYTES)",
                  close=True)


async def _answer(send, status: int, code: str, message: str, *, headers=None, close: bool = False) -> None:
    import json

    body = json.dumps(error_body(code, message)).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    for name, value in (headers or {}).items():
        raw.append((name.lower().encode(), value.encode()))
    if close:  # the unread rest of the body is not worth draining
        raw.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
