"""``python -m lanes.ops.probe URL``: exit 0 when URL answers 2xx within 4 s, else 1.

The compose stack's healthchecks (the image has Python, not curl): the API's
``/readyz``, a worker's or the beat's ``/metrics``, Flower's ``/healthcheck``,
the simulator's ``/health``. The reason for a failure goes to stderr, which
``docker inspect`` shows under the container's health log.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request


def probe(url: str, timeout: float = 4.0) -> str | None:
    """None when ``url`` answers 2xx, else why not."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:  # noqa: S310 (an http URL of our own)
            return None if 200 <= answer.status < 300 else f"{url} answered {answer.status}"
    except urllib.error.HTTPError as exc:
        return f"{url} answered {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return f"{url} did not answer ({getattr(exc, 'reason', exc)})"


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].startswith(("http://", "https://")):
        print("usage: python -m lanes.ops.probe http://HOST:PORT/PATH", file=sys.stderr)
        return 2
    problem = probe(argv[0])
    if problem:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
