"""The controller against the emulated cloud on loopback: a real HTTP server, a real client."""

from __future__ import annotations

import json

import pytest

from rayslice import names
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.local.google.metadata_server import MetadataServer
from rayslice.recovery.cloud import CloudClient, RefusedResource
from tests.recovery.conftest import (
    CLUSTER,
    NODE_FIELDS,
    PROJECT,
    RESERVED_TEMPLATE,
    ZONE,
    Clock,
    bulk_mig_fields,
    controller_violations,
    hosts_made,
    make_controller,
    mig_fields,
    old_mig_fields,
    seed,
    seed_flex,
    seed_queued,
)

SLICE0, SLICE1 = names.slice_name(CLUSTER, 0), names.slice_name(CLUSTER, 1)


def _summary(cloud: CloudApiEmulator) -> list[tuple[str, str]]:
    """(method id, resource path) of every mutating call served."""
    return [(c.method_id or "", c.path.rsplit("/", 1)[-1] + str(c.query)) for c in cloud.mutations()]


def test_preempted_tpu_node_is_recreated_whole_from_its_own_spec(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    seed(cloud, "tpu-vm")
    controller, stream = make_controller(client, "tpu-vm", controller_metadata)
    controller.step()  # healthy: records each node's spec, touches nothing
    assert cloud.mutations() == []
    old_id = cloud.state.nodes[(PROJECT, ZONE, SLICE1)]["id"]

    cloud.preempt(PROJECT, ZONE, SLICE1)
    controller.step()

    assert _summary(cloud) == [
        ("tpu.projects.locations.nodes.delete", SLICE1 + "{}"),
        ("tpu.projects.locations.nodes.create", "nodes" + str({"nodeId": SLICE1})),
    ]
    node = cloud.state.nodes[(PROJECT, ZONE, SLICE1)]
    assert node["state"] == "READY" and node["id"] != old_id
    for key in (
        "acceleratorType",
        "runtimeVersion",
        "networkConfig",
        "schedulingConfig",
        "metadata",
        "labels",
        "tags",
    ):
        assert node[key] == NODE_FIELDS[key], key
    assert cloud.state.nodes[(PROJECT, ZONE, SLICE0)]["state"] == "READY"
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(e["slice"], e["seen"], e["action"], e["outcome"]) for e in events] == [
        (SLICE1, "node state PREEMPTED", "recreate", "recreated")
    ]


