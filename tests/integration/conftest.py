"""Fixtures for tests on the simulated slice (root only: network, PID, UTS and mount namespaces).

`simulation_dir` gives each test its own state directory and, whatever the test did, removes
the simulation in it afterwards (the same `destroy` that `rayslice local down` runs), so a
failing test never leaves namespaces or processes behind. `simulate` boots a whole simulated
cluster for a module's fixtures, which destroy it themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rayslice import spec as spec_module
from rayslice.local.simulation.simulator import Simulation
from rayslice.local.simulation.state import STATE_FILE


@pytest.fixture
def simulation_dir(tmp_path: Path) -> Iterator[Path]:
    state_dir = tmp_path / "sim"
    yield state_dir
    if (state_dir / STATE_FILE).exists():
        Simulation.open(state_dir).destroy()


@pytest.fixture(scope="session")
def simulate(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Simulation]:
    """`simulate(**raw)`: the cluster `raw` describes, every host booted and joined (300 s at most).

    The caller destroys it; if booting fails, it is destroyed here before the error propagates.
    """

    def boot(**raw: object) -> Simulation:
        spec = spec_module.load(raw, require_zone=False)
        sim = Simulation.create(spec, tmp_path_factory.mktemp(spec.accelerator_type) / "sim")
        try:
            sim.boot_all()
            sim.wait_for(lambda states: all(s == "joined" for s in states.values()), timeout=300)
        except BaseException:
            sim.destroy()
            raise
        return sim

    return boot
