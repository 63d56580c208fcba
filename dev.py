#!/usr/bin/env python3
"""One entry point that needs nothing but Python 3.11+.

    python3 dev.py demo     # the product on embedded defaults
    python3 dev.py test     # the test suite
    python3 dev.py bench    # the benchmarks (``--smoke`` for a quick pass)
    python3 dev.py lanes …  # any lanes command inside the project's environment

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
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return
    print("installing Lanes and its dependencies into .venv", flush=True)
    subprocess.run(
        [str(BIN / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "-e", f"{ROOT}[dev]"],
        check=True,
    )
    stamp.write_text(digest)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    ensure_environment()
    verb, rest = argv[0], argv[1:]
    if verb == "test":
        command = [str(BIN / "python"), "-m", "pytest", *rest]
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
