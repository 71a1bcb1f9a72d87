"""The root of the ``aisim`` command line: one Typer app, one sub-app per area."""

from __future__ import annotations

from typing import Annotated

import typer

from aisim import __version__
from aisim import calibrate as calibrate_cli
from aisim import collab as collab_cli
from aisim import fl as fl_cli
from aisim import measure as measure_cli
from aisim import perf as perf_cli
from aisim import presets as presets_cli

app = typer.Typer(
    name="aisim",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="AISynergy simulation: predict distributed and federated training before running it.",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"aisim {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """AISynergy simulation."""


app.command("presets")(presets_cli.presets)
app.add_typer(perf_cli.app, name="perf", help="Analytical step-time model: estimate and grid.")
app.add_typer(calibrate_cli.app, name="calibrate", help="Fit the model's constants to measurements.")
app.command("measure")(measure_cli.measure)
app.add_typer(fl_cli.app, name="fl", help="Federated training simulation.")
app.add_typer(collab_cli.app, name="collab", help="Cross-site collaborative training efficiency.")


def main() -> None:
    """Console-script entry point."""
    app()
