"""The bearer token that every mutating endpoint needs.

With no ``LANES_API_TOKEN`` configured the mutating endpoints are refused
(403), never open: an API started without a token can be read, not changed.
The token is compared in constant time (:func:`hmac.compare_digest`).
"""

from __future__ import annotations

import hmac

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

_bearer = HTTPBearer(auto_error=False, description="LANES_API_TOKEN of the API's settings")
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def require_token(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:
    token = request.app.state.client.settings.api_token
    if token is None or not token.get_secret_value():
        raise HTTPException(
            403, "this API has no token configured, so it refuses every change; "
                 "set LANES_API_TOKEN where `lanes api` runs and send it as 'Authorization: Bearer TOKEN'")
    if credentials is None:
        raise HTTPException(401, "missing bearer token; send 'Authorization: Bearer TOKEN' (LANES_API_TOKEN)",
                            headers=_CHALLENGE)
    if not hmac.compare_digest(credentials.credentials.encode(), token.get_secret_value().encode()):
        raise HTTPException(401, "the bearer token does not match LANES_API_TOKEN", headers=_CHALLENGE)
