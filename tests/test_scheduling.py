"""The suite's scheduler (tests/conftest.py) knows every unit that starts simulated hosts or Ray.

It hands the longest unit out first by `RAY_UNIT_SECONDS`; a unit missing from that table would
be placed by guess, one that is gone would mislead the next reader. The units are what pytest
collects (a shared cluster's tests, or one module's), so the check collects them too.
"""

from __future__ import annotations

import subprocess
import sys

from tests import conftest
from tests.integration.clusters import SHARED


def _slow_units() -> set[str]:
    """The scheduler's units of the tests pytest collects under tests/integration and beside."""
    paths = ["tests/integration", *(p.removesuffix("::") for p in conftest._STARTS_LOCAL_RAY)]
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *paths],
        cwd=conftest.REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    nodeids = [line for line in collected.stdout.splitlines() if "::" in line]
    units = {conftest._xdist_scope(nodeid) for nodeid in nodeids}
    assert None not in units
    return {unit.removeprefix(conftest._RAY_UNIT) for unit in units if unit is not None}


def test_every_slow_unit_has_its_measured_seconds_and_no_other_does():
    units = _slow_units()
    assert {f"cluster {shape}" for shape in SHARED} <= units
    assert set(conftest.RAY_UNIT_SECONDS) == units
    assert set(conftest._NO_RAY_OF_THEIR_OWN) <= units


def test_the_longest_unit_goes_first_and_an_unmeasured_one_before_it():
    units = [conftest._RAY_UNIT + unit for unit in conftest.RAY_UNIT_SECONDS]
    ordered = conftest._order([*units, conftest._RAY_UNIT + "tests/integration/test_new.py"])
    assert ordered[0].endswith("test_new.py")
    seconds = [conftest.RAY_UNIT_SECONDS[unit.removeprefix(conftest._RAY_UNIT)] for unit in ordered[1:]]
    assert seconds == sorted(seconds, reverse=True)


def _unit(path: str) -> str:
    return conftest._RAY_UNIT + path


RECOVERY, SIMULATOR = (
    _unit("tests/integration/test_recovery.py"),
    _unit("tests/integration/test_simulator.py"),
)
ELASTIC, LOCAL_RAY = _unit("tests/integration/test_elastic.py"), _unit("tests/workloads/test_cluster.py")
SPEC, SANDBOX = "tests/test_spec.py", "tests/startup_scripts/test_boot_sandbox.py"


def test_a_ray_worker_takes_the_longest_unit_that_starts_ray_then_those_without_then_quick_ones():
    queue = [SPEC, SIMULATOR, RECOVERY, LOCAL_RAY, ELASTIC]
    assert conftest._choose(queue, runs_ray=True) == RECOVERY  # 167 s, then 126 s and 16 s
    assert conftest._choose([SPEC, SIMULATOR], runs_ray=True) == SIMULATOR
    assert conftest._choose([SPEC], runs_ray=True) == SPEC
    assert conftest._choose([], runs_ray=True) is None


def test_another_worker_takes_the_shortest_unit_that_starts_ray_only_once_nothing_else_is_left():
    queue = [RECOVERY, LOCAL_RAY, ELASTIC]
    assert conftest._choose([*queue, SIMULATOR, SPEC], runs_ray=False) == SIMULATOR
    assert conftest._choose([*queue, SPEC], runs_ray=False) == SPEC
    assert conftest._choose(queue, runs_ray=False) == LOCAL_RAY
    assert conftest._choose([RECOVERY, ELASTIC], runs_ray=False) == ELASTIC


def test_the_quick_modules_that_mostly_wait_are_taken_before_the_other_quick_ones():
    assert SANDBOX in conftest._WAITING_QUICK_MODULES
    assert all((conftest.REPO / module).is_file() for module in conftest._WAITING_QUICK_MODULES)
    assert conftest._choose([SPEC, SANDBOX], runs_ray=False) == SANDBOX
    assert conftest._choose([SPEC, SANDBOX, SIMULATOR], runs_ray=False) == SIMULATOR
    assert conftest._choose([SPEC, SANDBOX], runs_ray=True) == SANDBOX
    assert conftest._choose([SPEC, "tests/test_catalog.py"], runs_ray=False) == SPEC  # else in order
