"""One TPU slice: a single `gcp.tpu.V2Vm`, which the TPU API creates and deletes as a whole.

A multi-host slice is one API object, so its hosts are never half-created (kuberay#3552's
problem on GKE). Accelerator type and runtime version come from the validated spec (and so
from the catalog); capacity maps onto the V2Vm's scheduling config, and Secure Boot is on
where the catalog's generation allows it. Every host of the slice gets the same metadata; the
TPU runtime adds each host's own worker number and endpoints.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from rayslice import catalog
from rayslice.infra.firewall import cluster_tag, head_tag
from rayslice.infra.labels import resource_labels
from rayslice.infra.metadata import host_metadata
from rayslice.names import CLOUD_PLATFORM_SCOPE
from rayslice.spec import ClusterSpec


def scheduling(capacity: str) -> gcp.tpu.V2VmSchedulingConfigArgs | None:
    """The V2Vm scheduling config of a capacity: spot, any matching reservation, or none."""
    if capacity == "spot":
        return gcp.tpu.V2VmSchedulingConfigArgs(spot=True)
    if capacity == "reserved":
        return gcp.tpu.V2VmSchedulingConfigArgs(reserved=True)
    return None


def shielded_instance_config(spec: ClusterSpec) -> gcp.tpu.V2VmShieldedInstanceConfigArgs | None:
    """Secure Boot where the catalog says the generation boots with it, else the API's default."""
    if catalog.generation(spec.tpu.generation).shielded_vm:
        return gcp.tpu.V2VmShieldedInstanceConfigArgs(enable_secure_boot=True)
    return None


def slice_tags(spec: ClusterSpec, index: int) -> list[str]:
    """Network tags of a slice; with head=slice, slice 0 also carries the head tag."""
    if spec.head == "slice" and index == 0:
        return [cluster_tag(spec), head_tag(spec)]
    return [cluster_tag(spec)]


@dataclass(frozen=True)
class TpuSliceArgs:
    spec: ClusterSpec
    index: int
    script: str
    network: pulumi.Input[str]
    subnetwork: pulumi.Input[str | None]
    service_account_email: pulumi.Input[str]
    token_secret: str | None
    head_address: pulumi.Input[str] | None = None  # the head VM's IP with head=vm


class TpuSlice(pulumi.ComponentResource):
    """A slice and the internal IPs of its hosts (worker 0 first)."""

    slice_name: pulumi.Output[str]
    host_ips: pulumi.Output[list[str]]

    def __init__(self, name: str, args: TpuSliceArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("rayslice:infra:TpuSlice", name, None, opts)
        spec, index = args.spec, args.index
        metadata = pulumi.Output.from_input(args.head_address).apply(
            lambda head_ip: host_metadata(
                spec, args.script, index, head_address=head_ip, token_secret=args.token_secret
            )
        )
        vm = gcp.tpu.V2Vm(
            f"{name}-vm",
            name=spec.slice_name(index),
            project=spec.project,
            zone=spec.zone,
            accelerator_type=spec.accelerator_type,
            runtime_version=spec.runtime_version,
            scheduling_config=scheduling(spec.capacity),
            shielded_instance_config=shielded_instance_config(spec),
            network_config=gcp.tpu.V2VmNetworkConfigArgs(
                network=args.network,
                subnetwork=args.subnetwork,
                enable_external_ips=spec.external_ips,
            ),
            service_account=gcp.tpu.V2VmServiceAccountArgs(
                email=args.service_account_email, scopes=[CLOUD_PLATFORM_SCOPE]
            ),
            metadata=metadata,
            labels=resource_labels(spec, "tpu-slice", index),
            tags=slice_tags(spec, index),
            description=f"rayslice {spec.name}: slice {index} of {spec.slices} ({spec.accelerator_type})",
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.slice_name = vm.name
        self.host_ips = vm.network_endpoints.apply(lambda endpoints: [e.ip_address for e in endpoints or []])
        # Repeated from the annotations: registered outputs are what `pulumi stack` shows.
        self.register_outputs({"slice_name": self.slice_name, "host_ips": self.host_ips})
