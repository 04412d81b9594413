"""The controller against what a slice does over time (issue 51's controller part): a slice
partly created by an individual-mode MIG is given up within its cell's bound; a bulk MIG's wait
is read from its bulk instance operation, and its stand-in managed instances are no hosts; an
ended run's MIG is resized to 0, by a restarted controller too; an All Capacity reservation's
slice is moved after a short grace; a TPU node left UNKNOWN is recreated at once; a queued
request is asked again without its old deadline. Each test drives the cloud twin on loopback
with a real client and a real controller, and the clock is the test's own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rayslice import capacity_table as table
from rayslice import cli, names
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.local.google.metadata_server import MetadataServer
from rayslice.recovery import kinds
from rayslice.recovery.cloud import CloudClient
from tests.recovery.conftest import (
    CLUSTER,
    PROJECT,
    ZONE,
    Clock,
    bulk_mig_fields,
    hosts_made,
    make_controller,
    seed,
    seed_flex,
    seed_queued,
)

SLICE1 = names.slice_name(CLUSTER, 1)
KEY = (PROJECT, ZONE, SLICE1)
EXHAUSTED = {
    "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
    "message": "The zone 'us-east5-a' does not have enough resources available to fulfill the request.",
}
MIN = 60.0


def _events(stream: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def _methods(cloud: CloudApiEmulator) -> list[str]:
    return [str(c.method_id).rsplit(".", 1)[-1] for c in cloud.mutations()]


def _not_created(cloud: CloudApiEmulator, *workers: int) -> None:
    """Slice 1's hosts `workers` as an individual-mode MIG shows hosts the zone had no room for:
    managed instances still CREATING, no instance behind them, the last attempt's error (compute
    v1 ManagedInstance.lastAttempt)."""
    for worker in workers:
        record = cloud.state.instances[KEY][worker]
        record.pop("instanceStatus")
        record.update(currentAction="CREATING", lastAttempt={"errors": {"errors": [EXHAUSTED]}})


def test_a_partly_created_slice_is_deleted_after_its_bound_and_asked_again_after_a_back_off(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    """On-demand compute: two of four hosts made, two waiting for the zone. Within the cell's
    bound the controller waits; past it the MIG is deleted at once (the two hosts stop billing),
    and asked again only after the back-off; the event says why, from the last attempt."""
    seed(cloud, "compute")
    _not_created(cloud, 2, 3)
    clock = Clock()
    controller, stream = make_controller(
        client, "compute", controller_metadata, capacity=table.ON_DEMAND, clock=clock
    )
    bound = table.cell(table.COMPUTE, table.ON_DEMAND).whole_within_s
    assert bound is not None
    controller.step()
    clock.now += bound - 1
    controller.step()
    assert _methods(cloud) == [] and _events(stream) == []
    status = kinds.of("compute").status(client, SLICE1, 4, waits=False, cell=controller.target.cell)  # type: ignore[union-attr]
    assert status["meaning"].startswith("partly created: 2 of 4 hosts running"), status
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in status["meaning"]
    clock.now += 2
    controller.step()
    assert _methods(cloud) == ["delete"]
    assert KEY not in cloud.state.migs  # nothing bills while it backs off
    [event] = _events(stream)
    assert event["seen"].startswith(
        "MIG partly created: 2 of 4 hosts running; w2, w3: ZONE_RESOURCE_POOL_EXHAUSTED"
    )
    assert event["outcome"].startswith(f"not whole {bound / MIN:.0f} min after its creation began; deleted")
    assert event["outcome"].endswith("asked again in 10s"), event
    controller.step()  # still backing off
    assert _methods(cloud) == ["delete"]
    clock.now += 10
    controller.step()
    assert _methods(cloud) == ["delete", "insert", "createInstances"]
    assert len([h for h in cloud.state.hosts() if h.group == SLICE1]) == 4


def test_a_partly_created_slice_given_up_again_backs_off_longer(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    """Spot compute: the zone still lacks hosts after the slice is asked again; the second
    give-up waits twice as long (the count resets only once the slice is seen whole)."""
    seed(cloud, "compute")
    _not_created(cloud, 3)
    clock = Clock()
    controller, stream = make_controller(
        client, "compute", controller_metadata, capacity=table.SPOT, clock=clock
    )
    bound = float(table.WHOLE_WITHIN_S)
    controller.step()
    clock.now += bound
    controller.step()  # given up: deleted
    clock.now += 10
    controller.step()  # asked again; the twin makes it, and the zone again lacks one host
    _not_created(cloud, 3)
    controller.step()
    clock.now += bound
    controller.step()
    outcomes = [
        e["outcome"] for e in _events(stream) if e["action"] == "recreate" and "deleted" in e["outcome"]
    ]
    assert [o.rsplit(" ", 1)[-1] for o in outcomes] == ["10s", "20s"], outcomes


def test_a_bulk_wait_is_read_from_its_bulk_operation_and_its_stand_ins_are_no_hosts(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    """A flex-start bulk MIG waiting for capacity lists managed instances for the hosts to come
    (no instanceStatus) and says why in status.bulkInstanceOperation.lastProgressCheck: status
    shows a wait with Google's reason, elastic scaling counts no host, and nothing is sent."""
    seed_flex(cloud)
    for record in cloud.state.instances[KEY]:
        record.pop("instanceStatus")
        record["currentAction"] = "CREATING"
    cloud.state.migs[KEY]["status"] = {
        "bulkInstanceOperation": {
            "inProgress": True,
            "lastProgressCheck": {
                "timestamp": "2026-12-07T19:00:00Z",
                "error": {"errors": [{**EXHAUSTED, "code": "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"}]},
            },
        }
    }
    kind = kinds.of("compute")
    assert kind is not None
    cell = table.cell(table.COMPUTE, table.FLEX_START)
    shown = kind.status(client, SLICE1, 4, waits=True, cell=cell)
    assert shown["state"] == "REQUEST WAITING_FOR_RESOURCES", shown
    assert shown["meaning"].startswith(
        "waiting for capacity for all 4 hosts: ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"
    )
    assert shown["request"]["reason"].startswith("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS")
    assert kind.hosts_held(client, SLICE1) == (4, 0)
    controller, stream = make_controller(client, "compute", controller_metadata, capacity=table.FLEX_START)
    controller.step()
    controller.step()
    assert _methods(cloud) == [] and _events(stream) == []


