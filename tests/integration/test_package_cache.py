"""The head's package cache, on a slice whose hosts install from the simulated internet's index.

One two-host slice proves the three points in turn (each reinstall is a host made new: venv and
uv's cache removed): at the cold boot the worker fetches nothing from the index, since it
installs through the head's cache; with the index unreachable, a new host installs from the
warm cache and joins; with the cache stopped, a new host installs from the index itself and
joins. The link is fast here: the benchmark (bench/bringup.py --internet) measures slow ones.
"""

from __future__ import annotations

import shutil

from rayslice import spec as spec_module
from rayslice.local.simulation.internet import Link, SimulatedInternet, index_url
from rayslice.local.simulation.simulator import INDEX_SOURCE, Simulation
from tests.integration.clusters import SHORT_WAITS, boot, tpu_nodes, wait_nodes

FAST = Link(rate_mbit=4000, latency_ms=0)


def _log(sim: Simulation, host: str) -> str:
    return (sim.paths(host).root / "var/log/rayslice/boot.log").read_text()


def _reinstall(sim: Simulation, name: str, **env: str) -> None:
    """Boot `name` again as a new host would: no venv and nothing in uv's cache."""
    sim.power_off(name)
    root = sim.paths(name).root
    shutil.rmtree(root / "opt/rayslice/venv")
    shutil.rmtree(root / "root/.cache/uv", ignore_errors=True)
    sim.boot(name, env={**SHORT_WAITS, **env})


def test_hosts_install_through_the_cache_and_without_the_cache_or_the_index(
    simulation_dir, wheelhouse, tmp_path
):
    spec = spec_module.load(
        {
            "acceleratorType": "v4-16",
            "rayAuth": "none",
            "packageIndex": index_url(),
            "allowInsecurePackageIndex": "true",
        },
        require_zone=False,
    )
    sim = Simulation.create(spec, simulation_dir, package_source=INDEX_SOURCE, insecure=True)
    head = sim.plan.head
    [worker] = [h for h in sim.plan.hosts if h != head]
    (tmp_path / "internet").mkdir()
    with SimulatedInternet(sim, wheelhouse, FAST, tmp_path / "internet") as internet:
        boot(sim)
        wait_nodes(sim, [head.ip, worker.ip], timeout=600)
        cold = internet.fetched()
        assert cold[worker.name] == 0, cold
        assert cold[head.name] > 100e6, cold  # jax, libtpu and Ray, fetched once by the cache
        assert f"installing through the package cache at http://{head.ip}:" in _log(sim, worker.name)

        def worker_id() -> str:
            return next(n["id"] for n in tpu_nodes(sim) if n["ip"] == worker.ip)

        internet.set_reachable(False)
        before = worker_id()
        _reinstall(sim, worker.name)
        wait_nodes(sim, [head.ip, worker.ip], timeout=300, avoid=[before])
        assert internet.fetched() == cold
        assert _log(sim, worker.name).count("installing through the package cache") == 2
        internet.set_reachable(True)

        pidfile = f"{sim.plan.root}/var/lib/rayslice/rayslice-cache.pid"
        stopped = sim.exec_in(head.name, ["bash", "-c", f'kill -TERM -- "-$(cat {pidfile})"'])
        assert stopped.returncode == 0, stopped.stderr
        before = worker_id()
        _reinstall(sim, worker.name, RAYSLICE_CACHE_WAIT_S="3")
        wait_nodes(sim, [head.ip, worker.ip], timeout=300, avoid=[before])
        fetched = internet.fetched()
        assert fetched[head.name] == cold[head.name]
        # All of the set but uv (still installed) and the cache's own packages, from the index.
        assert fetched[worker.name] > 0.8 * cold[head.name], fetched
        assert "did not answer within 3s: installing from the index" in _log(sim, worker.name)
