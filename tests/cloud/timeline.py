"""Helpers for the twin's timeline tests: a twin on a clock the test owns, and instance templates
and MIGs made straight through the twin's Compute Engine (no stack), priced by the catalog."""

from __future__ import annotations

from typing import Any

from rayslice.cloud import bodies
from rayslice.cloud.twin import CloudTwin
from rayslice.cloud.twin.clock import TwinClock
from rayslice.cloud.twin.state import TwinHost

PROJECT, ZONE = "p", "us-east5-a"
V6E_HOST = "ct6e-standard-4t"  # a v6e host of 4 chips (rules.tpu_machine)
START = 1_800_000_000.0


def twin_at(start: float = START) -> tuple[CloudTwin, list[TwinHost]]:
    """A twin on a manual clock reading `start`, and the hosts its ``on_host_up`` announced."""
    twin = CloudTwin()
    twin.clock = TwinClock.manual(start)
    booted: list[TwinHost] = []
    twin.on_host_up = booted.append
    return twin, booted


def template(
    twin: CloudTwin, name: str, machine: str = V6E_HOST, *, reservation: str | None = None, **scheduling: Any
) -> str:
    """An instance template of `machine` with `scheduling` (Scheduling's fields), consuming the
    specific `reservation` if named; its link."""
    properties: dict[str, Any] = {"machineType": machine}
    if reservation:
        properties["reservationAffinity"] = {
            "consumeReservationType": "SPECIFIC_RESERVATION",
            "key": "compute.googleapis.com/reservation-name",
            "values": [reservation],
        }
    if scheduling:
        properties["scheduling"] = scheduling
    body = {"name": name, "properties": properties}
    request = bodies.Request("compute", "compute.instanceTemplates.insert", "InstanceTemplate", name, body)
    return str(twin.apply(bodies.TEMPLATE, name, request, project=PROJECT)["selfLink"])


def mig(
    twin: CloudTwin, name: str, template_link: str, *, bulk: bool = False, **fields: Any
) -> dict[str, Any]:
    """A MIG of `template_link`'s hosts, target size 0 (individual or bulk mode)."""
    body: dict[str, Any] = {
        "name": name,
        "baseInstanceName": name,
        "versions": [{"instanceTemplate": template_link}],
        "targetSize": 0,
        **fields,
    }
    if bulk:
        body["targetSizePolicy"] = {"mode": "BULK"}
    return twin.insert_mig(PROJECT, ZONE, body)


def hosts(count: int, prefix: str = "s") -> list[dict[str, Any]]:
    """createInstances' per-instance configs for hosts ``<prefix>-w0`` .. ``w<count-1>``."""
    return [{"name": f"{prefix}-w{i}"} for i in range(count)]