def test_a_restarted_controller_ends_a_run_whose_mig_waits_to_make_its_hosts_again(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer, tmp_path: Path
) -> None:
    """The run ends while no controller runs: the hosts are deleted and the MIG, keeping its
    target size, waits to make them again (a second paid run). The controller that comes back
    knows from its journal that the slice was whole, so it reads an end, not a first wait: it
    resizes the MIG to 0 and records that the slice ended; status says so."""
    seed_flex(cloud)
    state = tmp_path / "state"
    first, _ = make_controller(
        client, "compute", controller_metadata, capacity=table.FLEX_START, state_dir=state
    )
    first.step()  # whole
    for record in list(cloud.state.instances[KEY]):
        cloud.state.lose(cloud.state.vms[(PROJECT, ZONE, record["name"])], deleted=True)
    cloud.state.instances[KEY] = [{"name": f"{SLICE1}-p{i}", "currentAction": "CREATING"} for i in range(4)]
    cloud.state.migs[KEY]["status"] = {"bulkInstanceOperation": {"inProgress": True}}
    fresh, stream = make_controller(
        client, "compute", controller_metadata, capacity=table.FLEX_START, state_dir=state
    )
    fresh.step()
    fresh.step()
    assert _methods(cloud) == ["resize"]
    assert cloud.state.migs[KEY]["targetSize"] == 0
    [event] = _events(stream)
    assert event["outcome"].startswith("ended: not requested again") and "resized to 0" in event["outcome"]
    kind = kinds.of("compute")
    assert kind is not None
    shown = kind.status(client, SLICE1, 4, waits=True, cell=fresh.target.cell)
    assert shown["state"] == "EMPTY" and "capacity ended" in shown["meaning"], shown


@pytest.mark.parametrize(
    "capacity, recreated", [(table.RESERVED_ALL_CAPACITY, True), (table.RESERVED, False)]
)
def test_an_all_capacity_slice_is_left_for_its_short_grace_then_recreated(
    cloud: CloudApiEmulator,
    client: CloudClient,
    controller_metadata: MetadataServer,
    capacity: str,
    recreated: bool,
) -> None:
    """All Capacity mode: Google repairs a host in place and never moves the slice. The
    controller waits the cell's short grace, then recreates the slice in the reservation (one
    bulk createInstances); a managed reservation's slice is still left to Google then."""
    grace = table.ALL_CAPACITY_GRACE_S
    seed(cloud, "compute", fields=bulk_mig_fields)
    clock = Clock()
    controller, stream = make_controller(
        client, "compute", controller_metadata, capacity=capacity, clock=clock
    )
    controller.step()
    cloud.state.host_error(PROJECT, ZONE, SLICE1, repair=False)
    controller.step()
    assert _methods(cloud) == []
    kind = kinds.of("compute")
    assert kind is not None
    shown = kind.status(client, SLICE1, 4, waits=False, cell=controller.target.cell)
    assert ("in place" in shown["meaning"]) is recreated and "repair" in shown["meaning"], shown
    clock.now += grace
    controller.step()
    assert ("insert" in _methods(cloud)) is recreated, _methods(cloud)
    if recreated:
        assert _events(stream)[-1]["outcome"].startswith(f"not recovered after {grace / MIN:.0f} min")


