"""What a Compute Engine TPU host is made of, as plain values: pure builders, no resources.

`ComputeSlice` (slice.py) assembles these into Pulumi resources; tests call them directly.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_gcp as gcp

from rayslice import capacity_table, catalog
from rayslice.capacity_table import cell_for
from rayslice.spec import ClusterSpec, host_image_link

# What differs per capacity (provisioning model, termination action, reservation, the MIG's
# mode and failure action) comes from the stack's cell of `rayslice.capacity_table`, each value
# with its source there; the values are Compute Engine API enums, which
# tests/infra/test_api_enums.py checks against the compute v1 discovery document. The rules they
# satisfy are in `rayslice.cloud.rules` (docs/deploy-compute.md lists them).
WORKLOAD_POLICY_TYPE = "HIGH_THROUGHPUT"  # place the hosts as close as possible (one ICI domain)
BOOT_DISK_GB = 100
TIMEOUTS = pulumi.CustomTimeouts(create="60m", update="60m", delete="30m")


def template_name_prefix(slice_name: str) -> str:
    """The ``name_prefix`` of a slice's instance templates: the provider appends a generated
    suffix, so a changed template gets a new name. The head's grant to use this cluster's
    templates (`rayslice.infra.identity`) names templates by this prefix."""
    return f"{slice_name}-"


def _template_properties(spec: ClusterSpec) -> dict[str, Any]:
    """The capacity's part of the instance template (`capacity_table.Cell.calls`), filled in."""
    call = next(c for c in cell_for(spec).calls if c.method.endswith("nstanceTemplates.insert"))
    values = {
        capacity_table.RESERVATION_NAME: spec.reservation,
        capacity_table.MAX_RUN_SECONDS: spec.max_run_seconds,
    }
    filled: dict[str, Any] = capacity_table.fill(call.body, values)["properties"]
    return filled


def scheduling(spec: ClusterSpec) -> gcp.compute.InstanceTemplateSchedulingArgs:
    """The template's scheduling, exactly as the stack's capacity cell writes it."""
    body = dict(_template_properties(spec)["scheduling"])
    run = body.pop("maxRunDuration", None)
    return gcp.compute.InstanceTemplateSchedulingArgs(
        provisioning_model=body.pop("provisioningModel"),
        on_host_maintenance=body.pop("onHostMaintenance"),
        automatic_restart=body.pop("automaticRestart"),
        preemptible=body.pop("preemptible", None),
        instance_termination_action=body.pop("instanceTerminationAction", None),
        max_run_duration=None
        if run is None
        else gcp.compute.InstanceTemplateSchedulingMaxRunDurationArgs(seconds=int(run["seconds"])),
        **_nothing_left(body),
    )


def reservation_affinity(spec: ClusterSpec) -> gcp.compute.InstanceTemplateReservationAffinityArgs | None:
    """The cell's reservation affinity: a named reservation (``SPECIFIC_RESERVATION``, rule
    reservation-bound-specific), none (``NO_RESERVATION``, flex-start), or the API's default."""
    body = dict(_template_properties(spec).get("reservationAffinity") or {})
    if not body:
        return None
    kind = body.pop("consumeReservationType")
    key, values = body.pop("key", None), body.pop("values", None)
    _nothing_left(body)
    return gcp.compute.InstanceTemplateReservationAffinityArgs(
        type=kind,
        specific_reservation=None
        if key is None
        else gcp.compute.InstanceTemplateReservationAffinitySpecificReservationArgs(key=key, values=values),
    )


def lifecycle_policy(spec: ClusterSpec) -> gcp.compute.InstanceGroupManagerInstanceLifecyclePolicyArgs:
    """The MIG's action on a failed host, from the cell: ``DO_NOTHING`` on every TPU MIG (a
    MIG's default, ``REPAIR``, recreates single hosts, which cannot rejoin an ICI slice; rule
    tpu-mig-do-nothing). Compute Engine recovers on-demand, reserved and flex-start slices whole
    on its own; the recovery controller recreates Spot slices whole."""
    action = cell_for(spec).failure_action
    assert action is not None, "every compute cell names its MIG's failure action"
    return gcp.compute.InstanceGroupManagerInstanceLifecyclePolicyArgs(default_action_on_failure=action)


def target_size_policies(
    spec: ClusterSpec,
) -> list[gcp.compute.InstanceGroupManagerTargetSizePolicyArgs] | None:
    """The MIG's target-size policy, from the cell's ``mig_mode``: BULK (flex-start and
    reservation-bound: bulk mode takes only those templates, rule bulk-provisioning-model), else
    none, which is INDIVIDUAL (compute v1 discovery, InstanceGroupManagerTargetSizePolicy.mode:
    INDIVIDUAL "is the default mode"; "If mode is unspecified, MIG will behave as in the default
    INDIVIDUAL mode")."""
    mode = cell_for(spec).mig_mode
    assert mode in (capacity_table.BULK, capacity_table.INDIVIDUAL), "every compute cell names its MIG mode"
    if mode != capacity_table.BULK:
        return None
    return [gcp.compute.InstanceGroupManagerTargetSizePolicyArgs(mode=mode)]


def hosts_in_one_call(spec: ClusterSpec) -> bool:
    """Whether the cell's MIG gets its named hosts in one createInstances (a bulk MIG whose hosts
    come from target size 0: bulk mode takes them only while the target size is 0, rule
    bulk-grows-from-zero), rather than one per host (individual mode)."""
    found = cell_for(spec)
    return found.mig_mode == capacity_table.BULK and found.target_size == capacity_table.TARGET_FROM_ZERO


def _nothing_left(body: dict[str, Any]) -> dict[str, Any]:
    """Every field of the cell's body has become an argument above: none is dropped unseen."""
    assert not body, f"capacity table fields without a pulumi-gcp argument here: {sorted(body)}"
    return {}


def boot_disk_type(spec: ClusterSpec) -> str:
    """The boot disk type Google lists for the generation's TPU VMs (rule tpu-boot-disk)."""
    return catalog.BOOT_DISK_TYPES[spec.tpu.generation][0]


def base_image(spec: ClusterSpec) -> str:
    """The TPU OS image family of the generation, from the catalog: what a slice boots without
    `hostImage`, and what `rayslice image` bakes the hosts' venv onto."""
    return f"projects/{spec.tpu.image_project}/global/images/family/{spec.tpu.image_family}"


def source_image(spec: ClusterSpec) -> str:
    """The image the slice's boot disks are made from: `hostImage` (an image in the stack's
    project, built by `rayslice image`), else the generation's TPU OS image family.

    A bare image name becomes ``global/images/NAME``, the form Compute Engine resolves in the
    template's own project (compute v1 discovery document, AttachedDiskInitializeParams.sourceImage:
    "To create a disk with a custom image that you created, specify the image name in the
    following format: global/images/my-custom-image").
    """
    if spec.host_image is None:
        return base_image(spec)
    project, name = host_image_link(spec.host_image)
    return f"projects/{project}/global/images/{name}" if project else f"global/images/{name}"
