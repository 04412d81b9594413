"""What the Pulumi program sends is its capacity cell: for each compute and tpu-vm cell, the REST
body of the request that carries the capacity (the instance template, the MIG's failure action,
the TPU node, the queued resource) holds every field of the cell's call, filled in."""

from __future__ import annotations

from typing import Any

import pytest

from rayslice import capacity_table, names
from rayslice.cloud import bodies
from rayslice.infra.mocks import OfflineRun, run_offline
from rayslice.infra.preview import pulumi_config
from rayslice.infra.program import main

PROJECT, ZONE, RESERVATION = "my-gcp-project", "us-east5-a", "team-v6e"
# The stack keys of each cell (capacity_table.capacity_of reads them back).
KEYS: dict[str, dict[str, Any]] = {
    capacity_table.ON_DEMAND: {},
    capacity_table.SPOT: {"capacity": "spot"},
    capacity_table.RESERVED: {"capacity": "reserved", "reservation": RESERVATION},
    capacity_table.RESERVED_ANY: {"capacity": "reserved"},
    capacity_table.RESERVED_CALENDAR: {
        "capacity": "reserved",
        "reservation": RESERVATION,
        "calendarMode": True,
    },
    capacity_table.RESERVED_ALL_CAPACITY: {
        "capacity": "reserved",
        "reservation": RESERVATION,
        "capacityMode": "all-capacity",
    },
    capacity_table.FLEX_START: {"capacity": "flex-start", "maxRunHours": 2},
}
VALUES = {
    capacity_table.PROJECT: PROJECT,
    capacity_table.ZONE: ZONE,
    capacity_table.RESERVATION_NAME: RESERVATION,
    capacity_table.MAX_RUN_SECONDS: 7200,
}


def _run(cell: capacity_table.Cell) -> OfflineRun:
    """The program of a one-slice v6e-16 stack of `cell` (head on a VM), applied to a twin."""
    raw = {
        "name": "cells",
        "project": PROJECT,
        "platform": cell.platform,
        "acceleratorType": "v6e-16",
        "zone": ZONE,
        "head": "vm",
        **({"queued": True} if cell.queued else {}),
        **KEYS[cell.capacity],
    }
    run = run_offline(lambda: main().exports, pulumi_config(raw))
    assert run.twin.violations() == []
    return run


def _sent(cell: capacity_table.Cell, type_token: str) -> list[dict[str, Any]]:
    found = [bodies.request(r.type, r.inputs) for r in _run(cell).of_type(type_token)]
    return [r.body for r in found if r is not None]


def _holds(sent: Any, wanted: Any) -> bool:
    """Whether `sent` has every field of `wanted` with the same value (a template's fields sit
    under ``properties``; numbers may travel as strings, as int64 fields do)."""
    if isinstance(wanted, dict):
        return isinstance(sent, dict) and all(k in sent and _holds(sent[k], v) for k, v in wanted.items())
    return sent == wanted or str(sent) == str(wanted)


COMPUTE = [c for c in capacity_table.CELLS if c.platform == capacity_table.COMPUTE]
TPU_VM = [c for c in capacity_table.CELLS if c.platform == capacity_table.TPU_VM]


@pytest.mark.parametrize("cell", COMPUTE, ids=lambda c: c.key)
def test_a_compute_slices_template_and_failure_action_are_its_cells(cell: capacity_table.Cell) -> None:
    [template] = _sent(cell, bodies.TEMPLATE)
    wanted = capacity_table.fill(cell.calls[0].body, VALUES)
    assert _holds(template, wanted), (template.get("properties", {}).get("scheduling"), wanted)
    [mig] = _sent(cell, bodies.MIG)
    assert mig["instanceLifecyclePolicy"] == {"defaultActionOnFailure": cell.failure_action}