def test_a_tpu_node_unknown_after_a_failed_repair_is_recreated_at_once(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    """On-demand tpu-vm waits for the Cloud TPU service's repair of a TERMINATED node; a node
    UNKNOWN after a failed repair has nothing left to wait for."""
    seed(cloud, "tpu-vm")
    controller, stream = make_controller(client, "tpu-vm", controller_metadata, capacity=table.ON_DEMAND)
    controller.step()
    cloud.state.nodes[KEY]["state"] = "UNKNOWN"
    controller.step()
    assert "create" in _methods(cloud), _methods(cloud)
    [event] = _events(stream)
    assert event["seen"] == "node state UNKNOWN" and event["action"] == "recreate"


def test_a_queued_request_is_asked_again_without_its_old_deadline(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    """A Spot queued slice whose node was deleted (SUSPENDED) is asked again; the new request
    carries the tier and node but not queueingPolicy, which may come back as an absolute time
    already past."""
    seed_queued(cloud, spot={}, queueingPolicy={"validUntilDuration": "3600s"})
    controller, _ = make_controller(client, "tpu-vm", controller_metadata, capacity=table.SPOT)
    controller.step()
    cloud.state.end_run(PROJECT, ZONE, names.request_name(SLICE1))
    controller.step()
    [create] = [c for c in cloud.mutations() if str(c.method_id).endswith("queuedResources.create")]
    assert "spot" in create.request and "queueingPolicy" not in create.request, create.request


def test_status_says_partly_created_and_preempted_in_words(
    cloud: CloudApiEmulator,
    client: CloudClient,
    controller_metadata: MetadataServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`rayslice status` (text) beside Google's states: slice 0 preempted, slice 1 partly
    created with the reason its missing hosts' last attempt gives."""
    seed(cloud, "compute")
    cloud.preempt(PROJECT, ZONE, names.slice_name(CLUSTER, 0), mode="terminated")
    _not_created(cloud, 3)
    capsys.readouterr()
    args = ["--set", f"project={PROJECT}", "--set", f"zone={ZONE}", "--set", "capacity=spot"]
    assert cli.main(["status", *args, "--set", "slices=2", "--set", "platform=compute"]) == 0
    lines = capsys.readouterr().out.splitlines()
    [first] = [line for line in lines if line.startswith(f"slice {names.slice_name(CLUSTER, 0)}:")]
    [second] = [line for line in lines if line.startswith(f"slice {SLICE1}:")]
    assert "preempted: Google took back 4 host(s)" in first, first
    assert "partly created: 3 of 4 hosts running; the rest: ZONE_RESOURCE_POOL_EXHAUSTED" in second, second


class TwinClock(Clock):
    """The controller's clock read from the twin's, so that the two agree on how long passed."""

    def __init__(self, cloud: CloudApiEmulator) -> None:
        self.cloud = cloud

    @property  # type: ignore[override]
    def now(self) -> float:
        return self.cloud.state.clock.now


def test_a_slice_the_twin_creates_partly_bills_at_most_its_bound_of_wasted_host_hours(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    """Driven through the twin's clock: a Spot slice gone, recreated into a zone that has two of
    its four hosts. The twin's individual-mode MIG makes those two and lists the other two
    as CREATING with ZONE_RESOURCE_POOL_EXHAUSTED; the controller gives the slice up after its
    cell's bound, so the hosts billed for nothing stay within 2 hosts x the bound."""
    seed(cloud, "compute")
    controller, stream = make_controller(
        client, "compute", controller_metadata, capacity=table.SPOT, clock=TwinClock(cloud)
    )
    controller.step()
    cloud.state.delete_mig(PROJECT, ZONE, SLICE1)  # the slice is gone (its hosts back to the zone)
    cloud.state.set_capacity(ZONE, "", 2)  # and the zone has two hosts left for it
    start = cloud.state.clock.now
    controller.step()  # recreated: two hosts made, two waiting for the zone
    assert len(hosts_made(cloud, SLICE1)) == 2
    step_s = 60.0
    bound = float(table.WHOLE_WITHIN_S)
    gave_up: list[dict[str, Any]] = []
    while not gave_up and cloud.state.clock.now - start < bound + 2 * step_s:
        cloud.state.advance(step_s)
        controller.step()
        gave_up = [e for e in _events(stream) if "not whole" in e["outcome"]]
    assert len(gave_up) == 1 and "ZONE_RESOURCE_POOL_EXHAUSTED" in gave_up[0]["seen"], _events(stream)
    assert KEY not in cloud.state.migs  # given up: deleted, nothing bills while it backs off
    wasted = cloud.state.bill.wasted(since=start)
    assert 0 < wasted <= 2 * (bound + step_s) / 3600, wasted
    cloud.state.advance(step_s)
    controller.step()  # the back-off over: asked again
    assert KEY in cloud.state.migs
