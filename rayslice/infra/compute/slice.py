"""One TPU slice on Compute Engine: a workload policy, an instance template and a zonal MIG.

Google's pages "TPU resources in Compute Engine" and "Create a MIG with multi-host TPU slice"
describe the shape: a TPU host is an ordinary VM instance of a TPU machine type; a multi-host
slice is a managed instance group bound to a regional workload policy (``HIGH_THROUGHPUT`` plus
the accelerator topology). A single-host slice is a one-instance MIG too, so Compute Engine
repairs it the same way.

Host names are sequential (`rayslice.names.host_name`: ``<slice>-w0``, ``-w1``, ...): a MIG
alone names instances ``<base>-<4 random characters>``, so each host gets a per-instance config
(`gcp.compute.PerInstanceConfig`) that fixes its name and keeps its reserved internal address
through repairs and recreations. The provider creates a per-instance config with
``instanceGroupManagers.createInstances``, which adds the instance and raises the target size,
so the MIG is declared with target size 0 and its per-instance configs make the topology's host
count (rule instances-match-topology in `rayslice.cloud.rules`; a target size of N plus N
configs made 2N VMs). Pulumi ignores the target size after creation, or the next ``pulumi up``
would shrink the MIG back to 0. No target-size policy: bulk mode takes only flex-start and
reservation-bound templates (rule bulk-provisioning-model) and applies to the target size,
which creates nothing here. The metadata lists those names (the platform's identity attributes,
`rayslice.platforms.COMPUTE`), so each host finds its worker number and its peers without the
Cloud TPU API's attributes. With ``head=slice`` they also name ``-w0``'s reserved address as the
head's: the outputs point there, and no source says which host Google numbers worker 0.

A flex-start slice (``capacity: flex-start``) cannot be made this way: its hosts come only through
a resize request, which waits until the zone has every host and then creates them all at once,
named by the MIG (``resizeBy``: "The MIG automatically generates the names of the VMs"; Compute
Engine, "About resize requests in a MIG"). Its MIG runs in bulk mode (target-size policy BULK;
rule bulk-provisioning-model: the template's provisioning model is FLEX_START), holds no
per-instance configs and no reserved addresses, and a `gcp.compute.ResizeRequest` named
``<slice>-request`` asks for the slice's hosts with ``requestedRunDuration`` from ``maxRunHours``
(10 minutes to 7 days: pulumi-gcp's ResizeRequestRequestedRunDuration). ``pulumi up`` returns
once Google has accepted the request; the hosts boot with the same script when it is fulfilled
and identify themselves by Google's TPU attributes (`platforms.VmPlatform.identity_attributes`).
Its host IPs are not known to Pulumi (`host_ips` is empty); `rayslice status` lists them. On an
elastic cluster a flex-start slice above minSlices has no request here: the recovery controller
makes it when Ray needs the slice, cancels it if the need goes first, and deletes it with the
hosts (`controller_owns`; docs/elastic.md).

A change of the boot script or its attributes makes a new instance template; the MIG's update
policy then recreates every host of the slice at once, keeping names and addresses (a slice is
only usable whole, so a rolling update would only prolong the outage).
"""

from __future__ import annotations

import dataclasses

import pulumi
import pulumi_gcp as gcp

from rayslice.catalog import region_of
from rayslice.infra.compute.template import (
    BOOT_DISK_GB,
    BULK_MODE,
    TIMEOUTS,
    WORKLOAD_POLICY_TYPE,
    boot_disk_type,
    lifecycle_policy,
    reservation_affinity,
    scheduling,
    source_image,
    template_name_prefix,
)
from rayslice.infra.firewall import slice_tags
from rayslice.infra.hosts import SliceArgs
from rayslice.infra.labels import resource_labels
from rayslice.infra.metadata import REPLACE_ON_METADATA
from rayslice.names import CLOUD_PLATFORM_SCOPE, NIC, address_name, request_name, slice_host_names
from rayslice.spec import ClusterSpec

TARGET_SIZE = "targetSize"


