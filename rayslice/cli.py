"""The `rayslice` command: flag wiring only; the work lives in the modules it calls.

Every command that takes cluster input accepts ``--stack-file F`` and ``--set KEY=VALUE`` and
goes through `rayslice.spec`. Expected failures raise `UserError` (or `SpecError` /
`CatalogError`) and end as a message on stderr with exit code 2; nothing else prints tracebacks
on purpose.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence

from rayslice import catalog, spec

EXIT_INVALID = 2


class UserError(Exception):
    """A failure the user can fix; the message says how. Exit code 2 unless `code` says otherwise."""

    def __init__(self, message: str, code: int = EXIT_INVALID):
        super().__init__(message)
        self.code = code


def add_spec_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--stack-file", metavar="F", help="Pulumi stack file (Pulumi.<stack>.yaml) to read config from"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key (repeatable), e.g. --set acceleratorType=v5p-16",
    )


def spec_from_args(args: argparse.Namespace, *, require_zone: bool = True) -> spec.ClusterSpec:
    return spec.load_cli(args.stack_file, args.overrides, require_zone=require_zone)


# ---- catalog ---------------------------------------------------------------------------------


def _cmd_catalog(args: argparse.Namespace) -> int:
    if args.type:
        shape = catalog.lookup(args.type, args.platform)
        if args.json:
            print(json.dumps(shape.as_json(), indent=2))
        else:
            width = max(len(k) for k in shape.as_json())
            for key, value in shape.as_json().items():
                shown = ", ".join(value) if isinstance(value, list) else ("-" if value is None else value)
                print(f"{key:<{width}}  {shown}")
        return 0
    rows = _generation_rows(args.platform)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    headers = list(rows[0])
    widths = {h: max(len(h), *(len(str(r[h])) for r in rows)) for h in headers}
    print("  ".join(h.ljust(widths[h]) for h in headers))
    for row in rows:
        print("  ".join(str(row[h]).ljust(widths[h]) for h in headers))
    print(
        f"\n`rayslice catalog TYPE --platform {args.platform}` shows one type; sizes count "
        "TensorCores for v2/v3/v4/v5p/tpu7x and chips for v5litepod/v6e."
    )
    return 0


def _generation_rows(platform: str) -> list[dict[str, object]]:
    """One summary row per generation on a platform, for the readable table."""
    rows = []
    for gen in catalog.generations(platform):
        shapes = [
            s
            for n, s in catalog.table(platform).items()
            if n == s.accelerator_type and s.generation == gen.name
        ]
        shapes.sort(key=lambda s: s.chips)
        rows.append(
            {
                "generation": gen.name,
                "aliases": ",".join(gen.aliases) or "-",
                "smallest": shapes[0].accelerator_type,
                "largest": shapes[-1].accelerator_type,
                "chips/host": ",".join(str(c) for c in sorted({s.chips_per_host for s in shapes})),
                "runtime" if platform == "tpu-vm" else "machine": (
                    gen.runtime_version if platform == "tpu-vm" else f"{gen.gke_machine_family}-Nt"
                ),
                "multislice": "yes" if gen.multislice else "no",
                "zones": ",".join(gen.zones),
            }
        )
    return rows


# ---- validate --------------------------------------------------------------------------------


def _cmd_validate(args: argparse.Namespace) -> int:
    cluster = spec_from_args(args)
    t = cluster.tpu
    print(
        f"valid: {cluster.slices} x {t.accelerator_type} on {cluster.platform} in {cluster.zone} "
        f"({t.hosts} host(s) x {t.chips_per_host} chips per slice, topology {t.topology}, "
        f"head={cluster.head}, preset={cluster.preset})"
    )
    return 0


# ---- render ----------------------------------------------------------------------------------


def _cmd_render(args: argparse.Namespace) -> int:
    from rayslice import startup_scripts

    sys.stdout.write(startup_scripts.render(spec_from_args(args, require_zone=False)))
    return 0


# ---- wiring ----------------------------------------------------------------------------------


def _register_core(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("catalog", help="show TPU generations or one accelerator type")
    p.add_argument("type", nargs="?", help="accelerator type, e.g. v5p-16, v6e-4x4, tpu-v6e-slice-16")
    p.add_argument("--platform", choices=catalog.PLATFORMS, default="tpu-vm")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_catalog)

    p = sub.add_parser("validate", help="check a configuration without creating anything")
    add_spec_args(p)
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser("render", help="print the boot script every host of a slice runs")
    add_spec_args(p)
    p.set_defaults(func=_cmd_render)


# Command groups defined next to the code they drive. Those modules import this one (for
# UserError and the spec arguments), so they are imported when the parser is built.
COMMAND_MODULES = ("rayslice.preview", "rayslice.local.cli", "rayslice.workloads._submit")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rayslice", description="Ray clusters on Cloud TPU slices.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _register_core(sub)
    for module in COMMAND_MODULES:
        importlib.import_module(module).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (spec.SpecError, catalog.CatalogError) as exc:
        print(f"rayslice: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except UserError as exc:
        print(f"rayslice: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("rayslice: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    # Run through the imported module so `python -m rayslice.cli` and the entry point share one
    # set of exception classes (UserError raised by subcommand modules is rayslice.cli's).
    from rayslice.cli import main as entry_point

    sys.exit(entry_point())
