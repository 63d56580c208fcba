"""The ``lanes`` command.

Subcommands live in their own modules and are imported only when invoked:
``lanes --help`` lists them from the table below without importing any, so it
stays fast, and one broken subsystem cannot break the rest. Each module
exposes a click command or group named ``command``.

Exit codes: 0 success, 1 the operation failed, 2 bad input (nothing changed),
3 a service (Redis, database) did not answer. Every error is one line on
stderr; ``LANES_TRACEBACK=1`` shows the traceback of an unexpected one.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
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
    "revoke": ("lanes.cli.revoke", "Revoke a task (a lane wait is cancelled at once)."),
    "events": ("lanes.cli.events", "List routing events."),
    "worker": ("lanes.cli.worker", "Run a Celery worker for one fleet."),
    "demo": ("lanes.cli.demo", "Run the whole product on embedded defaults."),
    "history": ("lanes.cli.history", "Add chat history (one message or a JSON Lines file)."),
    "memory": ("lanes.cli.memory", "Enqueue and list hourly memory runs; run the memory workers."),
    "beat": ("lanes.cli.beat", "Run the scheduler (one active beat fleet-wide)."),
    "check": ("lanes.cli.check", "Check the lane pools against the farm's services."),
    "api": ("lanes.cli.api", "Serve the HTTP API (submit, results, pools, events)."),
    "flower": ("lanes.cli.flower", "Run Flower with every lane queue, task routing and worker lanes."),
    "top": ("lanes.cli.top", "A live view of every lane (q quits)."),
}


class LanesGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name, (module, _) in SUBCOMMANDS.items() if _module_exists(module))

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # click would import every subcommand for its short help; the table has it.
        rows = [(name, SUBCOMMANDS[name][1]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

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
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except OSError as exc:
            _fail(*_os_error(exc))
        except Exception as exc:
            if os.environ.get("LANES_TRACEBACK"):
                raise
            _fail(f"unexpected {type(exc).__name__}: {exc} (LANES_TRACEBACK=1 shows where)", EXIT_FAILED)


def _os_error(exc: OSError) -> tuple[str, int]:
    """A file or socket error as one line and its exit code."""
    if exc.filename is not None:
        # A path given by the user or the settings: bad input, nothing was changed.
        return (f"cannot use {exc.filename}: {exc.strerror or exc}; check the path and its permissions",
                EXIT_BAD_INPUT)
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return f"a service did not answer: {exc}", EXIT_UNAVAILABLE
    return f"{type(exc).__name__}: {exc}", EXIT_FAILED


def _module_exists(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _fail(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


@click.group(cls=LanesGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lanes")
def main() -> None:
    """Lanes: priority lanes for LLM inference fleets."""
