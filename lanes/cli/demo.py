"""``lanes demo``: the whole product on embedded defaults."""

from __future__ import annotations

from pathlib import Path

import click

from lanes.cli.common import pass_settings


@click.command(name="demo")
@click.option("--requests", type=click.IntRange(10, 5000), default=160, show_default=True,
              help="How many requests the mixed workload sends.")
@click.option("--catalog", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Catalog file to apply and simulate (default: examples/aifarm.toml).")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the PNG plot (default: demo.png in the state folder).")
@pass_settings
def command(settings, requests, catalog, plot) -> None:
    """Apply the example fleet, simulate it, run a worker per fleet, the beat and a mixed workload;
    change the dialog backend's capacity midway and plot the widths."""
    from lanes.demo.run import run_demo

    report = run_demo(settings, requests=requests, catalog=catalog, plot=plot)
    if report.over_admitted or report.failures:
        raise SystemExit(1)