@pytest.mark.parametrize("cell", COMPUTE, ids=lambda c: c.key)
def test_a_compute_slices_mig_mode_and_create_calls_are_its_cells(cell: capacity_table.Cell) -> None:
    """Issue 40 D4: the MIG's mode as Google reads it (``targetSizePolicy.mode``; none is
    INDIVIDUAL, compute v1 discovery: "This is the default mode") is the cell's ``mig_mode``, its
    target size at insert is the cell's (0 where createInstances names the hosts), and the hosts
    come in as many createInstances calls as the mode takes: one for every host of a bulk MIG grown
    from 0 (reserved: bulk mode adds hosts only while the target size is 0), one per host in
    individual mode, none where the MIG names them (flex-start). The twin then holds the slice's
    hosts, named and at their reserved addresses where rayslice names them."""
    run = _run(cell)
    [mig_registration] = run.of_type(bodies.MIG)
    mig = bodies.request(bodies.MIG, mig_registration.inputs)
    assert mig is not None
    sent_mode = mig.body.get("targetSizePolicy", {}).get("mode", capacity_table.INDIVIDUAL)
    assert sent_mode == cell.mig_mode
    calls = [
        request
        for r in run.registrations
        if (request := bodies.request(r.type, r.inputs)) is not None
        and request.method == "compute.instanceGroupManagers.createInstances"
    ]
    hosts = 4  # v6e-16: four ct6e-standard-4t hosts
    named = [str(i["name"]) for c in calls for i in c.body["instances"]]
    if cell.target_size == capacity_table.TARGET_AT_INSERT:
        assert mig.body["targetSize"] == hosts and calls == []
    else:
        assert mig.body["targetSize"] == 0
        assert len(calls) == (1 if cell.mig_mode == capacity_table.BULK else hosts)
        assert sorted(named) == [f"cells-slice-0-w{w}" for w in range(hosts)]
    [(key, held)] = run.twin.migs.items()
    assert held.get("targetSizePolicy", {}).get("mode", capacity_table.INDIVIDUAL) == cell.mig_mode
    vms = [vm for k, vm in run.twin.vms.items() if vm.group == key[2]]
    assert len(vms) == held["targetSize"] == hosts
    if named:  # each host at its reserved address
        assert sorted(vm.name for vm in vms) == sorted(named)
        assert all(vm.ip == run.twin.addresses[names.address_name(vm.name)] for vm in vms)


@pytest.mark.parametrize("cell", TPU_VM, ids=lambda c: c.key)
def test_a_tpu_vm_slices_node_or_request_is_its_cell(cell: capacity_table.Cell) -> None:
    [call] = cell.calls
    wanted = capacity_table.fill(call.body, VALUES)
    if cell.queued:
        [request] = _sent(cell, bodies.QUEUED_RESOURCE)
        assert _holds(request, wanted), request
        node = request["tpu"]["nodeSpec"][0]["node"]
        assert "schedulingConfig" not in node  # the capacity is the request's
    else:
        [node] = _sent(cell, bodies.TPU_NODE)
        assert _holds(node, wanted), node


GKE = [c for c in capacity_table.CELLS if c.platform == capacity_table.GKE]


@pytest.mark.parametrize("cell", GKE, ids=lambda c: c.key)
def test_a_gke_slices_node_pool_is_its_cell(cell: capacity_table.Cell) -> None:
    """Each TPU pool's nodePools.create holds the cell's fields, its NodeManagement.autoRepair
    included (on, GKE's default for new pools, sent anyway; off for flex-start)."""
    [call] = cell.calls
    wanted = capacity_table.fill(call.body, VALUES)
    pools = [body["nodePool"] for body in _sent(cell, bodies.NODE_POOL)]
    tpu_pools = [p for p in pools if "-slice-" in p["name"]]  # not the head's CPU pool
    assert tpu_pools and all(_holds(p, wanted) for p in tpu_pools), (tpu_pools, wanted)


@pytest.mark.parametrize("cell", COMPUTE, ids=lambda c: c.key)
def test_a_compute_template_restarts_its_hosts_unless_spot(cell: capacity_table.Cell) -> None:
    """Failure recovery of a slice 'is controlled by the automatic restart setting': every model
    but Spot (which cannot restart) keeps Compute Engine's default, flex-start included."""
    [template] = _sent(cell, bodies.TEMPLATE)
    restarts = template["properties"]["scheduling"]["automaticRestart"]
    assert restarts is (cell.provisioning_model != capacity_table.SPOT_MODEL)


@pytest.mark.parametrize("cell", COMPUTE, ids=lambda c: c.key)
def test_a_compute_cells_stockout_reaction_follows_its_mig_mode(cell: capacity_table.Cell) -> None:
    """A bulk MIG waits for every host whatever set its target size; an individual one makes what
    the zone has and is bounded by the cell's `whole_within_s`."""
    bulk = cell.mig_mode == capacity_table.BULK
    waits = cell.action(capacity_table.NO_CAPACITY) == capacity_table.KEEP_WAITING
    assert waits is bulk and (cell.whole_within_s is None) is bulk
    states = [w.state for w in cell.waits]
    assert ("partly created" in states) is not bulk and ("waiting for capacity" in states) is bulk
    assert any("partly created: up to 15 min" in line for line in cell.describe()) is not bulk
