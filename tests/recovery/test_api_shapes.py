"""Every request the client sends and every response the emulation returns, checked against
Google's discovery documents, after scenarios that exercise every emulated method."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Any

import pytest

from rayslice import cli, names
from rayslice.cloud.capacity import CapacityExhausted
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.local.google.cloud_api.routes import ROUTES
from rayslice.local.google.metadata_server import MetadataServer
from rayslice.recovery.cloud import CloudClient
from rayslice.recovery.scaling import instances_of
from tests.recovery import discovery
from tests.recovery.conftest import (
    CLUSTER,
    GKE_MACHINE,
    PROJECT,
    ZONE,
    gke_pool,
    make_controller,
    seed,
    seed_flex,
    seed_queued,
)
from tests.recovery.test_scaling import POLICY as SCALING


def _reduce(path: str) -> str:
    """The path with every {parameter} reduced to {}."""
    return re.sub(r"\{[^}]*\}", "{}", path)


def _exercise(cloud: CloudApiEmulator, client: CloudClient, vm: MetadataServer, platform: str) -> None:
    seed(cloud, platform)
    ns = names.GUEST_ATTRIBUTE_NAMESPACE
    for worker in range(4):
        host = names.host_name(names.slice_name(CLUSTER, 0), worker)
        cloud.guest[host] = {ns: {names.STATE_KEY: names.STATE_JOINED}}
        cloud.tpu_guest[(names.slice_name(CLUSTER, 0), worker)] = {ns: {names.STATE_KEY: names.STATE_JOINED}}
    controller, _ = make_controller(client, platform, vm)
    controller.step()
    cloud.preempt(PROJECT, ZONE, names.slice_name(CLUSTER, 1))
    controller.step()
    if platform == "tpu-vm":
        assert [n["name"].rsplit("/", 1)[-1] for n in client.list_nodes()] == [
            names.slice_name(CLUSTER, 0),
            names.slice_name(CLUSTER, 1),
        ]
    args = ["status", "--set", f"project={PROJECT}", "--set", f"zone={ZONE}", "--set", "slices=2"]
    assert cli.main([*args, "--set", "capacity=spot", "--set", f"platform={platform}", "--json"]) == 0
    if platform == "compute":
        _exercise_scale_down(client)
    _exercise_waiting(cloud, client, vm, args, platform)


def _exercise_scale_down(client: CloudClient) -> None:
    """A slice's per-instance configs deleted while its hosts run (listed as unapplied), then
    its hosts deleted, the MIG left at target size 0."""
    slice_name = names.slice_name(CLUSTER, 1)
    hosts = names.slice_host_names(slice_name, 4)
    allowed = [names.slice_name(CLUSTER, i) for i in range(2)]
    client.wait_zone_operation(client.delete_per_instance_configs(slice_name, hosts, allowed), 30)
    assert {c["status"] for c in client.list_per_instance_configs(slice_name)} == {"UNAPPLIED_DELETION"}
    client.wait_zone_operation(client.delete_instances(slice_name, hosts, allowed), 30)
    assert (client.get_mig(slice_name) or {}).get("targetSize") == 0
    # An elastic slice added back as the controller adds one: named hosts, reserved addresses.
    policy = dataclasses.replace(SCALING, hosts_per_slice=4)
    client.wait_zone_operation(
        client.create_instances(slice_name, instances_of(policy, PROJECT, hosts), allowed), 30
    )
    assert (client.get_mig(slice_name) or {}).get("targetSize") == 4


def _exercise_waiting(
    cloud: CloudApiEmulator, client: CloudClient, vm: MetadataServer, status: list[str], platform: str
) -> None:
    """The same cluster again with slices that wait for capacity (flex-start bulk MIGs on compute,
    queued resources on tpu-vm): the controller recreates a slice as it was made, and status reads
    them."""
    for index in range(2):
        slice_name = names.slice_name(CLUSTER, index)
        if platform == "compute":
            cloud.state.delete_mig(PROJECT, ZONE, slice_name)
        else:
            cloud.state.delete_node(PROJECT, ZONE, slice_name)
    (seed_flex if platform == "compute" else seed_queued)(cloud)
    controller, _ = make_controller(client, platform, vm)
    controller.step()
    cloud.preempt(PROJECT, ZONE, names.slice_name(CLUSTER, 1))
    controller.step()
    waits = "capacity=flex-start" if platform == "compute" else "queued=true"
    assert cli.main([*status, "--set", f"platform={platform}", "--set", waits, "--json"]) == 0
    if platform == "compute":
        _exercise_flex_scaling(cloud, client)


def _exercise_flex_scaling(cloud: CloudApiEmulator, client: CloudClient) -> None:
    """What an elastic flex-start cluster's controller sends (docs/elastic.md): a slice's bulk MIG
    resized to 0, then from 0 while the zone has no room (it waits), then to 0 again; and the
    zone's preemptions listed."""
    slice_name = names.slice_name(CLUSTER, 0)
    allowed = [names.slice_name(CLUSTER, i) for i in range(2)]
    client.wait_zone_operation(client.resize_mig(slice_name, 0, allowed), 30)
    cloud.state.set_capacity(ZONE, "", 0)  # the next resize waits
    client.wait_zone_operation(client.resize_mig(slice_name, 4, allowed), 30)
    client.wait_zone_operation(client.resize_mig(slice_name, 0, allowed), 30)
    assert client.list_managed_instances(slice_name) == []
    preempted = client.list_preemptions()
    assert preempted and {o["operationType"] for o in preempted} == {"compute.instances.preempted"}
    # A resize request: refused on a bulk MIG (the twin's rule bulk-no-resize-request), accepted
    # on an individual one (no client of rayslice's sends one; the twin serves it to refuse it).
    cloud.add_mig(PROJECT, ZONE, "individual", [])
    body = {"name": "more", "resizeBy": 1, "requestedRunDuration": {"seconds": "3600"}}
    for mig, code in ((slice_name, 400), ("individual", 200)):
        url = client._compute(f"instanceGroupManagers/{mig}/resizeRequests")
        assert client.session.post(url, json=body).status_code == code


