"""Queued tpu-vm slices: what the program declares for each capacity (a queued resource through
the dynamic provider, never a V2Vm), and the twin's queued resources: they wait in an empty
zone, are fulfilled whole, fail at their deadline with the reason, and the rules Google states
for their shape."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rayslice.cloud import bodies, rules
from rayslice.cloud.capacity import ACTIVE, FAILED, SUSPENDED, WAITING
from rayslice.cloud.twin import CloudTwin
from rayslice.cloud.twin.state import CloudRuleError, TwinHost
from rayslice.errors import InvalidInput
from rayslice.infra import preview
from rayslice.infra.mocks import run_offline
from rayslice.infra.network import SUBNET_CIDR
from rayslice.infra.program import main
from rayslice.names import request_name

STACKS = Path(__file__).resolve().parents[2] / "infra"
QUEUED = str(STACKS / "Pulumi.example-tpu-vm-queued-v6e-16.yaml")
PROJECT, ZONE, SLICE = "my-gcp-project", "us-east5-a", "jax-queued-v6e-16-slice-0"
REQUEST = request_name(SLICE)
KEY = (PROJECT, ZONE, REQUEST)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _twin(free: int | None) -> tuple[CloudTwin, list[TwinHost], Clock]:
    twin = CloudTwin(default_range=SUBNET_CIDR)
    booted: list[TwinHost] = []
    twin.on_host_up = booted.append
    clock = Clock()
    twin.clock = clock
    if free is not None:
        twin.set_capacity(ZONE, "v6e", free)
    return twin, booted, clock


def _state(twin: CloudTwin) -> dict[str, Any]:
    record = twin.queued_resource(*KEY)
    assert record is not None
    return dict(record["state"])


def _request(overrides: list[str]) -> bodies.Request:
    """The example's request with `overrides`; ``KEY=`` leaves KEY unset."""
    config = preview.stack_config(QUEUED, [o for o in overrides if not o.endswith("=")])
    for unset in (o for o in overrides if o.endswith("=")):
        del config[f"rayslice:{unset[:-1]}"]
    run = run_offline(lambda: main().exports, config)
    assert run.of_type(bodies.TPU_NODE) == [] and run.twin.violations() == []
    [queued] = run.of_type(bodies.QUEUED_RESOURCE)
    request = bodies.request(queued.type, queued.inputs)
    assert request is not None
    return request


def test_the_queued_example_waits_in_an_empty_zone_then_its_node_is_created_whole():
    twin, booted, _ = _twin(free=0)
    preview.deploy(preview.stack_config(QUEUED, []), twin)  # returns: the request waits
    assert _state(twin) == {"state": WAITING}
    assert not [h for h in twin.hosts() if h.group == SLICE] and booted == [
        h for h in booted if h.group is None
    ]
    twin.set_capacity(ZONE, "v6e", 3)  # three of the four hosts: still nothing
    assert _state(twin) == {"state": WAITING} and (PROJECT, ZONE, SLICE) not in twin.nodes
    twin.set_capacity(ZONE, "v6e", 4)
    assert _state(twin) == {"state": ACTIVE}
    node = twin.nodes[(PROJECT, ZONE, SLICE)]
    assert node["queuedResource"].endswith(f"/queuedResources/{REQUEST}")
    hosts = [h for h in booted if h.group == SLICE]
    assert [h.worker for h in hosts] == [0, 1, 2, 3]
    assert "startup-script" in hosts[0].metadata and hosts[0].metadata["agent-worker-number"] == "0"
    assert twin.capacity.free[(ZONE, "v6e")] == 0


def test_a_request_still_waiting_at_its_deadline_fails_with_the_reason():
    twin, _, clock = _twin(free=0)
    preview.deploy(preview.stack_config(QUEUED, []), twin)  # queueDeadlineHours: 24
    clock.now += 24 * 3600 - 1
    assert _state(twin) == {"state": WAITING}
    clock.now += 1
    state = _state(twin)
    assert state["state"] == FAILED
    assert (
        "deadline passed before zone us-east5-a had 4 free v6e host(s)"
        in state["failedData"]["error"]["message"]
    )
    twin.set_capacity(ZONE, "v6e", 4)  # too late: a failed request is never fulfilled
    assert _state(twin)["state"] == FAILED and (PROJECT, ZONE, SLICE) not in twin.nodes


def test_a_preempted_queued_node_suspends_its_request_and_delete_needs_force():
    twin, _, _ = _twin(free=None)
    preview.deploy(preview.stack_config(QUEUED, []), twin)
    twin.preempt(PROJECT, ZONE, SLICE)
    assert _state(twin) == {"state": SUSPENDED, "stateInitiator": "SERVICE"}
    with pytest.raises(InvalidInput, match="delete with force"):
        twin.delete_queued_resource(*KEY)
    twin.delete_queued_resource(*KEY, force=True)
    assert twin.queued_resource(*KEY) is None and (PROJECT, ZONE, SLICE) not in twin.nodes


