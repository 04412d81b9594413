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

A binding may carry an IAM Condition, which the emulation evaluates as Google documents it for
allow policies ("Overview of IAM Conditions", https://cloud.google.com/iam/docs/conditions-overview):
"If a role binding has a condition, then the principals in the role are only granted the role if
the condition expression evaluates to true", and "Conditional role bindings do not override role
bindings with no conditions": a permission is allowed when any binding that holds it admits the
call. The emulation evaluates the one attribute rayslice's conditions use, ``resource.name``, in
the forms `rayslice.recovery.permissions` and `rayslice.infra.record_bucket` write
(`CONDITION_TERM`: ``==`` and ``startsWith``, joined by ``||``); it refuses to bind any other
expression rather than guess at it. The name a resource has is the one "Resource attributes for
IAM Conditions" (https://cloud.google.com/iam/docs/conditions-resource-attributes) gives it
(`resource_name`): instances, instance templates and Cloud Storage objects have one; a MIG, an
operation or any Cloud TPU resource has none, and "Configure resource-based access"
(https://cloud.google.com/iam/docs/configuring-resource-based-access) says such a term "is never
interpreted as granting access", so it is false here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
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
    # instanceGroupManagerResizeRequests.insert: "Authorization requires the following IAM
    # permission on the specified resource instanceGroupManager: compute.instanceGroupManagers.update"
    # (its REST reference, compute/docs/reference/rest/v1/instanceGroupManagerResizeRequests/insert).
    "compute.instanceGroupManagerResizeRequests.insert": "compute.instanceGroupManagers.update",
    "compute.zoneOperations.list": "compute.zoneOperations.list",
    "compute.instances.getGuestAttributes": "compute.instances.getGuestAttributes",
    # GKE's node pools are read with the cluster's permission ("Authorization requires the
    # following IAM permission on the specified resource name: container.clusters.get", REST
    # reference of projects.locations.clusters.nodePools get and list).
    "container.projects.locations.clusters.nodePools.get": "container.clusters.get",
    "container.projects.locations.clusters.nodePools.list": "container.clusters.get",
    # Cloud Storage's objects.insert needs storage.objects.create ("IAM permissions for Cloud
    # Storage", cloud.google.com/storage/docs/access-control/iam-permissions); the emulation has
    # no Cloud Storage of its own, but the record's writers are checked here (`resource_name`).
    "storage.objects.insert": "storage.objects.create",
}
USE_TEMPLATE = "compute.instanceTemplates.useReadOnly"
USE_RESOURCE_POLICY = "compute.resourcePolicies.use"
ACT_AS = "iam.serviceAccounts.actAs"
# The permissions whose resource IAM Conditions can name, and that name (conditions-resource-
# attributes: ``projects/PROJECT_ID/zones/ZONE/instances/INSTANCE_NAME``). A template's name
# comes from the MIG's body (`resource_name`).
INSTANCE_PERMISSIONS = {
    "compute.instances.getGuestAttributes": "projects/{project}/zones/{zone}/instances/{name}",
    # An object's name (conditions-resource-attributes, Cloud Storage objects:
    # ``projects/_/buckets/BUCKET_NAME/objects/OBJECT_NAME``), whose prefix the record bucket's
    # conditional grants name (`rayslice.infra.record_bucket.object_condition`).
    "storage.objects.create": "projects/_/buckets/{bucket}/objects/{object}",
}
# One term of a condition the emulation evaluates: resource.name == "..." or .startsWith("...").
CONDITION_TERM = re.compile(
    r'resource\.name(?: == "(?P<equals>[^"\\]*)"|\.startsWith\("(?P<prefix>[^"\\]*)"\))'
)
# Where a template's resource name starts in the URL a MIG's body names it by (a full URL or a
# partial one: ``projects/P/global/instanceTemplates/N``, or ``.../regions/R/...``).
_TEMPLATE = re.compile(r"(?:^|/)(projects/[^/]+/(?:global|regions/[^/]+)/instanceTemplates/[^/?#]+)$")


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


def resource_name(permission: str, params: Mapping[str, str], body: Any) -> str | None:
    """The name IAM Conditions see for the resource `permission` is checked on in a call with path
    `params` and `body`; None where that resource has none (the module's docstring)."""
    if permission in INSTANCE_PERMISSIONS:
        return INSTANCE_PERMISSIONS[permission].format(**params)
    if permission == USE_TEMPLATE and isinstance(body, dict):
        urls = [
            body.get("instanceTemplate"),
            *(v.get("instanceTemplate") for v in body.get("versions") or []),
        ]
        # The provider's reference carries a query (``...?uniqueId=N``, as the twin records it).
        paths = [u.split("?")[0].split("#")[0] for u in urls if isinstance(u, str)]
        names = [m.group(1) for u in paths if (m := _TEMPLATE.search(u))]
        return names[0] if names else None
    return None


def condition_terms(expression: str) -> list[tuple[str, str]]:
    """The ("equals" | "prefix", value) terms of a condition the emulation evaluates; ValueError
    for any other expression (the module's docstring)."""
    terms = []
    for part in expression.split(" || "):
        found = CONDITION_TERM.fullmatch(part.strip())
        if found is None:
            raise ValueError(
                f'the emulated IAM evaluates only resource.name == "..." and resource.name.startsWith'
                f'("...") terms joined by ||, not {part.strip()!r}'
            )
        kind = "equals" if found.group("equals") is not None else "prefix"
        terms.append((kind, found.group(kind)))
    return terms


def admits(expression: str, name: str | None) -> bool:
    """Whether the condition `expression` is true for a resource named `name` (None: no name)."""
    if name is None:
        return False  # "never interpreted as granting access"
    return any(
        name == v if kind == "equals" else name.startswith(v) for kind, v in condition_terms(expression)
    )


@dataclass(frozen=True)
class Grant:
    """One role binding of a principal: its role's permissions, on the resources its condition
    admits (on every resource without one)."""

    permissions: frozenset[str]
    condition: str | None = None

    def allows(self, permission: str, name: str | None) -> bool:
        return permission in self.permissions and (self.condition is None or admits(self.condition, name))


class EmulatedIam:
    """Which tokens are bound to which permissions, and the check each API call passes."""

    def __init__(self) -> None:
        self.bindings: dict[str, list[Grant]] = {}

    def bind(self, token: str, permissions: Iterable[str], condition: str | None = None) -> None:
        """From now on `token` may call only what its bindings allow; this adds one, with
        `permissions`, on the resources `condition` admits (every one without)."""
        if condition is not None:
            condition_terms(condition)  # refused now, not at the first call it would decide
        self.bindings.setdefault(token, []).append(Grant(frozenset(permissions), condition))

    def authorize(
        self, token: str, method_id: str | None, body: Any, params: Mapping[str, str] | None = None
    ) -> None:
        """Raise 403 PERMISSION_DENIED, as Google does, unless `token` may make this call on the
        resource of path `params`."""
        grants = self.bindings.get(token)
        if grants is None:
            return  # the owner
        try:
            needed = required_permissions(method_id, body)
        except KeyError:
            raise ApiError(
                403, "PERMISSION_DENIED", f"{method_id}: no permission of the caller's role allows it"
            ) from None
        for permission in needed:
            name = resource_name(permission, params or {}, body)
            if not any(grant.allows(permission, name) for grant in grants):
                on = f" on '{name}'" if name is not None else ""
                raise ApiError(
                    403,
                    "PERMISSION_DENIED",
                    f"Permission '{permission}' denied{on} ({method_id}): no role binding of the "
                    "caller holds it for this resource",
                )
