"""Who may change what: two bearer tokens, two scopes.

- ``LANES_API_TOKEN`` holds the **admin** scope: everything, the fleet's
  pools and workflows included (``PATCH``), and submitting too.
- ``LANES_API_SUBMIT_TOKEN`` holds the **submit** scope only: submit and
  revoke tasks, add chat history. An application is given this one, so a
  leaked application token cannot resize the fleet or repoint a scrape.

With no token configured for a scope its endpoints are refused (403), never
open: an API started without tokens can be read, not changed. Tokens are
compared in constant time (:func:`hmac.compare_digest`), both of them every
time, so the answer's timing says nothing about which one was near.

:func:`refusal` is the one check; :class:`Scope` runs it as a FastAPI
dependency (and names the scheme in the OpenAPI document), and the request
gate (:mod:`lanes.api.gate`) runs it before a body is read.
"""

from __future__ import annotations

import hmac

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

SUBMIT = "submit"
ADMIN = "admin"

_bearer = HTTPBearer(auto_error=False,
                     description="LANES_API_TOKEN (admin scope) or LANES_API_SUBMIT_TOKEN (submit scope)")
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def _same(presented: str, secret) -> bool:
    expected = b"" if secret is None else secret.get_secret_value().encode()
    # Always compare (against nothing when unset): no early answer to time.
    return hmac.compare_digest(presented.encode(), expected) and bool(expected)


def scopes_of(settings, token: str | None) -> frozenset[str]:
    """The scopes ``token`` holds under ``settings`` (none for a wrong or missing one)."""
    if token is None:
        return frozenset()
    admin = _same(token, settings.api_token)
    submit = _same(token, settings.api_submit_token)
    if admin:
        return frozenset({ADMIN, SUBMIT})
    return frozenset({SUBMIT}) if submit else frozenset()


def refusal(settings, authorization: str | None, needed: str) -> HTTPException | None:
    """Why a request with this ``Authorization`` header may not use scope ``needed``; None if it may."""
    configured = settings.api_token is not None and bool(settings.api_token.get_secret_value())
    submit_configured = settings.api_submit_token is not None and bool(settings.api_submit_token.get_secret_value())
    if not configured and not (needed == SUBMIT and submit_configured):
        variables = "LANES_API_TOKEN" if needed == ADMIN else "LANES_API_TOKEN or LANES_API_SUBMIT_TOKEN"
        return HTTPException(
            403, f"this API has no token configured for the {needed} scope, so it refuses these changes; "
                 f"set {variables} where `lanes api` runs and send it as 'Authorization: Bearer TOKEN'")
    token = bearer_token(authorization)
    if token is None:
        return HTTPException(401, "missing bearer token; send 'Authorization: Bearer TOKEN' "
                                  "(LANES_API_TOKEN, or LANES_API_SUBMIT_TOKEN for tasks and history)",
                             headers=_CHALLENGE)
    held = scopes_of(settings, token)
    if not held:
        return HTTPException(401, "the bearer token does not match LANES_API_TOKEN or LANES_API_SUBMIT_TOKEN",
                             headers=_CHALLENGE)
    if needed not in held:
        return HTTPException(403, f"the submit token may submit and revoke tasks and add history, not use the "
                                  f"{needed} scope; send LANES_API_TOKEN for this")
    return None


class Scope:
    """A FastAPI dependency: the request's token must hold scope ``name``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, request: Request,
                 credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:
        refused = refusal(request.app.state.client.settings, request.headers.get("authorization"), self.name)
        if refused is not None:
            raise refused

    def __repr__(self) -> str:
        return f"Scope({self.name!r})"


require_submit = Scope(SUBMIT)
require_admin = Scope(ADMIN)


def required_scope(route) -> str | None:
    """The scope a route's dependencies ask for, or None for an open route."""
    for dependency in getattr(route, "dependencies", ()) or ():
        if isinstance(dependency.dependency, Scope):
            return dependency.dependency.name
    return None


def may_see_details(request: Request) -> bool:
    """Whether the request carries the admin token (pool details such as scrape URLs are for it)."""
    settings = request.app.state.client.settings
    return ADMIN in scopes_of(settings, bearer_token(request.headers.get("authorization")))
