"""docs/faults.md as the fault tests declare it: one section per test module that runs faults.

`scripts/write_faults_page.py` writes `expected()` to the page; test_faults_page.py compares.
"""

from __future__ import annotations

from pathlib import Path

from tests.integration import test_faults
from tests.startup_scripts import test_boot_sandbox, test_hostile_config
from tests.startup_scripts.faults import FaultTable, with_table

PAGE = Path(__file__).resolve().parents[2] / "docs" / "faults.md"
TABLES: tuple[FaultTable, ...] = (test_boot_sandbox.TABLE, test_faults.TABLE, test_hostile_config.TABLE)


def expected(page_text: str) -> str:
    """The page with every section regenerated from its declaring module."""
    for table in TABLES:
        page_text = with_table(page_text, table)
    return page_text
