"""The controller's roles hold exactly the permissions of the methods it calls: derived from the
calls it makes against the emulation, whose IAM refuses (403) any call its role does not allow."""

from __future__ import annotations

import contextlib
import re

import pytest
import requests

from rayslice import names
from rayslice.errors import NoCredentials
from rayslice.local.google.cloud_api import iam
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.local.google.cloud_api.routes import ROUTES
from rayslice.local.google.metadata_server import MetadataServer
from rayslice.recovery import kinds, permissions
from rayslice.recovery.cloud import CloudClient
from tests.recovery.conftest import (
    CLUSTER,
    LOCATION,
    PROJECT,
    ZONE,
    make_controller,
    seed,
    seed_flex,
    seed_queued,
)
from tests.recovery.test_controller_scaling import PENDING_SLICE, _elastic, _reading

STARTS_WITH = re.compile(r'resource\.name\.startsWith\("([^"]+)"\)')


def test_every_mutating_emulated_method_has_its_permission_and_nothing_broader() -> None:
    for platform, api in (("tpu-vm", "tpu"), ("compute", "compute")):
        granted = set(kinds.permissions_of(platform))
        # No list, but the zone's operations: a preemption is known only from its operation
        # (compute.instances.preempted), whose name no one can know to get it (issue 40, D2).
        listed = granted - {"compute.zoneOperations.list"}
        assert not any(p.endswith((".setIamPolicy", ".list")) or "*" in p for p in listed)
        service = "tpu" if api == "tpu" else "compute"
        assert all(p.startswith(f"{service}.") for p in granted)
    assert {"tpu.nodes.create", "tpu.nodes.delete", "tpu.nodes.get"} <= set(kinds.permissions_of("tpu-vm"))
    # Each MIG method the controller calls maps to one permission of the role.
    verbs = {
        "get": "get",
        "delete": "delete",
        "insert": "create",
        "createInstances": "update",
        "deleteInstances": "update",
        "deletePerInstanceConfigs": "update",
    }
    called = {r.method_id.rsplit(".", 1)[-1] for r in ROUTES if ".instanceGroupManagers." in r.method_id}
    assert set(verbs) <= called
    for method in called & set(verbs):
        assert f"compute.instanceGroupManagers.{verbs[method]}" in kinds.permissions_of("compute")
    assert kinds.permissions_of("gke") == () and kinds.role_parts("gke") == ()


@pytest.mark.parametrize("platform", ["tpu-vm", "compute"])
def test_each_permission_is_in_exactly_one_role(platform: str) -> None:
    parts = kinds.role_parts(platform)
    every = [p for part in parts for p in part.permissions]
    assert len(every) == len(set(every)) == len(kinds.permissions_of(platform))
    assert all(re.fullmatch(r"[a-z]{1,9}", part.key) for part in parts)
    assert len({part.key for part in parts}) == len(parts)


def test_only_the_template_grant_is_narrowed_and_the_rest_is_said_to_be_unnarrowed() -> None:
    narrowed = {p for part in kinds.role_parts("compute") if part.templates_only for p in part.permissions}
    assert narrowed == {"compute.instanceTemplates.useReadOnly"}
    assert not any(part.templates_only for part in kinds.role_parts("tpu-vm"))
    # Every unnarrowed compute permission is named in the explanation docs/recovery.md repeats.
    for part in kinds.role_parts("compute"):
        if not part.templates_only:
            for permission in part.permissions:
                assert permission.split(".", 1)[1].split(".")[0] in kinds.MigSlices.unnarrowed
    assert all(kind.unnarrowed for kind in kinds.KINDS.values())


def test_the_condition_names_exactly_this_clusters_templates() -> None:
    prefixes = [f"train-slice-{i}-" for i in range(11)]
    condition = permissions.template_condition("proj-1", prefixes)
    found = STARTS_WITH.findall(condition)
    assert found == [f"projects/proj-1/global/instanceTemplates/{p}" for p in prefixes]
    assert condition.count("||") == len(prefixes) - 1

    def granted(template: str) -> bool:  # CEL's startsWith, for the expressions above
        return any(f"projects/proj-1/global/instanceTemplates/{template}".startswith(p) for p in found)

    assert granted("train-slice-1-20250101000000000000000001")
    assert granted("train-slice-10-20250101000000000000000001")
    assert not granted("trainx-slice-0-20250101")  # another cluster
    assert not granted("train-slice-11-20250101")  # a slice this cluster does not have
    assert not any(f.startswith("projects/other/") for f in found)


@pytest.mark.parametrize("prefixes", [[], ["train-slice-0"]])
def test_a_condition_without_a_trailing_hyphen_or_prefixes_is_refused(prefixes: list[str]) -> None:
    with pytest.raises(ValueError):
        permissions.template_condition("proj-1", prefixes)


# ---- derived from the calls the controller makes, enforced by the emulation ------------------

SLICE0, SLICE1 = names.slice_name(CLUSTER, 0), names.slice_name(CLUSTER, 1)


