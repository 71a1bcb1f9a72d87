"""The root of the ``aisim`` command line: one Typer app, one sub-app per area."""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Annotated

import typer

from aisim import __version__
from aisim.console import err_console
from simbase.xla_cache import enable_compilation_cache

# name -> (module, its command or sub-app, help of a sub-app). A command imports only its own
# area's module: `aisim perf grid` starts without the federated engine, the fits or the
# cross-site model.
AREAS = {
    "presets": ("aisim.presets", "presets", None),
    "perf": ("aisim.perf", "app", "Analytical step-time model: estimate and grid."),
    "calibrate": ("aisim.calibrate", "app", "Fit the model's constants to measurements."),
    "measure": ("aisim.measure", "measure", None),
    "fl": ("aisim.fl", "app", "Federated training simulation."),
    "collab": ("aisim.collab", "app", "Cross-site collaborative training efficiency."),
}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"aisim {__version__}")
        raise typer.Exit()


def root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """AISynergy simulation."""


@functools.cache
def build_app(only: str | None = None) -> typer.Typer:
    """The ``aisim`` app with every area, or with the one named ``only`` (:data:`AREAS`)."""
    app = typer.Typer(
        name="aisim",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        help="AISynergy simulation: predict distributed and federated training before running it.",
    )
    app.callback()(root)
    for name, (module, attr, help_) in AREAS.items():
        if only in (None, name):
            area = getattr(importlib.import_module(module), attr)
            if isinstance(area, typer.Typer):
                app.add_typer(area, name=name, help=help_)
            else:
                app.command(name)(area)
    return app


def __getattr__(name: str):
    """``aisim.app.app``: the app with every area."""
    if name == "app":
        return build_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Console-script entry point: a usage error (an unknown option, a missing argument, a value
    of the wrong type) is one line on stderr and exit code 2, like the commands' own errors."""
    enable_compilation_cache()
    usage_error = typer.BadParameter.__mro__[1]  # click's UsageError, as typer ships it
    area = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] in AREAS else None
    try:
        code = build_app(area)(standalone_mode=False)
    except usage_error as e:
        hint = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
        err_console.print(f"[red]error:[/red] {e.format_message()}{hint}", highlight=False)
        code = 2
    except typer.Abort:
        err_console.print("[red]error:[/red] interrupted", highlight=False)
        code = 130
    raise SystemExit(code if isinstance(code, int) else 0)
