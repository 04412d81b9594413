"""Rewrite schema.json, the rayslice component package's schema, from the code.

A developer runs this after changing a config key (`rayslice.spec`) or the component's inputs
or outputs (`rayslice.infra.provider`): `python scripts/write_provider_schema.py`.
tests/infra/provider/test_schema.py fails until it has been run. The schema is what the provider
answers `GetSchema` with; the checked-in copy lets a reader (and the examples' test) see it
without starting the provider.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rayslice.infra import provider

CHECKOUT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root", type=Path, default=CHECKOUT, help="checkout to write into (default: this one)"
    )
    path = parser.parse_args(argv).root / provider.SCHEMA_FILE
    text = provider.schema_text()
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
        print(f"wrote {provider.SCHEMA_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
