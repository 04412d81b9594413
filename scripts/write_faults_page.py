"""Rewrite the fault tables of docs/faults.md from what the fault tests declare.

A developer runs this after adding or changing a fault scenario (`python scripts/write_faults_page.py`);
tests/startup_scripts/test_faults_page.py fails until it has been run. Each table is declared by
the test module that runs its scenarios, so the checkout's root goes on `sys.path` to import them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(CHECKOUT))

from tests.startup_scripts import faults_page  # noqa: E402  (needs CHECKOUT on sys.path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--page", type=Path, default=faults_page.PAGE, help="page to rewrite (default: docs/faults.md)"
    )
    page = parser.parse_args(argv).page
    text = page.read_text()
    wanted = faults_page.expected(text)
    if wanted != text:
        page.write_text(wanted)
        print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
