"""Showing a URL safely: every secret in it masked (settings, Sentinel URLs, every refusal)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

# Query parameters that carry a secret in the URLs Lanes is given (redis-py and
# libpq both read ``?password=``).
SECRET_QUERY_KEYS = frozenset({"password", "pass", "passwd", "pwd", "secret", "token", "access_token", "api_key",
                               "apikey", "key", "sslpassword", "auth"})
_USERINFO_PASSWORD = re.compile(r"^([^:/?#]*://[^:@/?#]*:)[^@/?#]*@")


def mask_url(url: str | None) -> str | None:
    """Return ``url`` with every secret in it replaced by ``***``.

    The password of the userinfo (``redis://user:PASSWORD@host``, also with
    an empty user), and any secret query parameter (``?password=``,
    ``&token=``...). A URL too malformed to parse (a port that is no
    number) is still masked, by pattern.
    """
    if not url:
        return url
    if url[:11].lower() == "sentinel://" and ";" in url:  # a Sentinel broker's addresses, each with its userinfo
        return ";".join(mask_url(part) for part in url.split(";"))
    try:
        parts = urlsplit(url)
        password, port = parts.password, parts.port
    except ValueError:
        masked = _USERINFO_PASSWORD.sub(r"\1***@", url)
        return re.sub(r"(?i)([?&](?:" + "|".join(SECRET_QUERY_KEYS) + r")=)[^&#]*", r"\1***", masked)
    netloc = parts.netloc
    if password is not None:
        user = parts.username or ""
        host = parts.hostname or ""
        if ":" in host:  # an IPv6 address keeps its brackets
            host = f"[{host}]"
        if port:
            host = f"{host}:{port}"
        netloc = f"{user}:***@{host}"
    query = parts.query
    if query:
        pairs = []
        for pair in query.split("&"):
            key, sep, _value = pair.partition("=")
            pairs.append(f"{key}=***" if sep and key.lower() in SECRET_QUERY_KEYS else pair)
        query = "&".join(pairs)
    if netloc == parts.netloc and query == parts.query:  # nothing secret: as written (unix:/// keeps its slashes)
        return url
    return urlunsplit(parts._replace(netloc=netloc, query=query))
