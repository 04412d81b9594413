"""What the recovery controller's identity needs, per platform, and how far it can be narrowed.

Each permission is the one Google's REST reference names for a method the controller calls
(`rayslice.recovery.cloud`), plus what creating the slice again implies. Each slice kind groups
them into the `RolePart`s it needs (`rayslice.recovery.kinds`, ``role_parts``), and
`rayslice.infra.identity` turns every part into one project custom role and one binding for the
controller VM's own service account, which nothing else runs as; this module is the only list of
those permissions.

How far a grant can be narrowed is decided by which resources IAM Conditions can see, and
Google's "Resource attributes for IAM Conditions"
(https://cloud.google.com/iam/docs/conditions-resource-attributes) lists them: "Resource
attributes are available for the Google Cloud services and resource types that are listed on
this page. Other services and resource types do not recognize resource attributes." Its
Compute Engine entries are backend services, disks, firewalls, forwarding rules, images,
instance templates (``projects/<project-id>/global/instanceTemplates/<name>``), instances,
snapshots and target proxies: no instance group manager, resource policy or operation, and no
Cloud TPU resource at all (``tpu.googleapis.com`` is not among its services). "Configure
resource-based access" (https://cloud.google.com/iam/docs/configuring-resource-based-access)
says what a condition on an attribute a resource does not provide does: "that part of the
condition is never interpreted as granting access". A ``resource.name`` condition on the MIGs
would therefore grant nothing and lock the controller out; so the MIG, operation, workload
policy and TPU permissions are granted without a condition (each slice kind's ``unnarrowed`` says
so, `rayslice.recovery.kinds`), and the one
resource that IAM can name, the instance template a recreated MIG uses, is narrowed to this
cluster's templates by `template_condition`. None of this has been checked against a real
project (see docs/recovery.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Cloud TPU v2: nodes.get / delete / create and operations.get (the controller polls its
# operations), and queuedResources.get / delete / create (a queued slice is read and recreated
# through its request; the permission names follow the nodes methods' pattern, ``tpu.<collection>.
# <verb>``, as the REST reference's "IAM Permissions" of each method lists them).
TPU_PERMISSIONS = (
    "tpu.nodes.create",
    "tpu.nodes.delete",
    "tpu.nodes.get",
    "tpu.operations.get",
    "tpu.queuedResources.create",
    "tpu.queuedResources.delete",
    "tpu.queuedResources.get",
)
# Compute Engine v1: instanceGroupManagers.get (also listManagedInstances / listPerInstanceConfigs,
# and instanceGroupManagerResizeRequests.list), .delete, .insert (create), .createInstances,
# .deleteInstances and .deletePerInstanceConfigs (all three update: each method's REST reference,
# "IAM Permissions"), and instanceGroupManagerResizeRequests.insert, .cancel and .delete (update,
# on the MIG; `rayslice.local.google.cloud_api.iam` says how far that is sourced): an elastic
# flex-start slice's request is made, cancelled and deleted with no permission beyond these.
COMPUTE_MIG_PERMISSIONS = (
    "compute.instanceGroupManagers.create",
    "compute.instanceGroupManagers.delete",
    "compute.instanceGroupManagers.get",
    "compute.instanceGroupManagers.update",
)
# The recorded workload policy the recreated MIG names, and the zonal operations it polls.
# zoneOperations.list: the zone's preemption operations, so that an event says "preempted".
COMPUTE_SUPPORT_PERMISSIONS = (
    "compute.resourcePolicies.use",
    "compute.zoneOperations.get",
    "compute.zoneOperations.list",
)
# The recorded instance template the recreated MIG names: the one grant IAM can narrow by name.
COMPUTE_TEMPLATE_PERMISSIONS = ("compute.instanceTemplates.useReadOnly",)
# The recreated slice runs as the hosts' service account: the controller must be allowed to act
# as that one account (roles/iam.serviceAccountUser granted on the account, not the project).
# Cloud TPU's "Use a cross-project service account" page asks the same of whoever creates a
# TPU VM that runs as a service account (https://cloud.google.com/tpu/docs/cross-project-sa).
ACT_AS_ROLE = "roles/iam.serviceAccountUser"
# The one permission of ACT_AS_ROLE the controller uses (on the hosts' account only).
ACT_AS_PERMISSION = "iam.serviceAccounts.actAs"

# An elastic cluster's controller reads Ray's demand from the head VM's guest attributes
# (instances.getGuestAttributes; its REST reference, "IAM Permissions"). Instances are among the
# resources IAM Conditions name (conditions-resource-attributes, above), so the grant is narrowed
# to the head VM (`instance_condition`).
DEMAND_PERMISSIONS = ("compute.instances.getGuestAttributes",)

# The name IAM Conditions give an instance template (conditions-resource-attributes, above).
TEMPLATE_RESOURCE_NAME = "projects/{project}/global/instanceTemplates/"
# ... and an instance.
INSTANCE_RESOURCE_NAME = "projects/{project}/zones/{zone}/instances/{name}"


@dataclass(frozen=True)
class RolePart:
    """One custom role of the controller and its one project binding.

    `key` is short and lowercase: it names the role (its ID allows only letters, digits, ``_``
    and ``.``) and the Pulumi resources. With `templates_only` the binding carries
    `template_condition`; without, it holds for the whole project.
    """

    key: str
    permissions: tuple[str, ...]
    templates_only: bool = False
    head_only: bool = False  # with `instance_condition`: the head VM alone


# What an elastic cluster's controller holds besides (docs/elastic.md); compute only.
ELASTIC_PART = RolePart("demand", DEMAND_PERMISSIONS, head_only=True)


def instance_condition(project: str, zone: str, name: str) -> str:
    """CEL expression true for the one instance `name` (the head VM)."""
    return f'resource.name == "{INSTANCE_RESOURCE_NAME.format(project=project, zone=zone, name=name)}"'


def template_condition(project: str, prefixes: Sequence[str]) -> str:
    """CEL expression true for instance templates whose names start with one of `prefixes`.

    Each prefix is a slice's template ``name_prefix`` (``<slice>-``); the trailing hyphen keeps
    slice 1 from matching slice 10's templates.
    """
    if not prefixes or any(not p.endswith("-") for p in prefixes):
        raise ValueError(f"template prefixes must be given and end with '-': {list(prefixes)}")
    base = TEMPLATE_RESOURCE_NAME.format(project=project)
    return " || ".join(f'resource.name.startsWith("{base}{prefix}")' for prefix in prefixes)
