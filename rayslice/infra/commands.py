"""`rayslice preview`: the click command, registered in pyproject.toml's ``rayslice.commands``.

The command validates the configuration first (exit 2 with every problem, nothing run), then
runs the real Pulumi program offline (`rayslice.infra.preview`) and prints what it registered.
"""

from __future__ import annotations

import click

from rayslice.cli import load_spec, spec_options
from rayslice.errors import EXIT_OK
from rayslice.infra.preview import FORMATS, preview, stack_config


@click.command("preview")
@spec_options
@click.option(
    "--output",
    type=click.Choice(sorted(FORMATS)),
    default="tree",
    show_default=True,
    help="tree: resources under their components; json: one object per resource; "
    "yaml: platform=gke's Kubernetes manifests for kubectl apply.",
)
def preview_command(stack_file: str | None, overrides: tuple[str, ...], output: str) -> int:
    """Show the cloud resources `pulumi up` would create (offline: no Pulumi CLI, no credentials).

    Resources that a change of requirements, rayVersion, preset or the boot script replaces are
    marked, with the create/delete timeouts Pulumi will wait.
    """
    load_spec(stack_file, overrides)  # every problem at once, before the program runs
    registrations = preview(stack_config(stack_file, list(overrides)))
    click.echo(FORMATS[output](registrations))
    return EXIT_OK
