"""The controller scaling an elastic cluster against the emulated cloud on loopback: the head's
demand read through instances.getGuestAttributes, whole slices added with createInstances and
removed with deleteInstances, every step an event (docs/elastic.md)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rayslice import names
from rayslice.cloud.rest import operation_error
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.local.google.metadata_server import MetadataServer
from rayslice.recovery import controller as controller_module
from rayslice.recovery.cloud import CloudClient
from tests.recovery.conftest import CLUSTER, PROJECT, ZONE, hosts_made, make_controller, mig_fields
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


def _elastic(
    cloud: CloudApiEmulator,
    client: CloudClient,
    controller_metadata: MetadataServer,
    head: dict,
    capacity: str | None = None,
    **fields,
):
    """Two empty slices, as the program declares an elastic cluster's (MIG `fields` added); the
    head VM answers with `head["demand"]`, the controller VM with its own events; `capacity`: the
    stack's capacity cell."""
    for name in (SLICE0, SLICE1):
        cloud.add_mig(PROJECT, ZONE, name, [], **mig_fields(name), **fields)
    controller_source = cloud.guest_source

    def source(instance: str):
        if instance == HEAD:
            return {names.GUEST_ATTRIBUTE_NAMESPACE: {names.DEMAND_KEY: head["demand"]}} if head else None
        return controller_source(instance) if controller_source else None

    cloud.guest_source = source
    controller, stream = make_controller(client, "compute", controller_metadata, capacity=capacity)
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


