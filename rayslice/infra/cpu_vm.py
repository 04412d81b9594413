"""A CPU Compute Engine instance of the cluster: the head VM and the controller's VM.

Both are on-demand Ubuntu instances on the cluster's network, running as a service account of
the cluster's identity, with Shielded VM on, and replaced (not patched) when their metadata
changes: they differ only in name, size, account, metadata, labels and tags.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pulumi
import pulumi_gcp as gcp

from rayslice.infra.metadata import REPLACE_ON_METADATA
from rayslice.names import CLOUD_PLATFORM_SCOPE
from rayslice.spec import ClusterSpec

# Same OS family as the TPU VM runtime images (Ubuntu 22.04), so one boot script fits both.
CPU_VM_IMAGE = "ubuntu-os-cloud/ubuntu-2204-lts"


def cpu_vm(
    resource_name: str,
    *,
    spec: ClusterSpec,
    name: str,
    machine_type: str,
    disk_gb: int,
    network: pulumi.Input[str],
    subnetwork: pulumi.Input[str | None],
    service_account_email: pulumi.Input[str],
    metadata: Mapping[str, pulumi.Input[str]],
    labels: Mapping[str, str],
    tags: Sequence[str],
    external_ip: bool,
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource],
) -> gcp.compute.Instance:
    """The instance; an external IP only with `external_ip` (the firewall decides what reaches
    it). Without one it reaches Google's APIs through the created network's Cloud NAT or
    Private Google Access (`rayslice.infra.network`)."""
    return gcp.compute.Instance(
        resource_name,
        name=name,
        project=spec.project,
        zone=spec.zone,
        machine_type=machine_type,
        boot_disk=gcp.compute.InstanceBootDiskArgs(
            initialize_params=gcp.compute.InstanceBootDiskInitializeParamsArgs(
                image=CPU_VM_IMAGE, size=disk_gb, type="pd-balanced"
            ),
        ),
        network_interfaces=[
            gcp.compute.InstanceNetworkInterfaceArgs(
                network=network,
                subnetwork=subnetwork,
                access_configs=(
                    [gcp.compute.InstanceNetworkInterfaceAccessConfigArgs()] if external_ip else None
                ),
            )
        ],
        service_account=gcp.compute.InstanceServiceAccountArgs(
            email=service_account_email, scopes=[CLOUD_PLATFORM_SCOPE]
        ),
        shielded_instance_config=gcp.compute.InstanceShieldedInstanceConfigArgs(
            enable_secure_boot=True, enable_vtpm=True, enable_integrity_monitoring=True
        ),
        metadata=dict(metadata),
        labels=dict(labels),
        tags=list(tags),
        allow_stopping_for_update=True,
        opts=pulumi.ResourceOptions(
            parent=parent,
            depends_on=list(depends_on),
            replace_on_changes=[REPLACE_ON_METADATA],
            delete_before_replace=True,
        ),
    )
