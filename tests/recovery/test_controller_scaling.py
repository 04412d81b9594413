"""The controller scaling an elastic cluster against the emulated cloud on loopback: the head's
demand read through instances.getGuestAttributes, whole slices added with createInstances and
removed with deleteInstances, every step an event (docs/elastic.md)."""

from __future__ import annotations

import dataclasses
import json

from rayslice import names
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.local.google.metadata_server import MetadataServer
from rayslice.recovery.cloud import CloudClient
from tests.recovery.conftest import CLUSTER, PROJECT, ZONE, make_controller, mig_fields
from tests.recovery.test_scaling import POLICY as SCALING

SLICE0, SLICE1 = names.slice_name(CLUSTER, 0), names.slice_name(CLUSTER, 1)
HEAD = names.head_name(CLUSTER)
NOW = 2_000_000.0
POLICY = dataclasses.replace(SCALING, min_slices=0, head_instance=HEAD)  # both slices the controller's
PENDING_SLICE = [{"bundles": [{"shape": {"TPU-v6e-16-head": 1}, "count": 1}], "strategy": "STRICT_SPREAD"}]


def _reading(pgs=(), slices=None) -> str:
    return json.dumps(
        {"v": 1, "at": NOW, "pgs": list(pgs), "tasks": [], "slices": slices or {}, "truncated": False}
    )


def _elastic(cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer, head: dict):
    """Two empty slices, as the program declares an elastic cluster's; the head VM answers with
    `head["demand"]`, the controller VM with its own events."""
    for name in (SLICE0, SLICE1):
        cloud.add_mig(PROJECT, ZONE, name, [], **mig_fields(name))
    controller_source = cloud.guest_source

    def source(instance: str):
        if instance == HEAD:
            return {names.GUEST_ATTRIBUTE_NAMESPACE: {names.DEMAND_KEY: head["demand"]}} if head else None
        return controller_source(instance) if controller_source else None

    cloud.guest_source = source
    controller, stream = make_controller(client, "compute", controller_metadata)
    controller.scaling, controller.wall_clock = POLICY, lambda: NOW
    return controller, stream


def _events(stream) -> list[tuple[str, str, str]]:
    return [(e["slice"], e["action"], e["outcome"]) for e in map(json.loads, stream.getvalue().splitlines())]


def test_a_pending_slice_adds_one_whole_slice_and_an_idle_one_is_removed(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    head = {"demand": _reading(PENDING_SLICE)}
    controller, stream = _elastic(cloud, client, controller_metadata, head)
    controller.step()
    assert not cloud.mutations()  # demand seen once: it may be a slice's second placement group
    controller.step()
    [create] = cloud.mutations()
    assert create.method_id == "compute.instanceGroupManagers.createInstances" and SLICE0 in create.path
    added = [i["name"] for i in create.request["instances"]]
    assert added == names.slice_host_names(SLICE0, 4)
    assert create.request["instances"][0]["preservedState"]["internalIPs"]["nic0"]["ipAddress"][
        "address"
    ] == (f"projects/{PROJECT}/regions/us-east5/addresses/{SLICE0}-w0-ip")
    assert _events(stream) == [(SLICE0, "add slice", "4 host(s) requested")]

    head["demand"] = _reading(slices={SLICE0: {"nodes": 4, "busy": True, "idle_s": 0}})
    controller.step()  # a job runs on it: nothing changes, however long
    assert len(cloud.mutations()) == 1

    head["demand"] = _reading(slices={SLICE0: {"nodes": 4, "busy": False, "idle_s": 61}})
    controller.step()
    methods = [m.method_id for m in cloud.mutations()]
    assert methods[1] == "compute.instanceGroupManagers.deleteInstances"
    assert controller.removing == {SLICE0}
    assert cloud.state.migs[(PROJECT, ZONE, SLICE0)]["targetSize"] == 0
    assert _events(stream)[-1] == (SLICE0, "remove slice", "4 host(s) deleted (idle for 60s or more)")
    controller.step()  # the hosts are gone: the slice is an empty one again, and nothing is recreated
    assert controller.removing == set()
    assert [m.method_id for m in cloud.mutations()] == methods


def test_demand_beyond_slices_waits_and_says_on_what(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    head = {"demand": _reading(PENDING_SLICE * 3)}
    controller, stream = _elastic(cloud, client, controller_metadata, head)
    controller.step()
    controller.step()
    controller.step()  # the same wait again: recorded once
    created = [m for m in cloud.mutations() if m.method_id.endswith("createInstances")]
    assert len(created) == 2
    waits = [e for e in _events(stream) if e[1] == "wait"]
    assert waits == [(CLUSTER, "wait", "1 more slice(s) wanted; slices=2 reached")]


def test_no_demand_from_the_head_adds_and_removes_nothing(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    controller, stream = _elastic(cloud, client, controller_metadata, {})
    controller.step()
    controller.step()
    assert not cloud.mutations()
    assert _events(stream) == [(CLUSTER, "wait", "no recent demand from the head")]