def test_a_reserved_slice_gets_every_host_in_one_call_and_is_removed_by_a_resize_to_0(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    """Issue 40 D4: a reserved slice's MIG is in bulk mode (its cell's), so its hosts come in one
    createInstances while its target size is 0 and go by a resize to 0, which bulk mode takes
    (Compute Engine, "About bulk mode"), not deleteInstances; what is left of their per-instance
    configs goes too, so the next add of the same names starts clean."""
    head = {"demand": _reading(PENDING_SLICE)}
    controller, stream = _elastic(
        cloud, client, controller_metadata, head, capacity="reserved", targetSizePolicy={"mode": "BULK"}
    )
    controller.step()
    controller.step()
    [create] = cloud.mutations()
    assert create.method_id == "compute.instanceGroupManagers.createInstances" and SLICE0 in create.path
    assert [i["name"] for i in create.request["instances"]] == names.slice_host_names(SLICE0, 4)
    key = (PROJECT, ZONE, SLICE0)
    assert len(cloud.state.instances[key]) == cloud.state.migs[key]["targetSize"] == 4

    head["demand"] = _reading(slices={SLICE0: {"nodes": 4, "busy": False, "idle_s": 61}})
    controller.step()
    methods = [m.method_id for m in cloud.mutations()]
    assert methods[1:] == ["compute.instanceGroupManagers.resize"], methods
    assert cloud.mutations()[1].query == {"size": "0"}
    assert cloud.state.migs[key]["targetSize"] == 0 and not cloud.state.instances[key]
    assert not cloud.state.configs[key]
    assert _events(stream)[-1] == (SLICE0, "remove slice", "MIG resized to 0 host(s): idle for 60s or more")

    head["demand"] = _reading(PENDING_SLICE)  # wanted again: the same names, one call from 0
    controller.step()
    controller.step()
    assert [m.method_id for m in cloud.mutations()][2:] == ["compute.instanceGroupManagers.createInstances"]
    assert len(cloud.state.instances[key]) == 4


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


def test_a_forged_reading_is_refused_and_a_failing_decision_is_recorded_once_and_survived(
    cloud: CloudApiEmulator,
    client: CloudClient,
    controller_metadata: MetadataServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Any job can write the head's demand: a count no float holds (OverflowError in the scaling
    sums, every pass, before the bounds) is refused as unreadable; and whatever a decision raises
    is recorded once, while every pass goes on."""
    forged = json.loads(_reading())
    forged["tasks"] = [{"shape": {"TPU": 4}, "count": 10**400}]
    head = {"demand": json.dumps(forged)}
    controller, stream = _elastic(cloud, client, controller_metadata, head)
    controller.step()
    controller.step()
    assert not cloud.mutations()
    assert "the head's demand is unreadable: demand tasks[0].count" in capsys.readouterr().err
    assert _events(stream) == [(CLUSTER, "wait", "no recent demand from the head")]

    def fails(*args, **kwargs):
        raise ArithmeticError("a rule nobody foresaw")

    monkeypatch.setattr(controller_module, "decide", fails)
    head["demand"] = _reading(PENDING_SLICE)
    for _ in range(3):
        controller.step()
    assert not cloud.mutations()
    assert _events(stream)[1:] == [
        (CLUSTER, "wait", "no scaling decision: ArithmeticError: a rule nobody foresaw")
    ]
    monkeypatch.undo()
    controller.step()
    controller.step()
    assert [m.method_id for m in cloud.mutations()] == ["compute.instanceGroupManagers.createInstances"]


# ---- flex-start: slices added by resizing bulk MIGs from 0 (docs/elastic.md, "Flex-start") ------

FLEX = dataclasses.replace(POLICY, run_duration_s=86400)


def _flex(cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer, head: dict):
    """Two empty bulk MIGs, as the program declares an elastic flex-start cluster's slices above
    minSlices; the zone has no free host until a test gives it some."""
    cloud.state.set_capacity(ZONE, "", 0)  # the emulated templates name no machine type
    controller, stream = _elastic(cloud, client, controller_metadata, head, targetSizePolicy={"mode": "BULK"})
    controller.scaling = FLEX
    return controller, stream


def _add_slice0(cloud: CloudApiEmulator, controller, head: dict) -> None:
    head["demand"] = _reading(PENDING_SLICE)
    controller.step()
    controller.step()
    [resize] = cloud.mutations()
    assert resize.method_id == "compute.instanceGroupManagers.resize" and SLICE0 in resize.path
    assert resize.query == {"size": "4"} and resize.status == 200
    key = (PROJECT, ZONE, SLICE0)
    assert cloud.state.migs[key]["targetSize"] == 4 and hosts_made(cloud, SLICE0) == []
    assert not cloud.state.resize_requests_of(*key)  # bulk mode takes no resize request
    controller.step()  # still pending, and the slice waits for capacity: no second resize
    assert len(cloud.mutations()) == 1


def test_a_flex_start_slice_waits_for_capacity_comes_whole_and_goes_by_a_resize_to_zero(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    """D1 (issue 40): the elastic path adds a flex-start slice by resizing its bulk MIG from 0 and
    removes it by resizing to 0; no resize request (bulk mode does not support them)."""
    head: dict = {}
    controller, stream = _flex(cloud, client, controller_metadata, head)
    _add_slice0(cloud, controller, head)
    assert _events(stream)[-1] == (SLICE0, "add slice", "MIG resized to 4 host(s): waits for capacity")

    cloud.state.set_capacity(ZONE, "", 4)  # capacity comes: all four hosts at once, named by the MIG
    hosts = sorted(hosts_made(cloud, SLICE0))
    assert len(hosts) == 4 and not set(hosts) & set(names.slice_host_names(SLICE0, 4))
    head["demand"] = _reading(slices={SLICE0: {"nodes": 4, "busy": True, "idle_s": 0}})
    controller.step()  # a job runs on it: nothing changes
    assert len(cloud.mutations()) == 1

    head["demand"] = _reading(slices={SLICE0: {"nodes": 4, "busy": False, "idle_s": 61}})
    controller.step()
    [shrink] = cloud.mutations()[1:]
    assert shrink.method_id == "compute.instanceGroupManagers.resize" and shrink.query == {"size": "0"}
    assert cloud.state.migs[(PROJECT, ZONE, SLICE0)]["targetSize"] == 0
    assert not cloud.state.instances[(PROJECT, ZONE, SLICE0)]
    assert _events(stream)[-1] == (
        SLICE0,
        "remove slice",
        "MIG resized to 0 host(s): idle for 60s or more",
    )
    controller.step()
    assert controller.removing == set() and len(cloud.mutations()) == 2

    head["demand"] = _reading(PENDING_SLICE)  # needed again: grown from 0 again
    controller.step()
    controller.step()
    assert len(hosts_made(cloud, SLICE0)) == 4  # the zone has the hosts back


def test_a_slice_whose_demand_went_before_capacity_came_is_resized_back_to_zero(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    head: dict = {}
    controller, stream = _flex(cloud, client, controller_metadata, head)
    _add_slice0(cloud, controller, head)
    head["demand"] = _reading()  # the job was cancelled: nothing pends
    controller.step()
    [cancel] = cloud.mutations()[1:]
    assert cancel.method_id == "compute.instanceGroupManagers.resize" and cancel.query == {"size": "0"}
    assert _events(stream)[-1] == (
        SLICE0,
        "cancel slice",
        "MIG resized to 0 host(s): no demand for it before capacity came",
    )
    cloud.state.set_capacity(ZONE, "", 8)  # capacity comes later: no host arrives for nothing
    assert not hosts_made(cloud, SLICE0)
    controller.step()
    assert len(cloud.mutations()) == 2


def test_a_bulk_mig_refuses_growth_above_zero_through_the_api(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    """D8 (issue 40): growth of a bulk MIG whose target size is above 0 fails its operation and
    changes nothing, by resize or by createInstances."""
    head: dict = {}
    _flex(cloud, client, controller_metadata, head)
    allowed = (SLICE0, SLICE1)
    client.wait_zone_operation(client.resize_mig(SLICE0, 4, allowed), 30)
    done = client.wait_zone_operation(client.resize_mig(SLICE0, 5, allowed), 30)
    assert "bulk mode" in str(operation_error(done))
    done = client.wait_zone_operation(client.create_instances(SLICE0, [{"name": "x-w0"}], allowed), 30)
    assert "bulk mode" in str(operation_error(done))
    assert cloud.state.migs[(PROJECT, ZONE, SLICE0)]["targetSize"] == 4
