"""Fixtures for tests on the simulated slice (root only: network, PID, UTS and mount namespaces).

`simulation_dir` gives each test its own state directory and, whatever the test did, removes
the simulation in it afterwards (the same `destroy` that `rayslice local down` runs), so a
failing test never leaves namespaces or processes behind. `cluster` is the shared, booted cluster
a test names with `clusters.on(shape)`; it is removed after the last test of its shape.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rayslice import spec as spec_module
from rayslice.local.simulation.simulator import Simulation
from rayslice.local.simulation.state import STATE_FILE
from tests.integration.clusters import SHARED, bring_up


@pytest.fixture
def simulation_dir(tmp_path: Path) -> Iterator[Path]:
    state_dir = tmp_path / "sim"
    yield state_dir
    if (state_dir / STATE_FILE).exists():
        Simulation.open(state_dir).destroy()


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Simulation]:
    """The shared cluster `request.param` (a key of `clusters.SHARED`), every host joined Ray.

    One instance per shape: pytest groups the tests of a shape and finalises this before it
    creates the next shape's, so at most one shared cluster runs at a time.
    """
    spec = spec_module.load(SHARED[request.param], require_zone=False)
    sim = Simulation.create(spec, tmp_path_factory.mktemp("shared") / "sim")
    try:
        bring_up(sim)
        yield sim
    finally:
        sim.destroy()
