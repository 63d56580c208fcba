"""A broker behind Redis Sentinel: the ``sentinel://`` URL Lanes takes, and a client of its primary.

``LANES_BROKER_URL`` names every sentinel, as kombu's Sentinel transport
reads them, and the name of the monitored primary as ``master_name`` (kombu
wants it as a transport option; an environment variable holds one string)::

    sentinel://:PASSWORD@s1:26379/0;sentinel://:PASSWORD@s2:26379/0?master_name=broker

The password and database are the primary's (the first sentinel's URL gives
them, as kombu reads it). Lanes hands kombu the URL without ``master_name``
and passes the name as the transport option; its own clients of the broker
(queue lengths, ``lanes redis check``, the supervisor's queue moves) ask the
sentinels for the primary with redis-py's :class:`redis.sentinel.Sentinel`.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from lanes.urls import mask_url

SCHEME = "sentinel"
DEFAULT_PORT = 26379


@dataclass(frozen=True)
class SentinelURL:
    sentinels: tuple[tuple[str, int], ...]
    master_name: str
    db: int
    username: str | None
    password: str | None
    kombu_url: str  # every sentinel, without master_name: what kombu's Connection parses


def is_sentinel(url: str) -> bool:
    return url.split("://", 1)[0].lower() == SCHEME


def parse(url: str) -> SentinelURL:
    """The parts of a ``sentinel://`` broker URL; ValueError naming the fault and the fix."""
    shown = mask_url(url)
    parts = [part for part in url.split(";") if part.strip()]
    sentinels: list[tuple[str, int]] = []
    names: set[str] = set()
    stripped: list[str] = []
    for part in parts:
        split = urlsplit(part.strip())
        if split.scheme.lower() != SCHEME:
            raise ValueError(f"{shown!r}: every address of a Sentinel URL starts with sentinel:// "
                             "(sentinel://HOST:26379/0;sentinel://HOST2:26379/0?master_name=NAME)")
        try:
            port = split.port or DEFAULT_PORT
        except ValueError:
            raise ValueError(f"{shown!r}: a sentinel's port is not a number") from None
        if not split.hostname:
            raise ValueError(f"{shown!r}: a sentinel address has no host")
        sentinels.append((split.hostname, port))
        query = parse_qsl(split.query, keep_blank_values=True)
        if any(key.startswith("ssl") for key, _ in query):
            # kombu would reach the primary over TLS, Lanes' own clients (queue
            # lengths, checks) would not: refused rather than half working.
            raise ValueError(f"{shown!r}: TLS to a primary behind Sentinel is not supported; "
                             "use a rediss:// broker URL or a Sentinel without TLS")
        names.update(value for key, value in query if key == "master_name")
        kept = [(key, value) for key, value in query if key != "master_name"]
        stripped.append(urlunsplit(split._replace(query=urlencode(kept, safe="/"))))
    if not sentinels:
        raise ValueError(f"{shown!r} names no sentinel")
    names.discard("")
    if len(names) != 1:
        found = "none" if not names else ", ".join(sorted(names))
        raise ValueError(f"{shown!r}: a Sentinel URL needs exactly one ?master_name=NAME, the primary the "
                         f"sentinels monitor (found {found})")
    first = urlsplit(parts[0].strip())
    path = (first.path or "/").strip("/") or "0"
    try:
        db = int(path)
    except ValueError:
        raise ValueError(f"{shown!r}: the database {path!r} is not a number (sentinel://HOST:PORT/0)") from None
    return SentinelURL(
        sentinels=tuple(sentinels),
        master_name=names.pop(),
        db=db,
        username=unquote(first.username) if first.username else None,
        password=unquote(first.password) if first.password is not None else None,
        kombu_url=";".join(stripped),
    )


def primary_client(url: str, **connection_kwargs):
    """A redis-py client of the primary the sentinels of ``url`` name (asked again on each new connection)."""
    from redis.sentinel import Sentinel

    parsed = parse(url)
    timeouts = {key: connection_kwargs[key] for key in ("socket_timeout", "socket_connect_timeout")
                if key in connection_kwargs}
    sentinel = Sentinel(list(parsed.sentinels), sentinel_kwargs=timeouts)
    return sentinel.master_for(parsed.master_name, db=parsed.db, username=parsed.username,
                               password=parsed.password, **connection_kwargs)
