"""Fault figures on a simulated slice: each scenario ends with every host joined, or with a named
failure state and nothing left behind. docs/faults.md shows `SCENARIOS` (section "simulator").

The hosts run the real rendered boot script and real Ray. One TPU-VM v6e-16 (4 hosts), whose
metadata servers answer 503 for their first 8 s, goes through the scenarios in order: workers
first while the head stays away and one host never boots, then a head restart, then every host
rebooted at once, then its removal. Between the head restart and the reboot, while every host is
joined, the two scripts of Ray's documentation that need a v6e-16 run on it (the JaxTrainer
example and the subslice placement, tests/integration/ray_scripts.py). Faults the
simulator cannot make (Secret Manager, a failing install) are covered by
tests/startup_scripts/test_boot_sandbox.py; installing from a wheelhouse by test_boot_script.py.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

from rayslice import names
from rayslice import spec as spec_module
from rayslice.local.simulation.simulator import Simulation
from rayslice.local.simulation.state import STATE_FILE
from tests.integration import ray_scripts
from tests.integration.clusters import (
    SHORT_WAITS,
    boot,
    raylet_environment,
    rayslice_run,
    tpu_nodes,
    wait_nodes,
)
from tests.startup_scripts.faults import Fault, FaultTable

HEAD_AWAY_S = 10
SCENARIOS = {
    "metadata_503": Fault(
        "metadata servers answer 503 for the first 8 s",
        "boot retries with backoff; every host **joined**",
    ),
    "workers_first": Fault("workers boot before the head", "every host **joined** once the head came up"),
    "head_never": Fault(
        f"the head has not appeared for {HEAD_AWAY_S} s",
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
    return spec_module.load({"acceleratorType": "v6e-16", "platform": "tpu-vm", **raw}, require_zone=False)


def _ips(sim: Simulation, hosts: list[str] | None = None) -> list[str]:
    return [sim.plan.host(h).ip for h in hosts] if hosts is not None else [h.ip for h in sim.plan.hosts]


def _nothing_left(sim: Simulation) -> None:
    """`destroy` (what `rayslice local down` runs) leaves no namespace, process or state behind."""
    sim.destroy()
    assert not (sim.state_dir / STATE_FILE).exists()
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not any(host.netns in namespaces for host in sim.plan.hosts)


@pytest.fixture(scope="module")
def slice16(tmp_path_factory) -> Iterator[Simulation]:
    sim = Simulation.create(_spec(), tmp_path_factory.mktemp("faults") / "sim", metadata_unavailable_for=8)
    try:
        yield sim
    finally:
        if (sim.state_dir / STATE_FILE).exists():
            sim.destroy()


def test_workers_first_a_late_head_and_a_host_that_never_boots(slice16):
    sim = slice16
    spec = sim.spec()
    head = sim.plan.head.name
    workers = [h.name for h in sim.plan.hosts if h.name != head]
    missing, booted = workers[-1], workers[:-1]
    boot(sim, booted)
    sim.wait_for(lambda s: all(s[w] == "waiting: head" for w in booted), timeout=300)
    for name in booted:  # they booted while metadata answered 503
        assert '" 503 ' in sim.paths(name).metadata_log.read_text(), name
    # The head stays away: the workers wait, with no deadline, their boot done, the supervisor running.
    away = time.monotonic() + HEAD_AWAY_S
    while time.monotonic() < away:
        states = sim.states()
        assert all(states[w] == "waiting: head" for w in booted), states
        assert all(sim.script_exit(w) == 0 and sim.running(w) for w in booted)
        time.sleep(1)

    boot(sim, [head])
    sim.wait_for(lambda s: all(s[h] == names.STATE_JOINED for h in [head, *booted]), timeout=300)
    wait_nodes(sim, _ips(sim, [head, *booted]), timeout=120)
    states = sim.states()
    assert states[missing] == "" and not sim.running(missing)

    boot(sim, [missing])
    sim.wait_for(lambda s: all(v == names.STATE_JOINED for v in s.values()), timeout=300)
    nodes = wait_nodes(sim, _ips(sim), timeout=120)
    # One Ray cluster over the slice, as the catalog describes it: every chip, the slice's head
    # resource once, every node in the slice.
    assert sum(n["resources"]["TPU"] for n in nodes) == spec.tpu.chips
    assert sum(n["resources"].get(f"TPU-{spec.accelerator_type}-head", 0) for n in nodes) == 1
    assert all(n["resources"].get(spec.slice_name(0)) == 1 for n in nodes)
    assert all(sim.script_exit(h.name) == 0 for h in sim.plan.hosts)


def test_head_restart_every_worker_rejoins(slice16):
    sim = slice16
    for host in sim.plan.hosts:  # the tests' short Ray timeouts reach Ray, as the hosts booted it
        environment = raylet_environment(sim, host.name)
        assert {k: environment.get(k) for k in SHORT_WAITS if k.startswith("RAY_")} == {
            k: v for k, v in SHORT_WAITS.items() if k.startswith("RAY_")
        }
    before = {n["id"] for n in tpu_nodes(sim)}
    assert sim.restart_head_ray().returncode == 0
    wait_nodes(sim, _ips(sim), timeout=300, avoid=before)


def test_ray_docs_jaxtrainer_runs_unchanged_on_a_v6e_16(slice16, tmp_path):
    """Issue 22's acceptance: Ray's `JaxTrainer` example, its values unchanged (`topology="4x4"`,
    `TPU-V6E`, 4 workers), on this module's v6e-16 while every host is joined: every worker sees
    the slice's 16 devices and is one of 4 processes, indexes 0 to 3, and rank 0's checkpoint went
    through `ray.train.report` into the shared storage and back."""
    folder = tmp_path / "docs_jaxtrainer"
    folder.mkdir()
    storage = tempfile.mkdtemp(prefix="ray-train-", dir=slice16.plan.shared_dir)
    script = folder / "docs_jaxtrainer.py"
    script.write_text(f"STORAGE_PATH = {storage!r}\n{ray_scripts.JAXTRAINER}")
    try:
        result = rayslice_run(slice16, str(script))
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    assert result.returncode == 0
    [workers] = re.findall(r"^JAXTRAINER (.+)$", result.stdout, re.M)
    assert sorted(map(tuple, json.loads(workers))) == [(i, 16, 4) for i in range(4)]
    [saved] = re.findall(r"^CHECKPOINT (.+)$", result.stdout, re.M)
    assert json.loads(saved) == {"workers": json.loads(workers)}


def test_a_subslice_placement_group_script_runs_unmodified_on_a_v6e_16(slice16, tmp_path):
    """Ray's SubslicePlacementGroup reserves a full slice, asks libtpu on every host for its chips'
    coordinates (the simulated libtpu.sdk.slice) and places a 2x4 subslice on two hosts that are
    neighbours in the slice's 2x2 grid of hosts. It runs on this module's v6e-16 once every host
    rejoined after the head restart: the suite's one slice of four hosts, which the subslice needs
    (the shared multislice cluster's slices have two)."""
    cluster = slice16
    folder = tmp_path / "subslice"
    folder.mkdir()
    (folder / "subslice.py").write_text(ray_scripts.SUBSLICE)
    result = rayslice_run(cluster, str(folder / "subslice.py"))
    assert result.returncode == 0, result.stderr[-3000:]
    [line] = [line for line in result.stdout.splitlines() if line.startswith("SUBSLICE ")]
    parent, sub, hosts, slice_name, names = line.split(" ", 5)[1:]
    assert (parent, sub, hosts) == ("4x4", "2x4", "2")
    assert all(n.startswith(f"{slice_name}-w") for n in ast.literal_eval(names)), names
    # The grid is Google's numbering of the hosts (their TPU worker ids), not their names' (on
    # Compute Engine the twin numbers a MIG's hosts in the order Pulumi created them).
    worker_of = {h.name: h.worker for h in cluster.plan.hosts}
    workers = sorted(worker_of[n] for n in ast.literal_eval(names))
    assert workers in ([0, 1], [2, 3], [0, 2], [1, 3]), workers  # a row or a column of the grid


def test_every_host_rebooted_at_once(slice16):
    sim = slice16
    before = {n["id"] for n in tpu_nodes(sim)}
    for host in sim.plan.hosts:
        sim.power_off(host.name)
    boot(sim)
    wait_nodes(sim, _ips(sim), timeout=300, avoid=before)
    sim.wait_for(lambda s: all(sim.script_exit(h) == 0 for h in s), timeout=60)
    for host in sim.plan.hosts:  # one Ray service per boot, one node per host
        log = (sim.paths(host.name).root / "var/log/rayslice/boot.log").read_text()
        assert log.count("rayslice-ray (process) started") == 2, host.name
    _nothing_left(sim)


def test_metadata_that_never_answers_ends_in_a_failure_and_nothing_running(simulation_dir):
    sim = Simulation.create(
        _spec(acceleratorType="v6e-4", rayAuth="none"), simulation_dir, metadata_silent_for=1e6, insecure=True
    )
    [host] = [h.name for h in sim.plan.hosts]
    sim.boot(host, env={"RAYSLICE_METADATA_DEADLINE_S": "6"})
    states = sim.wait_for(lambda s: s[host].startswith(names.STATE_FAILED_PREFIX), timeout=120)
    assert states[host] == "failed: startup-script exited 1"
    log = (sim.paths(host).root / "var/log/rayslice/boot.log").read_text()
    assert "failed: could not read the host identity from metadata" in log
    assert "supervisor" not in log
