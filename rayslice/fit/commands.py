"""`rayslice fit`: compile a job's step for the stack's slices and say whether it fits, offline.

Registered under ``rayslice.commands`` in pyproject.toml; the work is `rayslice.fit.plan`'s.
"""

from __future__ import annotations

import click

from rayslice.cli import load_spec, spec_options
from rayslice.errors import EXIT_OK, InvalidInput
from rayslice.fit.plan import Target, check


def target_of(
    stack_file: str | None, overrides: tuple[str, ...], topology: str | None, slices: int
) -> Target:
    """The chips to compile for: `--topology` when given, else the stack's slices."""
    if topology is not None:
        return Target.parse(topology, slices)
    if slices != 1:
        raise InvalidInput("--slices goes with --topology; a stack's own `slices` key says how many it has")
    cluster = load_spec(stack_file, overrides, require_zone=False)
    return Target.of(cluster.tpu, cluster.slices)


@click.command("fit")
@click.argument("job", metavar="JOB")
@click.argument("job_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- JOB_ARGS...]")
@spec_options
@click.option(
    "--topology",
    metavar="GEN:DIMS",
    help="Compile for this topology instead of the stack's, as libtpu names it (v5e:1x1, v6e:4x4).",
)
@click.option(
    "--slices",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="With --topology: how many slices (multislice).",
)
@click.option(
    "--fill-cache",
    metavar="LOCATION",
    help="Also write the compiled step into the cluster's compilation cache (a folder, or the "
    "gs:// URL `pulumi stack output compilation_cache` prints), so the hosts skip compiling it. "
    "Helps only where this machine's jax, jaxlib and libtpu match the hosts' (docs/fit.md). "
    "The step is compiled afresh, never read from LOCATION, and only entries it lacks are written.",
)
@click.option(
    "--verbose", is_flag=True, help="Show libtpu's own lines (by default they go to its log folder)."
)
def fit_command(
    job: str,
    job_args: tuple[str, ...],
    stack_file: str | None,
    overrides: tuple[str, ...],
    topology: str | None,
    slices: int,
    fill_cache: str | None,
    verbose: bool,
) -> int:
    """Compile a job's step for the stack's TPU slices on this machine; exit 2 if it does not fit.

    JOB is a bundled job (jax_train), a file (train.py) or a module (my_pkg.train), optionally
    with :FUNCTION; it must define fit_step(devices, argv) returning the jitted step and its
    abstract arguments (docs/fit.md). Arguments after -- go to the job. Prints, per chip, the HBM
    the step needs against the chip's, its FLOPs and time at the chip's peak, and how each array
    is sharded. Needs libtpu: pip install 'rayslice[fit]'. Creates nothing.
    """
    target = target_of(stack_file, overrides, topology, slices)
    found = check(job, job_args, target, cache=fill_cache, verbose=verbose)
    for line in found.lines():
        click.echo(line)
    return EXIT_OK
