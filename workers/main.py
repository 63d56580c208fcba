"""Run a fleet's Celery worker in this process (the supervisor's child).

    python -m workers.main --fleet aifarm-gpu0-dialog --foreground 2000
    python -m workers.main --fleet aifarm-gpu0-dialog --background 2000
    python -m workers.main --fleet aifarm-gpu0-dialog --foreground 2000 --background 2000

A process takes the fleet's queues whose bound is given: at most that many
messages of each, every one a task on a green thread of its own (Celery's
gevent pool, the default) or an OS thread (``--pool threads``), waiting in
its lane or calling its backend. Without ``--pool`` the process runs the
pool ``LANES_FLEET_POOL`` names, as the supervisor's plan does. The supervisor
runs the two queues in processes of their own (workers/fleet.py says why);
given both, one process takes both queues: Celery's task consumer the
foreground queue, the background consumer (workers/background.py) the
background queue, each holding at most its own bound.

Why gevent and not an asyncio runtime: the walker, backend client, breakers
and lane client are synchronous code shared with the CLI, the API's submit
path and the tests; under gevent's monkey patching their sockets, locks,
events and sleeps yield to each other unchanged, so one code path is tested
and run everywhere.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket

POOLS = ("gevent", "threads")
# The default of the fleet_pool setting (lanes/settings.py), read here from
# the environment itself: nothing may be imported before gevent patches the
# process (a lock made earlier stays a real one, and blocks every green
# thread that waits on it).
DEFAULT_POOL = "threads"


def pool_from_environment() -> str:
    value = os.environ.get("LANES_FLEET_POOL", DEFAULT_POOL).strip().lower()
    if value not in POOLS:
        raise SystemExit(f"error: LANES_FLEET_POOL={value!r} is not a pool: give one of {', '.join(POOLS)}")
    return value


def parse(argv: list[str] | None):
    parser = argparse.ArgumentParser(prog="python -m workers.main")
    parser.add_argument("--fleet", required=True)
    parser.add_argument("--foreground", type=int, default=None, metavar="N",
                        help="take the foreground queue, holding at most N of its messages")
    parser.add_argument("--background", type=int, default=None, metavar="N",
                        help="take the background queue, holding at most N of its messages")
    parser.add_argument("--pool", choices=POOLS, default=None,
                        help="gevent: a green thread per held message; threads: an OS thread each "
                             "(default: LANES_FLEET_POOL, else gevent)")
    parser.add_argument("--loglevel", default="WARNING")
    parser.add_argument("--hostname", default=None)
    args = parser.parse_args(argv)
    if args.foreground is None and args.background is None:
        parser.error("give --foreground N, --background N or both (the queues this process takes)")
    for name in ("foreground", "background"):
        value = getattr(args, name)
        if value is not None and not 1 <= value <= 100_000:
            parser.error(f"--{name} {value} is out of range: give 1 to 100000 messages")
    if args.pool is None:
        args.pool = pool_from_environment()
    return args


# Sockets and files a worker opens besides one backend connection and one
# broker connection at most per held message (Redis clients, the catalog,
# the metrics port, pipes, imports).
SPARE_FILES = 256


def files_needed(held: int) -> int:
    return 2 * held + SPARE_FILES


def ensure_file_limit(held: int) -> str | None:
    """Raise this process's open-file limit to what ``held`` messages need
    (up to the hard limit); the one-line refusal when even that is too low."""
    import resource

    needed = files_needed(held)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    if soft != resource.RLIM_INFINITY and soft < needed:
        return (f"error: holding {held} messages needs {needed} open files and this process may open {soft} "
                f"(hard limit {hard}); lower LANES_FLEET_HELD_MESSAGES (or --foreground/--background) to "
                f"{max(1, (soft - SPARE_FILES) // 2)}, or raise the limit (ulimit -n, LimitNOFILE, nofile)")
    return None


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    refusal = ensure_file_limit((args.foreground or 0) + (args.background or 0))
    if refusal is not None:
        raise SystemExit(refusal)
    if args.pool == "gevent":
        # Before anything opens a socket or starts a thread: every blocking
        # call below (redis-py, httpx, the lane's doorbell poll, sleeps,
        # events) then yields to the other green threads.
        from gevent import monkey

        monkey.patch_all()

    from lanes.celery_client import fleet_queues
    from lanes.settings import load_settings
    from workers.app import create_app
    from workers.background import BackgroundQueue

    logging.basicConfig(level=args.loglevel, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if logging.getLevelName(args.loglevel) >= logging.WARNING:
        # Celery logs every rejected-and-requeued task at WARNING with a
        # traceback; for Lanes that is routine (a wait given up at shutdown
        # or at the wait cap), not a warning.
        logging.getLogger("celery.app.trace").setLevel(logging.ERROR)

    foreground, background = fleet_queues(args.fleet)
    settings = load_settings()
    if args.foreground is None:
        # Background work alone: Celery's own consumer takes the background
        # queue, in order, up to the bound.
        app = create_app(settings, consumer_threads=args.background)
        queue, held = background, args.background
    else:
        extra = BackgroundQueue(background, args.background) if args.background else None
        app = create_app(settings, background=extra, consumer_threads=args.foreground)
        queue, held = foreground, args.foreground + (args.background or 0)
    if args.pool == "gevent":
        green_transport(app, held, settings.redis_timeout_seconds)
        green_shutdown_handlers()
    app.worker_main(
        [
            "--quiet",
            "worker",
            "--pool", args.pool,
            # A green thread (or thread) for every message the consumers may hold at once.
            "--concurrency", str(held),
            "--queues", queue,
            "--hostname", args.hostname or f"{args.fleet}@{socket.gethostname()}",
            "--loglevel", args.loglevel,
            "--task-events",
            "--without-gossip",
            "--without-mingle",
        ]
    )


def green_transport(app, held: int, wait_seconds: float) -> None:
    """Broker options for a worker of the green pool: every held task
    acknowledges (and may publish a retry) on the broker channel's connection
    pool, all at once when a lane drains. kombu's pool of 10 refused the rest
    ("Too many connections") at a thousand in flight; one connection per held
    message counted thousands a process against Redis's ``maxclients``. The
    pool is bounded (lanes.redis_conn.shared_pool_size) and a call past it
    waits for a connection, at most ``wait_seconds`` (lanes/broker.py)."""
    from lanes.redis_conn import shared_pool_size

    options = dict(app.conf.broker_transport_options or {})
    options["max_connections"] = shared_pool_size(held)
    options["pool_wait_seconds"] = wait_seconds
    app.conf.broker_transport_options = options


def green_shutdown_handlers() -> None:
    """Run Celery's shutdown signal handlers on a green thread of their own.

    Under gevent a signal handler runs inside the event loop's callback, where
    nothing may block; Celery's cold shutdown (SIGQUIT) cancels the active
    requests and joins the pool there, and died with "Impossible to call
    blocking function in the event loop callback" before giving the held
    messages back. Spawned, the handler may wait; it ends by setting
    Celery's shutdown flag, which the consumer's loop reads, as before. Its
    cancel leaves the held messages unacknowledged (workers/handback.py says why).
    """
    import gevent
    from celery import platforms, signals

    from workers.handback import keep_unacknowledged_when_cancelled

    @signals.worker_ready.connect(weak=False)
    def _respawn(sender=None, **_) -> None:
        # The cold shutdown's cancel kills the green threads of the calls in flight.
        keep_unacknowledged_when_cancelled(sender)
        for name in ("SIGTERM", "SIGINT", "SIGQUIT"):
            handler = platforms.signals[name]
            if callable(handler):
                platforms.signals[name] = lambda *args, run=handler: gevent.spawn(run, *args)


if __name__ == "__main__":
    main()