class ComputeSlice(pulumi.ComponentResource):
    """A slice's MIG and the internal IPs of its hosts (worker 0 first)."""

    slice_name: pulumi.Output[str]
    host_ips: pulumi.Output[list[str]]

    def __init__(self, name: str, args: SliceArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("rayslice:infra:ComputeSlice", name, None, opts)
        spec, index = args.spec, args.index
        assert spec.zone is not None  # VmSliceCluster checked it
        zone, region = spec.zone, region_of(spec.zone)
        child = pulumi.ResourceOptions(parent=self)
        slice_name = spec.slice_name(index)
        # A flex-start slice's hosts are named by the MIG when its request is fulfilled.
        hosts = [] if spec.waits_for_capacity else slice_host_names(slice_name, spec.tpu.hosts)
        labels = resource_labels(spec, "tpu-slice", index)

        policy = gcp.compute.ResourcePolicy(
            f"{name}-policy",
            name=f"{slice_name}-policy",
            project=spec.project,
            region=region,
            description=f"rayslice {spec.name}: topology of slice {index} ({spec.accelerator_type})",
            workload_policy=gcp.compute.ResourcePolicyWorkloadPolicyArgs(
                type=WORKLOAD_POLICY_TYPE, accelerator_topology=spec.tpu.topology
            ),
            opts=child,
        )
        addresses = [
            gcp.compute.Address(
                f"{name}-ip-{worker}",
                name=address_name(host),
                project=spec.project,
                region=region,
                address_type="INTERNAL",
                subnetwork=args.subnetwork,
                labels=labels,
                opts=child,
            )
            for worker, host in enumerate(hosts)
        ]
        if spec.head == "slice" and addresses:
            # The head is the host at `<slice>-w0`'s reserved address (the boot script's rule), so
            # that `head_internal_ip` names it whichever host Google numbers worker 0.
            args = dataclasses.replace(args, head_address=addresses[0].address)
        metadata = args.metadata()
        template = gcp.compute.InstanceTemplate(
            f"{name}-template",
            name_prefix=template_name_prefix(slice_name),
            project=spec.project,
            machine_type=spec.tpu.machine_type,
            description=f"rayslice {spec.name}: hosts of slice {index} ({spec.accelerator_type})",
            disks=[
                gcp.compute.InstanceTemplateDiskArgs(
                    boot=True,
                    auto_delete=True,
                    source_image=source_image(spec),
                    disk_size_gb=BOOT_DISK_GB,
                    disk_type=boot_disk_type(spec),
                )
            ],
            network_interfaces=[
                gcp.compute.InstanceTemplateNetworkInterfaceArgs(
                    network=args.network,
                    subnetwork=args.subnetwork,
                    access_configs=[gcp.compute.InstanceTemplateNetworkInterfaceAccessConfigArgs()]
                    if spec.external_ips
                    else None,
                )
            ],
            service_account=gcp.compute.InstanceTemplateServiceAccountArgs(
                email=args.service_account_email, scopes=[CLOUD_PLATFORM_SCOPE]
            ),
            scheduling=scheduling(spec),
            reservation_affinity=reservation_affinity(spec),
            metadata=metadata,
            labels=labels,
            tags=slice_tags(spec, index),
            # A template cannot change in place: a new one (new name from the prefix) exists
            # before the MIG moves to it. Marked so that `rayslice preview` says so.
            opts=pulumi.ResourceOptions(parent=self, replace_on_changes=[REPLACE_ON_METADATA]),
        )
        mig = gcp.compute.InstanceGroupManager(
            f"{name}-mig",
            name=slice_name,
            project=spec.project,
            zone=zone,
            base_instance_name=slice_name,
            description=f"rayslice {spec.name}: slice {index} of {spec.slices} ({spec.accelerator_type})",
            versions=[
                gcp.compute.InstanceGroupManagerVersionArgs(instance_template=template.self_link_unique)
            ],
            target_size=0,  # the per-instance configs or the resize request below add the hosts
            target_size_policies=[gcp.compute.InstanceGroupManagerTargetSizePolicyArgs(mode=BULK_MODE)]
            if spec.waits_for_capacity
            else None,
            instance_lifecycle_policy=lifecycle_policy(spec),
            resource_policies=gcp.compute.InstanceGroupManagerResourcePoliciesArgs(
                workload_policy=policy.self_link
            ),
            update_policy=gcp.compute.InstanceGroupManagerUpdatePolicyArgs(
                type="PROACTIVE",
                minimal_action="REPLACE",
                replacement_method="RECREATE",  # keep the sequential names
                max_surge_fixed=0,
                max_unavailable_fixed=spec.tpu.hosts,  # the whole slice at once
            ),
            wait_for_instances=False,  # the hosts come from what follows, not from the MIG itself
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=list(args.depends_on),
                custom_timeouts=TIMEOUTS,
                ignore_changes=[TARGET_SIZE],  # raised by the per-instance configs or the request
            ),
        )
        # An elastic flex-start slice's request is the controller's: it asks for the slice when Ray
        # needs it, cancels it when the need goes before the hosts come, and deletes it with them.
        if spec.waits_for_capacity and not controller_owns(spec, index):
            _resize_request(f"{name}-request", spec, slice_name, zone, mig, args)
        # An elastic cluster's slices above minSlices start empty: the recovery controller adds
        # their hosts with the same names and addresses when Ray needs them, and removes them.
        owned = [] if controller_owns(spec, index) else hosts
        for worker, (host, address) in enumerate(zip(owned, addresses[: len(owned)], strict=True)):
            gcp.compute.PerInstanceConfig(
                f"{name}-w{worker}",
                name=host,
                project=spec.project,
                zone=zone,
                instance_group_manager=mig.name,
                preserved_state=gcp.compute.PerInstanceConfigPreservedStateArgs(
                    internal_ips=[
                        gcp.compute.PerInstanceConfigPreservedStateInternalIpArgs(
                            interface_name=NIC,
                            auto_delete="NEVER",
                            ip_address=gcp.compute.PerInstanceConfigPreservedStateInternalIpIpAddressArgs(
                                address=address.self_link
                            ),
                        )
                    ]
                ),
                remove_instance_on_destroy=True,
                opts=pulumi.ResourceOptions(
                    parent=mig, depends_on=list(args.depends_on), custom_timeouts=TIMEOUTS
                ),
            )
        self.slice_name = mig.name  # (no addresses for a flex-start slice: `hosts` is empty)
        self.host_ips = pulumi.Output.all(*[a.address for a in addresses])
        # Repeated from the annotations: registered outputs are what `pulumi stack` shows.
        self.register_outputs({"slice_name": self.slice_name, "host_ips": self.host_ips})


