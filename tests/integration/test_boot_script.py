"""The real boot script on simulated hosts: install, reuse, ordering, reboots, failures, rejoin.

Every host runs the byte-identical output of `render()`; the only simulator knobs are the
rendered ones (process supervisor, package source, root). These tests start real Ray nodes.
"""

from __future__ import annotations

import time

import pytest

from rayslice import spec as spec_module
from rayslice.local.simulation.simulator import Simulation, default_package_source
from rayslice.startup_scripts import RenderOptions, render


def _spec(**raw: object) -> spec_module.ClusterSpec:
    return spec_module.load({"acceleratorType": "v6e-16", **raw}, require_zone=False)


def _all(state: str):
    return lambda states: all(s == state for s in states.values())


def _alive_tpu_nodes(sim: Simulation) -> list[dict]:
    return [n for n in sim.ray_nodes() if n["resources"].get("TPU")]


def _wait_nodes(sim: Simulation, count: int, timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    nodes: list[dict] = []
    while time.monotonic() < deadline:
        try:
            nodes = _alive_tpu_nodes(sim)
        except OSError:
            nodes = []
        if len(nodes) == count:
            return nodes
        time.sleep(2)
    raise AssertionError(
        f"expected {count} alive TPU nodes, saw {len(nodes)}: {[n['node_ip'] for n in nodes]}"
    )


def _log(sim: Simulation, host: str) -> str:
    return (sim.paths(host).root / "var/log/rayslice/boot.log").read_text()


@pytest.fixture(scope="module")
def slice16(tmp_path_factory, wheelhouse):
    """One v6e-16 slice that installs from a wheelhouse; its metadata servers answer 503 for 6 s."""
    sim = Simulation.create(
        _spec(),
        tmp_path_factory.mktemp("slice16") / "sim",
        package_source=f"wheels:{wheelhouse}",
        metadata_unavailable_for=6,
    )
    try:
        yield sim
    finally:
        sim.destroy()


def test_workers_booted_before_the_head_join_once_it_appears(slice16):
    sim = slice16
    head = sim.plan.head.name
    workers = [h.name for h in sim.plan.hosts if h.name != head]
    for name in workers:
        sim.boot(name)
    sim.wait_for(lambda s: all(s[w] == "waiting: head" for w in workers), timeout=600)
    sim.boot(head)
    sim.wait_for(_all("joined"), timeout=600)
    nodes = _wait_nodes(sim, 4, timeout=60)
    assert sum(n["resources"]["TPU"] for n in nodes) == 16
    assert sum(n["resources"].get("TPU-v6e-16-head", 0) for n in nodes) == 1
    assert all(n["resources"].get("rayslice-slice-0") == 1 for n in nodes)
    # The workers booted while their metadata servers still answered 503; retries rode it out.
    for name in workers:
        assert '" 503 ' in sim.paths(name).metadata_log.read_text(), name
    assert all(sim.script_exit(h.name) == 0 for h in sim.plan.hosts)


def test_second_boot_takes_the_fast_path_with_one_node_per_host(slice16):
    sim = slice16
    for host in sim.plan.hosts:
        sim.reboot(host.name)
    sim.wait_for(lambda s: all(sim.script_exit(h) == 0 for h in s), timeout=180)
    nodes = _wait_nodes(sim, 4, timeout=180)
    assert sorted(n["ip"] for n in nodes) == sorted(h.ip for h in sim.plan.hosts)
    for host in sim.plan.hosts:
        log = _log(sim, host.name)
        assert log.count("rayslice-ray (process) started") == 2
        # Installed at the first boot only: the reboot found the marker and skipped the install.
        assert log.count("installing jax[tpu]") == 1, host.name
        assert "requirements unchanged" in log, host.name


def test_every_worker_rejoins_after_a_head_restart(slice16):
    sim = slice16
    before = {n["id"] for n in _alive_tpu_nodes(sim)}
    assert sim.restart_head_ray().returncode == 0
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        try:
            nodes = _alive_tpu_nodes(sim)
        except OSError:
            nodes = []
        if len(nodes) == 4 and not before & {n["id"] for n in nodes}:
            break
        time.sleep(3)
    else:
        raise AssertionError(f"workers did not rejoin: {[(n['node_ip'], n['node_id'][:8]) for n in nodes]}")
    assert sorted(n["ip"] for n in nodes) == sorted(h.ip for h in sim.plan.hosts)


def test_a_head_that_never_appears_leaves_workers_waiting_for_it(simulation_dir):
    sim = Simulation.create(_spec(rayAuth="none"), simulation_dir, insecure=True)
    worker = next(h.name for h in sim.plan.hosts if h.name != sim.plan.head.name)
    sim.boot(worker)
    sim.wait_for(lambda s: s[worker] == "waiting: head", timeout=120)
    assert sim.script_exit(worker) == 0  # the boot is done; the supervisor waits, with no deadline
    time.sleep(10)
    assert sim.states()[worker] == "waiting: head"


def test_install_from_a_wheelhouse_then_reuse_on_reboot(simulation_dir, wheelhouse):
    sim = Simulation.create(
        _spec(acceleratorType="v6e-4", rayAuth="none"),
        simulation_dir,
        package_source=f"wheels:{wheelhouse}",
        insecure=True,
    )
    [host] = [h.name for h in sim.plan.hosts]
    sim.boot(host)
    sim.wait_for(_all("joined"), timeout=600)
    log = _log(sim, host)
    assert "installing jax[tpu]" in log and "installing uv" in log
    venv_ray = sim.paths(host).root / "opt/rayslice/venv/bin/ray"
    assert venv_ray.exists()
    assert _wait_nodes(sim, 1, timeout=60)[0]["resources"]["TPU"] == 4

    sim.reboot(host)
    deadline = time.monotonic() + 180
    while "requirements unchanged" not in _log(sim, host) and time.monotonic() < deadline:
        time.sleep(1)
    log = _log(sim, host)
    assert log.count("installing jax[tpu]") == 1
    assert "requirements unchanged" in log
    assert _wait_nodes(sim, 1, timeout=120)[0]["resources"]["TPU"] == 4


def test_a_script_rendered_for_another_type_refuses_to_run(simulation_dir):
    sim = Simulation.create(_spec(rayAuth="none"), simulation_dir, insecure=True)
    head = sim.plan.head.name
    other = render(
        _spec(acceleratorType="v6e-4", rayAuth="none"),
        RenderOptions(supervisor="process", package_source=default_package_source(), root=sim.plan.root),
    )
    sim.paths(head).script.write_text(other)
    sim.boot(head)
    states = sim.wait_for(lambda s: s[head].startswith("failed"), timeout=120)
    assert states[head] == (
        "failed: this script was rendered for v6e-4 (1 hosts) but this slice has 4 hosts; "
        "render it for this slice"
    )
