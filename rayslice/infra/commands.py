"""`rayslice preview`: the click command, registered in pyproject.toml's ``rayslice.commands``.

The command validates the configuration first (exit 2 with every problem, nothing run), then
runs the real Pulumi program offline (`rayslice.infra.preview`) and prints what it registered.
If the cloud twin refused a request or its audit of the finished deployment found fault (the
rules of `rayslice.cloud.rules`), the output is printed all the same and the violations follow
on stderr, with exit 2 (`CloudRuleError`, an `InvalidInput`): like a bad config value, it is bad
input that Google would refuse, caught before anything is created.
"""

from __future__ import annotations

import click

from rayslice.cli import load_spec, spec_options
from rayslice.cloud.twin import CloudRuleError
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
    marked, with the create/delete timeouts Pulumi will wait. Resources that break one of Google's
    documented rules (the policy pack in policy/ checks the same ones) are listed with the rule
    and its source, and the command exits 2.
    """
    load_spec(stack_file, overrides)  # every problem at once, before the program runs
    found = preview(stack_config(stack_file, list(overrides)))
    click.echo(FORMATS[output](found))
    if found.violations:
        raise CloudRuleError(found.violations)
    return EXIT_OK