def _exercise_gke(cloud: CloudApiEmulator, client: CloudClient) -> None:
    """Status on GKE: a flex-start pool with its nodes, one that waits, one that failed; the list."""
    cloud.state.set_capacity(ZONE, GKE_MACHINE, 4)
    for index, flex in ((0, True), (1, True), (2, False)):
        with contextlib.suppress(CapacityExhausted):  # the fixed pool finds no room: kept in ERROR
            cloud.state.create_node_pool(
                PROJECT, ZONE, CLUSTER, gke_pool(names.slice_name(CLUSTER, index), flex=flex)
            )
    args = ["status", "--set", f"project={PROJECT}", "--set", f"zone={ZONE}", "--set", "platform=gke"]
    assert cli.main([*args, "--set", "slices=3", "--json"]) == 0
    client.request(
        "GET", client._container(CLUSTER, "nodePools")
    )  # nodePools.list, which status need not call


@pytest.mark.parametrize("platform", ["tpu-vm", "compute", "gke"])
def test_every_request_and_response_matches_the_discovery_schemas(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer, platform: str
) -> None:
    if platform == "gke":
        _exercise_gke(cloud, client)
    else:
        _exercise(cloud, client, controller_metadata, platform)
    by_id = {route.method_id: route for route in ROUTES}
    served = [c for c in cloud.calls if c.status == 200]
    assert served, "nothing was served"
    found: list[str] = []
    for call in served:
        assert call.method_id is not None
        route = by_id[call.method_id]
        spec = discovery.method(route.api, call.method_id)
        assert spec["httpMethod"] == call.method
        for name in call.query:
            if name not in spec.get("parameters", {}):
                found.append(f"{call.method_id}: query parameter {name!r} is not in the discovery document")
        if call.request is not None:
            assert "request" in spec, f"{call.method_id} takes no body"
            found += discovery.problems(
                route.api, spec["request"], call.request, call.method_id + " request", request=True
            )
        found += discovery.problems(
            route.api, spec["response"], call.response, call.method_id + " response", request=False
        )
    assert found == []
    used = {c.method_id for c in served}
    apis = {"tpu-vm": ("tpu", "tpu-v2alpha1"), "compute": ("compute",), "gke": ("container",)}
    expected = {r.method_id for r in ROUTES if r.api in apis[platform]}
    # Every emulated method of the platform was exercised.
    assert expected <= used, expected - used


def test_the_validator_catches_invented_fields_wrong_types_enums_and_output_only_requests() -> None:
    node: dict[str, Any] = {"$ref": "Node"}
    assert (
        discovery.problems("tpu", node, {"state": "READY", "acceleratorType": "v6e-16"}, "n", request=False)
        == []
    )
    assert discovery.problems("tpu", node, {"status": "READY"}, "n", request=False)  # no such field
    assert discovery.problems("tpu", node, {"state": "GONE"}, "n", request=False)  # not an enum value
    assert discovery.problems("tpu", node, {"state": "READY"}, "n", request=True)  # output-only in a request
    assert discovery.problems("tpu", node, {"labels": {"a": 1}}, "n", request=False)  # map of strings
    mig: dict[str, Any] = {"$ref": "InstanceGroupManager"}
    assert discovery.problems("compute", mig, {"targetSize": "4"}, "m", request=False)  # int32 is a number
    assert discovery.problems("compute", mig, {"id": 4}, "m", request=False)  # uint64 is a string


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.method_id)
def test_each_emulated_route_is_the_discovery_documents_path_and_method(route: Any) -> None:
    spec = discovery.method(route.api, route.method_id)
    doc = discovery.document(route.api)
    path = spec.get("flatPath", spec["path"])
    prefix = "/" if route.api.startswith("tpu") else "/" + doc["servicePath"]
    template = (prefix + path).replace("+", "")
    ours = _reduce(
        route.pattern.pattern.lstrip("^").rstrip("$").replace("(?P<", "{").replace(">[^/:?]+)", "}")
    )
    assert ours == _reduce(template)
    assert route.method == spec["httpMethod"]
    assert route.response_schema == spec["response"]["$ref"]
    assert route.request_schema == (spec["request"]["$ref"] if "request" in spec else None)
