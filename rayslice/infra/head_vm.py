"""The CPU head VM (``head=vm``): a Compute Engine instance that runs only the Ray head.

Multislice needs a head that no slice owns: a preempted or recreated slice must not take the
GCS, the Jobs API and the multislice coordinator down with it. The VM boots the same script
as the TPU hosts; the ``rayslice-role: head-vm`` attribute makes it start the head. It is
always on-demand, even when the slices are spot, for the same reason. Like the slices, it is
replaced, not patched, when its metadata (the boot script) changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from rayslice.infra.cpu_vm import cpu_vm
from rayslice.infra.firewall import cluster_tag, head_tag
from rayslice.infra.labels import resource_labels
from rayslice.infra.metadata import host_metadata
from rayslice.names import ATTR_COMPILATION_CACHE, ATTR_RECORD, HEAD_VM_ROLE, HEAD_VM_SLICE_INDEX, head_name
from rayslice.spec import ClusterSpec

HEAD_VM_DISK_GB = 100


def head_vm_name(spec: ClusterSpec) -> str:
    return head_name(spec.name)


def _internal_ip(nics: Sequence[gcp.compute.outputs.InstanceNetworkInterface]) -> str:
    """The head's address, which Compute Engine assigns on creation (never empty once created)."""
    ip = nics[0].network_ip
    if not ip:
        raise RuntimeError("Compute Engine returned the head VM without an internal IP")
    return ip


@dataclass(frozen=True, kw_only=True)
class HostArgs:
    """What every component that boots hosts from the rendered script gets: the head VM as is,
    each slice as `hosts.SliceArgs`, which adds the slice's index and the head's address."""

    spec: ClusterSpec
    script: str
    network: pulumi.Input[str]
    subnetwork: pulumi.Input[str | None]
    service_account_email: pulumi.Input[str]
    token_secret: str | None
    # The gs:// location of the cluster's compilation cache (`rayslice.infra.compilation_cache`).
    compilation_cache: pulumi.Input[str] | None = None
    # The gs:// prefix of the cluster's record (`rayslice.infra.record_bucket`); None: no record.
    record: pulumi.Input[str] | None = None
    # What the resources that boot hosts must wait for (firewall, IAM wait): a component's
    # depends_on does not reach its children, so each one passes these to its instances.
    depends_on: Sequence[pulumi.Resource] = ()


class HeadVm(pulumi.ComponentResource):
    """The head instance; `internal_ip` is the address every TPU host joins."""

    instance_name: pulumi.Output[str]
    internal_ip: pulumi.Output[str]

    def __init__(self, name: str, args: HostArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("rayslice:infra:HeadVm", name, None, opts)
        spec = args.spec
        metadata: dict[str, pulumi.Input[str]] = {
            **host_metadata(spec, args.script, HEAD_VM_SLICE_INDEX, token_secret=args.token_secret)
        }
        if args.compilation_cache is not None:  # the bucket's location, known once it exists
            metadata[ATTR_COMPILATION_CACHE] = args.compilation_cache
        if args.record is not None:
            metadata[ATTR_RECORD] = args.record
        instance = cpu_vm(
            f"{name}-instance",
            spec=spec,
            name=head_vm_name(spec),
            machine_type=spec.head_machine_type,
            disk_gb=HEAD_VM_DISK_GB,
            network=args.network,
            subnetwork=args.subnetwork,
            service_account_email=args.service_account_email,
            metadata=metadata,
            labels=resource_labels(spec, HEAD_VM_ROLE),
            tags=[cluster_tag(spec), head_tag(spec)],
            external_ip=spec.external_ips,
            parent=self,
            depends_on=args.depends_on,
        )
        self.instance_name = instance.name
        self.internal_ip = instance.network_interfaces.apply(_internal_ip)
        # Repeated from the annotations: registered outputs are what `pulumi stack` shows.
        self.register_outputs({"instance_name": self.instance_name, "internal_ip": self.internal_ip})
