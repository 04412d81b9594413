"""What a MIG shows while the zone lacks hosts, over the twin's clock: an individual-mode MIG
creates what the zone has and the rest as hosts come (N1), a bulk MIG waits with one
placeholder per host and says why in its bulk instance operation (N2), and a resize request on
a bulk MIG is refused through the API too (D8). Shapes are checked against Google's discovery
document."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests

from rayslice import catalog
from rayslice.cloud.capacity import ZONE_RESOURCE_POOL_EXHAUSTED
from rayslice.cloud.twin.clock import TwinClock
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.local.google.cloud_api.routes import ApiError
from tests import serving
from tests.cloud.timeline import PROJECT, V6E_HOST, ZONE, hosts, mig, template
from tests.recovery.discovery import problems

START = 1_800_000_000.0


@pytest.fixture
def cloud() -> Iterator[CloudApiEmulator]:
    """The emulated APIs over a twin on the test's clock, serving (handlers are also called
    directly)."""
    emulator = CloudApiEmulator()
    emulator.state.clock = TwinClock.manual(START)
    serving.start(emulator)
    yield emulator
    serving.stop(emulator)


def _where(name: str) -> dict[str, str]:
    return {"project": PROJECT, "zone": ZONE, "name": name}


def _listed(cloud: CloudApiEmulator, name: str) -> list[dict[str, Any]]:
    """listManagedInstances through the emulated API, checked against the discovery document."""
    answer = cloud.mig_instances(_where(name), {}, None)
    schema = {"$ref": "InstanceGroupManagersListManagedInstancesResponse"}
    assert problems("compute", schema, answer, "listManagedInstances", request=False) == []
    return list(answer["managedInstances"])


def _got(cloud: CloudApiEmulator, name: str) -> dict[str, Any]:
    """instanceGroupManagers.get through the emulated API, checked against the document."""
    answer = cloud.mig_get(_where(name), {}, None)
    assert problems("compute", {"$ref": "InstanceGroupManager"}, answer, "get", request=False) == []
    return dict(answer)


def _being_created(records: list[dict[str, Any]]) -> list[str]:
    return [r["name"] for r in records if r["currentAction"] == "CREATING" and "instanceStatus" not in r]


def test_an_individual_mig_creates_what_the_zone_has_then_the_rest_as_capacity_arrives(cloud) -> None:
    twin = cloud.state
    twin.set_capacity(ZONE, V6E_HOST, 1)
    slice_mig = mig(twin, "s", template(twin, "od"))
    for config in hosts(4):  # one createInstances per host, as an individual slice's program sends
        twin.create_instances(PROJECT, ZONE, slice_mig, [config])
    records = _listed(cloud, "s")
    assert [r["name"] for r in records if r.get("instanceStatus") == "RUNNING"] == ["s-w0"]
    assert _being_created(records) == ["s-w1", "s-w2", "s-w3"]
    for record in records[1:]:
        [error] = record["lastAttempt"]["errors"]["errors"]
        assert error["code"] == ZONE_RESOURCE_POOL_EXHAUSTED and ZONE in error["message"]
    assert _got(cloud, "s")["targetSize"] == 4
    # Capacity arrives piecemeal: one host after an hour, two more after three.
    twin.schedule_capacity(ZONE, V6E_HOST, 1, at=START + 3600)
    twin.schedule_capacity(ZONE, V6E_HOST, 2, at=START + 3 * 3600)
    twin.advance(3600)
    assert _being_created(_listed(cloud, "s")) == ["s-w2", "s-w3"]
    twin.advance(2 * 3600)
    records = _listed(cloud, "s")
    assert _being_created(records) == [] and {r["instanceStatus"] for r in records} == {"RUNNING"}
    assert sorted(v.worker for v in twin.vms.values()) == [0, 1, 2, 3]
    # The bill: 1 host for 1 h, 2 for 2 h, all wasted (the slice was not whole); then whole.
    host_hour = catalog.chip_hour_price("v6e", catalog.region_of(ZONE), "on-demand") * 4
    assert twin.bill.wasted() == pytest.approx(1 + 2 * 2)
    assert twin.bill.wasted_usd() == pytest.approx(5 * host_hour)
    twin.advance(3600)
    assert twin.bill.wasted() == pytest.approx(5) and twin.bill.host_hours() == pytest.approx(5 + 4)


def test_an_instance_still_being_created_that_is_deleted_is_no_longer_waited_for(cloud) -> None:
    twin = cloud.state
    twin.set_capacity(ZONE, V6E_HOST, 0)
    slice_mig = mig(twin, "s", template(twin, "od"))
    twin.create_instances(PROJECT, ZONE, slice_mig, hosts(2))
    twin.delete_instances(PROJECT, ZONE, "s", [f"zones/{ZONE}/instances/s-w1"], skip_invalid=False)
    assert _being_created(_listed(cloud, "s")) == ["s-w0"] and slice_mig["targetSize"] == 1
    twin.resize_mig(PROJECT, ZONE, "s", 0)  # what is still being created goes first
    assert _listed(cloud, "s") == [] and twin.capacity.waiting() == []
    twin.set_capacity(ZONE, V6E_HOST, 4)
    assert twin.vms == {}


def test_a_bulk_mig_waits_with_placeholders_and_its_bulk_operation_says_why(cloud) -> None:
    twin = cloud.state
    twin.set_capacity(ZONE, V6E_HOST, 3)
    link = template(twin, "flex", provisioningModel="FLEX_START", instanceTerminationAction="DELETE")
    slice_mig = mig(twin, "s", link, bulk=True)
    twin.create_instances(PROJECT, ZONE, slice_mig, hosts(4))
    # "During this waiting period, the MIG creates managed instances" (About bulk mode).
    assert _being_created(_listed(cloud, "s")) == ["s-w0", "s-w1", "s-w2", "s-w3"] and twin.vms == {}
    operation = _got(cloud, "s")["status"]["bulkInstanceOperation"]
    assert operation["inProgress"] is True
    check = operation["lastProgressCheck"]
    assert check["timestamp"] == "2027-01-15T08:00:00Z"
    [error] = check["error"]["errors"]
    assert (
        error["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"
        and "4 x ct6e-standard-4t" in error["message"]
    )
    assert twin.bill.host_hours() == 0  # placeholders bill nothing
    twin.schedule_capacity(ZONE, V6E_HOST, 4, at=START + 600)
    twin.advance(600)
    records = _listed(cloud, "s")
    assert [r["name"] for r in records] == ["s-w0", "s-w1", "s-w2", "s-w3"]
    assert {r["instanceStatus"] for r in records} == {"RUNNING"}
    operation = _got(cloud, "s")["status"]["bulkInstanceOperation"]
    assert operation == {"inProgress": False, "lastProgressCheck": {"timestamp": "2027-01-15T08:10:00Z"}}


def test_a_bulk_mig_resized_to_zero_while_it_waits_drops_its_placeholders(cloud) -> None:
    twin = cloud.state
    twin.set_capacity(ZONE, V6E_HOST, 0)
    link = template(twin, "flex", provisioningModel="FLEX_START", instanceTerminationAction="DELETE")
    mig(twin, "s", link, bulk=True)
    twin.resize_mig(PROJECT, ZONE, "s", 4)
    assert len(_being_created(_listed(cloud, "s"))) == 4
    twin.resize_mig(PROJECT, ZONE, "s", 0)
    assert (
        _listed(cloud, "s") == []
        and _got(cloud, "s")["status"]["bulkInstanceOperation"]["inProgress"] is False
    )
    twin.set_capacity(ZONE, V6E_HOST, 4)
    assert twin.vms == {}


def test_a_resize_request_on_a_bulk_mig_is_refused_through_the_api(cloud) -> None:
    twin = cloud.state
    link = template(twin, "flex", provisioningModel="FLEX_START", instanceTerminationAction="DELETE")
    mig(twin, "bulk", link, bulk=True)
    mig(twin, "individual", link)
    body = {"name": "r1", "resizeBy": 4, "requestedRunDuration": {"seconds": "3600"}}
    with pytest.raises(ApiError) as refused:
        cloud.resize_request_insert(_where("bulk"), {}, body)
    assert refused.value.code == 400 and "bulk-no-resize-request" in str(refused.value.body())
    assert (
        twin.resize_requests_of(PROJECT, ZONE, "bulk") == []
        and twin.refused[-1].rule == "bulk-no-resize-request"
    )
    answer = cloud.resize_request_insert(_where("individual"), {}, body)
    assert answer["kind"] == "compute#operation"
    [request] = twin.resize_requests_of(PROJECT, ZONE, "individual")
    assert request["name"] == "r1" and request["state"] == "SUCCEEDED"  # an unlimited zone


def test_what_fell_due_happens_before_the_emulated_api_answers(cloud) -> None:
    """A clock moved by hand (as a controller test moves the clock it shares with the twin): the
    capacity that arrived meanwhile is applied before the next HTTP request is answered."""
    twin = cloud.state
    twin.set_capacity(ZONE, V6E_HOST, 0)
    twin.create_instances(PROJECT, ZONE, mig(twin, "s", template(twin, "od")), hosts(1))
    twin.schedule_capacity(ZONE, V6E_HOST, 1, at=START + 600)
    twin.clock.now += 600  # nothing runs yet
    assert _being_created(twin.instances[(PROJECT, ZONE, "s")]) == ["s-w0"]
    cloud.tokens.add("t")
    mig_url = f"{cloud.url}/compute/v1/projects/{PROJECT}/zones/{ZONE}/instanceGroupManagers/s"
    url = f"{mig_url}/listManagedInstances"
    answer = requests.post(url, headers={"Authorization": "Bearer t"}, timeout=10).json()
    assert [(r["name"], r["instanceStatus"]) for r in answer["managedInstances"]] == [("s-w0", "RUNNING")]
