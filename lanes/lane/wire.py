"""Reading one reply off a redis-py connection on the doorbell's hot path.

``Connection.read_response`` walks five Python frames per reply (the
connection, the parser, its socket reader) before hiredis parses it. Warm
that costs a few microseconds; right after a process wakes from a long
sleep, which is when a waiter reads its doorbell, every frame runs cold, and
it was measured at ~45 us against ~18 us for the same read done here
(``recv_into`` the socket, ``feed`` the connection's own hiredis reader,
``gets``): see docs/BENCHMARKS_JOURNAL.md, round 5.

This leans on three private parts of redis-py (``_parser``, its ``_reader``
and the connection's ``_sock``), so it is taken only when they are exactly
what it expects: redis-py's hiredis parser, connected. Anything else, and
any redis-py that moved them, goes through ``read_response`` unchanged; every
RESP3 push but a plain published message goes to redis-py's push handling.
Failures behave as ``read_response``'s do: the connection is dropped and a
redis-py error is raised.
"""

from __future__ import annotations

import socket
import time

from redis.exceptions import ConnectionError, ResponseError, TimeoutError

try:
    from hiredis import PushNotification
    from redis._parsers.hiredis import NOT_ENOUGH_DATA, _HiredisParser
except ImportError:  # pragma: no cover - another redis-py or hiredis: always the public path
    NOT_ENOUGH_DATA = _HiredisParser = PushNotification = None

READ_SIZE = 65536
_MESSAGE = frozenset((b"message", "message"))


def read_reply(conn, buffer: bytearray):
    """The next reply on ``conn`` (blocking until it is whole), as
    ``conn.read_response(push_request=True)`` would return it. ``buffer`` is
    the caller's scratch space for the socket read (reused across calls)."""
    parser = getattr(conn, "_parser", None)
    reader = getattr(parser, "_reader", None)
    sock = getattr(conn, "_sock", None)
    if _HiredisParser is None or type(parser) is not _HiredisParser or reader is None or sock is None:
        return conn.read_response(push_request=True)
    try:
        response = reader.gets()
        while response is NOT_ENOUGH_DATA:
            received = sock.recv_into(buffer)
            if received == 0:
                raise ConnectionError("Connection closed by server.")
            reader.feed(buffer, 0, received)
            response = reader.gets()
    except socket.timeout as exc:
        conn.disconnect()
        raise TimeoutError("Timeout reading from the doorbell connection") from exc
    except OSError as exc:
        conn.disconnect()
        raise ConnectionError(f"Error while reading from the doorbell connection: {exc}") from exc
    except BaseException:
        conn.disconnect()
        raise
    if getattr(conn, "health_check_interval", 0):
        conn.next_health_check = time.monotonic() + conn.health_check_interval
    if response.__class__ is PushNotification:
        # RESP3 (redis-py 8's default): a published message is a push. The
        # parser's default handler only logs it at debug level and returns it
        # (building the log line first: the costliest step of a cold read);
        # any other push, or a handler of the caller's own, goes to redis-py.
        handler = getattr(parser, "pubsub_push_handler_func", None)
        if not (response and response[0] in _MESSAGE
                and getattr(handler, "__func__", None) is _HiredisParser.handle_pubsub_push_response):
            return parser.handle_push_response(response)
        return response
    if isinstance(response, (ResponseError, ConnectionError)):
        raise response
    return response
