"""The real boot script on simulated hosts: installing from a wheelhouse and reusing the install
at the next boot, and refusing a script rendered for another slice type.

Every host runs the byte-identical output of `render()`; the only simulator knobs are the
rendered ones (process supervisor, package source, root). Ordering, reboots, a head restart and
the other failures on a multi-host slice are test_faults.py's. One host proves each point here.
"""

from __future__ import annotations

import time

from rayslice import spec as spec_module
from rayslice.local.simulation.simulator import Simulation, default_package_source
from rayslice.startup_scripts import RenderOptions, render
from rayslice.startup_scripts.variables import preset_lock
from tests.integration.clusters import boot, wait_nodes


def _spec(**raw: object) -> spec_module.ClusterSpec:
    return spec_module.load({"acceleratorType": "v6e-4", "rayAuth": "none", **raw}, require_zone=False)


def _log(sim: Simulation, host: str) -> str:
    return (sim.paths(host).root / "var/log/rayslice/boot.log").read_text()


def test_install_from_a_wheelhouse_reuse_on_reboot_and_an_image_of_it_skips_the_install(
    simulation_dir, wheelhouse, tmp_path
):
    """One cold install proves three points: the first boot installs the preset's lock from the
    wheelhouse; a reboot reuses it; and the simulator's host image (`images`) made of that host
    (the builder) starts a new simulation's host, whose spec names the image, with the venv in
    place, so its first boot skips the install."""
    source = f"wheels:{wheelhouse}"
    sim = Simulation.create(_spec(), simulation_dir, package_source=source, insecure=True)
    [host] = sim.plan.hosts
    chips = sim.spec().tpu.chips_per_host
    boot(sim)
    sim.wait_for(lambda s: s[host.name] == "joined", timeout=600)
    log = _log(sim, host.name)
    lock = preset_lock(sim.spec())
    assert lock is not None  # the jax preset's lock, installed hash-checked from the wheelhouse
    installing = f"installing the lock {lock.digest} into"
    assert installing in log and "installing uv" in log
    venv_ray = sim.paths(host.name).root / "opt/rayslice/venv/bin/ray"
    assert venv_ray.exists()
    [node] = wait_nodes(sim, [host.ip], timeout=60)
    assert node["resources"]["TPU"] == chips

    sim.power_off(host.name)
    boot(sim)
    deadline = time.monotonic() + 180
    while "requirements unchanged" not in _log(sim, host.name) and time.monotonic() < deadline:
        time.sleep(1)
    log = _log(sim, host.name)
    assert log.count(installing) == 1  # installed at the first boot only
    assert "requirements unchanged" in log
    assert log.count("rayslice-ray (process) started") == 2
    [again] = wait_nodes(sim, [host.ip], timeout=120, avoid=[node["id"]])
    assert again["resources"]["TPU"] == chips

    fingerprint = sim.capture_image(host.name, tmp_path / "image")
    sim.destroy()
    spec = _spec(hostImage=f"rayslice-host-{fingerprint}")
    sim = Simulation.create(
        spec, simulation_dir, package_source=source, insecure=True, host_image=tmp_path / "image"
    )
    [host] = sim.plan.hosts
    boot(sim)
    sim.wait_for(lambda s: s[host.name] == "joined", timeout=120)
    log = _log(sim, host.name)
    assert f"requirements unchanged ({fingerprint}): skipping install" in log
    assert "installing" not in log  # neither uv nor the requirements: the first boot took the fast path
    [node] = wait_nodes(sim, [host.ip], timeout=60)
    assert node["resources"]["TPU"] == spec.tpu.chips_per_host


def test_a_script_rendered_for_another_type_refuses_to_run(simulation_dir):
    spec = _spec(platform="compute")
    other = _spec(platform="compute", acceleratorType="v6e-16")
    sim = Simulation.create(spec, simulation_dir, insecure=True)
    [host] = [h.name for h in sim.plan.hosts]
    script = render(
        other,
        RenderOptions(supervisor="process", package_source=default_package_source(), root=sim.plan.root),
    )
    sim.paths(host).script.write_text(script)
    sim.boot(host)
    states = sim.wait_for(lambda s: s[host].startswith("failed"), timeout=120)
    assert states[host] == (
        f"failed: this script was rendered for {other.accelerator_type} but the host is "
        f"{spec.accelerator_type}; render it for this slice"
    )
