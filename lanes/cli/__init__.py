"""The ``lanes`` command.

Subcommands live in their own modules and are imported only when invoked, so
``lanes --help`` stays fast and one broken subsystem cannot break the rest.
Each module exposes a click command or group named ``command``.

Exit codes: 0 success, 1 the operation failed, 2 bad input (nothing changed),
3 a service (Redis, database) did not answer.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

import click

from lanes.errors import InvalidInput, LanesError, ServiceUnavailable

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_UNAVAILABLE = 3

# name -> (module, one-line help shown by `lanes --help`)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "db": ("lanes.cli.db", "Create and migrate the catalog database."),
    "catalog": ("lanes.cli.catalog", "Apply, show and export the routing catalog."),
    "pools": ("lanes.cli.pools", "Live lane statistics of every pool; resize a lane."),
    "redis": ("lanes.cli.redis_cmd", "Start, stop and inspect the embedded Redis server."),
    "sim": ("lanes.cli.sim", "Run the simulated vLLM fleet."),
    "submit": ("lanes.cli.submit", "Submit work to a workflow."),
    "result": ("lanes.cli.result", "Show a task's result and routing trace."),
    "events": ("lanes.cli.events", "List routing events."),
    "worker": ("lanes.cli.worker", "Run a Celery worker for one fleet."),
    "demo": ("lanes.cli.demo", "Run the whole product on embedded defaults."),
    "history": ("lanes.cli.history", "Add chat history (one message or a JSON Lines file)."),
    "memory": ("lanes.cli.memory", "Enqueue and list hourly memory runs; run the memory workers."),
    "beat": ("lanes.cli.beat", "Run the scheduler (one active beat fleet-wide)."),
    "check": ("lanes.cli.check", "Check the lane pools against the farm's services."),
}


class LanesGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name, (module, _) in SUBCOMMANDS.items() if _module_exists(module))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        entry = SUBCOMMANDS.get(name)
        if entry is None or not _module_exists(entry[0]):
            return None
        command = importlib.import_module(entry[0]).command
        if not command.help and not command.short_help:
            command.short_help = entry[1]
        return command

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except InvalidInput as exc:
            _fail(str(exc), EXIT_BAD_INPUT)
        except ServiceUnavailable as exc:
            _fail(str(exc), EXIT_UNAVAILABLE)
        except LanesError as exc:
            _fail(str(exc), EXIT_FAILED)


def _module_exists(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _fail(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


@click.group(cls=LanesGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lanes")
def main() -> None:
    """Lanes: priority lanes for LLM inference fleets."""
