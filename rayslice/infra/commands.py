"""`rayslice preview` and `rayslice image`: click commands, registered in pyproject.toml's
``rayslice.commands``.

The command validates the configuration first (exit 2 with every problem, nothing run), then
runs the real Pulumi program offline (`rayslice.infra.preview`) and prints what it registered.
If the cloud twin refused a request or its audit of the finished deployment found fault (the
rules of `rayslice.cloud.rules`), the output is printed all the same and the violations follow
on stderr, with exit 2 (`CloudRuleError`, an `InvalidInput`): like a bad config value, it is bad
input that Google would refuse, caught before anything is created.
"""

from __future__ import annotations

import functools
import shlex

import click

from rayslice import capacity_table
from rayslice.cli import Group, load_spec, spec_options
from rayslice.cloud.twin.state import CloudRuleError
from rayslice.errors import EXIT_OK, InvalidInput
from rayslice.fit.plan import Target, check
from rayslice.infra.cost import render_costs, stack_costs
from rayslice.infra.image import (
    PHASE_KEY,
    PHASE_NAMESPACE,
    PHASES,
    image_name,
    stale_image_warning,
    unbuildable,
)
from rayslice.infra.image import main as image_main
from rayslice.infra.preview import FORMATS, preview, stack_config
from rayslice.startup_scripts.stack_locks import StackLocks


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
@click.option(
    "--fit",
    "fit_job",
    metavar="'JOB [ARGS]'",
    help="First compile this job's step for the stack's slices, as `rayslice fit JOB -- ARGS` "
    "does (needs rayslice[fit]); exit 2 before the preview if it does not fit.",
)
def preview_command(
    stack_file: str | None, overrides: tuple[str, ...], output: str, fit_job: str | None
) -> int:
    """Show the cloud resources `pulumi up` would create (no Pulumi CLI, no credentials, no cloud API).

    Resources that a change of requirements, rayVersion, preset or the boot script replaces are
    marked, with the create/delete timeouts Pulumi will wait; the tree ends with the cost per hour
    of each slice, each VM and the whole stack at list prices. Resources that break one of Google's
    documented rules (the policy pack in policy/ checks the same ones) are listed with the rule
    and its source, and the command exits 2.

    A stack with requirements, or with a rayVersion that has no preset lock, has them locked
    first, into rayslice-locks/<stack>.lock beside Pulumi.yaml (commit it): resolved against the
    package index when the file is missing or stale (the one network access), reused as it is
    otherwise. Only wheels are used: a requirement the index offers only as a source distribution
    is refused, since building it would run its code here.
    """
    cluster = load_spec(stack_file, overrides)  # every problem at once, before the program runs
    if fit_job:
        job, *job_args = shlex.split(fit_job)
        fitted = check(job, job_args, Target.of(cluster.tpu, cluster.slices))
        click.echo("\n".join(fitted.lines()), err=output != "tree")  # json and yaml stay parseable
    locks = StackLocks.for_stack_file(stack_file).lock
    found = preview(stack_config(stack_file, list(overrides)), locks=locks)
    click.echo(FORMATS[output](found))
    if output == "tree":  # json and yaml stay what a machine reads
        click.echo("\n" + render_costs(stack_costs(cluster, found.registrations)))
        click.echo(
            "\n" + "\n".join(capacity_table.stack_lines(cluster, controller_runs=cluster.runs_recovery))
        )
    warning = stale_image_warning(cluster, locks(cluster))  # the lock the preview just stored
    if warning:
        click.echo(f"rayslice: warning: {warning}", err=True)
    if found.violations:
        raise CloudRuleError(found.violations)
    return EXIT_OK


@click.group("image", cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
def image_group() -> None:
    """The compute host image (hostImage): its name, and the program that builds it, offline."""


@image_group.command("name")
@spec_options
def image_name_command(stack_file: str | None, overrides: tuple[str, ...]) -> int:
    """Print the name of the image that holds this stack's venv (set it as hostImage)."""
    cluster = load_spec(stack_file, overrides, require_zone=False)
    problem = unbuildable(cluster, PHASES[0])
    if problem:
        raise InvalidInput(problem)
    click.echo(image_name(cluster, StackLocks.for_stack_file(stack_file).lock(cluster)))
    return EXIT_OK


@image_group.command("preview")
@spec_options
@click.option(
    "--phase",
    type=click.Choice([*PHASES, "all"]),
    default="all",
    show_default=True,
    help="Which `pulumi up` of the image program to show (rayslice-image:phase); all: each in turn.",
)
@click.option("--output", type=click.Choice(["tree", "json"]), default="tree", show_default=True)
def image_preview_command(stack_file: str | None, overrides: tuple[str, ...], phase: str, output: str) -> int:
    """Show what each phase of the image program creates (offline, against the cloud twin).

    build: the builder instance, which installs the hosts' packages and powers off; image: the
    builder stopped and the image of its disk; done: the image alone (the builder deleted).
    Exits 2 with the rule and its source if Google would refuse a request.
    """
    cluster = load_spec(stack_file, overrides)
    problem = unbuildable(cluster, PHASES[0])
    if problem:
        raise InvalidInput(problem)
    locks = StackLocks.for_stack_file(stack_file).lock
    found = []
    for shown in PHASES if phase == "all" else (phase,):
        config = {**stack_config(stack_file, list(overrides)), f"{PHASE_NAMESPACE}:{PHASE_KEY}": shown}
        result = preview(config, functools.partial(image_main, locks))
        if output == "tree":
            click.echo(
                f"# phase {shown}: `pulumi config set {PHASE_NAMESPACE}:{PHASE_KEY} {shown} && pulumi up`"
            )
        click.echo(FORMATS[output](result))
        found += result.violations
    if found:
        raise CloudRuleError(found)
    return EXIT_OK
