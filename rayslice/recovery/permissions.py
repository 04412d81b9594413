"""What the recovery controller's identity needs, per platform, and how far it can be narrowed.

Each permission is the one Google's REST reference names for a method the controller calls
(`rayslice.recovery.cloud`), plus what creating the slice again implies. The custom role holds
only these; the binding carries an IAM condition on resource names where the service evaluates
one. Compute Engine evaluates ``resource.name`` conditions on its resources; the condition below
lists this cluster's MIGs by exact name (a prefix such as ``<cluster>-slice-`` would also
match another cluster named ``<cluster>-slice-x``). What cannot be narrowed, and why, is
`UNNARROWED`; docs/recovery.md repeats it. None of this has been checked against a real
project (see docs/recovery.md).
"""

from __future__ import annotations

from rayslice import names

# Cloud TPU v2: nodes.get / delete / create and operations.get (the controller polls its operations).
TPU_PERMISSIONS = ("tpu.nodes.create", "tpu.nodes.delete", "tpu.nodes.get", "tpu.operations.get")
# Compute Engine v1: instanceGroupManagers.get (also listManagedInstances / listPerInstanceConfigs),
# .delete, .insert (create), .createInstances (update); using the recorded instance template and
# workload policy in the recreated MIG.
COMPUTE_MIG_PERMISSIONS = (
    "compute.instanceGroupManagers.create",
    "compute.instanceGroupManagers.delete",
    "compute.instanceGroupManagers.get",
    "compute.instanceGroupManagers.update",
)
# Permissions on resources that are not the slice (operations, the template, the workload policy):
# granted without the name condition, which would not match them.
COMPUTE_SUPPORT_PERMISSIONS = (
    "compute.instanceTemplates.useReadOnly",
    "compute.resourcePolicies.use",
    "compute.zoneOperations.get",
)
# The recreated slice runs as the hosts' service account: the controller must be allowed to act
# as that one account (roles/iam.serviceAccountUser granted on the account, not the project).
ACT_AS_ROLE = "roles/iam.serviceAccountUser"

UNNARROWED = {
    "tpu-vm": "Cloud TPU does not evaluate IAM conditions on resource names, so the TPU permissions "
    "hold for every node in the project; the controller's own name check is what keeps it on this "
    "cluster's slices.",
    "compute": "zoneOperations.get, instanceTemplates.useReadOnly and resourcePolicies.use are "
    "granted without a condition: their resources are not the MIG, and templates get generated "
    "names (name_prefix) that are not known before deployment.",
}


def permissions(platform: str) -> tuple[str, ...]:
    """Every permission of the controller's custom role on `platform`."""
    if platform == "tpu-vm":
        return TPU_PERMISSIONS
    if platform == "compute":
        return COMPUTE_MIG_PERMISSIONS + COMPUTE_SUPPORT_PERMISSIONS
    return ()


def mig_condition(project: str, zone: str, cluster: str, slices: int) -> str:
    """CEL expression true exactly for this cluster's slice MIGs (Compute Engine resource names)."""
    base = f"projects/{project}/zones/{zone}/instanceGroupManagers"
    return " || ".join(f'resource.name == "{base}/{names.slice_name(cluster, i)}"' for i in range(slices))
