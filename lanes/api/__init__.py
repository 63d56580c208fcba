"""The HTTP API: ``create_app(settings)`` gives the FastAPI application.

Endpoints (the OpenAPI document is at ``/openapi.json``, browsable at ``/docs``):

- ``POST /v1/tasks``, ``GET /v1/tasks/{id}``, ``DELETE /v1/tasks/{id}``
- ``GET /v1/pools``, ``GET|PATCH /v1/pools/{name}``, ``GET|PATCH /v1/workflows/{name}``
- ``GET /v1/events``, ``POST /v1/history``
- ``GET /healthz``, ``GET /readyz``, ``GET /metrics``

Mutating endpoints need ``Authorization: Bearer $LANES_API_TOKEN``
(:mod:`lanes.api.auth`); errors are JSON (:mod:`lanes.api.errors`).
"""

from __future__ import annotations


def create_app(settings=None):
    from lanes.api.app import create_app as build

    return build(settings)


__all__ = ["create_app"]
