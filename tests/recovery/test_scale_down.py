"""Removing a whole Compute Engine slice while its MIG stays (elastic clusters' scale-down):
instanceGroupManagers.deleteInstances and .deletePerInstanceConfigs as the emulation and its
twin answer them (target size, validation, the per-instance configs), and the client's guards.
Sources of each rule: `rayslice.cloud.twin.compute`'s docstring."""

from __future__ import annotations

from typing import Any

import pytest

from rayslice import names
from rayslice.cloud.rest import operation_error
from rayslice.errors import CloudError, InvalidInput
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.recovery.cloud import CloudClient, RefusedResource
from tests.recovery.conftest import CLUSTER, PROJECT, ZONE, seed

SLICE0, SLICE1 = names.slice_name(CLUSTER, 0), names.slice_name(CLUSTER, 1)
ALLOWED = (SLICE0, SLICE1)
HOSTS0 = names.slice_host_names(SLICE0, 4)
KEY0 = (PROJECT, ZONE, SLICE0)


def _done(client: CloudClient, operation: dict[str, Any]) -> dict[str, Any]:
    finished = client.wait_zone_operation(operation, timeout_s=30)
    assert finished["status"] == "DONE"
    return finished


def _post(client: CloudClient, mig: str, verb: str, body: dict[str, Any]) -> dict[str, Any]:
    """A request the client's guards would not send: what the emulation itself does with it."""
    return client.request("POST", client._compute(f"instanceGroupManagers/{mig}/{verb}"), body=body)


def test_deleting_a_slices_hosts_lowers_the_target_size_and_keeps_the_mig(
    cloud: CloudApiEmulator, client: CloudClient
) -> None:
    seed(cloud, "compute")
    downs: list[str] = []
    cloud.on_slice_down = downs.append
    operation = client.delete_instances(SLICE0, HOSTS0, ALLOWED)
    assert operation["operationType"] == "deleteInstances" and "/zones/" in operation["zone"]
    call = cloud.calls[-1]
    assert call.method_id == "compute.instanceGroupManagers.deleteInstances"
    assert call.request == {
        "instances": [f"zones/{ZONE}/instances/{h}" for h in HOSTS0],
        "skipInstancesOnValidationError": True,
    }
    assert operation_error(_done(client, operation)) is None
    assert downs == [SLICE0]  # the slice went down once, when the operation ended
    mig = client.get_mig(SLICE0)
    assert mig is not None and mig["targetSize"] == 0  # the MIG stays, at target size 0
    assert client.list_managed_instances(SLICE0) == []
    # The twin deletes a deleted instance's per-instance config with it (its docstring says why).
    assert client.list_per_instance_configs(SLICE0) == []
    assert not any(h.group == SLICE0 for h in cloud.state.hosts())
    other = client.get_mig(SLICE1)
    assert other is not None and other["targetSize"] == 4 and len(client.list_managed_instances(SLICE1)) == 4


def test_the_same_slice_comes_back_under_the_same_names_and_goes_again(
    cloud: CloudApiEmulator, client: CloudClient
) -> None:
    seed(cloud, "compute")
    recorded = [
        {"name": c["name"], "preservedState": c["preservedState"]}
        for c in client.list_per_instance_configs(SLICE0)
    ]
    for _ in range(2):
        _done(client, client.delete_instances(SLICE0, HOSTS0, ALLOWED))
        assert cloud.state.migs[KEY0]["targetSize"] == 0
        _done(client, client.create_instances(SLICE0, recorded, ALLOWED))
        assert cloud.state.migs[KEY0]["targetSize"] == 4
        hosts = [h for h in cloud.state.hosts() if h.group == SLICE0]
        assert [(h.name, h.worker, h.ip) for h in hosts] == [
            (n, w, f"10.1.0.{w}") for w, n in enumerate(HOSTS0)
        ]
        assert [c["name"] for c in client.list_per_instance_configs(SLICE0)] == HOSTS0


