"""Rewrite Pulumi.yaml's config section and docs/configuration.md from `rayslice.spec.ClusterSpec`.

A developer runs this after adding or changing a config key (`python scripts/write_config_reference.py`);
tests/rayslice/test_pulumi_yaml.py fails until it has been run. It writes into the checkout it
lives in, or into `--root`. The text comes from `rayslice.config_reference`, which only renders:
the installed package never writes files.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rayslice import config_reference

CHECKOUT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root", type=Path, default=CHECKOUT, help="checkout to write into (default: this one)"
    )
    root = parser.parse_args(argv).root
    wanted = config_reference.expected(root)
    for path in config_reference.stale(root):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(wanted[path])
        print(f"wrote {path.relative_to(root)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
