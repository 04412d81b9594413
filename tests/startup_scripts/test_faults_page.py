"""docs/faults.md is what the fault tests declare: each scenario and the outcome its test asserts.

Tests never write the page; `scripts/write_faults_page.py` does, and this test names it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.startup_scripts import faults_page
from tests.startup_scripts.faults import section

REPO = Path(__file__).resolve().parents[2]
WRITER = REPO / "scripts" / "write_faults_page.py"


def test_committed_page_is_what_the_tests_declare():
    page = faults_page.PAGE.read_text()
    assert page == faults_page.expected(page), (
        f"docs/faults.md is stale: run python {WRITER.relative_to(REPO)}"
    )


@pytest.mark.parametrize("table", faults_page.TABLES, ids=lambda t: t.section)
def test_every_declared_scenario_has_its_row(table):
    """Each section lists its module's scenarios, each with the outcome its test asserts."""
    rows = section(faults_page.PAGE.read_text(), table.section)
    assert table.faults
    for fault in table.faults.values():
        assert f"| {fault.scenario} | {fault.outcome} |" in rows, fault.scenario


def test_the_writer_script_rewrites_the_page(tmp_path):
    page = tmp_path / "faults.md"
    shutil.copy(faults_page.PAGE, page)
    first = faults_page.TABLES[0]
    fault = next(iter(first.faults.values()))
    page.write_text(page.read_text().replace(f"| {fault.outcome} |", "| something else |"))
    assert page.read_text() != faults_page.PAGE.read_text()
    subprocess.run([sys.executable, str(WRITER), "--page", str(page)], check=True, capture_output=True)
    assert page.read_text() == faults_page.PAGE.read_text()
