"""Issue 24's flex-start path on the simulator: an elastic cluster of 0 to 1 flex-start v6e-4
slice (one host, the smallest shape) in a zone with no capacity, deployed through the cloud twin.

A job asks for a slice with `slice_placement_group`. The controller makes the slice's resize
request, which waits; `rayslice status` shows it waiting. `rayslice local capacity` gives the zone
a host: the MIG creates and names it, it boots and joins, and the job runs on it. Once the slice
has been idle for idleTimeoutSeconds, its host and its request are gone (docs/elastic.md).
"""

from __future__ import annotations

import threading
from pathlib import Path

from rayslice import spec
from rayslice.cli import load_spec
from rayslice.local.simulation.cloud_bridge import cloud_access, cloud_config, request_capacity
from rayslice.local.simulation.simulator import Simulation
from rayslice.recovery.commands import client_for, gather, render_text
from tests.integration.clusters import bring_up
from tests.integration.test_elastic import EXAMPLE, IDLE_S, JOB, _events, _run, _wait_for


def test_an_elastic_flex_start_slice_waits_for_capacity_runs_the_job_and_goes_with_its_request(
    simulation_dir: Path, tmp_path: Path
) -> None:
    # The elastic example without its price ceiling (no flex-start list price is published).
    stack = tmp_path / "Pulumi.elastic-flex.yaml"
    lines = Path(EXAMPLE).read_text().splitlines()
    stack.write_text("\n".join(line for line in lines if "maxUsdPerHour" not in line) + "\n")
    overrides = [
        "acceleratorType=v6e-4",
        "slices=1",
        "capacity=flex-start",
        "zone=us-east5-a",  # a zone that takes v6e flex-start (catalog.FLEX_START_ZONES)
        "maxRunHours=1",
        f"idleTimeoutSeconds={IDLE_S}",
    ]
    cluster = load_spec(str(stack), overrides, require_zone=False)
    sim = Simulation.create(cluster, simulation_dir, zone_capacity=0)
    assert [h.slice_index for h in sim.plan.hosts] == [-1]  # the head VM alone: no TPU host yet
    bring_up(sim)
    spec_run = spec.load(cloud_config(sim.spec()), require_zone=False)  # with the emulation's project
    client = client_for(spec_run, cloud_access(sim.state_dir))
    slice_name = cluster.slice_name(0)
    job = tmp_path / "elastic_job.py"
    job.write_text(JOB)

    ran: list[list[str]] = []
    runner = threading.Thread(target=lambda: ran.append(_run(sim, job, slices=1, hold=1)))
    runner.start()
    try:
        # The controller asks for the slice; the request waits, and status says so.
        _wait_for(lambda: (slice_name, "add slice") in _events(client, spec_run), 300, "the slice's request")
        [waiting] = gather(client, spec_run)["slices"]
        assert waiting["state"] == "REQUEST ACCEPTED" and waiting["hosts"] == []
        assert "waits for capacity" in render_text(gather(client, spec_run))
        answer = request_capacity(sim.state_dir, 1, None, None)
        assert answer["waiting"] == []
    finally:
        runner.join(timeout=900)
    [[host]] = ran  # the host the MIG named ran the job
    assert host.startswith(f"{slice_name}-") and len(host) == len(slice_name) + 5
    assert _events(client, spec_run).count((slice_name, "add slice")) == 1

    # Idle once the job is over: the host is deleted and the request with it.
    _wait_for(lambda: (slice_name, "remove slice") in _events(client, spec_run), 180, "the slice's removal")
    _wait_for(lambda: not Simulation.open(simulation_dir).running(host), 60, "its host to power off")
    [gone] = gather(client, spec_run)["slices"]
    assert gone["hosts"] == [] and gone["request"] is None
