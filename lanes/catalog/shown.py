"""How a value from a file appears in a message: short, and without secrets.

Catalog files end up in CI logs through their error messages, so a value is
shortened *before* it is formatted (a ``repr`` of a list built from YAML
aliases can be hundreds of megabytes; cutting it afterwards is too late) and
anything that looks like a credential is masked: the password of a URL, the
query of a URL (``?api_key=...``), and a string pasted where a variable's
*name* belongs.
"""

from __future__ import annotations

import re
import reprlib
from typing import Any

SHOWN_LENGTH = 60

# scheme://user:password@host -> scheme://user:***@host
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)[^@\s/]*@")
# scheme://host/path?anything -> scheme://host/path?***
_URL_QUERY = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s?#]*)[?#]\S*")


def mask_secrets(text: str) -> str:
    text = _URL_PASSWORD.sub(r"\g<head>***@", text)
    return _URL_QUERY.sub(r"\g<head>?***", text)


class _ShortRepr(reprlib.Repr):
    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = self.maxdict = 4
        self.maxstring = SHOWN_LENGTH
        self.maxlong = 30
        self.maxother = SHOWN_LENGTH

    def repr_str(self, value: str, level: int) -> str:
        return super().repr_str(mask_secrets(value[: 4 * SHOWN_LENGTH]), level)


_SHORT = _ShortRepr()


def show(value: Any) -> str:
    """A ``repr`` of ``value`` at most about 60 characters long, secrets masked."""
    text = _SHORT.repr(value)
    return text if len(text) <= SHOWN_LENGTH + 3 else text[:SHOWN_LENGTH] + "..."


def show_hidden(value: str) -> str:
    """A string that may be a secret itself: its first characters and its length only."""
    return f"{value[:3]!r}... ({len(value)} characters, the rest not shown)"
