"""Every Redis name a lane uses, built in one place.

Layout (``prefix`` defaults to ``lanes:v2``; the version is part of it, so a
change of layout takes a new prefix instead of misreading old keys)::

    {prefix}:{<lane key>}:meta      hash  width, epoch, counters, statistics
    {prefix}:{<lane key>}:holders   zset  holder id -> lease deadline (ms)
    {prefix}:{<lane key>}:hinfo     hash  holder id -> generation, grant time, priority
    {prefix}:{<lane key>}:queue     zset  waiter record -> priority * 2^51 + enqueue stamp
    {prefix}:{<lane key>}:wexp      zset  waiter record -> waiter lease / wait deadline (ms)
    {prefix}:{<lane key>}:waits     list  recent admission waits
    {prefix}:{<lane key>}:shares    hash  holders and waiters per priority and workflow, share cursors
    {prefix}:{<lane key>}:wfq       zset  every waiter again, in lex order by priority, workflow, arrival
    {prefix}:wake:<process token>   pub/sub channel (not a key) that wakes one process's waiters
                                    and asks its background holders to yield (lib_yield.lua)

The lane key (the caller's stable id, e.g. ``pool:42``) is the hash tag, so
every key of one lane lives in one Redis Cluster slot and one script can touch
them all. Scripts never build key names: they receive these in ``KEYS``. A
waiter record is ``notify:timeout_ms:lease_ms:id[:workflow]`` (see scripts/lib_base.lua).
The two share keys came with workflows (issue 14); a state written before
them reads as one anonymous workflow, so the prefix stays ``lanes:v2``.
"""

from __future__ import annotations

from dataclasses import dataclass

from lanes.errors import InvalidInput

SUFFIXES = ("meta", "holders", "hinfo", "queue", "wexp", "waits", "shares", "wfq")
DEFAULT_PREFIX = "lanes:v2"
PRIO_SPAN = 2**51  # a queue score is priority * PRIO_SPAN + enqueue stamp (lib_base.lua)


def check_prefix(prefix: str) -> str:
    if not prefix or "{" in prefix or "}" in prefix:
        raise InvalidInput(f"lane key prefix {prefix!r} must be non-empty and hold no braces")
    return prefix


def check_lane_key(key: str) -> str:
    # Braces would end the hash tag early and scatter a lane over slots.
    if not isinstance(key, str) or not key or "{" in key or "}" in key:
        raise InvalidInput(f"lane key {key!r} must be a non-empty string without braces, e.g. 'pool:42'")
    return key


@dataclass(frozen=True)
class LaneKeys:
    """The eight keys of one lane, in the order every script takes them."""

    prefix: str
    lane: str

    def __post_init__(self) -> None:
        check_prefix(self.prefix)
        check_lane_key(self.lane)

    @property
    def base(self) -> str:
        return f"{self.prefix}:{{{self.lane}}}"

    def all(self) -> list[str]:
        return [f"{self.base}:{suffix}" for suffix in SUFFIXES]

    @property
    def meta(self) -> str:
        return f"{self.base}:meta"


def wake_channel(prefix: str, token: str) -> str:
    """The pub/sub channel on which one process hears grants for its waiters.
    The scripts derive it from a waiter id ``<token>.<n>`` (lib_base.lua
    channel_of): the two must agree."""
    return f"{check_prefix(prefix)}:wake:{token}"


def meta_pattern(prefix: str) -> str:
    """SCAN pattern matching the meta key of every lane under ``prefix``."""
    return f"{check_prefix(prefix)}:{{*}}:meta"


def lane_of_meta(prefix: str, meta_key: str) -> str | None:
    """The lane key inside a meta key name, or None if it is not one."""
    head = f"{prefix}:{{"
    if not (meta_key.startswith(head) and meta_key.endswith("}:meta")):
        return None
    return meta_key[len(head): -len("}:meta")]
