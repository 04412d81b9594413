"""The reserved slice's SliceHosts dynamic provider as `pulumi up` and `pulumi destroy` run it,
against the emulated Compute Engine API: its create sends every host in one createInstances on
the empty bulk MIG and returns once the call is accepted; a create sent again after an
interrupted run adopts what the first made; its delete resizes the MIG to 0 and leaves no host or
per-instance config; any change replaces it (rayslice/infra/compute/bulk_hosts.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rayslice import names
from rayslice.cloud import bodies
from rayslice.infra import preview
from rayslice.infra.compute import bulk_hosts
from rayslice.infra.compute.bulk_hosts import SliceHostsProvider
from rayslice.infra.mocks import run_offline
from rayslice.infra.program import main
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.recovery.cloud import CloudClient
from tests.recovery.conftest import PROJECT, ZONE, bulk_mig_fields

STACK = str(Path(__file__).resolve().parents[2] / "infra" / "Pulumi.example-compute-v6e-16.yaml")


def _props() -> dict[str, Any]:
    """What the engine hands the provider: the registered inputs, Pulumi's own left out."""
    config = preview.stack_config(
        STACK, [f"project={PROJECT}", f"zone={ZONE}", "capacity=reserved", "reservation=r1"]
    )
    [hosts] = run_offline(lambda: main().exports, config).of_type(bodies.SLICE_HOSTS)
    return {k: v for k, v in hosts.inputs.items() if k != "__provider"}


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """The provider's client polls the emulation's operations without 5 s waits."""
    made = bulk_hosts._client

    def client(props: dict[str, Any]) -> CloudClient:
        found = made(props)
        found.poll_interval_s = 0.05
        return found

    monkeypatch.setattr(bulk_hosts, "_client", client)


def test_create_sends_every_host_in_one_call_and_delete_leaves_nothing(
    cloud: CloudApiEmulator, adc: Path, quick: None
) -> None:
    props = _props()
    mig = str(props["instanceGroupManager"])
    key = (PROJECT, ZONE, mig)
    cloud.add_mig(PROJECT, ZONE, mig, [], **bulk_mig_fields(mig))
    provider = SliceHostsProvider()
    created = provider.create(props)
    assert created.id == f"projects/{PROJECT}/zones/{ZONE}/instanceGroupManagers/{mig}/hosts"
    [call] = [c for c in cloud.mutations()]
    assert call.method_id == "compute.instanceGroupManagers.createInstances" and mig in call.path
    request = bodies.request(bodies.SLICE_HOSTS, props)
    assert request is not None and call.request == request.body
    wanted = names.slice_host_names(mig, 4)
    assert [i["name"] for i in call.request["instances"]] == wanted
    assert sorted(i["name"] for i in cloud.state.instances[key]) == wanted
    assert cloud.state.migs[key]["targetSize"] == 4

    # An interrupted `pulumi up` that sent the call runs again: bulk mode would refuse a second
    # createInstances, so the provider takes the hosts there as its own and sends nothing.
    provider.create(props)
    assert len(cloud.mutations()) == 1

    provider.delete(created.id, props)
    assert [c.method_id for c in cloud.mutations()][1:2] == ["compute.instanceGroupManagers.resize"]
    assert not cloud.state.instances[key] and not cloud.state.configs[key]
    assert cloud.state.migs[key]["targetSize"] == 0
    assert not [v for v in cloud.state.vms.values() if v.group == mig]
    count = len(cloud.mutations())
    cloud.state.delete_mig(*key)
    provider.delete(created.id, props)  # the MIG already gone: nothing to do
    assert len(cloud.mutations()) == count


def test_a_create_on_a_mig_holding_other_hosts_is_refused_naming_them(
    cloud: CloudApiEmulator, adc: Path, quick: None
) -> None:
    props = _props()
    mig = str(props["instanceGroupManager"])
    cloud.add_mig(PROJECT, ZONE, mig, [f"{mig}-other"], **bulk_mig_fields(mig))
    with pytest.raises(Exception, match=f"{mig}-other"):
        SliceHostsProvider().create(props)
    assert cloud.mutations() == []


def test_any_change_replaces_the_hosts_deleting_the_old_ones_first() -> None:
    provider = SliceHostsProvider()
    old = {"project": "p", "zone": "z", "instanceGroupManager": "s", "instances": [{"name": "s-w0"}]}
    assert provider.diff("id", old, dict(old)).changes is False
    diff = provider.diff("id", old, {**old, "instances": [{"name": "s-w1"}]})
    assert diff.changes and diff.replaces == ["instances"] and diff.delete_before_replace
