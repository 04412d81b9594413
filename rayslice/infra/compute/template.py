"""What a Compute Engine TPU host is made of, as plain values: pure builders, no resources.

`ComputeSlice` (slice.py) assembles these into Pulumi resources; tests call them directly.
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from rayslice.spec import ClusterSpec

# Values below are Compute Engine API enums; tests/infra/test_api_enums.py checks each against
# the compute v1 discovery document google-api-python-client ships.
WORKLOAD_POLICY_TYPE = "HIGH_THROUGHPUT"  # place the hosts as close as possible (one ICI domain)
BULK = "BULK"  # create all hosts of the slice or none
# TPU hosts cannot live-migrate: Compute Engine's TPU docs require TERMINATE on host maintenance.
ON_HOST_MAINTENANCE = "TERMINATE"
# Spot: Compute Engine's "Spot VMs" page documents STOP or DELETE as the termination action; a
# MIG recreates a DELETEd instance when capacity returns, and "Configuring stateful MIGs" lists
# as a limitation that instances of a MIG with per-instance configs cannot be stopped. A
# preempted host has lost the slice's state either way.
SPOT_TERMINATION_ACTION = "DELETE"
RESERVATION_NAME_KEY = "compute.googleapis.com/reservation-name"  # SPECIFIC_RESERVATION by name
BOOT_DISK_GB = 100
# Assumed: the TPU machine series boot from Hyperdisk, not Persistent Disk. Not verified per
# machine type (docs/deploy-compute.md, "Not verified against real GCP").
BOOT_DISK_TYPE = "hyperdisk-balanced"
NIC = "nic0"
TIMEOUTS = pulumi.CustomTimeouts(create="60m", update="60m", delete="30m")


def template_name_prefix(slice_name: str) -> str:
    """The ``name_prefix`` of a slice's instance templates: the provider appends a generated
    suffix, so a changed template gets a new name. The head's grant to use this cluster's
    templates (`rayslice.infra.identity`) names templates by this prefix."""
    return f"{slice_name}-"


def scheduling(capacity: str) -> gcp.compute.InstanceTemplateSchedulingArgs:
    """Provisioning per capacity. pulumi-gcp requires preemptible and no automatic restart
    with SPOT; reserved and on-demand hosts restart after a host error."""
    if capacity == "spot":
        return gcp.compute.InstanceTemplateSchedulingArgs(
            provisioning_model="SPOT",
            preemptible=True,
            automatic_restart=False,
            instance_termination_action=SPOT_TERMINATION_ACTION,
            on_host_maintenance=ON_HOST_MAINTENANCE,
        )
    return gcp.compute.InstanceTemplateSchedulingArgs(
        provisioning_model="STANDARD",
        automatic_restart=True,
        on_host_maintenance=ON_HOST_MAINTENANCE,
    )


def reservation_affinity(spec: ClusterSpec) -> gcp.compute.InstanceTemplateReservationAffinityArgs | None:
    """reserved: the named reservation, else any matching one; other capacities: the default."""
    if spec.capacity != "reserved":
        return None
    if spec.reservation:
        return gcp.compute.InstanceTemplateReservationAffinityArgs(
            type="SPECIFIC_RESERVATION",
            specific_reservation=gcp.compute.InstanceTemplateReservationAffinitySpecificReservationArgs(
                key=RESERVATION_NAME_KEY, values=[spec.reservation]
            ),
        )
    return gcp.compute.InstanceTemplateReservationAffinityArgs(type="ANY_RESERVATION")


def source_image(spec: ClusterSpec) -> str:
    """The TPU OS image family of the generation, from the catalog."""
    return f"projects/{spec.tpu.image_project}/global/images/family/{spec.tpu.image_family}"
