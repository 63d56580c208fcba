"""What an oversized request body costs the API process, in memory.

    python bench/api_body_memory.py [--mb 100] [--baseline-tree DIR]
    python bench/api_body_memory.py --smoke    # 5 MB bodies, this tree only

Serves `lanes api` (this checkout's, and with ``--baseline-tree`` also the
one of another source tree, e.g. an export of main) on a free port, then
over raw sockets sends: one anonymous POST of ``--mb`` megabytes, eight at
once, and one with the token. After each it prints the process's resident
memory (VmRSS) and its peak (VmHWM) against the figure before it, so the
ratio is against a same-run baseline.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-token-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def memory_mb(pid: int) -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def post(port: int, size: int, token: str | None) -> int:
    head = (f"POST /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {size}\r\n" + (f"Authorization: Bearer {token}\r\n" if token else "") + "\r\n")
    chunk = b" " * (1 << 20)
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(head.encode())
        sent = 0
        try:
            while sent < size:
                piece = chunk[: min(len(chunk), size - sent)]
                sock.sendall(piece)
                sent += len(piece)
        except OSError:
            pass  # the server answered and closed: it did not want the rest
        answer = sock.recv(4096)
    return int(answer.split()[1]) if answer else 0


def serve(tree: Path, state: Path, redis_url: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANES_")}
    env.update(PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1", LANES_STATE_DIR=str(state),
               LANES_REDIS_URL=redis_url, LANES_API_TOKEN=TOKEN)
    proc = subprocess.Popen([sys.executable, "-m", "lanes.cli", "api", "--port", str(port), "--log-level", "error"],
                            env=env, cwd=str(state))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"lanes api from {tree} did not listen")


def measure(name: str, tree: Path, size: int, redis_url: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        state = Path(folder)
        subprocess.run([sys.executable, "-m", "lanes.cli", "catalog", "apply", str(ROOT / "examples" / "aifarm.toml")],
                       env={**os.environ, "PYTHONPATH": str(tree), "LANES_STATE_DIR": str(state),
                            "PYTHONDONTWRITEBYTECODE": "1"}, check=True, capture_output=True)
        proc, port = serve(tree, state, redis_url)
        try:
            time.sleep(1.0)
            base, _ = memory_mb(proc.pid)
            print(f"{name}: idle RSS {base:.0f} MB")
            for label, count, token in (("1 anonymous", 1, None), ("8 anonymous at once", 8, None),
                                        ("1 with the token", 1, TOKEN)):
                statuses: list[int] = []
                threads = [threading.Thread(target=lambda: statuses.append(post(port, size, token)))
                           for _ in range(count)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                rss, peak = memory_mb(proc.pid)
                print(f"{name}: {label} POST of {size >> 20} MB -> {sorted(set(statuses))}; "
                      f"RSS {rss:.0f} MB ({rss / base:.2f}x idle), peak {peak:.0f} MB ({peak / base:.2f}x idle)")
        finally:
            proc.terminate()
            proc.wait(20)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--baseline-tree", type=Path, help="another source tree to measure first (e.g. main's)")
    parser.add_argument("--redis-url", default=os.environ.get("LANES_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--smoke", action="store_true", help="a quick pass: 5 MB bodies, no baseline")
    args = parser.parse_args()
    if args.smoke:
        args.mb, args.baseline_tree = 5, None
    size = args.mb << 20
    if args.baseline_tree:
        measure("baseline", args.baseline_tree, size, args.redis_url)
    measure("this tree", ROOT, size, args.redis_url)


if __name__ == "__main__":
    main()