@pytest.mark.parametrize(
    ("overrides", "api", "fields"),
    [
        ([], "tpu", {"spot": {}, "queueingPolicy": {"validUntilDuration": "86400s"}}),
        (["capacity=on-demand", "queueDeadlineHours="], "tpu", {}),
        (
            ["capacity=reserved", "reservation=r1"],
            "tpu",
            {
                "reservationName": f"projects/{PROJECT}/locations/{ZONE}/reservations/r1",
                "queueingPolicy": {"validUntilDuration": "86400s"},
            },
        ),
        (  # D6: any matching reservation, as gcloud's --reserved names it
            ["capacity=reserved"],
            "tpu",
            {
                "reservationName": f"projects/{PROJECT}/locations/{ZONE}/reservations/-",
                "queueingPolicy": {"validUntilDuration": "86400s"},
            },
        ),
        (  # D6: a calendar-mode reservation is consumed reservation-bound (v2alpha1 only)
            ["capacity=reserved", "reservation=r1", "calendarMode=true"],
            "tpu-v2alpha1",
            {
                "reservationName": f"projects/{PROJECT}/locations/{ZONE}/reservations/r1",
                "provisioningModel": "RESERVATION_BOUND",
                "queueingPolicy": {"validUntilDuration": "86400s"},
            },
        ),
        (
            ["capacity=flex-start", "maxRunHours=48"],
            "tpu-v2alpha1",
            {
                "provisioningModel": "FLEX_START",
                "runDuration": {"maxRunDuration": "172800s"},
                "queueingPolicy": {"validUntilDuration": "86400s"},
            },
        ),
    ],
)
def test_each_capacity_is_the_request_googles_api_takes(overrides, api, fields):
    request = _request(overrides)
    assert request.api == api and request.name == REQUEST
    assert {k: v for k, v in request.body.items() if k != "tpu"} == fields
    [spec] = request.body["tpu"]["nodeSpec"]
    assert spec["nodeId"] == SLICE and spec["parent"] == f"projects/{PROJECT}/locations/{ZONE}"
    node = spec["node"]
    assert node["acceleratorConfig"] == {"type": "V6E", "topology": "4x4"}
    assert node["serviceAccount"]["scope"] and "startup-script" in node["metadata"]
    # The capacity is the request's; gcloud's queued-resources create sets none of it on the node.
    assert "schedulingConfig" not in node


def _violations(body: dict[str, Any], api: str = "tpu") -> list[str]:
    request = bodies.Request(
        api, "tpu.projects.locations.queuedResources.create", "QueuedResource", "q", body
    )
    resource = rules.Resource(bodies.QUEUED_RESOURCE, "urn:q", "q", request)
    return [v.message for v in rules.check(rules.Stack([resource]))]


NODE_SPEC = {"tpu": {"nodeSpec": [{"parent": "projects/p/locations/z", "nodeId": "n", "node": {"x": 1}}]}}


def test_the_rules_refuse_two_tiers_alpha_fields_on_v2_and_malformed_names():
    assert _violations(NODE_SPEC) == []
    assert _violations({**NODE_SPEC, "spot": {}, "guaranteed": {}}) == [
        "sets tiers spot, guaranteed; a queued resource takes one tier at most"
    ]
    flex = {**NODE_SPEC, "provisioningModel": "FLEX_START", "runDuration": {"maxRunDuration": "3600s"}}
    assert len(_violations(flex)) == 2 and _violations(flex, "tpu-v2alpha1") == []
    assert _violations({**NODE_SPEC, "reservationName": "r1"})
    assert _violations({**NODE_SPEC, "queueingPolicy": {"validUntilDuration": "2h"}})
    assert _violations({"tpu": {"nodeSpec": [{"nodeId": "bad/id", "node": {"x": 1}}]}}) == [
        "a node spec needs its parent and its node",
        "nodeId 'bad/id' does not match ^[A-Za-z0-9_.~+%-]+$",
    ]


def test_the_twin_refuses_a_queued_node_that_breaks_a_node_rule():
    """The node rules read a queued resource's node as they read a V2Vm's."""
    twin, _, _ = _twin(free=None)
    node = {"acceleratorType": "v6e-16", "acceleratorConfig": {"type": "V6E", "topology": "4x4"}}
    body = {"tpu": {"nodeSpec": [{"parent": "projects/p/locations/z", "nodeId": "n", "node": node}]}}
    request = bodies.Request(
        "tpu", "tpu.projects.locations.queuedResources.create", "QueuedResource", "q", body
    )
    with pytest.raises(CloudRuleError, match="tpu-node-exclusive-fields"):
        twin.apply(bodies.QUEUED_RESOURCE, "q", request, project=PROJECT, zone=ZONE)


def test_a_flex_start_run_that_ends_deletes_the_node_and_suspends_the_request():
    """Item 4 of issue 40 (Cloud TPU, flex-start: at the end of the run duration the VMs are
    deleted and the queued resource moves to SUSPENDED)."""
    twin, _, _ = _twin(free=None)
    preview.deploy(preview.stack_config(QUEUED, ["capacity=flex-start", "maxRunHours=24"]), twin)
    assert _state(twin) == {"state": ACTIVE} and (PROJECT, ZONE, SLICE) in twin.nodes
    twin.end_run(PROJECT, ZONE, REQUEST)
    assert _state(twin) == {"state": SUSPENDED, "stateInitiator": "SERVICE"}
    assert (PROJECT, ZONE, SLICE) not in twin.nodes and not [h for h in twin.hosts() if h.group == SLICE]
