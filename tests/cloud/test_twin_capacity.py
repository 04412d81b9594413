"""The twin's capacity applied to what the program declares: a direct create in an empty zone
fails with Google's error, a flex-start slice's bulk MIG waits and is created whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rayslice.cloud.capacity import CANCELLED, ZONE_RESOURCE_POOL_EXHAUSTED
from rayslice.cloud.twin import CloudTwin
from rayslice.cloud.twin.compute import BulkModeError
from rayslice.cloud.twin.state import TwinHost
from rayslice.infra import preview
from rayslice.infra.network import SUBNET_CIDR
from rayslice.names import ATTR_SLICE_HOSTS, ATTR_SLICE_NAME, address_name

STACKS = Path(__file__).resolve().parents[2] / "infra"
FLEX = "Pulumi.example-compute-flex-v6e-16.yaml"
ZONE, HOST_TYPE = "us-east5-a", "ct6e-standard-4t"  # the example's zone and v6e-16's machine type
PROJECT, SLICE = "my-gcp-project", "jax-flex-v6e-16-slice-0"


def _twin(free: int | None) -> tuple[CloudTwin, list[TwinHost]]:
    twin = CloudTwin(default_range=SUBNET_CIDR)
    booted: list[TwinHost] = []
    twin.on_host_up = booted.append
    if free is not None:
        twin.set_capacity(ZONE, HOST_TYPE, free)
    return twin, booted


def _slice_hosts(twin: CloudTwin) -> list[TwinHost]:
    return [h for h in twin.hosts() if h.group == SLICE]


def _creating(twin: CloudTwin, slice_name: str) -> list[dict[str, Any]]:
    """The slice's managed instances the MIG is still creating (no instance status yet)."""
    records = twin.instances[(PROJECT, ZONE, slice_name)]
    return [r for r in records if r["currentAction"] == "CREATING" and "instanceStatus" not in r]


def test_a_direct_create_in_an_empty_zone_creates_nothing_and_lists_every_host_as_being_created():
    """N1: an individual-mode MIG accepts each host's createInstances and keeps trying to create
    the instance (About bulk mode: it "attempts to create the remaining instances as capacity
    becomes available"); each managed instance says why in lastAttempt."""
    twin, _ = _twin(free=0)
    preview.deploy(
        preview.stack_config(str(STACKS / "Pulumi.example-compute-v6e-16.yaml"), [f"zone={ZONE}"]), twin
    )
    slice_name = "jax-compute-v6e-16-slice-0"
    assert [h for h in twin.hosts() if h.group is not None] == []
    waiting = _creating(twin, slice_name)
    assert len(waiting) == 4 and twin.migs[(PROJECT, ZONE, slice_name)]["targetSize"] == 4
    for record in waiting:
        [error] = record["lastAttempt"]["errors"]["errors"]
        assert (
            error["code"] == ZONE_RESOURCE_POOL_EXHAUSTED
            and f"projects/{PROJECT}/zones/{ZONE}" in error["message"]
        )


def test_a_direct_create_takes_what_there_is_and_the_rest_when_hosts_come():
    """Each per-instance config is its own createInstances call: in a zone with 3 of the 4 hosts
    three are created and the fourth waits (the partial slice that bulk mode avoids), created
    once a host is free."""
    twin, booted = _twin(free=3)
    preview.deploy(
        preview.stack_config(str(STACKS / "Pulumi.example-compute-v6e-16.yaml"), [f"zone={ZONE}"]), twin
    )
    slice_name = "jax-compute-v6e-16-slice-0"
    assert len([h for h in twin.hosts() if h.group == slice_name]) == 3
    assert twin.capacity.free[(ZONE, HOST_TYPE)] == 0
    [late] = _creating(twin, slice_name)
    twin.set_capacity(ZONE, HOST_TYPE, 1)
    assert _creating(twin, slice_name) == [] and twin.capacity.free[(ZONE, HOST_TYPE)] == 0
    assert booted[-1].name == late["name"] and twin.vms[(PROJECT, ZONE, late["name"])].worker == 3
    assert sorted(h.worker for h in twin.hosts() if h.group == slice_name) == [0, 1, 2, 3]


