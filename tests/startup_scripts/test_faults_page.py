"""docs/faults.md lists every fault scenario the simulator tests run (they write that section)."""

from __future__ import annotations

from tests.integration.test_faults import SCENARIOS
from tests.startup_scripts.faults import PAGE, section


def test_committed_fault_table_lists_every_simulator_scenario():
    rows = section(PAGE.read_text(), "simulator")
    for scenario in SCENARIOS.values():
        assert f"| {scenario} |" in rows, scenario