def controller_owns(spec: ClusterSpec, index: int) -> bool:
    """Whether slice `index`'s hosts belong to the controller (an elastic cluster's slices above
    minSlices), not to the program: Pulumi then declares the slice's MIG, template, workload policy
    and addresses, and no per-instance config or resize request, so a ``pulumi up`` after the
    controller added or removed hosts has nothing to change (the MIG's target size is ignored
    already)."""
    return spec.elastic and index >= (spec.min_slices or 0)


def _resize_request(
    name: str,
    spec: ClusterSpec,
    slice_name: str,
    zone: str,
    mig: gcp.compute.InstanceGroupManager,
    args: SliceArgs,
) -> gcp.compute.ResizeRequest:
    """The request that grows a flex-start slice's MIG by all its hosts at once, when the zone
    has them, for ``maxRunHours`` (the spec fills the default: 7 days)."""
    assert spec.max_run_seconds is not None  # the spec sets maxRunHours for flex-start
    return gcp.compute.ResizeRequest(
        name,
        name=request_name(slice_name),
        project=spec.project,
        zone=zone,
        instance_group_manager=mig.name,
        description=f"rayslice {spec.name}: all {spec.tpu.hosts} hosts of slice {slice_name}",
        resize_by=spec.tpu.hosts,
        requested_run_duration=gcp.compute.ResizeRequestRequestedRunDurationArgs(
            seconds=str(spec.max_run_seconds)
        ),
        opts=pulumi.ResourceOptions(parent=mig, depends_on=list(args.depends_on)),
    )
