"""JSON bodies that are text: a lone surrogate is refused (400) where it is parsed.

JSON may spell a UTF-16 half (``"\\ud800"``) that no UTF-8 text can hold;
Python's parser takes it, and it would fail much later, as a 500, when the
task is encoded for the broker. :class:`CheckedRoute` parses every body with
:class:`CheckedRequest`, which refuses such a string and names where it is.
"""

from __future__ import annotations

import json
import re

from fastapi import HTTPException, Request
from fastapi.routing import APIRoute

_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(value) -> str | None:
    """The path (``payload.messages[0].content``) of the first string holding a lone surrogate, or None."""
    stack = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return path or "(body)"
        elif isinstance(item, dict):
            for key, child in item.items():
                if _SURROGATE.search(key):
                    return f"{path}.{key!r}".lstrip(".") + " (a key)"
                stack.append((f"{path}.{key}".lstrip("."), child))
        elif isinstance(item, list):
            stack.extend((f"{path}[{index}]", child) for index, child in enumerate(item))
    return None


class CheckedRequest(Request):
    async def json(self):
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise HTTPException(400, f"the request body is not UTF-8 (byte {exc.start}); "
                                         "send JSON encoded as UTF-8") from None
            value = json.loads(text)  # a JSONDecodeError is FastAPI's 422, as before
            where = lone_surrogate(value)
            if where is not None:
                raise HTTPException(400, f"{where}: a string holds a lone UTF-16 surrogate (\\ud800-\\udfff), "
                                         "which is not text; send valid Unicode")
            self._json = value
        return self._json


class CheckedRoute(APIRoute):
    def get_route_handler(self):
        handler = super().get_route_handler()

        async def checked(request: Request):
            return await handler(CheckedRequest(request.scope, request.receive))

        return checked
