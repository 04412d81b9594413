"""Fault figures on a simulated slice: each scenario ends with every host joined, or with a named
failure state and nothing left behind. docs/faults.md shows `SCENARIOS` (section "simulator").

The hosts run the real rendered boot script and real Ray. Faults the simulator cannot make
(Secret Manager, a failing install) are covered by tests/startup_scripts/test_boot_sandbox.py.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest

from rayslice import names
from rayslice import spec as spec_module
from rayslice.local.simulation.simulator import Simulation
from rayslice.local.simulation.state import STATE_FILE
from tests.startup_scripts.faults import Fault, FaultTable

SCENARIOS = {
    "metadata_503": Fault(
        "metadata servers answer 503 for the first 8 s",
        "boot retries with backoff; every host **joined**",
    ),
    "workers_first": Fault("workers boot before the head", "every host **joined** once the head came up"),
    "head_never": Fault(
        "the head has not appeared for 20 s",
        "workers stay `waiting: head` (no deadline), supervisor running",
    ),
    "head_restart": Fault(
        "Ray on the head restarted",
        "supervisors restart Ray; every host **joined** again (new node ids)",
    ),
    "reboot_all": Fault("every host rebooted at once", "every host **joined** again, one node per host"),
    "host_missing": Fault(
        "one host never boots",
        "the other hosts **joined**; the missing host has published no state (status shows it empty)",
    ),
    "metadata_never": Fault(
        "metadata server accepts connections and never answers",
        "`failed: startup-script exited 1` after the deadline; log names the metadata server; no supervisor",
    ),
}
TABLE = FaultTable("simulator", SCENARIOS)


def _spec(**raw: object) -> spec_module.ClusterSpec:
    return spec_module.load(
        {"acceleratorType": "v6e-16", "platform": "tpu-vm", "rayAuth": "none", **raw}, require_zone=False
    )


def _tpu_nodes(sim: Simulation) -> list[dict]:
    try:
        return [n for n in sim.ray_nodes() if n["resources"].get("TPU")]
    except OSError:
        return []


def _wait_nodes(sim: Simulation, ips: set[str], timeout: float, avoid: set[str] | None = None) -> list[dict]:
    """Wait until the alive TPU nodes are exactly `ips`, none of them with an id in `avoid`."""
    deadline = time.monotonic() + timeout
    nodes: list[dict] = []
    while time.monotonic() < deadline:
        nodes = _tpu_nodes(sim)
        if (
            {n["ip"] for n in nodes} == ips
            and len(nodes) == len(ips)
            and not (avoid or set()) & {n["id"] for n in nodes}
        ):
            return nodes
        time.sleep(2)
    raise AssertionError(f"expected nodes {sorted(ips)}, saw {[(n['ip'], n['id'][:8]) for n in nodes]}")


def _nothing_left(sim: Simulation) -> None:
    """`destroy` (what `rayslice local down` runs) leaves no namespace, process or state behind."""
    sim.destroy()
    assert not (sim.state_dir / STATE_FILE).exists()
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not any(host.netns in namespaces for host in sim.plan.hosts)


@pytest.fixture(scope="module")
def slice16(tmp_path_factory) -> Iterator[Simulation]:
    sim = Simulation.create(
        _spec(), tmp_path_factory.mktemp("faults") / "sim", metadata_unavailable_for=8, insecure=True
    )
    try:
        yield sim
    finally:
        if (sim.state_dir / STATE_FILE).exists():
            sim.destroy()


def test_workers_first_a_late_head_and_a_host_that_never_boots(slice16):
    sim = slice16
    head = sim.plan.head.name
    workers = [h.name for h in sim.plan.hosts if h.name != head]
    missing, booted = workers[-1], workers[:-1]
    for name in booted:
        sim.boot(name)
    sim.wait_for(lambda s: all(s[w] == "waiting: head" for w in booted), timeout=300)
    for name in booted:  # they booted while metadata answered 503
        assert '" 503 ' in sim.paths(name).metadata_log.read_text(), name
    time.sleep(20)
    assert all(sim.states()[w] == "waiting: head" for w in booted)
    assert all(sim.script_exit(w) == 0 for w in booted)  # boot done; the supervisor waits

    sim.boot(head)
    sim.wait_for(lambda s: all(s[h] == names.STATE_JOINED for h in [head, *booted]), timeout=300)
    _wait_nodes(sim, {sim.plan.host(h).ip for h in [head, *booted]}, timeout=120)
    states = sim.states()
    assert states[missing] == "" and not sim.running(missing)

    sim.boot(missing)
    sim.wait_for(lambda s: all(v == names.STATE_JOINED for v in s.values()), timeout=300)
    _wait_nodes(sim, {h.ip for h in sim.plan.hosts}, timeout=120)


def test_head_restart_every_worker_rejoins(slice16):
    sim = slice16
    before = {n["id"] for n in _tpu_nodes(sim)}
    assert sim.restart_head_ray().returncode == 0
    _wait_nodes(sim, {h.ip for h in sim.plan.hosts}, timeout=300, avoid=before)


def test_every_host_rebooted_at_once(slice16):
    sim = slice16
    before = {n["id"] for n in _tpu_nodes(sim)}
    for host in sim.plan.hosts:
        sim.power_off(host.name)
    for host in sim.plan.hosts:
        sim.boot(host.name)
    _wait_nodes(sim, {h.ip for h in sim.plan.hosts}, timeout=300, avoid=before)
    _nothing_left(sim)


def test_metadata_that_never_answers_ends_in_a_failure_and_nothing_running(simulation_dir):
    sim = Simulation.create(
        _spec(acceleratorType="v6e-4"), simulation_dir, metadata_silent_for=1e6, insecure=True
    )
    [host] = [h.name for h in sim.plan.hosts]
    sim.boot(host, env={"RAYSLICE_METADATA_DEADLINE_S": "6"})
    states = sim.wait_for(lambda s: s[host].startswith(names.STATE_FAILED_PREFIX), timeout=120)
    assert states[host] == "failed: startup-script exited 1"
    log = (sim.paths(host).root / "var/log/rayslice/boot.log").read_text()
    assert "failed: could not read the host identity from metadata" in log
    assert "supervisor" not in log
