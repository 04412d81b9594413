"""What the Pulumi program sends is its capacity cell: for each compute and tpu-vm cell, the REST
body of the request that carries the capacity (the instance template, the MIG's failure action,
the TPU node, the queued resource) holds every field of the cell's call, filled in."""

from __future__ import annotations

from typing import Any

import pytest

from rayslice import capacity_table
from rayslice.cloud import bodies
from rayslice.infra.mocks import run_offline
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
    capacity_table.FLEX_START: {"capacity": "flex-start", "maxRunHours": 2},
}
VALUES = {
    capacity_table.PROJECT: PROJECT,
    capacity_table.ZONE: ZONE,
    capacity_table.RESERVATION_NAME: RESERVATION,
    capacity_table.MAX_RUN_SECONDS: 7200,
}


def _sent(cell: capacity_table.Cell, type_token: str) -> list[dict[str, Any]]:
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
    found = [bodies.request(r.type, r.inputs) for r in run.of_type(type_token)]
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