def test_a_reserved_slice_is_one_bulk_create_that_waits_for_every_host_and_takes_no_second():
    """D4 (issue 40): a reserved slice's bulk MIG gets all four hosts from one createInstances at
    target size 0; with 3 of the 4 hosts free it creates none (bulk mode: all or none, it waits),
    and once the reservation has room all four come, under rayslice's names and at their reserved
    addresses. A second createInstances is refused while the target size is above 0."""
    twin, _ = _twin(free=3)
    overrides = [f"zone={ZONE}", "capacity=reserved", "reservation=team-v6e", "head=vm"]
    preview.deploy(
        preview.stack_config(str(STACKS / "Pulumi.example-compute-v6e-16.yaml"), overrides), twin
    )  # no ZONE_RESOURCE_POOL_EXHAUSTED: the bulk MIG waits
    slice_name = "jax-compute-v6e-16-slice-0"
    key = (PROJECT, ZONE, slice_name)
    mig = twin.migs[key]
    assert mig["targetSizePolicy"] == {"mode": "BULK"} and mig["targetSize"] == 4
    assert len(_creating(twin, slice_name)) == 4 and [h for h in twin.hosts() if h.group == slice_name] == []
    twin.set_capacity(ZONE, HOST_TYPE, 4)
    hosts = sorted((h for h in twin.hosts() if h.group == slice_name), key=lambda h: h.name)
    assert [h.name for h in hosts] == [f"{slice_name}-w{w}" for w in range(4)]
    assert [h.ip for h in hosts] == [twin.addresses[address_name(h.name)] for h in hosts]
    with pytest.raises(BulkModeError, match="target size 4"):
        twin.create_instances(PROJECT, ZONE, mig, [{"name": f"{slice_name}-w9"}])
    assert len(twin.instances[key]) == 4 and twin.violations() == []


def test_a_flex_start_slice_waits_in_an_empty_zone_and_is_created_whole_when_capacity_comes():
    """D1 (issue 40): the documented bulk form. The MIG is inserted in bulk mode with its target
    size set to the slice's hosts and a FLEX_START template that carries the run duration; no
    resize request (bulk mode takes none). It waits, creating nothing, until the zone has them all."""
    twin, booted = _twin(free=0)
    preview.deploy(preview.stack_config(str(STACKS / FLEX), []), twin)  # returns: the MIG waits
    key = (PROJECT, ZONE, SLICE)
    assert twin.resize_requests_of(*key) == []
    mig = twin.migs[key]
    assert mig["targetSizePolicy"] == {"mode": "BULK"} and mig["targetSize"] == 4
    assert mig["instanceLifecyclePolicy"] == {"defaultActionOnFailure": "DO_NOTHING"}
    template = twin._template_of(mig)
    assert template is not None
    scheduling = template["properties"]["scheduling"]
    assert scheduling["provisioningModel"] == "FLEX_START"
    assert scheduling["maxRunDuration"] == {"seconds": "86400"}  # maxRunHours: 24
    assert _slice_hosts(twin) == [] and len(_creating(twin, SLICE)) == 4  # placeholders only

    twin.set_capacity(ZONE, HOST_TYPE, 3)  # not enough for all four: nothing is created
    assert _slice_hosts(twin) == []

    twin.set_capacity(ZONE, HOST_TYPE, 5)
    hosts = _slice_hosts(twin)
    assert twin.migs[key]["targetSize"] == 4 and twin.capacity.free[(ZONE, HOST_TYPE)] == 1
    # Named by the MIG: <baseInstanceName>-<4 characters>, not rayslice's -w<i>.
    assert all(h.name.startswith(f"{SLICE}-") and len(h.name) == len(SLICE) + 5 for h in hosts)
    assert len({h.name for h in hosts}) == 4 and {h.name for h in booted} >= {h.name for h in hosts}
    # Each host knows its worker and its peers from Google's attributes alone: rayslice wrote no
    # list of names it could not know, only the slice's name.
    assert sorted(int(h.metadata["worker-id"]) for h in hosts) == [0, 1, 2, 3]
    endpoints = {h.metadata["worker-network-endpoints"] for h in hosts}
    assert len(endpoints) == 1 and endpoints.pop().count("unknown:unknown:") == 4
    assert all(ATTR_SLICE_HOSTS not in h.metadata and h.metadata[ATTR_SLICE_NAME] == SLICE for h in hosts)
    assert twin.violations() == []


def test_in_a_zone_with_room_the_request_is_fulfilled_at_once():
    twin, _ = _twin(free=None)
    preview.deploy(preview.stack_config(str(STACKS / FLEX), []), twin)
    assert len(_slice_hosts(twin)) == 4 and twin.violations() == []


def test_deleting_the_mig_withdraws_its_waiting_request_and_gives_its_hosts_back():
    twin, _ = _twin(free=0)
    preview.deploy(preview.stack_config(str(STACKS / FLEX), []), twin)
    [wait] = twin.capacity.waiting()
    twin.delete_mig(PROJECT, ZONE, SLICE)
    assert wait.state == CANCELLED and twin.capacity.waiting() == []
    twin.set_capacity(ZONE, HOST_TYPE, 4)
    assert _slice_hosts(twin) == []  # nothing is created for a withdrawn request

    # A new request, in a project with room (deploying again into `twin` would be refused: it
    # holds the rest of the stack, rule already-exists), is fulfilled at once; deleting its MIG
    # gives the hosts back.
    fresh, _ = _twin(free=4)
    preview.deploy(preview.stack_config(str(STACKS / FLEX), []), fresh)
    assert len(_slice_hosts(fresh)) == 4 and fresh.capacity.free[(ZONE, HOST_TYPE)] == 0
    fresh.delete_mig(PROJECT, ZONE, SLICE)
    assert fresh.capacity.free[(ZONE, HOST_TYPE)] == 4
