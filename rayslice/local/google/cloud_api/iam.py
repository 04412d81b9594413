"""IAM in the emulation: the permission each emulated method needs, checked on every call.

Google refuses a call whose caller lacks the method's permission with 403 ``PERMISSION_DENIED``;
the emulation does the same for a token bound to a role (`EmulatedIam.bind`: the permissions a
principal holds, here the token stands for its principal). A token with no binding is the
project's owner and may call everything, as the simulator's owner credentials and most tests do.

`METHOD_PERMISSIONS` is this module's own statement of Google's REST reference (each method's
"IAM Permissions"), written independently of what rayslice grants
(`rayslice.recovery.permissions`): tests/recovery/test_permissions.py derives what the
controller needs from the calls it makes here and compares the two. `referenced_permissions`
adds what a created resource implies on the resources its body names: Compute Engine checks
that the caller may use the instance template and resource policy a new MIG names, and both
APIs check that it may act as the service account a new VM runs as.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rayslice.local.google.cloud_api.routes import ApiError

METHOD_PERMISSIONS = {
    "tpu.projects.locations.nodes.get": "tpu.nodes.get",
    "tpu.projects.locations.nodes.list": "tpu.nodes.list",
    "tpu.projects.locations.nodes.delete": "tpu.nodes.delete",
    "tpu.projects.locations.nodes.create": "tpu.nodes.create",
    "tpu.projects.locations.nodes.getGuestAttributes": "tpu.nodes.get",
    "tpu.projects.locations.operations.get": "tpu.operations.get",
    "tpu.projects.locations.queuedResources.get": "tpu.queuedResources.get",
    "tpu.projects.locations.queuedResources.create": "tpu.queuedResources.create",
    "tpu.projects.locations.queuedResources.delete": "tpu.queuedResources.delete",
    "compute.instanceGroupManagers.get": "compute.instanceGroupManagers.get",
    "compute.instanceGroupManagers.delete": "compute.instanceGroupManagers.delete",
    "compute.instanceGroupManagers.insert": "compute.instanceGroupManagers.create",
    "compute.instanceGroupManagers.listManagedInstances": "compute.instanceGroupManagers.get",
    "compute.instanceGroupManagers.listPerInstanceConfigs": "compute.instanceGroupManagers.get",
    "compute.instanceGroupManagers.createInstances": "compute.instanceGroupManagers.update",
    # deleteInstances and deletePerInstanceConfigs: "Authorization requires the following IAM
    # permission on the specified resource instanceGroupManager: compute.instanceGroupManagers.update"
    # (REST reference of each, compute/docs/reference/rest/v1/instanceGroupManagers/...).
    "compute.instanceGroupManagers.deleteInstances": "compute.instanceGroupManagers.update",
    "compute.instanceGroupManagers.deletePerInstanceConfigs": "compute.instanceGroupManagers.update",
    "compute.zoneOperations.get": "compute.zoneOperations.get",
    # resize: "Authorization requires the following IAM permission on the specified resource
    # instanceGroupManager: compute.instanceGroupManagers.update" (its REST reference); the zone's
    # operations are listed with compute.zoneOperations.list (the same for zoneOperations.list).
    "compute.instanceGroupManagers.resize": "compute.instanceGroupManagers.update",
    "compute.zoneOperations.list": "compute.zoneOperations.list",
    "compute.instances.getGuestAttributes": "compute.instances.getGuestAttributes",
    # GKE's node pools are read with the cluster's permission ("Authorization requires the
    # following IAM permission on the specified resource name: container.clusters.get", REST
    # reference of projects.locations.clusters.nodePools get and list).
    "container.projects.locations.clusters.nodePools.get": "container.clusters.get",
    "container.projects.locations.clusters.nodePools.list": "container.clusters.get",
}
USE_TEMPLATE = "compute.instanceTemplates.useReadOnly"
USE_RESOURCE_POLICY = "compute.resourcePolicies.use"
ACT_AS = "iam.serviceAccounts.actAs"


def referenced_permissions(method_id: str, body: Any) -> tuple[str, ...]:
    """What the resources that a create call's `body` names require of the caller."""
    if not isinstance(body, dict):
        return ()
    if method_id == "compute.instanceGroupManagers.insert":
        needed = []
        if body.get("instanceTemplate") or any(v.get("instanceTemplate") for v in body.get("versions") or []):
            needed.append(USE_TEMPLATE)
        if body.get("resourcePolicies"):
            needed.append(USE_RESOURCE_POLICY)
        return tuple(needed)
    if method_id == "tpu.projects.locations.nodes.create" and (body.get("serviceAccount") or {}).get("email"):
        return (ACT_AS,)
    if method_id == "tpu.projects.locations.queuedResources.create" and any(
        ((spec.get("node") or {}).get("serviceAccount") or {}).get("email")
        for spec in (body.get("tpu") or {}).get("nodeSpec") or []
    ):
        return (ACT_AS,)  # its node runs as that account, as a node created directly
    return ()


def required_permissions(method_id: str | None, body: Any) -> tuple[str, ...]:
    """Every permission a call of `method_id` with `body` needs; raises KeyError for a method
    whose permission this module does not know (refused to a bound caller)."""
    if method_id is None:
        raise KeyError("no method")
    return (METHOD_PERMISSIONS[method_id], *referenced_permissions(method_id, body))


class EmulatedIam:
    """Which tokens are bound to which permissions, and the check each API call passes."""

    def __init__(self) -> None:
        self.bindings: dict[str, frozenset[str]] = {}

    def bind(self, token: str, permissions: Iterable[str]) -> None:
        """From now on `token` may call only what `permissions` allow."""
        self.bindings[token] = frozenset(permissions)

    def authorize(self, token: str, method_id: str | None, body: Any) -> None:
        """Raise 403 PERMISSION_DENIED, as Google does, unless `token` may make this call."""
        granted = self.bindings.get(token)
        if granted is None:
            return  # the owner
        try:
            needed = required_permissions(method_id, body)
        except KeyError:
            raise ApiError(
                403, "PERMISSION_DENIED", f"{method_id}: no permission of the caller's role allows it"
            ) from None
        missing = [p for p in needed if p not in granted]
        if missing:
            raise ApiError(
                403,
                "PERMISSION_DENIED",
                f"Permission '{missing[0]}' denied ({method_id}): the caller's role lacks it",
            )
