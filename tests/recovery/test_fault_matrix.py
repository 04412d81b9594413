"""The start of issue 40's fault matrix: for every compute cell of the capacity table and every
event it lists whose action is the controller's (recreate, or wait for Google's repair), inject
the event in the cloud twin and check that the controller does what the cell says. The table of
outcomes is published in docs/recovery.md ("Fault matrix"), which `test_the_docs_list_every_row`
keeps in step with the capacity table."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from rayslice import capacity_table as table
from rayslice import names
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.local.google.metadata_server import MetadataServer
from rayslice.recovery.cloud import CloudClient
from tests.recovery.conftest import CLUSTER, PROJECT, ZONE, make_controller, seed, seed_flex

DOCS = Path(__file__).resolve().parents[2] / "docs" / "recovery.md"
CONTROLLER_ACTIONS = (table.RECREATE, table.WAIT_FOR_REPAIR, table.END)
SLICE1 = names.slice_name(CLUSTER, 1)


def _inject(event: str) -> Callable[[CloudApiEmulator], None]:
    """How the twin makes `event` happen to slice 1."""
    return {
        table.PREEMPTION: lambda cloud: cloud.preempt(PROJECT, ZONE, SLICE1, mode="terminated"),
        table.MAINTENANCE: lambda cloud: cloud.state.host_error(PROJECT, ZONE, SLICE1),
        table.HOST_ERROR: lambda cloud: cloud.state.host_error(PROJECT, ZONE, SLICE1),
        table.GONE: lambda cloud: cloud.state.delete_mig(PROJECT, ZONE, SLICE1),
        table.RUN_DURATION: _end_run,
    }[event]


def _end_run(cloud: CloudApiEmulator) -> None:
    """The run (or the reservation's period) ends: Compute Engine deletes every host; the MIG stays."""
    for record in list(cloud.state.instances[(PROJECT, ZONE, SLICE1)]):
        cloud.state.lose(cloud.state.vms[(PROJECT, ZONE, record["name"])], deleted=True)


def _cases() -> list[tuple[table.Cell, str, str]]:
    return [
        (cell, event, reaction.action)
        for cell in table.CELLS
        if cell.platform == table.COMPUTE
        for event, reaction in cell.events.items()
        if reaction.action in CONTROLLER_ACTIONS
    ]


def _row(cell: table.Cell, event: str, action: str) -> str:
    return f"| {cell.key} | {event} | {action} |"


@pytest.mark.parametrize("cell, event, action", _cases(), ids=lambda v: getattr(v, "key", v))
def test_the_controller_does_what_the_cell_says(
    cloud: CloudApiEmulator,
    client: CloudClient,
    controller_metadata: MetadataServer,
    cell: table.Cell,
    event: str,
    action: str,
) -> None:
    if cell.run_duration:  # flex-start: a bulk MIG whose hosts the MIG named
        seed_flex(cloud)
    else:
        seed(cloud, "compute")
    controller, stream = make_controller(client, "compute", controller_metadata, capacity=cell.capacity)
    controller.step()  # seen whole
    assert cloud.mutations() == []
    _inject(event)(cloud)
    controller.step()
    methods = [c.method_id for c in cloud.mutations()]
    [seen] = [json.loads(line) for line in stream.getvalue().splitlines()]
    if action == table.WAIT_FOR_REPAIR:
        assert methods == [] and seen["action"] == table.WAIT_FOR_REPAIR
    elif action == table.END:  # recorded once, nothing asked again
        assert methods == [] and seen["outcome"].startswith("ended")
    else:  # recreated whole, at once
        assert "compute.instanceGroupManagers.insert" in methods and seen["action"] == "recreate"
        assert not seen["outcome"].startswith("failed"), seen


def test_the_docs_list_every_row() -> None:
    text = DOCS.read_text()
    missing = [_row(*case) for case in _cases() if _row(*case) not in text]
    assert not missing, "docs/recovery.md's fault matrix lacks:\n" + "\n".join(missing)
