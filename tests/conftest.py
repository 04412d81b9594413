"""Shared test helpers."""

from __future__ import annotations

import copy
import fcntl
import os
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import settings

from rayslice.spec import load
from tests.bench import load as load_bench
from tests.integration.clusters import SHARED

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
INTEGRATION = Path(__file__).resolve().parent / "integration"

# Hypothesis's default 200 ms deadline per example is a timed assertion: on a loaded 2-core
# machine (the suite beside simulated clusters) a correct example overran it and failed the run
# (test_catalog's lookup, DeadlineExceeded). Performance is measured in bench/, never in tests.
settings.register_profile("rayslice", deadline=None)
settings.load_profile("rayslice")
# `pytest --hypothesis-profile timelines-long tests/recovery/test_timelines.py`: the controller's
# timelines at a nightly run's length (dev/testing.md); the suite's own run is short.
settings.register_profile("timelines-long", deadline=None, max_examples=400, stateful_step_count=40)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Markers live here, in one place: everything under tests/integration/ starts simulated
    hosts or real Ray nodes (`slow`) inside network namespaces (`root`). The quick subset
    (`-m "not slow"`) needs no network: a test that asks for the wheelhouse must be marked slow.

    """
    for item in items:
        if INTEGRATION in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.root)
        if "wheelhouse" in getattr(item, "fixturenames", ()) and item.get_closest_marker("slow") is None:
            raise pytest.UsageError(
                f"{item.nodeid} uses the wheelhouse (filled from the network): mark it slow"
            )


# Under pytest-xdist, this many workers take the tests that start Ray, the shared clusters and
# the longest first (with four workers, two on quick modules, a local Ray once missed the 30 s
# Ray gives a node to register with its GCS, a fixed limit). The other workers take the quick
# modules, and only then the shortest of the Ray units left, near the end of the run, when the
# shared clusters are gone.
RAY_WORKERS = 2
# Slow tests outside tests/integration/ that start a local Ray.
_STARTS_LOCAL_RAY = (
    "tests/workloads/test_cluster.py::",
    "tests/startup_scripts/test_demand_publisher_ray.py::",
)
_RAY_UNIT = "ray: "
# Integration modules whose own tests start no Ray (simulated hosts with a tiny boot script, JAX
# processes, a pod's start script with a fake `ray`): any worker may take them, the quick
# workers too once their quick modules are done. Their tests on a shared cluster are that
# cluster's unit.
_NO_RAY_OF_THEIR_OWN = (
    "tests/integration/test_pod_start.py",
    "tests/integration/test_simulator.py",
    "tests/integration/test_tpu_runtime.py",
)
# Quick modules that mostly wait (the real boot script under bash against stub servers, retrying
# on purpose: 150 s of wall time for 30 CPU-s in the 2026-12-07 11:08 UTC run). A worker takes
# them before the other quick modules: early in the run the Ray workers boot clusters and keep both
# cores busy; later their units wait more (elastic slices, the fault scenarios), and in that run
# this module's waits fell beside theirs, the cores half idle for two minutes.
_WAITING_QUICK_MODULES = ("tests/startup_scripts/test_boot_sandbox.py",)
# Seconds each unit that starts simulated hosts or Ray took in a full run (the sum of its tests'
# setup, call and teardown in the suite's pytest line with `--durations=0` on the 2-core machine,
# the run that ended 2026-12-07 10:11 UTC; dev/suite-timings.md): the scheduler hands the longest
# out first, so that the two Ray workers end together. A unit missing here goes first (it may be the longest);
# tests/test_scheduling.py fails until it is added.
RAY_UNIT_SECONDS = {
    "cluster 2 x tpu7x-16 spot": 212,
    "cluster v6e-4": 188,
    "tests/integration/test_recovery.py": 167,
    "tests/integration/test_faults.py": 161,
    "tests/integration/test_elastic.py": 126,
    "tests/integration/test_simulator.py": 96,
    "tests/integration/test_package_cache.py": 91,
    "tests/integration/test_workloads_on_ray.py": 86,
    "cluster v5p-16 tpu-vm": 73,
    "tests/integration/test_readme.py": 65,
    "tests/integration/test_boot_script.py": 58,
    "tests/integration/test_elastic_flex.py": 56,
    "tests/integration/test_run_restarts.py": 39,
    "tests/integration/test_wheel_install.py": 17,
    "tests/workloads/test_cluster.py": 16,
    "tests/integration/test_pod_joins_ray.py": 13,
    "tests/startup_scripts/test_demand_publisher_ray.py": 12,
    "tests/integration/test_pod_start.py": 12,
    "tests/integration/test_tpu_runtime.py": 8,
}


def _xdist_scope(nodeid: str) -> str | None:
    """The pytest-xdist work unit of a test that starts Ray: the tests of one shared cluster
    (`tests/integration/clusters.py`) together, or those of one module (each test on its own
    simulation, sandbox or local Ray); None for a quick test."""
    if not nodeid.startswith(("tests/integration/", *_STARTS_LOCAL_RAY)):
        return None
    for shape in SHARED:
        if nodeid.endswith(f"[{shape}]"):
            return f"{_RAY_UNIT}cluster {shape}"
    return _RAY_UNIT + nodeid.split("::")[0]


def _order(units: list[str]) -> list[str]:
    """Longest first, by `RAY_UNIT_SECONDS` (a unit it lacks first of all)."""
    return sorted(units, key=lambda unit: -RAY_UNIT_SECONDS.get(unit.removeprefix(_RAY_UNIT), 10**6))


def _choose(queue: list[str], *, runs_ray: bool) -> str | None:
    """The unit a worker takes next of those not handed out yet (`queue`): a Ray worker
    (`runs_ray`) the units that start Ray, longest first, then the slow units that start no Ray of
    their own, then quick modules (`_WAITING_QUICK_MODULES` first); any other worker those slow
    units, then quick modules, and once none is left the shortest unit that starts Ray, so that
    it does not idle while the Ray workers finish theirs."""
    slow = [unit for unit in queue if unit.startswith(_RAY_UNIT)]
    ray = _order([unit for unit in slow if _starts_ray(unit)])
    without_ray = _order([unit for unit in slow if not _starts_ray(unit)])
    quick = sorted(
        (unit for unit in queue if not unit.startswith(_RAY_UNIT)),
        key=lambda unit: unit not in _WAITING_QUICK_MODULES,  # stable: the rest in their order
    )
    order = ray + without_ray + quick if runs_ray else without_ray + quick + ray[::-1]
    return next(iter(order), None)


def _starts_ray(unit: str) -> bool:
    return unit.startswith(_RAY_UNIT) and unit.removeprefix(_RAY_UNIT) not in _NO_RAY_OF_THEIR_OWN


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under pytest-xdist (`-n 3`, as scripts/test.sh runs the suite): `RAY_WORKERS` workers take
    the work units that start Ray (`_xdist_scope`), longest first (`RAY_UNIT_SECONDS`), each unit
    whole and in order, then the slow units that start no Ray of their own, then quick modules;
    the other workers take those slow units without Ray first, then quick modules, one module a
    unit, then what is left of the units that start Ray, shortest first (`_choose`).
    (pytest-xdist's own `--dist loadgroup` cannot group with pytest 9: it renames test ids
    through an attribute pytest 9 dropped.)"""
    from xdist.scheduler import LoadScopeScheduling  # pytest-xdist is loaded: it calls this hook

    class RayOnTwoWorkers(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _xdist_scope(nodeid) or super()._split_scope(nodeid)

        def _runs_ray(self, node: Any) -> bool:
            return len(self.nodes) <= RAY_WORKERS or self.nodes.index(node) < RAY_WORKERS

        def _next_unit(self, node: Any) -> str | None:
            return _choose(list(self.workqueue), runs_ray=self._runs_ray(node))

        def _assign_work_unit(self, node: Any) -> None:
            scope = self._next_unit(node)
            if scope is not None:  # else the queue is empty: the worker stays idle until the run ends
                self.workqueue.move_to_end(scope, last=False)
                super()._assign_work_unit(node)

    return RayOnTwoWorkers(config, log)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Root-only tests skip on a developer's machine without root, but fail under CI (`CI=true`):
    a CI run that could run none of them must not go green."""
    if item.get_closest_marker("root") is None or os.geteuid() == 0:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("CI=true but not root: the simulator tests need root (network namespaces)")
    pytest.skip("needs root (network namespaces); run as root")


@pytest.fixture(autouse=True)
def _quick_tests_start_no_ray(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test outside the slow tier that leaves Ray initialised in this process fails: the quick
    subset starts no Ray."""
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized() and request.node.get_closest_marker("slow") is None:
        raise AssertionError(f"{request.node.nodeid} started Ray: mark it slow")


@pytest.fixture(scope="session")
def rayslice_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout (no dependencies, no build isolation), built once per session:
    under pytest-xdist, by the first worker that asks, in the session's directory all share."""
    base = tmp_path_factory.getbasetemp()
    out = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    with open(out / "rayslice-wheel.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not list(out.glob("rayslice-*.whl")):
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "wheel",
                    "--quiet",
                    "--no-deps",
                    "--no-build-isolation",
                    "--wheel-dir",
                    str(out),
                    str(REPO),
                ],
                check=True,
                capture_output=True,
                timeout=300,
            )
    [wheel] = out.glob("rayslice-*.whl")
    return wheel


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repo's local wheelhouse (jax preset, Ray, uv and their dependencies), as an offline site
    keeps one: filled once from the package index, then read offline by every later session.
    bench/wheelhouse.py builds it (bench/bringup.py uses the same one). Checked once per session:
    under pytest-xdist, by the first worker that asks (the offline check alone resolves every
    requirement, half a minute on 2 cores)."""
    base = tmp_path_factory.getbasetemp()
    out = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    with open(out / "wheelhouse.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        checked = out / "wheelhouse.checked"
        if not checked.exists():
            spec = load({"acceleratorType": "v6e-4"}, require_zone=False)
            load_bench("wheelhouse").ensure_wheelhouse(REPO / ".wheelhouse", spec)
            checked.touch()
    return REPO / ".wheelhouse"


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """Files copied into the repository for tests; each folder's SOURCE.md names origin and license."""
    return FIXTURES


def _strict(schema: dict) -> dict:
    """The CRD schema with unknown fields refused (kubectl's default --validate=strict)."""
    schema = copy.deepcopy(schema)

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


@pytest.fixture(scope="session")
def crd_validator(fixtures_dir: Path) -> jsonschema.Draft7Validator:
    """KubeRay's RayCluster CRD schema (tests/fixtures/kuberay-v*), strict."""
    [path] = fixtures_dir.glob("kuberay-v*/ray.io_rayclusters.yaml")
    crd = yaml.safe_load(path.read_text())
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


@pytest.fixture
def stack_walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per `traceback.extract_stack` call while the test runs: how Pulumi's SDK walks
    the Python stack at every registration (the offline engine skips it; bench/offline_run.py's
    baseline does not)."""
    walked: list[int] = []
    original = traceback.extract_stack
    monkeypatch.setattr(traceback, "extract_stack", lambda *a, **k: walked.append(1) or original(*a, **k))
    return walked
