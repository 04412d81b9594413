"""Issue 24's acceptance on the simulator: an elastic cluster of 0 to 2 v6e-4 slices (one host of
4 chips each, the smallest shape), a CPU head VM and the controller VM, deployed through the
cloud twin like any other.

Jobs submitted with `rayslice run`, as a user would, ask for slices the way Ray does: a job with
`ray.util.tpu.slice_placement_group` (a pending placement group), then the bundled JaxTrainer
run, which Ray Train's elastic scaling makes ask with `request_resources`. The head publishes
Ray's demand; the controller reads it through the emulated Compute API and adds whole slices,
whose hosts boot and join; the job runs; the slice is removed once it has been idle for
idleTimeoutSeconds, never while the job holds it; the trainer asking for 2 to 3 slices gets two,
under the same names, and the third waits on `slices`. `rayslice status` lists every add,
removal and wait (docs/elastic.md).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from rayslice import spec
from rayslice.cli import load_spec
from rayslice.local.simulation.cloud_bridge import cloud_access, cloud_config
from rayslice.local.simulation.simulator import Simulation
from rayslice.recovery.commands import client_for, gather, render_text
from tests.integration.clusters import bring_up, rayslice_run

EXAMPLE = "infra/Pulumi.example-compute-elastic-v6e-16.yaml"
IDLE_S = 8
# A job that reserves `slices` whole v6e-4 slices, runs a task on the TPU host of each, holds
# them `hold` seconds (past the idle time), then checks they are all still there.
JOB = """
import json, socket, sys, time

import ray
from ray.util.tpu import slice_placement_group

slices, hold, wait_s = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
ray.init()
# A v6e-4 slice is one host: Ray reserves no slice head for it (ray/util/tpu.py skips the head
# when the topology fits one host), so the slices are the group's bundles, one per slice.
group = slice_placement_group(topology="2x2", accelerator_version="v6e", num_slices=slices)
try:
    ray.get(group.placement_group.ready(), timeout=wait_s)
except ray.exceptions.GetTimeoutError:
    print("REFUSED", flush=True)
    group.shutdown()
    sys.exit(0)


@ray.remote(num_cpus=0, resources={"TPU": 4})
def host():
    return socket.gethostname()


def on_each():
    pg = group.placement_group
    return ray.get(
        [host.options(placement_group=pg, placement_group_bundle_index=i).remote() for i in range(slices)],
        timeout=60,
    )


print("RAN " + json.dumps(on_each()), flush=True)
time.sleep(hold)
print("STILL " + json.dumps(on_each()), flush=True)
group.shutdown()
"""


def _events(client: Any, cluster: spec.ClusterSpec) -> list[tuple[str, str]]:
    return [(e["slice"], e["action"]) for e in gather(client, cluster)["events"]]


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(1)


def _submit(sim: Simulation, *argv: str, timeout: float) -> subprocess.CompletedProcess:
    """`rayslice_run`, and on a timeout everything that says why: the job's output so far, the
    controller's events and each machine's state and logs."""
    try:
        return rayslice_run(sim, *argv, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        spec_run = spec.load(cloud_config(sim.spec()), require_zone=False)
        status = render_text(gather(client_for(spec_run, cloud_access(sim.state_dir)), spec_run))
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else str(exc.stdout)
        raise AssertionError(
            f"rayslice run {argv[0]} ran past {timeout:.0f}s; its output:\n{out[-4000:]}\n"
            f"status:\n{status}\n{sim.report()}"
        ) from None


def _run(sim: Simulation, job: Path, slices: int, hold: float, wait_s: float = 300) -> list[str]:
    """The hosts the job ran on; [] when its slices were not all there within `wait_s`."""
    result = _submit(sim, str(job), str(slices), str(hold), str(wait_s), timeout=wait_s + hold + 120)
    assert result.returncode == 0, sim.report()
    if re.search(r"^REFUSED$", result.stdout, re.M):
        return []
    [ran] = re.findall(r"^RAN (.+)$", result.stdout, re.M)
    [still] = re.findall(r"^STILL (.+)$", result.stdout, re.M)
    assert json.loads(still) == json.loads(ran)  # held past the idle time: never removed meanwhile
    return list(json.loads(ran))


def test_an_elastic_cluster_adds_whole_slices_for_ray_jobs_and_removes_idle_ones(
    simulation_dir: Path, tmp_path: Path
) -> None:
    overrides = ["acceleratorType=v6e-4", f"idleTimeoutSeconds={IDLE_S}"]
    cluster = load_spec(EXAMPLE, overrides, require_zone=False)
    sim = Simulation.create(cluster, simulation_dir)
    assert [h.slice_index for h in sim.plan.hosts] == [-1]  # the head VM alone: no TPU host yet
    bring_up(sim)
    spec_run = spec.load(cloud_config(sim.spec()), require_zone=False)  # with the emulation's project
    client = client_for(spec_run, cloud_access(sim.state_dir))
    first, second = cluster.slice_name(0), cluster.slice_name(1)
    job = tmp_path / "elastic_job.py"
    job.write_text(JOB)

    # One slice asked for: exactly one slice appears, its host joins, the job runs on it and
    # keeps it past the idle time.
    [ran_on] = _run(sim, job, slices=1, hold=IDLE_S + 6)
    assert ran_on == f"{first}-w0"
    assert _events(client, spec_run).count((first, "add slice")) == 1
    assert (second, "add slice") not in _events(client, spec_run)

    # Idle once the job is over: removed, and status says both.
    _wait_for(lambda: (first, "remove slice") in _events(client, spec_run), 180, "the idle slice's removal")
    _wait_for(lambda: not Simulation.open(simulation_dir).running(f"{first}-w0"), 60, "its host to power off")
    text = render_text(gather(client, spec_run))
    assert "add slice" in text and "remove slice" in text

    # Ray Train's elastic JaxTrainer asks for its workers with request_resources (no placement
    # group until they fit), here 2 to 3 slices of the type the cluster has none of now: the
    # controller adds both slices it may have, the first again under its own name, and records
    # that the third waits on `slices`; the run starts on both (8 devices) and ends.
    storage = Path(tempfile.mkdtemp(prefix="trainer-", dir=sim.plan.shared_dir))
    try:
        trained = _submit(
            sim,
            "jax_trainer",
            *("--accelerator-type", "v6e-4", "--min-slices", "2", "--max-slices", "3"),
            *("--steps", "3", "--checkpoint-every", "3", "--storage-path", str(storage)),
            timeout=420,
        )
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    assert trained.returncode == 0, sim.report()
    assert "no complete v6e-4 slice yet: asking Ray for 3" in trained.stdout
    assert re.search(r"workers 2, devices 8, from step 0$", trained.stdout, re.M)
    assert re.search(r"^finished at step 3, .* on 2 workers", trained.stdout, re.M)
    events = _events(client, spec_run)
    assert events.count((first, "add slice")) == 2 and events.count((second, "add slice")) == 1
    assert "wait -> 1 more slice(s) wanted; slices=2 reached" in render_text(gather(client, spec_run))
    # The run over, Ray Train withdrew its request_resources: both slices go once idle.
    _wait_for(
        lambda: (
            _events(client, spec_run).count((first, "remove slice")) == 2
            and (second, "remove slice") in _events(client, spec_run)
        ),
        180,
        "both slices' removal once the trainer's request is withdrawn",
    )
