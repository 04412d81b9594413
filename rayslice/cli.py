"""The `rayslice` command: the core commands, and the group that every other command joins.

Dependencies point one way. This module knows the catalog and the spec; the commands that drive
Pulumi (`preview`), the simulator (`local`) or a cluster (`run`) live beside their code and
register through the ``rayslice.commands`` entry-point group in pyproject.toml, so nothing here
imports `rayslice.infra`, `rayslice.local` or `rayslice.workloads`.

Every command that takes cluster input uses `spec_options` and `load_spec`. Expected failures are
`rayslice.errors.RaysliceError`s: `main` prints their message on stderr and returns their exit
code; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import Any, TypeVar

import click

from rayslice import capacity_table, catalog, spec
from rayslice.errors import EXIT_INTERRUPTED, EXIT_INVALID, EXIT_OK, RaysliceError

COMMANDS_GROUP = "rayslice.commands"
F = TypeVar("F", bound=Callable[..., Any])


def spec_options(func: F) -> F:
    """`--stack-file F` and repeatable `--set KEY=VALUE`, the two ways to give cluster input."""
    func = click.option(
        "--set",
        "overrides",
        multiple=True,
        metavar="KEY=VALUE",
        help="Override one config key (repeatable), e.g. --set acceleratorType=v5p-16.",
    )(func)
    return click.option(
        "--stack-file",
        metavar="F",
        type=click.Path(dir_okay=False),
        help="Pulumi stack file (Pulumi.<stack>.yaml) to read config from.",
    )(func)


def load_spec(
    stack_file: str | None, overrides: Sequence[str], *, require_zone: bool = True
) -> spec.ClusterSpec:
    """The validated spec from a stack file plus overrides; raises `SpecError` (exit 2)."""
    return spec.load_cli(stack_file, list(overrides), require_zone=require_zone)


class Group(click.Group):
    """A click group whose `--help` lists each command's whole first sentence, not 45 characters."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List the commands; one whose package fails to import is listed with the error instead
        of taking the whole help page down with it."""
        rows = []
        for name in self.list_commands(ctx):
            try:
                command = self.get_command(ctx, name)
            except Exception as exc:  # any import failure of a plugin package: shown, not hidden
                rows.append((name, f"(unavailable: {type(exc).__name__}: {exc})"))
                continue
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=200)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class RaysliceGroup(Group):
    """The core commands plus every command registered under ``rayslice.commands``."""

    def _registered(self) -> dict[str, Any]:
        return {ep.name: ep for ep in entry_points(group=COMMANDS_GROUP)}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._registered()))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None and (entry := self._registered().get(cmd_name)) is not None:
            command = entry.load()
        return command


@click.group(
    cls=RaysliceGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="`rayslice COMMAND --help` describes each command. Exit status: 0 success, 1 the job "
    "(or bring-up) failed, 2 bad input, 3 no cluster reachable, no credentials or a cloud API call failed.",
)
def app() -> None:
    """Ray clusters on Cloud TPU slices, from one validated description."""


@app.command("catalog")
@click.argument("accelerator_type", required=False, metavar="[TYPE]")
@click.option(
    "--platform",
    type=click.Choice(catalog.PLATFORMS),
    default="tpu-vm",
    show_default=True,
    help="Which API's names and shapes to show.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def catalog_command(accelerator_type: str | None, platform: str, as_json: bool) -> int:
    """Show the TPU generations on a platform, or one accelerator type (e.g. v5p-16, v6e-4x4)."""
    if accelerator_type:
        tpu = catalog.lookup(accelerator_type, platform)
        shape, prices = tpu.as_json(), catalog.slice_prices(tpu)
        if as_json:
            priced = {"price_per_hour": prices, "price_source": catalog.price_source()}
            click.echo(json.dumps(shape | priced, indent=2))
        else:
            width = max(len(k) for k in shape)
            for key, value in shape.items():
                shown = ", ".join(value) if isinstance(value, list) else ("-" if value is None else value)
                click.echo(f"{key:<{width}}  {shown}")
            _echo_prices(prices)
        return EXIT_OK
    rows = catalog.generation_rows(platform)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return EXIT_OK
    headers = list(rows[0])
    widths = {h: max(len(h), *(len(str(r[h])) for r in rows)) for h in headers}
    click.echo("  ".join(h.ljust(widths[h]) for h in headers))
    for row in rows:
        click.echo("  ".join(str(row[h]).ljust(widths[h]) for h in headers))
    click.echo(
        f"\n`rayslice catalog TYPE --platform {platform}` shows one type; sizes count TensorCores "
        "for v2/v3/v4/v5p/tpu7x and chips for v5litepod/v6e."
    )
    return EXIT_OK


def _echo_prices(prices: dict[str, dict[str, float | None]]) -> None:
    """One slice's price per hour, a row per region and a column per capacity."""
    click.echo("\nprice of one slice per hour, by region and capacity:")
    rows = [["region", *catalog.CAPACITIES]] + [
        [region, *(catalog.format_price(by_capacity[c]) for c in catalog.CAPACITIES)]
        for region, by_capacity in prices.items()
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    click.echo(f"({catalog.price_source()})")


@app.command("validate")
@spec_options
def validate_command(stack_file: str | None, overrides: tuple[str, ...]) -> int:
    """Check a configuration without creating anything (exit 2 with every problem if invalid)."""
    cluster = load_spec(stack_file, overrides)
    t = cluster.tpu
    head = "KubeRay head pod on the CPU pool" if cluster.platform == "gke" else f"head={cluster.head}"
    click.echo(
        f"valid: {cluster.slices} x {t.accelerator_type} on {cluster.platform} in {cluster.zone} "
        f"({t.hosts} host(s) x {t.chips_per_host} chips per slice, topology {t.topology}, "
        f"{head}, preset={cluster.preset})"
    )
    for line in capacity_table.stack_lines(cluster, controller_runs=cluster.runs_recovery):
        click.echo(line)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code (tests call this; the console script exits with it)."""
    try:
        result = app.main(
            args=list(argv) if argv is not None else None, prog_name="rayslice", standalone_mode=False
        )
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code if exc.exit_code else EXIT_INVALID
    except RaysliceError as exc:
        click.echo(f"rayslice: {exc}", err=True)
        return exc.exit_code
    except (click.Abort, KeyboardInterrupt):
        click.echo("rayslice: interrupted", err=True)
        return EXIT_INTERRUPTED
    return result if isinstance(result, int) else EXIT_OK


def entry_point() -> None:
    """The `rayslice` console script."""
    sys.exit(main())