def _controller_client(cloud: CloudApiEmulator, granted: tuple[str, ...]) -> CloudClient:
    """A client whose token the emulation binds to `granted`, as IAM binds the controller's
    account to its roles: a call needing anything else is refused with 403."""
    token = f"controller-{len(cloud.bindings)}"
    cloud.tokens.add(token)
    cloud.bind(token, granted)
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    return CloudClient(
        session,
        LOCATION,
        tpu_base=f"{cloud.url}/",
        compute_base=f"{cloud.url}/compute/v1/",
        sleep=lambda _: None,
        poll_interval_s=0,
    )


def _every_way_it_acts(
    cloud: CloudApiEmulator, client: CloudClient, vm: MetadataServer, platform: str
) -> str:
    """The controller looks at healthy slices, recreates a preempted one (delete, create and
    the polls of both operations) and one that vanished (create only); returns its output."""
    seed(cloud, platform)
    controller, stream = make_controller(client, platform, vm)
    controller.step()
    # Stopped, not deleted, on compute: the controller lists the zone's preemptions to say so.
    cloud.preempt(PROJECT, ZONE, SLICE1, mode="terminated" if platform == "compute" else "gone")
    controller.step()
    key = (PROJECT, ZONE, SLICE0)
    if platform == "tpu-vm":
        del cloud.state.nodes[key]
    else:
        cloud.state.delete_mig(*key)  # its instances go with it
    controller.step()
    if platform == "tpu-vm":  # the same slices as queued ones: one recreated through a new request
        for index in range(2):
            cloud.state.delete_node(PROJECT, ZONE, names.slice_name(CLUSTER, index))
        seed_queued(cloud)
        queued, queued_stream = make_controller(client, platform, vm)
        queued.step()
        cloud.preempt(PROJECT, ZONE, SLICE1)
        queued.step()
        assert "recreated; queued resource" in queued_stream.getvalue()
    return stream.getvalue()


@pytest.mark.parametrize("platform", ["tpu-vm", "compute"])
def test_the_roles_hold_exactly_what_the_controllers_calls_need(
    cloud: CloudApiEmulator, controller_metadata: MetadataServer, platform: str
) -> None:
    client = _controller_client(cloud, kinds.held(platform))
    output = _every_way_it_acts(cloud, client, controller_metadata, platform)
    assert output.count('"outcome": "recreated"') == 2, output
    # Nothing refused; the one 404 is the vanished slice, as Google answers for it.
    assert cloud.calls and {c.status for c in cloud.calls} == {200, 404}
    called = {c.method_id for c in cloud.calls}
    polled = "tpu.projects.locations.operations.get" if platform == "tpu-vm" else "compute.zoneOperations.get"
    assert polled in called
    needed = {p for c in cloud.calls for p in iam.required_permissions(c.method_id, c.request)}
    # The custom roles: exactly what the calls needed (acting as the hosts is its own grant).
    assert set(kinds.permissions_of(platform)) == needed - {iam.ACT_AS}
    # A TPU node create names the hosts' account; Compute's MIG insert names a template whose
    # account IAM may check (undocumented, permissions.py), so act-as is held on both.
    assert (iam.ACT_AS in needed) == (platform == "tpu-vm")
    assert set(kinds.held(platform)) == needed | {iam.ACT_AS}


@pytest.mark.parametrize(
    "platform, withheld",
    [
        ("tpu-vm", "tpu.operations.get"),
        ("tpu-vm", "tpu.nodes.delete"),
        ("compute", "compute.zoneOperations.get"),
        ("compute", "compute.instanceTemplates.useReadOnly"),
    ],
)
def test_a_call_the_role_does_not_allow_is_refused_403_and_nothing_is_recreated(
    cloud: CloudApiEmulator, controller_metadata: MetadataServer, platform: str, withheld: str
) -> None:
    granted = tuple(p for p in kinds.held(platform) if p != withheld)
    client = _controller_client(cloud, granted)
    with contextlib.suppress(NoCredentials):  # a 403 is what the client calls refused credentials
        _every_way_it_acts(cloud, client, controller_metadata, platform)
    refused = [c for c in cloud.calls if c.status == 403]
    assert refused and refused[0].response["error"]["status"] == "PERMISSION_DENIED"
    assert withheld in refused[0].response["error"]["message"]


def test_removing_a_slices_hosts_needs_update_which_the_role_holds(cloud: CloudApiEmulator) -> None:
    """Scale-down (deleteInstances, then deletePerInstanceConfigs of any config left) with the
    controller's role; without compute.instanceGroupManagers.update both are refused, 403."""
    seed(cloud, "compute")
    hosts = names.slice_host_names(SLICE0, 4)
    allowed = (SLICE0, SLICE1)
    withheld = "compute.instanceGroupManagers.update"
    lacking = _controller_client(cloud, tuple(p for p in kinds.held("compute") if p != withheld))
    with pytest.raises(NoCredentials):
        lacking.delete_instances(SLICE0, hosts, allowed)
    with pytest.raises(NoCredentials):
        lacking.delete_per_instance_configs(SLICE1, [names.host_name(SLICE1, 0)], allowed)
    assert [c.response["error"]["status"] for c in cloud.calls] == ["PERMISSION_DENIED"] * 2
    assert all(withheld in c.response["error"]["message"] for c in cloud.calls)
    assert len(cloud.state.instances[(PROJECT, ZONE, SLICE0)]) == 4

    client = _controller_client(cloud, kinds.held("compute"))
    client.wait_zone_operation(client.delete_instances(SLICE0, hosts, allowed), 30)
    client.wait_zone_operation(
        client.delete_per_instance_configs(SLICE1, [names.host_name(SLICE1, 0)], allowed), 30
    )
    assert cloud.state.instances[(PROJECT, ZONE, SLICE0)] == []
    assert {c.status for c in cloud.calls[2:]} == {200}


