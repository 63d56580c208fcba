"""The three lane priorities, most urgent first."""

from __future__ import annotations

import enum


class Priority(enum.IntEnum):
    """Lower value = served first. The value is the lane's score class."""

    INTERACTIVE = 0
    USER_TOOL = 1
    BACKGROUND = 2

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, value: "Priority | str | int") -> "Priority":
        """Accept a Priority, its name (any case, ``-`` or ``_``) or its number."""
        from lanes.errors import InvalidInput

        if isinstance(value, Priority):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                pass
        elif isinstance(value, str):
            key = value.strip().upper().replace("-", "_")
            if key in cls.__members__:
                return cls[key]
        known = ", ".join(p.label for p in cls)
        raise InvalidInput(f"unknown priority {value!r} (known: {known})")
