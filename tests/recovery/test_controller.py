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
    FLEX_REQUEST,
    NODE_FIELDS,
    PROJECT,
    ZONE,
    Clock,
    controller_violations,
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
    seen = "MIG 0 of 4 instances" if mode == "gone" else f"MIG {SLICE0}-w0 TERMINATED"
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert len(events) == 1 and events[0]["outcome"] == "recreated" and events[0]["seen"].startswith(seen)


def test_the_rules_refuse_the_shape_an_earlier_controller_sent() -> None:
    """What the controller used to insert again for a MIG an earlier rayslice made (BULK, the
    default REPAIR) breaks Google's rules for a Spot template: the check above can fail."""
    name = SLICE0
    insert = {"name": name, **old_mig_fields(name), "targetSize": 0}
    create = {"instances": [{"name": f"{name}-w{w}"} for w in range(4)]}
    assert {v.rule for v in controller_violations(insert, create)} == {
        "bulk-provisioning-model",
        "spot-tpu-do-nothing",
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
        (SLICE1, f"MIG {SLICE1}-w1 {shown}", "recreated")
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


def test_a_flex_start_slice_is_recreated_through_a_new_resize_request_that_waits_for_capacity(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    seed_flex(cloud)
    controller, stream = make_controller(client, "compute", controller_metadata)
    controller.step()  # both slices whole: their MIGs and requests recorded
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
        "compute.instanceGroupManagerResizeRequests.insert",
    ]
    insert, request = (c.request for c in cloud.mutations()[1:])
    assert insert["targetSize"] == 0 and insert["targetSizePolicy"] == {"mode": "BULK"}
    assert request == {"name": names.request_name(SLICE1), **FLEX_REQUEST}
    # The new request waits: the slice has no hosts, and a waiting slice is not a broken one.
    [waiting] = cloud.state.resize_requests_of(*key)
    assert waiting["state"] == "ACCEPTED" and cloud.state.instances[key] == []
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [e["outcome"] for e in events] == [
        f"recreated; resize request {names.request_name(SLICE1)} waits for 4 hosts"
    ]
    controller.step()
    assert len(cloud.mutations()) == 3  # left alone while it waits

    cloud.state.set_capacity(ZONE, "", 4)  # capacity comes: all four hosts at once, named by the MIG
    assert cloud.state.resize_requests_of(*key)[0]["state"] == "SUCCEEDED"
    assert len(cloud.state.instances[key]) == 4 and cloud.state.migs[key]["targetSize"] == 4
    controller.step()
    assert len(cloud.mutations()) == 3


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