def test_a_node_answered_with_both_of_an_exclusive_pair_is_created_with_one(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    """nodes.get may fill in both networkConfig and networkConfigs (and acceleratorType beside
    acceleratorConfig); the create call carries only the one the program sets of each pair,
    which the emulated API (like Google's) requires."""
    seed(cloud, "tpu-vm")
    node = cloud.state.nodes[(PROJECT, ZONE, SLICE1)]
    node["acceleratorConfig"] = {"type": "V6E", "topology": "4x4"}
    node["networkConfigs"] = [NODE_FIELDS["networkConfig"]]
    controller, stream = make_controller(client, "tpu-vm", controller_metadata)
    controller.step()
    cloud.preempt(PROJECT, ZONE, SLICE1)
    controller.step()

    create = cloud.mutations()[-1]
    assert create.method_id == "tpu.projects.locations.nodes.create"
    assert create.status == 200, create.response
    assert create.request["acceleratorConfig"] == {"type": "V6E", "topology": "4x4"}
    assert create.request["networkConfig"] == NODE_FIELDS["networkConfig"]
    assert "acceleratorType" not in create.request and "networkConfigs" not in create.request
    assert json.loads(stream.getvalue())["outcome"] == "recreated"


@pytest.mark.parametrize("fields", [mig_fields, old_mig_fields], ids=["program", "earlier-bulk"])
@pytest.mark.parametrize("mode", ["gone", "terminated"])
def test_preempted_compute_slice_is_recreated_whole_with_its_host_names(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer, mode: str, fields
) -> None:
    seed(cloud, "compute", fields=fields)
    controller, stream = make_controller(client, "compute", controller_metadata)
    controller.step()
    assert cloud.mutations() == []

    cloud.preempt(PROJECT, ZONE, SLICE0, mode=mode)
    controller.step()

    assert [c.method_id for c in cloud.mutations()] == [
        "compute.instanceGroupManagers.delete",
        "compute.instanceGroupManagers.insert",
        "compute.instanceGroupManagers.createInstances",
    ]
    insert, create = cloud.mutations()[1:]
    # The program's shape, whatever shape the MIG had: target size 0 raised by createInstances,
    # no bulk target-size policy, DO_NOTHING on a failed host.
    assert [str(v) for v in controller_violations(insert.request, create.request)] == []
    assert insert.request["targetSize"] == 0 and "targetSizePolicy" not in insert.request
    assert insert.request["instanceLifecyclePolicy"]["defaultActionOnFailure"] == "DO_NOTHING"
    assert [i["name"] for i in create.request["instances"]] == [f"{SLICE0}-w{w}" for w in range(4)]
    assert create.request["instances"][2]["preservedState"]["internalIPs"]["nic0"]["ipAddress"] == {
        "literal": "10.1.0.2"
    }
    key = (PROJECT, ZONE, SLICE0)
    mig = cloud.state.migs[key]
    assert mig["targetSize"] == 4
    assert mig["instanceTemplate"] == mig_fields(SLICE0)["instanceTemplate"]
    assert mig["resourcePolicies"] == mig_fields(SLICE0)["resourcePolicies"]
    assert [(i["name"], i["instanceStatus"]) for i in cloud.state.instances[key]] == [
        (f"{SLICE0}-w{w}", "RUNNING") for w in range(4)
    ]
    # A stopped host reads "preempted": Compute Engine recorded its compute.instances.preempted operation.
    seen = "MIG 0 of 4 instances" if mode == "gone" else "MIG host w0 preempted"
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert len(events) == 1 and events[0]["outcome"] == "recreated" and events[0]["seen"].startswith(seen)


@pytest.mark.parametrize("fields", [bulk_mig_fields, mig_fields], ids=["program", "earlier-individual"])
def test_a_reserved_compute_slice_is_recreated_in_bulk_mode_with_every_host_in_one_call(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer, fields
) -> None:
    """Issue 40 D4: a reserved slice's MIG is inserted again in the cell's mode, BULK, with target
    size 0, and one createInstances brings every host back with its name and preserved address
    (bulk mode takes hosts only while the target size is 0: one call), whatever mode the recorded
    MIG had; the bodies pass Google's rules with the reservation-bound template."""
    seed(cloud, "compute", fields=fields)
    controller, stream = make_controller(client, "compute", controller_metadata, capacity="reserved")
    controller.step()
    cloud.state.delete_mig(PROJECT, ZONE, SLICE0)  # gone: recreated at once (the cell's slice-gone)
    controller.step()
    assert [c.method_id for c in cloud.mutations()] == [
        "compute.instanceGroupManagers.insert",
        "compute.instanceGroupManagers.createInstances",
    ]
    insert, create = cloud.mutations()
    assert insert.request["targetSize"] == 0 and insert.request["targetSizePolicy"] == {"mode": "BULK"}
    assert [i["name"] for i in create.request["instances"]] == [f"{SLICE0}-w{w}" for w in range(4)]
    assert create.request["instances"][1]["preservedState"]["internalIPs"]["nic0"]["ipAddress"] == {
        "literal": "10.1.0.1"
    }
    assert [str(v) for v in controller_violations(insert.request, create.request, RESERVED_TEMPLATE)] == []
    key = (PROJECT, ZONE, SLICE0)
    assert cloud.state.migs[key]["targetSize"] == 4
    assert sorted(i["name"] for i in cloud.state.instances[key]) == [f"{SLICE0}-w{w}" for w in range(4)]
    [event] = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert event["outcome"] == "recreated", event


def test_the_rules_refuse_the_shape_an_earlier_controller_sent() -> None:
    """What the controller used to insert again for a MIG an earlier rayslice made (BULK, the
    default REPAIR) breaks Google's rules for a Spot template: the check above can fail. (Its one
    createInstances from target size 0 is what bulk mode takes.)"""
    name = SLICE0
    insert = {"name": name, **old_mig_fields(name), "targetSize": 0}
    create = {"instances": [{"name": f"{name}-w{w}"} for w in range(4)]}
    assert {v.rule for v in controller_violations(insert, create)} == {
        "bulk-provisioning-model",
        "tpu-mig-do-nothing",
    }


@pytest.mark.parametrize(
    "status, action",
    [
        ("STOPPING", "NONE"),  # a Spot preemption with termination action STOP, on its way
        ("STOPPED", "NONE"),
        ("PROVISIONING", "CREATING"),  # a single host created again: it cannot rejoin the slice
        (None, "CREATING"),
        ("RUNNING", "RECREATING"),  # the MIG replacing a host by itself (seen as its action)
    ],
)
def test_a_host_not_running_after_the_slice_was_whole_breaks_it(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer, status, action
) -> None:
    seed(cloud, "compute")
    controller, stream = make_controller(client, "compute", controller_metadata)
    controller.step()  # whole: every host RUNNING
    instance = cloud.state.instances[(PROJECT, ZONE, SLICE1)][1]
    instance.pop("instanceStatus")
    instance.update({"currentAction": action, **({"instanceStatus": status} if status else {})})
    controller.step()
    assert [c.method_id for c in cloud.mutations()] == [
        "compute.instanceGroupManagers.delete",
        "compute.instanceGroupManagers.insert",
        "compute.instanceGroupManagers.createInstances",
    ]
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    shown = action if action == "RECREATING" else status or action
    assert [(e["slice"], e["seen"], e["outcome"]) for e in events] == [
        (SLICE1, f"MIG host w1 {shown}", "recreated")
    ]


def test_a_compute_slice_being_created_is_not_broken_until_it_was_whole(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    seed(cloud, "compute")
    creating = cloud.state.instances[(PROJECT, ZONE, SLICE0)]
    for instance in creating[2:]:
        instance.pop("instanceStatus")
        instance["currentAction"] = "CREATING"
    controller, stream = make_controller(client, "compute", controller_metadata)
    controller.step()
    assert cloud.mutations() == [] and stream.getvalue() == ""
    for instance in creating[2:]:
        instance.update(instanceStatus="RUNNING", currentAction="NONE")
    controller.step()  # whole now
    creating[3]["instanceStatus"] = "TERMINATED"
    controller.step()
    assert [c.method_id for c in cloud.mutations()][-1] == "compute.instanceGroupManagers.createInstances"


def test_a_recreated_compute_slice_is_left_to_come_up(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    """After a recreation the new hosts are CREATING for a while: not broken again until whole."""
    seed(cloud, "compute")
    controller, stream = make_controller(client, "compute", controller_metadata)
    controller.step()
    cloud.preempt(PROJECT, ZONE, SLICE0, mode="terminated")
    controller.step()
    for instance in cloud.state.instances[(PROJECT, ZONE, SLICE0)]:  # as if still coming up
        instance.pop("instanceStatus")
        instance["currentAction"] = "CREATING"
    before = len(cloud.mutations())
    controller.step()
    assert len(cloud.mutations()) == before
    assert len(stream.getvalue().splitlines()) == 1


@pytest.mark.parametrize("platform", ["tpu-vm", "compute"])
def test_a_healthy_cluster_is_left_alone(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer, platform: str
) -> None:
    seed(cloud, platform)
    controller, stream = make_controller(client, platform, controller_metadata)
    for _ in range(3):
        controller.step()
    assert cloud.mutations() == []
    assert stream.getvalue() == "" and controller_metadata.guest == {}
    assert len(cloud.calls) >= 6  # it did look, every pass


def test_a_slice_being_created_is_not_a_broken_one(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    seed(cloud, "tpu-vm")
    cloud.state.nodes[(PROJECT, ZONE, SLICE0)]["state"] = "CREATING"
    controller, stream = make_controller(client, "tpu-vm", controller_metadata)
    controller.step()
    assert cloud.mutations() == [] and stream.getvalue() == ""


def test_backoff_grows_exponentially_and_caps(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    seed(cloud, "tpu-vm")
    clock = Clock()
    controller, stream = make_controller(client, "tpu-vm", controller_metadata, clock=clock, base=10, cap=30)
    controller.step()
    cloud.fail_creates = 4  # four stockouts in a row, then capacity returns
    cloud.preempt(PROJECT, ZONE, SLICE0)

    def creates() -> int:
        return sum(1 for c in cloud.mutations() if c.method_id == "tpu.projects.locations.nodes.create")

    attempts_at = []
    start = clock.now
    for _ in range(95):  # one look at the slice per simulated second
        before = creates()
        controller.act_on(SLICE0)
        if creates() > before:
            attempts_at.append(clock.now - start)
        clock.now += 1
    # Tries at 0, then after 10, 20, 30 (capped, not 40) and 30 s: 0, 10, 30, 60, 90.
    assert attempts_at == [0, 10, 30, 60, 90]
    assert cloud.state.nodes[(PROJECT, ZONE, SLICE0)]["state"] == "READY"
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [e["attempt"] for e in events] == [1, 2, 3, 4, 5]
    assert [e["outcome"].split(";")[-1].strip() for e in events[:4]] == [
        "next try in 10s",
        "next try in 20s",
        "next try in 30s",
        "next try in 30s",
    ]
    assert events[-1]["outcome"] == "recreated"
    assert controller.backoff(1) == 10 and controller.backoff(2) == 20 and controller.backoff(9) == 30


def test_a_name_that_is_not_this_clusters_slice_is_refused_and_never_touched(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    seed(cloud, "tpu-vm")
    # Preempted nodes that look close to the cluster's slices but are not among them.
    for foreign in ("prod-slice-0", f"{CLUSTER}-slice-2", f"{CLUSTER}-slice-1-copy", f"x{CLUSTER}-slice-0"):
        cloud.add_node(PROJECT, ZONE, foreign, **NODE_FIELDS)
        cloud.preempt(PROJECT, ZONE, foreign)
    controller, stream = make_controller(client, "tpu-vm", controller_metadata)
    before = len(cloud.calls)
    for name in ("prod-slice-0", f"{CLUSTER}-slice-2", f"{CLUSTER}-slice-1-copy", f"{CLUSTER}-head"):
        with pytest.raises(RefusedResource, match="not one of"):
            controller.act_on(name)
        with pytest.raises(RefusedResource):
            client.delete_node(name, controller.target.slice_names)
        with pytest.raises(RefusedResource):
            client.create_node(name, {}, controller.target.slice_names)
    assert len(cloud.calls) == before  # refused before any request was sent
    for _ in range(3):
        controller.step()
    assert cloud.mutations() == []
    touched = {c.path.rsplit("/", 1)[-1] for c in cloud.calls}
    assert touched == {SLICE0, SLICE1, names.request_name(SLICE0), names.request_name(SLICE1)}
    assert stream.getvalue() == ""


def test_compute_refuses_a_foreign_mig_before_sending(cloud: CloudApiEmulator, client: CloudClient) -> None:
    allowed = (SLICE0,)
    with pytest.raises(RefusedResource):
        client.delete_mig("default-pool", allowed)
    with pytest.raises(RefusedResource):
        client.insert_mig({"name": "default-pool"}, allowed)
    with pytest.raises(RefusedResource):
        client.create_instances("default-pool", [{"name": "x"}], allowed)
    assert cloud.calls == []


def test_a_platform_without_a_vm_slice_resource_is_refused_before_any_request(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    controller, _ = make_controller(client, "gke", controller_metadata)
    with pytest.raises(RefusedResource, match="platform 'gke' has no recovery controller"):
        controller.act_on(SLICE0)
    assert cloud.calls == []


def test_each_event_is_recorded_once_in_every_sink(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    seed(cloud, "compute")
    controller, stream = make_controller(client, "compute", controller_metadata)
    controller.step()
    cloud.preempt(PROJECT, ZONE, SLICE1)
    for _ in range(4):  # the recovery, then healthy passes
        controller.step()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    stored = controller_metadata.guest[names.GUEST_ATTRIBUTE_NAMESPACE]
    assert len(stored) == 1
    ((key, value),) = stored.items()
    assert key.startswith("recovery-") and json.loads(value) == json.loads(lines[0])
    event = json.loads(value)
    assert set(event) == {"time", "slice", "seen", "action", "outcome", "attempt"}
    assert event["slice"] == SLICE1 and event["action"] == "recreate"


def test_a_missing_slice_never_seen_whole_is_reported_not_guessed(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    seed(cloud, "tpu-vm", slices=1)  # slice 1 does not exist, and was never seen
    clock = Clock()
    controller, stream = make_controller(client, "tpu-vm", controller_metadata, clock=clock)
    controller.step()
    controller.step()  # inside the backoff: no second event
    assert cloud.mutations() == []
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(e["slice"], e["seen"], e["action"]) for e in events] == [(SLICE1, "node missing", "none")]
    assert "no recorded spec" in events[0]["outcome"]


def test_a_node_deleted_after_it_was_seen_is_created_again(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    seed(cloud, "tpu-vm")
    controller, _ = make_controller(client, "tpu-vm", controller_metadata)
    controller.step()
    del cloud.state.nodes[(PROJECT, ZONE, SLICE0)]
    controller.step()
    assert [c.method_id for c in cloud.mutations()] == ["tpu.projects.locations.nodes.create"]
    assert cloud.state.nodes[(PROJECT, ZONE, SLICE0)]["acceleratorType"] == "v6e-16"


def test_a_flex_start_slice_is_recreated_as_a_bulk_mig_that_waits_for_capacity(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    """D1 (issue 40): recreated in the documented bulk form, its target size the slice's hosts,
    with no resize request (bulk mode takes none)."""
    seed_flex(cloud)
    controller, stream = make_controller(client, "compute", controller_metadata)
    controller.step()  # both slices whole: their MIGs recorded
    assert cloud.mutations() == []
    key = (PROJECT, ZONE, SLICE1)
    # From now on the zone is empty (the seeded MIGs name no template the twin holds, so the kind
    # their hosts count as is "").
    cloud.state.set_capacity(ZONE, "", 0)

    cloud.preempt(PROJECT, ZONE, SLICE1)  # hosts deleted (a flex-start host is deleted, not stopped)
    controller.step()

    assert [c.method_id for c in cloud.mutations()] == [
        "compute.instanceGroupManagers.delete",
        "compute.instanceGroupManagers.insert",
    ]
    insert = cloud.mutations()[1].request
    assert insert["targetSize"] == 4 and insert["targetSizePolicy"] == {"mode": "BULK"}
    # The new MIG waits: no hosts, and a waiting slice is not a broken one.
    assert hosts_made(cloud, SLICE1) == [] and not cloud.state.resize_requests_of(*key)
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [e["outcome"] for e in events] == ["recreated; the MIG waits for capacity for 4 host(s)"]
    controller.step()
    assert len(cloud.mutations()) == 2  # left alone while it waits

    cloud.state.set_capacity(ZONE, "", 4)  # capacity comes: all four hosts at once, named by the MIG
    assert len(hosts_made(cloud, SLICE1)) == 4 and cloud.state.migs[key]["targetSize"] == 4
    controller.step()
    assert len(cloud.mutations()) == 2


# Not flex-start: its request SUSPENDED means the run ended, and it is not requested again
# (tests/recovery/test_queued_recovery.py).
@pytest.mark.parametrize("fields", [{"spot": {}}], ids=["spot"])
def test_a_queued_slice_is_recreated_through_a_new_queued_resource_that_waits_for_capacity(
    cloud: CloudApiEmulator,
    client: CloudClient,
    controller_metadata: MetadataServer,
    fields: dict[str, object],
) -> None:
    seed_queued(cloud, **fields)
    controller, stream = make_controller(client, "tpu-vm", controller_metadata)
    controller.step()  # both requests ACTIVE, their nodes READY: recorded
    assert cloud.mutations() == []
    request = names.request_name(SLICE1)
    sent = cloud.state.queued_resource(PROJECT, ZONE, request)
    assert sent is not None
    cloud.state.set_capacity(ZONE, "v6e", 0)  # from now on the zone has no v6e host

    cloud.preempt(PROJECT, ZONE, SLICE1)  # the node PREEMPTED, its request SUSPENDED
    controller.step()

    assert [(c.method_id, c.query) for c in cloud.mutations()] == [
        ("tpu.projects.locations.queuedResources.delete", {"force": "true"}),
        ("tpu.projects.locations.queuedResources.create", {"queuedResourceId": request}),
    ]
    body = cloud.mutations()[1].request
    assert body == {k: v for k, v in sent.items() if k in ("tpu", *fields)}  # the recorded request
    # The new request waits for capacity; the slice has no node, and waiting breaks nothing.
    waiting = cloud.state.queued_resource(PROJECT, ZONE, request)
    assert waiting is not None and waiting["state"]["state"] == "WAITING_FOR_RESOURCES"
    assert (PROJECT, ZONE, SLICE1) not in cloud.state.nodes
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(e["seen"], e["outcome"]) for e in events] == [
        ("queued resource SUSPENDED", f"recreated; queued resource {request} waits for capacity")
    ]
    controller.step()
    assert len(cloud.mutations()) == 2  # left alone while it waits

    cloud.state.set_capacity(ZONE, "v6e", 4)  # the whole slice at once: the node is created
    assert cloud.state.nodes[(PROJECT, ZONE, SLICE1)]["state"] == "READY"
    controller.step()
    assert len(cloud.mutations()) == 2


# ---- D2 (issue 40): a slice Google recovers is never deleted while it may be recovering --------


def _broken_on_demand(cloud: CloudApiEmulator, client: CloudClient, vm: MetadataServer, clock: Clock):
    """An on-demand compute cluster, seen whole, whose slice 1 then has a host error."""
    seed(cloud, "compute")
    controller, stream = make_controller(client, "compute", vm, clock=clock, capacity="on-demand")
    controller.step()
    cloud.state.host_error(PROJECT, ZONE, SLICE1)
    controller.step()
    return controller, stream


def test_an_on_demand_slice_google_recovers_is_waited_for_and_recorded(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    clock = Clock()
    controller, stream = _broken_on_demand(cloud, client, controller_metadata, clock)
    assert cloud.mutations() == []  # not deleted: Compute Engine is recovering it
    [first] = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert (first["slice"], first["seen"], first["action"]) == (
        SLICE1,
        "MIG host w0 TERMINATED, host w1 TERMINATED, host w2 TERMINATED, host w3 TERMINATED",
        "wait-for-repair",
    )
    assert "Compute Engine is recovering the slice" in first["outcome"] and "240 min" in first["outcome"]
    clock.now += 600
    controller.step()  # still within the grace: nothing sent, nothing recorded again
    assert cloud.mutations() == [] and len(stream.getvalue().splitlines()) == 1

    cloud.state.recover(PROJECT, ZONE, SLICE1)
    controller.step()
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert (events[-1]["action"], events[-1]["outcome"]) == ("none", "recovered after 10 min")
    assert cloud.mutations() == []


def test_an_on_demand_slice_not_recovered_within_the_grace_is_recreated(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    clock = Clock()
    controller, stream = _broken_on_demand(cloud, client, controller_metadata, clock)
    clock.now += 4 * 3600  # the cell's repair_grace_s
    controller.step()
    assert [c.method_id for c in cloud.mutations()][:2] == [
        "compute.instanceGroupManagers.delete",
        "compute.instanceGroupManagers.insert",
    ]
    last = json.loads(stream.getvalue().splitlines()[-1])
    assert last["action"] == "recreate" and last["outcome"] == "not recovered after 240 min; recreated"


@pytest.mark.parametrize(
    "capacity, mode, seen",
    [
        # The instances deleted: nothing is left for Compute Engine to recover.
        ("on-demand", "gone", "MIG 0 of 4 instances"),
        # Spot: Google recovers nothing; a stopped host reads "preempted" (its operation).
        (
            "spot",
            "terminated",
            "MIG host w0 preempted, host w1 preempted, host w2 preempted, host w3 preempted",
        ),
    ],
)
def test_a_gone_or_spot_slice_is_recreated_at_once(
    cloud: CloudApiEmulator,
    client: CloudClient,
    controller_metadata: MetadataServer,
    capacity: str,
    mode: str,
    seen: str,
) -> None:
    seed(cloud, "compute")
    controller, stream = make_controller(client, "compute", controller_metadata, capacity=capacity)
    controller.step()
    cloud.preempt(PROJECT, ZONE, SLICE1, mode=mode)
    controller.step()
    assert next(c.method_id for c in cloud.mutations()) == "compute.instanceGroupManagers.delete"
    [event] = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert (event["seen"], event["outcome"]) == (seen, "recreated")


@pytest.mark.parametrize("capacity, waits", [("on-demand", True), ("spot", False)])
def test_a_terminated_tpu_node_is_left_to_the_cloud_tpu_service_where_it_repairs(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer, capacity, waits
) -> None:
    """D2 (issue 40) on tpu-vm: a TERMINATED node still exists; where the capacity cell says the
    Cloud TPU service repairs it, the controller waits; on Spot it recreates at once."""
    seed(cloud, "tpu-vm")
    controller, stream = make_controller(client, "tpu-vm", controller_metadata, capacity=capacity)
    controller.step()
    cloud.state.nodes[(PROJECT, ZONE, SLICE1)]["state"] = "TERMINATED"
    controller.step()
    [event] = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert event["seen"] == "node state TERMINATED"
    if waits:
        assert cloud.mutations() == [] and event["action"] == "wait-for-repair"
    else:
        assert cloud.mutations() and event["action"] == "recreate"


def test_a_flex_start_slice_whose_hosts_all_went_has_ended_and_is_not_asked_again(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    """The compute flex-start cell: at the end of the run duration Compute Engine deletes the
    hosts; the controller records that the slice ended, resizes its MIG to 0 (a bulk MIG that kept
    its target size could make the hosts again: a second paid run) and makes nothing again
    (maxRunHours bounds the cost)."""
    seed_flex(cloud)
    controller, stream = make_controller(client, "compute", controller_metadata, capacity="flex-start")
    controller.step()
    key = (PROJECT, ZONE, SLICE1)
    for record in list(cloud.state.instances[key]):  # the run ended: every host deleted, MIG kept
        cloud.state.lose(cloud.state.vms[(PROJECT, ZONE, record["name"])], deleted=True)
    controller.step()
    controller.step()
    assert [c.method_id for c in cloud.mutations()] == ["compute.instanceGroupManagers.resize"]
    assert cloud.state.migs[key]["targetSize"] == 0
    [event] = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert event["seen"].startswith("MIG 0 of 4 instances: ended: run duration reached")
    assert event["outcome"].startswith("ended: not requested again")
    assert "MIG resized to 0 host(s)" in event["outcome"]
