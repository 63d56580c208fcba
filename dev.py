#!/usr/bin/env python3
"""One entry point that needs nothing but Python 3.11+.

    python3 dev.py demo     # the product on embedded defaults
    python3 dev.py test     # the fast tier: what to run before a commit (minutes)
    python3 dev.py test --all             # every test: adds the slow tier (CI runs it)
    python3 dev.py test -m slow           # the slow tier alone
    python3 dev.py test tests/lane -x     # exactly the paths given, slow ones included
    python3 dev.py bench    # the benchmarks (``--smoke`` for a quick pass)
    python3 dev.py lanes …  # any lanes command inside the project's environment

``test`` with no path runs ``pytest --fast-tier``: tests marked ``slow`` (fault
harness, chaos, multi-host, browser, long end-to-end runs) are skipped, and a
test that takes longer than ``fast_tier_limit`` (pyproject.toml, 8 s) is listed
at the end and makes the run exit with status 6 though it passed
(tests/tiers.py). ``--all`` drops the tier. Given a path or node id (or ``-m``),
it runs exactly what was asked, with no tier filter and no timing check. Any
other argument goes to pytest as it is.

It creates ``.venv`` beside this file on first use and reinstalls the project
whenever ``pyproject.toml`` changes.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("LANES_VENV", ROOT / ".venv"))
BIN = VENV / "bin"


def ensure_environment() -> None:
    if sys.version_info < (3, 11):
        sys.exit(f"Lanes needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    if not (BIN / "python").exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    stamp = VENV / ".lanes-installed"
    # LANES_EXTRAS names the optional extras to install (CI adds the peer benchmark's).
    extras = os.environ.get("LANES_EXTRAS", "dev")
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + extras.encode()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return
    print("installing Lanes and its dependencies into .venv", flush=True)
    subprocess.run(
        [str(BIN / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "-e", f"{ROOT}[{extras}]"],
        check=True,
    )
    stamp.write_text(digest)


def names_tests(argument: str) -> bool:
    """Whether a pytest argument names tests: a path or node id under the project."""
    return not argument.startswith("-") and (ROOT / argument.split("::")[0]).exists()


def test_arguments(rest: list[str]) -> list[str]:
    """The fast tier unless ``--all``, a path or a marker expression says otherwise."""
    if "--all" in rest:
        return [argument for argument in rest if argument != "--all"]
    marker = any(a == "-m" or (a.startswith("-m") and not a.startswith("--")) for a in rest)
    if marker or "--fast-tier" in rest or any(names_tests(argument) for argument in rest):
        return rest
    print("fast tier: tests marked slow are skipped (python3 dev.py test --all runs every test)",
          flush=True)
    return ["--fast-tier", *rest]


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    ensure_environment()
    verb, rest = argv[0], argv[1:]
    if verb == "test":
        command = [str(BIN / "python"), "-m", "pytest", *test_arguments(rest)]
    elif verb == "demo":
        command = [str(BIN / "lanes"), "demo", *rest]
    elif verb == "bench":
        command = [str(BIN / "python"), str(ROOT / "bench" / "run_all.py"), *rest]
    elif verb == "lanes":
        command = [str(BIN / "lanes"), *rest]
    else:
        print(f"unknown verb {verb!r}: use demo, test, bench or lanes", file=sys.stderr)
        return 2
    return subprocess.call(command, cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
