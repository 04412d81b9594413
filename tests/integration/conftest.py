"""Fixtures for tests on the simulated slice (root only: network, PID, UTS and mount namespaces).

`simulation_dir` gives each test its own state directory and, whatever the test did, removes
the simulation in it afterwards (the same `destroy` that `rayslice local down` runs), so a
failing test never leaves namespaces or processes behind. `cluster` is the shared, booted cluster
a test names with `clusters.on(shape)`; it is removed right after the last test of its shape, not
at the end of the session: an idle cluster's hosts (up to ten machines of Ray, metadata servers
and a recovery controller) would otherwise take CPU from every test that runs after it.
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


# The shared clusters this process runs, by shape, and the shapes it has already removed.
_RUNNING: dict[str, Simulation] = {}
_REMOVED: set[str] = set()


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Simulation]:
    """The shared cluster `request.param` (a key of `clusters.SHARED`), every host joined Ray.

    One instance per shape: pytest groups the tests of a shape (and the scheduler in
    tests/conftest.py keeps them on one worker), so at most one shared cluster runs at a time in a
    process. `pytest_runtest_teardown` removes it after the last of them.
    """
    spec = spec_module.load(SHARED[request.param], require_zone=False)
    sim = Simulation.create(spec, tmp_path_factory.mktemp("shared") / "sim")
    _RUNNING[request.param] = sim
    try:
        bring_up(sim)
        yield sim
    finally:
        if _RUNNING.pop(request.param, None) is not None:
            sim.destroy()


def _shape(item: pytest.Item | None) -> str | None:
    """The shared cluster a test runs on, if it names one."""
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("cluster") if callspec is not None else None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test whose shared cluster was already removed fails at once (its shape's tests must run
    together: pytest orders them so, and so does the scheduler)."""
    if _shape(item) in _REMOVED:
        pytest.fail(f"the shared cluster {_shape(item)} was removed after what seemed its last test")


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test of a shape (the next test names another, or none is left), remove
    that shared cluster now, before the next test runs beside its idle hosts."""
    shape = _shape(item)
    if shape is not None and shape in _RUNNING and _shape(nextitem) != shape:
        _REMOVED.add(shape)
        _RUNNING.pop(shape).destroy()
