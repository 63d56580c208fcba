"""A TCP proxy between lane clients and a real Redis that injects faults.

Every client connection gets its own upstream connection and two pump
threads. Faults, each switchable while traffic flows:

- ``drop_reply_to(pattern)``: the next command whose bytes contain
  ``pattern`` reaches Redis and runs, but its reply is swallowed (a lost
  reply: the client times out and cannot know whether the command ran);
- ``cut_mid_reply_to(pattern)``: the reply to the next command whose bytes
  contain ``pattern`` arrives in part, then the connection closes (a reply
  lost mid-read: the command ran, its answer cannot be read);
- ``delay_replies(seconds)``: every reply is held back that long;
- ``cut()``: every open connection is closed at once (the clients reconnect);
- ``blackhole(on)``: nothing passes in either direction and new
  connections hang (a host cut off the network); ``blackhole(False)``
  heals it for new connections.

The proxy forwards bytes; it never parses RESP beyond looking for a pattern
in a client's chunk (a command of the lane is small and sent in one write).
"""

from __future__ import annotations

import socket
import threading
import time


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._drop_patterns: list[bytes] = []
        self._cut_patterns: list[bytes] = []
        self._delay = 0.0
        self._blackholed = False
        self.dropped = 0          # replies swallowed so far
        self.closed = False
        threading.Thread(target=self._accept_loop, name="fault-proxy", daemon=True).start()

    # --- faults -------------------------------------------------------------

    def drop_reply_to(self, pattern: bytes, times: int = 1) -> None:
        with self._lock:
            self._drop_patterns += [pattern] * times

    def cut_mid_reply_to(self, pattern: bytes) -> None:
        with self._lock:
            self._cut_patterns.append(pattern)

    def delay_replies(self, seconds: float) -> None:
        self._delay = seconds

    def cut(self) -> None:
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for sock in pair:
                _close(sock)

    def blackhole(self, on: bool = True) -> None:
        self._blackholed = on

    def close(self) -> None:
        self.closed = True
        _close(self._listener)
        self.cut()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    # --- plumbing -----------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self.closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._open, args=(client,), daemon=True).start()

    def _open(self, client: socket.socket) -> None:
        while self._blackholed and not self.closed:
            time.sleep(0.01)  # a cut-off host: the connection hangs, nothing answers
        try:
            server = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            _close(client)
            return
        server.settimeout(None)
        pair = (client, server)
        with self._lock:
            self._pairs.append(pair)
        # Replies to swallow on this connection (set when a matching command passes).
        state = {"swallow": 0, "cut": 0}
        threading.Thread(target=self._pump_up, args=(client, server, state), daemon=True).start()
        threading.Thread(target=self._pump_down, args=(server, client, state), daemon=True).start()

    def _pump_up(self, client: socket.socket, server: socket.socket, state: dict) -> None:
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                while self._blackholed and not self.closed:
                    time.sleep(0.01)
                with self._lock:
                    for pattern in self._drop_patterns:
                        if pattern in data:
                            self._drop_patterns.remove(pattern)
                            state["swallow"] += 1
                            break
                    for pattern in self._cut_patterns:
                        if pattern in data:
                            self._cut_patterns.remove(pattern)
                            state["cut"] += 1
                            break
                server.sendall(data)
        except OSError:
            pass
        finally:
            _close(client)
            _close(server)

    def _pump_down(self, server: socket.socket, client: socket.socket, state: dict) -> None:
        try:
            while True:
                data = server.recv(65536)
                if not data:
                    break
                while self._blackholed and not self.closed:
                    time.sleep(0.01)
                if state["swallow"]:
                    state["swallow"] -= 1
                    self.dropped += 1
                    continue
                if self._delay:
                    time.sleep(self._delay)
                if state["cut"]:
                    client.sendall(data[:max(1, len(data) // 2)])
                    break  # the rest never comes: both sides close
                client.sendall(data)
        except OSError:
            pass
        finally:
            _close(client)
            _close(server)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
