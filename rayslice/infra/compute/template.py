"""What a Compute Engine TPU host is made of, as plain values: pure builders, no resources.

`ComputeSlice` (slice.py) assembles these into Pulumi resources; tests call them directly.
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from rayslice.cloud import rules
from rayslice.spec import ClusterSpec, host_image_link

# Values below are Compute Engine API enums; tests/infra/test_api_enums.py checks each against
# the compute v1 discovery document google-api-python-client ships. The rules they satisfy, each
# with its source, are in `rayslice.cloud.rules` (docs/deploy-compute.md lists them).
WORKLOAD_POLICY_TYPE = "HIGH_THROUGHPUT"  # place the hosts as close as possible (one ICI domain)
# TPU hosts cannot live-migrate: Compute Engine's TPU docs require TERMINATE on host maintenance.
ON_HOST_MAINTENANCE = "TERMINATE"
# Spot: Google's "Request TPU Spot VMs" page stops preempted TPU VMs (rule spot-tpu-stop); the
# MIG does not repair them one by one (`lifecycle_policy`), the recovery controller recreates the
# slice whole.
SPOT_TERMINATION_ACTION = rules.STOP
# Reserved: the reservation-bound provisioning model consumes a named (specific) reservation and
# deletes its instances when the reservation ends (rules reservation-bound-specific and
# bulk-reservation-bound-delete).
RESERVED_TERMINATION_ACTION = rules.DELETE
RESERVATION_NAME_KEY = "compute.googleapis.com/reservation-name"  # SPECIFIC_RESERVATION by name
# Flex-start: Compute Engine deletes the hosts at the end of their run duration, so their
# termination action is DELETE; they consume no reservation and do not restart by themselves
# (SkyPilot's TPU flex-start template, sky/provision/gcp/mig_utils.py
# create_region_instance_template: FLEX_START, DELETE, maxRunDuration, NO_RESERVATION; MIG
# create_region_managed_instance_group: BULK, targetSize = hosts, DO_NOTHING).
FLEX_START_TERMINATION_ACTION = rules.DELETE
NO_RESERVATION = "NO_RESERVATION"
# The MIG creates a flex-start slice's hosts all at once or none, waiting until the zone has them
# all (compute v1 discovery, InstanceGroupManagerTargetSizePolicy.mode BULK: "if the MIG is unable
# to create even one VM, the MIG waits until all VMs can be created at the same time"; Compute
# Engine, "About bulk mode": no resize requests; hosts are added only while the target size is 0).
BULK_MODE = rules.BULK
BOOT_DISK_GB = 100
TIMEOUTS = pulumi.CustomTimeouts(create="60m", update="60m", delete="30m")


def template_name_prefix(slice_name: str) -> str:
    """The ``name_prefix`` of a slice's instance templates: the provider appends a generated
    suffix, so a changed template gets a new name. The head's grant to use this cluster's
    templates (`rayslice.infra.identity`) names templates by this prefix."""
    return f"{slice_name}-"


def scheduling(capacity: str, run_seconds: int | None = None) -> gcp.compute.InstanceTemplateSchedulingArgs:
    """Provisioning per capacity. pulumi-gcp requires preemptible and no automatic restart
    with SPOT; reservation-bound and on-demand hosts restart after a host error. A flex-start
    template carries the run duration (`run_seconds`, ``maxRunHours``): its MIG is in bulk mode,
    which takes no resize request to carry it (SkyPilot, sky/provision/gcp/mig_utils.py
    create_region_instance_template: FLEX_START, DELETE, ``maxRunDuration``, TERMINATE)."""
    if capacity == "spot":
        return gcp.compute.InstanceTemplateSchedulingArgs(
            provisioning_model=rules.SPOT,
            preemptible=True,
            automatic_restart=False,
            instance_termination_action=SPOT_TERMINATION_ACTION,
            on_host_maintenance=ON_HOST_MAINTENANCE,
        )
    if capacity == "flex-start":
        return gcp.compute.InstanceTemplateSchedulingArgs(
            provisioning_model=rules.FLEX_START,
            automatic_restart=False,
            instance_termination_action=FLEX_START_TERMINATION_ACTION,
            on_host_maintenance=ON_HOST_MAINTENANCE,
            max_run_duration=gcp.compute.InstanceTemplateSchedulingMaxRunDurationArgs(seconds=run_seconds)
            if run_seconds is not None
            else None,
        )
    if capacity == "reserved":
        return gcp.compute.InstanceTemplateSchedulingArgs(
            provisioning_model=rules.RESERVATION_BOUND,
            automatic_restart=True,
            instance_termination_action=RESERVED_TERMINATION_ACTION,
            on_host_maintenance=ON_HOST_MAINTENANCE,
        )
    return gcp.compute.InstanceTemplateSchedulingArgs(
        provisioning_model="STANDARD",
        automatic_restart=True,
        on_host_maintenance=ON_HOST_MAINTENANCE,
    )


def reservation_affinity(spec: ClusterSpec) -> gcp.compute.InstanceTemplateReservationAffinityArgs | None:
    """reserved: the named reservation (``SPECIFIC_RESERVATION``, rule
    reservation-bound-specific; the spec requires the name on compute); other capacities: the
    default; flex-start: none (``NO_RESERVATION``)."""
    if spec.capacity == "flex-start":
        return gcp.compute.InstanceTemplateReservationAffinityArgs(type=NO_RESERVATION)
    if spec.capacity != "reserved":
        return None
    return gcp.compute.InstanceTemplateReservationAffinityArgs(
        type=rules.SPECIFIC_RESERVATION,
        specific_reservation=gcp.compute.InstanceTemplateReservationAffinitySpecificReservationArgs(
            key=RESERVATION_NAME_KEY, values=[str(spec.reservation)]
        ),
    )


def lifecycle_policy() -> gcp.compute.InstanceGroupManagerInstanceLifecyclePolicyArgs:
    """``DO_NOTHING`` on a failed host, whatever the capacity (rule tpu-mig-do-nothing): a MIG's
    default, ``REPAIR``, recreates single hosts, which cannot rejoin an ICI slice. Compute Engine
    recovers an on-demand, reserved or flex-start slice whole by itself (Cloud TPU, "Failure
    recovery of TPU instances"), not through the MIG's repair; a Spot slice is recreated whole by
    the recovery controller."""
    return gcp.compute.InstanceGroupManagerInstanceLifecyclePolicyArgs(
        default_action_on_failure=rules.DO_NOTHING
    )


def boot_disk_type(spec: ClusterSpec) -> str:
    """The boot disk type Google lists for the generation's TPU VMs (rule tpu-boot-disk)."""
    return rules.BOOT_DISK_TYPES[spec.tpu.generation][0]


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
