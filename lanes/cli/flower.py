"""``lanes flower``: Flower with every lane queue, a Lanes page, each task's lane events and each worker's lanes."""

from __future__ import annotations

import errno

import click

from lanes.cli.common import pass_settings
from lanes.errors import InvalidInput


@click.command(name="flower")
@click.option("--port", type=int, default=5555, show_default=True, help="Port to serve on (0: any free port).")
@click.option("--address", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--no-auth", is_flag=True,
              help="Serve without a login (only where nothing else can reach the port).")
@pass_settings
def command(settings, port, address, no_auth) -> None:
    """Run Flower on Lanes' broker: lane queues, task routing, lane events, worker lanes.

    Logins come from LANES_FLOWER_BASIC_AUTH (user:password, several separated
    by commas); without it Flower is refused unless --no-auth is given.
    """
    import signal
    import sys

    from lanes.catalog import load_routing, open_catalog
    from lanes.embedded import client_redis_url
    from lanes.flower.config import FlowerConfig, basic_auth, celery_app, lane_queues

    from lanes.settings import secret_problems

    if not 0 <= port <= 65535:
        raise InvalidInput(f"port {port} is not a port (0..65535; 0 picks a free one)")
    weak = secret_problems(settings, names=("flower_basic_auth",))
    if weak:
        raise InvalidInput("refusing to serve Flower with a weak login: " + "; ".join(weak))
    config = FlowerConfig(port=port, address=address, logins=basic_auth(settings, no_auth=no_auth))
    engine = open_catalog(settings, create=False)

    def queues() -> list[str]:
        return lane_queues(load_routing(engine))

    known = queues()  # read once now: a catalog that cannot be read is refused before serving
    capp = celery_app(settings, client_redis_url(settings), known)
    from lanes.ops.lanes_page import lanes_page
    from lanes.routing.client import LanesClient

    client = LanesClient(settings)
    app = _flower(capp, config, queues, lambda: lanes_page(client))
    try:
        bound = app.start_http_server()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise InvalidInput(f"port {port} on {address} is taken; pass another --port (0 picks a free one)") from None
        raise
    logins = f"{len(config.logins)} login(s)" if config.logins else "no login"
    click.echo(f"Flower at http://{address}:{bound}/ ({logins}; {len(known)} lane queue(s))")
    sys.stdout.flush()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        app.start()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        app.stop()
        client.close()
        engine.dispose()


def _flower(capp, config, queues, page):
    import flower.options  # noqa: F401 (defines Flower's options on tornado's global options)
    from tornado.options import options

    from lanes.flower.server import build

    for name, value in config.tornado_options().items():
        setattr(options, name, value)
    return build(capp, options, queues, page)
