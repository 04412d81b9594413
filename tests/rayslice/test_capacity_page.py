"""docs/capacity-table.md is the capacity table as `rayslice.capacity_page` renders it: every cell,
with its sources and unsettled points."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rayslice import capacity_page, capacity_table

ROOT = Path(__file__).resolve().parents[2]


def test_the_page_is_in_step_with_the_table():
    page = (ROOT / capacity_page.PAGE).read_text()
    assert page == capacity_page.render(), "run: python scripts/write_capacity_table.py"


def test_every_cell_is_listed_with_its_sources_and_unsettled_points():
    page = capacity_page.render()
    for cell in capacity_table.CELLS:
        assert f"## {cell.key}\n" in page
        for source in cell.sources:
            assert source.title in page
        for unsettled in cell.unsettled:
            assert unsettled.choice in page


def test_the_writer_script_rewrites_a_stale_page(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    (tmp_path / capacity_page.PAGE).write_text("stale\n")
    script = ROOT / "scripts" / "write_capacity_table.py"
    done = subprocess.run(
        [sys.executable, str(script), "--root", str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert "wrote docs/capacity-table.md" in done.stdout
    assert (tmp_path / capacity_page.PAGE).read_text() == capacity_page.render()
