"""The queued resource's dynamic provider as `pulumi up` runs it, against the emulated TPU API:
its create sends the request the program declared and returns once it is accepted (the zone
has no capacity: it waits), its delete forces the request away, and any change replaces it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rayslice.cloud import bodies
from rayslice.infra import preview
from rayslice.infra.mocks import run_offline
from rayslice.infra.program import main
from rayslice.infra.tpu_vm import queued
from rayslice.infra.tpu_vm.queued import QueuedResourceProvider
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.recovery.cloud import CloudClient
from tests.recovery.conftest import PROJECT, ZONE

QUEUED = str(Path(__file__).resolve().parents[2] / "infra" / "Pulumi.example-tpu-vm-queued-v6e-16.yaml")


def _props(overrides: list[str]) -> dict[str, Any]:
    """What the engine hands the provider: the registered inputs, Pulumi's own left out."""
    config = preview.stack_config(QUEUED, [f"project={PROJECT}", f"zone={ZONE}", *overrides])
    [queued] = run_offline(lambda: main().exports, config).of_type(bodies.QUEUED_RESOURCE)
    return {k: v for k, v in queued.inputs.items() if k != "__provider"}


def test_create_sends_the_declared_request_and_returns_while_it_waits(
    cloud: CloudApiEmulator, adc: Path, monkeypatch: pytest.MonkeyPatch
):
    made = queued._client

    def quick(props: dict[str, Any]) -> CloudClient:  # polls the emulation's operations without 5 s waits
        client = made(props)
        client.poll_interval_s = 0.05
        return client

    monkeypatch.setattr(queued, "_client", quick)
    cloud.state.set_capacity(ZONE, "v6e", 0)
    props = _props(["capacity=flex-start", "maxRunHours=12"])  # v2alpha1, which the emulation serves
    provider = QueuedResourceProvider()
    created = provider.create(props)
    name = str(props["name"])
    assert created.id == f"projects/{PROJECT}/locations/{ZONE}/queuedResources/{name}"
    [call] = [c for c in cloud.calls if c.method == "POST" and c.path.endswith("/queuedResources")]
    assert call.path.startswith("/v2alpha1/") and call.query == {"queuedResourceId": name}
    request = bodies.request(bodies.QUEUED_RESOURCE, props)
    assert request is not None and call.request == request.body
    record = cloud.state.queued_resource(PROJECT, ZONE, name)
    assert record is not None and record["state"] == {"state": "WAITING_FOR_RESOURCES"}

    provider.delete(created.id, props)
    assert cloud.state.queued_resource(PROJECT, ZONE, name) is None
    provider.delete(created.id, props)  # already gone: nothing to do


def test_any_change_replaces_the_request_deleting_the_old_one_first():
    provider = QueuedResourceProvider()
    old = {"name": "r", "project": "p", "zone": "z", "node": {"metadata": {"a": "1"}}}
    assert provider.diff("id", old, dict(old)).changes is False
    diff = provider.diff("id", old, {**old, "node": {"metadata": {"a": "2"}}})
    assert diff.changes and diff.replaces == ["node"] and diff.delete_before_replace
