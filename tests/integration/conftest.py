"""Fixtures for tests on the simulated slice (root only: network, PID, UTS and mount namespaces).

`simulation_dir` gives each test its own state directory and, whatever the test did, removes
the simulation in it afterwards (the same `destroy` that `rayslice local down` runs), so a
failing test never leaves namespaces or processes behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rayslice.local.simulator import Simulation
from rayslice.local.state import STATE_FILE


@pytest.fixture
def simulation_dir(tmp_path: Path) -> Iterator[Path]:
    state_dir = tmp_path / "sim"
    yield state_dir
    if (state_dir / STATE_FILE).exists():
        Simulation.open(state_dir).destroy()
