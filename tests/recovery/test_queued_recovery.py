"""A queued tpu-vm slice as the recovery controller and `rayslice status` treat it, by its
capacity cell (`rayslice.capacity_table`): a flex-start request SUSPENDED at the end of its run
duration has ended and is not requested again (D5); a recreated request's node carries one of
each pair of fields the TPU API refuses together (D10)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rayslice import cli, names
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.local.google.metadata_server import MetadataServer
from rayslice.recovery.cloud import CloudClient
from rayslice.recovery.controller import ENDED_OUTCOME
from tests.recovery.conftest import CLUSTER, PROJECT, ZONE, make_controller, seed_queued

SLICE0, SLICE1 = names.slice_name(CLUSTER, 0), names.slice_name(CLUSTER, 1)
FLEX = {"provisioningModel": "FLEX_START", "runDuration": {"maxRunDuration": "86400s"}}


def test_a_flex_start_request_suspended_at_its_run_duration_has_ended_and_is_not_requested_again(
    cloud: CloudApiEmulator,
    client: CloudClient,
    controller_metadata: MetadataServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Cloud TPU, "Request Cloud TPUs using flex-start": at the end of the run duration the VMs
    are deleted and the queued resource moves to SUSPENDED. Requesting it again would run the
    cluster past maxRunHours, which bounds its cost."""
    seed_queued(cloud, **FLEX)
    controller, stream = make_controller(client, "tpu-vm", controller_metadata)
    controller.step()  # both requests ACTIVE, their nodes READY
    cloud.preempt(PROJECT, ZONE, SLICE1)  # what the run's end leaves: no node, the request SUSPENDED
    for _ in range(3):
        controller.step()

    assert cloud.mutations() == []  # nothing deleted, nothing requested again
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(e["slice"], e["action"], e["outcome"]) for e in events] == [(SLICE1, "none", ENDED_OUTCOME)]
    assert "ended: run duration reached" in events[0]["seen"]

    where = ["--set", f"project={PROJECT}", "--set", f"zone={ZONE}", "--set", "slices=2"]
    flex = [
        "status",
        *where,
        "--set",
        "platform=tpu-vm",
        "--set",
        "queued=true",
        "--set",
        "capacity=flex-start",
    ]
    assert cli.main(flex) == 0
    text = capsys.readouterr().out
    assert (
        f"queued resource {names.request_name(SLICE1)}: SUSPENDED, ended: run duration reached; Google "
        "deleted the hosts and suspended the request; not requested again"
    ) in text


def test_a_spot_request_suspended_by_a_preemption_is_still_requested_again(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    """The same state on Spot capacity means a preemption: the controller asks again."""
    seed_queued(cloud, spot={})
    controller, _ = make_controller(client, "tpu-vm", controller_metadata)
    controller.step()
    cloud.preempt(PROJECT, ZONE, SLICE1)
    controller.step()
    assert [c.method_id for c in cloud.mutations()] == [
        "tpu.projects.locations.queuedResources.delete",
        "tpu.projects.locations.queuedResources.create",
    ]


def test_a_recreated_request_carries_one_of_each_pair_of_node_fields_the_api_refuses_together(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    """D10: nodes.get may answer with both acceleratorConfig and acceleratorType (and both
    network fields); the round-3 pruning that a directly created node gets applies to the node of
    a recreated queued resource too (tpu v2 discovery document: the two are mutually exclusive)."""
    seed_queued(cloud, spot={})
    for index in range(2):  # the API's answer: both of each pair
        key = (PROJECT, ZONE, names.request_name(names.slice_name(CLUSTER, index)))
        node = cloud.state.queued[key]["tpu"]["nodeSpec"][0]["node"]
        node["acceleratorConfig"] = {"type": "V6E", "topology": "4x4"}
        node["networkConfigs"] = [node["networkConfig"]]
    controller, _ = make_controller(client, "tpu-vm", controller_metadata)
    controller.step()
    cloud.preempt(PROJECT, ZONE, SLICE1)
    controller.step()
    create = cloud.mutations()[-1]
    assert create.method_id == "tpu.projects.locations.queuedResources.create"
    assert create.status == 200, create.response
    node = create.request["tpu"]["nodeSpec"][0]["node"]
    assert "acceleratorConfig" in node and "acceleratorType" not in node
    assert "networkConfig" in node and "networkConfigs" not in node


@pytest.fixture(autouse=True)
def _no_adc_leak(adc: Path) -> None:
    """`rayslice status` reads the emulation through the same credentials as the controller."""
