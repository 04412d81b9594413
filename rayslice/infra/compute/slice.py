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

A flex-start slice (``capacity: flex-start``) is made in the documented bulk form: its MIG runs
in bulk mode (target-size policy BULK; rule bulk-provisioning-model: the template's provisioning
model is FLEX_START, which carries ``maxRunDuration`` from ``maxRunHours``) with its target size
set to the slice's host count at insert. The MIG waits until the zone has every host and then
creates them all at once, named by the MIG. Bulk mode takes no resize request and adds hosts only
while the target size is 0 (Compute Engine, "About bulk mode"; rules bulk-no-resize-request and
bulk-grows-from-zero), so the slice holds no per-instance configs and no reserved addresses
(SkyPilot's TPU flex-start provisioner does the same: sky/provision/gcp/mig_utils.py,
create_region_instance_template and create_region_managed_instance_group). ``pulumi up`` returns
once the MIG exists; the hosts boot with the same script when the zone has them and identify
themselves by Google's TPU attributes (`platforms.VmPlatform.identity_attributes`). Its host IPs
are not known to Pulumi (`host_ips` is empty); `rayslice status` lists them. On an elastic
cluster a flex-start slice above minSlices is declared with target size 0: the recovery
controller resizes it to the slice's hosts when Ray needs the slice, and back to 0 to remove it
(`controller_owns`; docs/elastic.md).

A change of the boot script or its attributes makes a new instance template; the MIG's update
policy then recreates every host of the slice at once, keeping names and addresses (a slice is
only usable whole, so a rolling update would only prolong the outage).
"""

from __future__ import annotations

import dataclasses
import functools

import pulumi
import pulumi_gcp as gcp

from rayslice.catalog import region_of
from rayslice.infra.compute.bulk_hosts import SliceHosts
from rayslice.infra.compute.template import (
    BOOT_DISK_GB,
    TIMEOUTS,
    WORKLOAD_POLICY_TYPE,
    boot_disk_type,
    hosts_in_one_call,
    lifecycle_policy,
    reservation_affinity,
    scheduling,
    source_image,
    target_size_policies,
    template_name_prefix,
)
from rayslice.infra.firewall import slice_tags
from rayslice.infra.hosts import SliceArgs
from rayslice.infra.labels import resource_labels
from rayslice.infra.metadata import REPLACE_ON_METADATA
from rayslice.names import CLOUD_PLATFORM_SCOPE, NIC, address_name, slice_host_names
from rayslice.recovery.scaling import host_config
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
            # Flex-start: every host at insert, in bulk mode (none on a slice the controller owns,
            # which it resizes from 0); else 0 and createInstances below adds the hosts.
            target_size=spec.tpu.hosts if spec.waits_for_capacity and not controller_owns(spec, index) else 0,
            target_size_policies=target_size_policies(spec),
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
            wait_for_instances=False,  # a flex-start MIG waits for capacity; `pulumi up` does not
            opts=pulumi.ResourceOptions(
                parent=self,
                # After its addresses: `pulumi destroy` deletes a resource before what it depends
                # on, so the MIG and the hosts the controller added to it (which use the addresses)
                # are gone before the addresses are deleted; an address in use cannot be.
                depends_on=[*args.depends_on, *addresses],
                custom_timeouts=TIMEOUTS,
                # Raised by createInstances, or set by the controller on its slices.
                ignore_changes=[TARGET_SIZE],
            ),
        )
        # An elastic cluster's slices above minSlices start empty: the recovery controller adds
        # their hosts with the same names and addresses when Ray needs them, and removes them.
        owned = [] if controller_owns(spec, index) else hosts
        if owned and hosts_in_one_call(spec):
            # Bulk mode: every host in one createInstances from target size 0 (bulk_hosts.py).
            SliceHosts(
                f"{name}-hosts",
                {
                    "project": spec.project or gcp.organizations.get_client_config_output().project,
                    "zone": zone,
                    "instanceGroupManager": mig.name,
                    "instances": [
                        address.self_link.apply(functools.partial(host_config, host))
                        for host, address in zip(owned, addresses, strict=True)
                    ],
                },
                opts=pulumi.ResourceOptions(parent=mig, depends_on=list(args.depends_on)),
            )
        else:
            # Individual mode: one per-instance config, so one createInstances, per host.
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
    and addresses, and no per-instance config (a flex-start MIG with target size 0), so a
    ``pulumi up`` after the controller added or removed hosts has nothing to change (the MIG's
    target size is ignored already)."""
    return spec.elastic and index >= (spec.min_slices or 0)
