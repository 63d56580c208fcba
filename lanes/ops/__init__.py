"""Operations that the CLI, the HTTP API and the beat share.

Each function does one operator action (read every pool's lane, change a
pool, list events, add history, check readiness) and returns plain values;
the shells around them only parse input and print or serialise the answer,
so ``lanes pools --json`` and ``GET /v1/pools`` can never drift apart.

Functions take a :class:`lanes.routing.client.LanesClient`: it already bundles
what an operation needs, each opened on first use (settings, the catalog
engine, the Redis client, the Celery app) and closed once by its owner (a CLI
command per call, the API per process).
"""
