"""`rayslice run`: flag wiring for submitting a workload or a script (the work is in `submit`).

Everything after the first ``--`` belongs to the job, wherever `run`'s own options stand
(`run jax_train --address X -- --steps 20` and `run --address X jax_train -- --steps 20` are the
same command). `RunCommand` splits the argument list there before click parses the rest, so a
job option such as ``--address`` after ``--`` never reaches `run`, and a stray word before ``--``
is an error instead of a job argument.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from rayslice.errors import EXIT_OK
from rayslice.jobs import restarts, submit, upload

JOB_ARGS_KEY = "rayslice.job_args"


class RunCommand(click.Command):
    """A command whose arguments after the first ``--`` are passed through untouched."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            split = args.index("--")
            args, ctx.meta[JOB_ARGS_KEY] = args[:split], args[split + 1 :]
        else:
            ctx.meta[JOB_ARGS_KEY] = []
        return super().parse_args(ctx, args)

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(ctx.command_path, "[OPTIONS] WORKLOAD|SCRIPT.py [-- JOB ARGS...]")


@click.command(
    "run",
    cls=RunCommand,
    epilog=(
        "Examples:\n\n"
        "\b\n"
        "  rayslice run --list\n"
        "  rayslice run jax_train -- --steps 20\n"
        "  rayslice run --address http://HEAD:8265 --token-file ray-token my_job/train.py -- --lr 0.1\n\n"
        "  rayslice run --stop raysubmit_XXXX\n\n"
        "Exit status: 0 the job succeeded, 1 it failed, 2 bad input, 3 no cluster reachable, "
        "130 interrupted."
    ),
)
@click.argument("target", required=False, metavar="WORKLOAD|SCRIPT.py")
@click.option(
    "--address",
    metavar="URL",
    help="Ray Jobs API address, e.g. http://HEAD:8265 (default: $RAY_ADDRESS, else the local "
    "simulated slice from `rayslice local up`).",
)
@click.option(
    "--token-file",
    metavar="F",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Ray auth token file for a cluster with token auth. The simulated slice's own token is "
    "used only when no address is given.",
)
@click.option(
    "--working-dir",
    metavar="DIR",
    type=click.Path(file_okay=False),
    help="Folder to upload with a script (default: the script's folder; never your home folder or "
    "one above it). .git, .venv, .state, __pycache__, .env, credential stores, token and key files "
    "and whatever .rayignore/.gitignore list stay behind; a symlink out of the folder is refused.",
)
@click.option(
    "--verbose", is_flag=True, help="With a script: list every file uploaded, not just the count and size."
)
@click.option(
    "--max-restarts",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    metavar="N",
    help="If the job fails because a node died, wait until every slice is whole again and submit it "
    "again, up to N times. A job that fails on its own is never restarted.",
)
@click.option(
    "--rejoin-timeout",
    type=click.FloatRange(min=1),
    default=restarts.REJOIN_TIMEOUT_S,
    show_default=True,
    metavar="S",
    help="With --max-restarts: give up when the cluster is not whole again after S seconds.",
)
@click.option(
    "--stop-on-interrupt",
    is_flag=True,
    help="On Ctrl-C or SIGTERM, stop the job too. Without it the job keeps running on the cluster and "
    "rayslice says how to stop it.",
)
@click.option(
    "--stop",
    "stop_job",
    metavar="JOB_ID",
    help="Stop a running job (the ID `rayslice run` printed) and exit; with --address/--token-file "
    "as for submitting.",
)
@click.option("--list", "list_only", is_flag=True, help="List the bundled workloads and exit.")
@click.pass_context
def run_command(
    ctx: click.Context,
    target: str | None,
    address: str | None,
    token_file: Path | None,
    working_dir: str | None,
    max_restarts: int,
    rejoin_timeout: float,
    verbose: bool,
    stop_on_interrupt: bool,
    stop_job: str | None,
    list_only: bool,
) -> int:
    """Run a bundled workload or your script (path/to/script.py) as a Ray job.

    Streams the job's logs and exits with its status. Arguments after -- go to the job.
    """
    if list_only:
        names = upload.workloads()
        width = max(map(len, names))
        for name, workload in names.items():
            click.echo(f"{name:<{width}}  {workload.summary}")
        return EXIT_OK
    if stop_job is not None:
        if target is not None:
            raise click.UsageError("--stop takes a job ID, not a workload or script")
        submit.stop(stop_job, address=address, token_file=token_file)
        return EXIT_OK
    if target is None:
        raise click.UsageError("name a workload or a script (`rayslice run --list` shows the workloads)")
    job_args: list[Any] = ctx.meta[JOB_ARGS_KEY]
    submit.submit(
        target,
        job_args,
        address=address,
        token_file=token_file,
        working_dir=working_dir,
        max_restarts=max_restarts,
        rejoin_timeout_s=rejoin_timeout,
        verbose=verbose,
        stop_on_interrupt=stop_on_interrupt,
    )
    return EXIT_OK