def test_a_host_not_in_the_mig_fails_the_operation_unless_skipped(
    cloud: CloudApiEmulator, client: CloudClient
) -> None:
    seed(cloud, "compute")
    stranger = names.host_name(SLICE0, 7)  # a name of this slice's, but no such member
    failed = _done(
        client, client.delete_instances(SLICE0, [HOSTS0[0], stranger], ALLOWED, skip_missing=False)
    )
    error = operation_error(failed)
    assert error is not None and stranger in error
    assert cloud.state.migs[KEY0]["targetSize"] == 4 and len(cloud.state.instances[KEY0]) == 4
    # Skipped: the member goes, the target size drops by the one deleted.
    _done(client, client.delete_instances(SLICE0, [HOSTS0[0], stranger], ALLOWED, skip_missing=True))
    assert cloud.state.migs[KEY0]["targetSize"] == 3
    assert [i["name"] for i in cloud.state.instances[KEY0]] == HOSTS0[1:]
    # A host created again into the gap takes the worker number it left.
    _done(client, client.create_instances(SLICE0, [{"name": HOSTS0[0]}], ALLOWED))
    assert cloud.state.host(HOSTS0[0]) is not None and cloud.state.host(HOSTS0[0]).worker == 0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "instances",
    [
        [f"zones/us-central1-a/instances/{HOSTS0[0]}"],  # another zone
        [f"projects/other/zones/{ZONE}/instances/{HOSTS0[0]}"],  # another project
        [f"zones/{ZONE}/instance/{HOSTS0[0]}"],  # malformed
        [f"zones/{ZONE}/instances/{HOSTS0[0]}", HOSTS0[1]],  # URLs and names together
    ],
)
def test_a_malformed_or_foreign_url_always_fails_and_deletes_nothing(
    cloud: CloudApiEmulator, client: CloudClient, instances: list[str]
) -> None:
    seed(cloud, "compute")
    body = {"instances": instances, "skipInstancesOnValidationError": True}
    assert operation_error(_done(client, _post(client, SLICE0, "deleteInstances", body))) is not None
    assert cloud.state.migs[KEY0]["targetSize"] == 4 and len(cloud.state.instances[KEY0]) == 4


def test_full_urls_name_the_instances_and_bare_names_only_queued_ones(
    cloud: CloudApiEmulator, client: CloudClient
) -> None:
    seed(cloud, "compute")
    full = f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/{HOSTS0[0]}"
    _done(client, _post(client, SLICE0, "deleteInstances", {"instances": [full]}))
    assert cloud.state.migs[KEY0]["targetSize"] == 3
    # A bare name names a queued instance; there is none, so it is not a member.
    bare = {"instances": [HOSTS0[1]]}
    assert operation_error(_done(client, _post(client, SLICE0, "deleteInstances", bare))) is not None
    _done(client, _post(client, SLICE0, "deleteInstances", {**bare, "skipInstancesOnValidationError": True}))
    assert cloud.state.migs[KEY0]["targetSize"] == 3
    too_many = {"instances": [f"zones/{ZONE}/instances/h{i}" for i in range(1001)]}
    with pytest.raises(CloudError, match="at most 1000"):
        _post(client, SLICE0, "deleteInstances", too_many)


def test_per_instance_configs_deleted_before_or_after_their_hosts(
    cloud: CloudApiEmulator, client: CloudClient
) -> None:
    seed(cloud, "compute")
    # Before: the configs of running hosts stay listed, their deletion unapplied; the hosts run on.
    operation = client.delete_per_instance_configs(SLICE0, HOSTS0[:2], ALLOWED)
    assert cloud.calls[-1].request == {"names": HOSTS0[:2]}
    assert operation_error(_done(client, operation)) is None
    statuses = {c["name"]: c["status"] for c in client.list_per_instance_configs(SLICE0)}
    assert statuses == {
        **dict.fromkeys(HOSTS0[:2], "UNAPPLIED_DELETION"),
        **dict.fromkeys(HOSTS0[2:], "EFFECTIVE"),
    }
    assert len(client.list_managed_instances(SLICE0)) == 4
    # Then the hosts go, and every config with them.
    _done(client, client.delete_instances(SLICE0, HOSTS0, ALLOWED))
    assert client.list_per_instance_configs(SLICE0) == []
    # A name without a config fails the operation (undocumented; the twin's strict choice).
    failed = _done(client, client.delete_per_instance_configs(SLICE1, [names.host_name(SLICE1, 9)], ALLOWED))
    assert operation_error(failed) is not None
    assert len(client.list_per_instance_configs(SLICE1)) == 4


@pytest.mark.parametrize(
    "mig, hosts",
    [
        ("default-pool", ["default-pool-w0"]),  # not this cluster's MIG
        (SLICE0, [names.host_name(SLICE1, 0)]),  # another slice's host
        (SLICE0, [f"{SLICE0}-w01"]),
        (SLICE0, [f"{SLICE0}-head"]),
        (SLICE0, [f"zones/{ZONE}/instances/{HOSTS0[0]}"]),
        (SLICE0, [f"{SLICE0}-w0/../x-w0"]),
        (SLICE0, [HOSTS0[0], "gke-node-w1"]),
    ],
)
def test_the_client_refuses_anything_but_this_clusters_hosts_before_sending(
    cloud: CloudApiEmulator, client: CloudClient, mig: str, hosts: list[str]
) -> None:
    with pytest.raises(RefusedResource):
        client.delete_instances(mig, hosts, ALLOWED)
    with pytest.raises(RefusedResource):
        client.delete_per_instance_configs(mig, hosts, ALLOWED)
    assert cloud.calls == []


def test_the_client_refuses_an_empty_deletion(cloud: CloudApiEmulator, client: CloudClient) -> None:
    with pytest.raises(InvalidInput, match="no instances"):
        client.delete_instances(SLICE0, [], ALLOWED)
    with pytest.raises(InvalidInput, match="no instances"):
        client.delete_per_instance_configs(SLICE0, [], ALLOWED)
    assert cloud.calls == []
