"""``python -m lanes.ops.secrets_check NAME...``: refuse weak secrets before a stack starts.

The compose stack's ``migrate`` job runs it first, on every secret of
``.env`` (the API tokens, Flower's logins, PostgreSQL's and Grafana's
passwords): a placeholder such as ``change-me`` or a secret shorter than 16
characters stops the stack before anything serves with it (Grafana and
PostgreSQL would take any password). Exit 0 when all are strong, 2 with one
line per weak one (naming the variable, never the value).
"""

from __future__ import annotations

import os
import sys

from lanes.settings import weak_secret


def problems(names: list[str], environ=None) -> list[str]:
    environ = os.environ if environ is None else environ
    found = []
    for name in names:
        value = environ.get(name, "")
        if not value:
            continue  # optional (LANES_API_SUBMIT_TOKEN); compose itself requires the others
        if name.endswith("BASIC_AUTH"):
            for login in value.split(","):
                user, _, password = login.strip().partition(":")
                why = weak_secret(password)
                if why:
                    found.append(f"{name}: the password of user {user!r} {why}")
            continue
        why = weak_secret(value)
        if why:
            found.append(f"{name} {why}")
    return found


def main(argv: list[str]) -> int:
    found = problems(argv)
    for line in found:
        print(f"error: {line}", file=sys.stderr)
    if found:
        print("replace them in .env; make each with: python3 -c 'import secrets; print(secrets.token_urlsafe(24))' "
              "(token_hex(24) for POSTGRES_PASSWORD, which goes into a URL)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