def test_resizing_a_flex_start_slice_needs_update_which_the_role_holds(cloud: CloudApiEmulator) -> None:
    """An elastic flex-start slice's bulk MIG resized (docs/elastic.md) with the controller's
    role; without compute.instanceGroupManagers.update it is refused, 403."""
    seed_flex(cloud)
    allowed = (SLICE0, SLICE1)
    withheld = "compute.instanceGroupManagers.update"
    lacking = _controller_client(cloud, tuple(p for p in kinds.held("compute") if p != withheld))
    with pytest.raises(NoCredentials):
        lacking.resize_mig(SLICE0, 0, allowed)
    assert [c.response["error"]["status"] for c in cloud.calls] == ["PERMISSION_DENIED"]
    assert withheld in cloud.calls[0].response["error"]["message"]

    client = _controller_client(cloud, kinds.held("compute"))
    client.wait_zone_operation(client.resize_mig(SLICE0, 0, allowed), 30)
    assert client.list_managed_instances(SLICE0) == []
    assert {c.status for c in cloud.calls[1:]} == {200}


def _every_way_it_scales(cloud: CloudApiEmulator, client: CloudClient, vm: MetadataServer) -> str:
    """An elastic cluster's controller reads the head's demand, adds a slice (createInstances)
    and removes it once idle (deleteInstances and the per-instance configs left); its output."""
    head = {"demand": _reading(PENDING_SLICE)}
    controller, stream = _elastic(cloud, client, vm, head)
    controller.step()
    controller.step()
    head["demand"] = _reading(slices={SLICE0: {"nodes": 4, "busy": False, "idle_s": 61}})
    controller.step()
    controller.step()
    return stream.getvalue()


def test_the_elastic_role_holds_exactly_what_scaling_needs_beyond_recovery(
    cloud: CloudApiEmulator, controller_metadata: MetadataServer
) -> None:
    """The part an elastic cluster adds (`permissions.ELASTIC_PART`) is exactly what its scaling
    calls need that recovery's roles do not hold: a permission more or less fails here.
    `test_the_roles_hold_exactly_what_the_controllers_calls_need` does the same for the rest."""
    elastic = kinds.held("compute", elastic=True)
    output = _every_way_it_scales(cloud, _controller_client(cloud, elastic), controller_metadata)
    assert '"action": "add slice"' in output and '"action": "remove slice"' in output, output
    assert cloud.calls and {c.status for c in cloud.calls} == {200}
    needed = {p for c in cloud.calls for p in iam.required_permissions(c.method_id, c.request)}
    fixed = set(kinds.permissions_of("compute"))
    added = set(kinds.permissions_of("compute", elastic=True)) - fixed
    assert added == needed - fixed == set(permissions.ELASTIC_PART.permissions)
    assert len(kinds.permissions_of("compute", elastic=True)) == len(fixed) + len(added)  # each once
    assert kinds.role_parts("compute", elastic=True) == (
        *kinds.role_parts("compute"),
        permissions.ELASTIC_PART,
    )

    # Without the demand read, the head's demand is refused (403) and no slice is added.
    cloud.calls.clear()
    withheld = "compute.instances.getGuestAttributes"
    lacking = _controller_client(cloud, tuple(p for p in elastic if p != withheld))
    controller, _ = _elastic(cloud, lacking, controller_metadata, {"demand": _reading(PENDING_SLICE)})
    controller.step()
    controller.step()
    refused = [c for c in cloud.calls if c.status == 403]
    assert refused and all(withheld in c.response["error"]["message"] for c in refused)
    assert not [c for c in cloud.calls if c.method_id == "compute.instanceGroupManagers.createInstances"]


def test_an_unbound_token_is_the_owner_and_may_call_everything(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer
) -> None:
    output = _every_way_it_acts(cloud, client, controller_metadata, "tpu-vm")
    assert output.count('"outcome": "recreated"') == 2 and {c.status for c in cloud.calls} == {200, 404}


# Checked by the emulated IAM without a route of its own: the record's writes (Cloud Storage is
# not emulated over HTTP; the record's tests authorize its writers directly).
UNROUTED = {"storage.objects.insert"}


def test_every_emulated_method_has_its_permission() -> None:
    assert {r.method_id for r in ROUTES} | UNROUTED == set(iam.METHOD_PERMISSIONS)
