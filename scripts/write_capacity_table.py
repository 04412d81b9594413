"""Rewrite docs/capacity-table.md from `rayslice.capacity_table` (`rayslice.capacity_page.render`).

A developer runs this after changing a cell, a source or the flex-start zones
(`python scripts/write_capacity_table.py`); tests/rayslice/test_capacity_page.py fails until it
has been run. It writes into the checkout it lives in, or into `--root`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rayslice import capacity_page

CHECKOUT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root", type=Path, default=CHECKOUT, help="checkout to write into (default: this one)"
    )
    page = parser.parse_args(argv).root / capacity_page.PAGE
    wanted = capacity_page.render()
    if not page.exists() or page.read_text() != wanted:
        page.write_text(wanted)
        print(f"wrote {capacity_page.PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
