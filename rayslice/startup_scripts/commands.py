"""`rayslice render`: the boot script, as every host of a slice runs it."""

from __future__ import annotations

import click

from rayslice.cli import load_spec, spec_options
from rayslice.errors import EXIT_OK
from rayslice.startup_scripts import render


@click.command("render")
@spec_options
def render_command(stack_file: str | None, overrides: tuple[str, ...]) -> int:
    """Print the boot script every host of a slice runs."""
    click.echo(render(load_spec(stack_file, overrides, require_zone=False)), nl=False)
    return EXIT_OK
