"""One TPU slice on the Cloud TPU API: a single `gcp.tpu.V2Vm`, created and deleted as a whole.

A multi-host slice is one API object, so its hosts are never half-created (kuberay#3552's
problem on GKE). Accelerator type and runtime version come from the validated spec (and so
from the catalog); capacity maps onto the V2Vm's scheduling config, and Secure Boot is on
where the catalog's generation allows it. Every host of the slice gets the same metadata; the
TPU runtime adds each host's own worker number and endpoints.

The shape is sent as ``accelerator_config`` (type and topology), not as ``accelerator_type``:
with a ``<gen>-<N>`` name alone the API picks its own topology for N, which need not be the one
the catalog (and so the boot script and Ray) expects. pulumi-gcp 10.2 takes one or the other.

A change of anything in the hosts' metadata (the boot script, so requirements, rayVersion,
preset; or the ``rayslice-*`` attributes) replaces the slice: a V2Vm's metadata is otherwise
updated in place and running hosts keep the old configuration until they happen to reboot.
Its name is fixed, so the old slice is deleted before the new one is created.

With ``queued: true`` the slice is not a V2Vm but a queued resource (`rayslice.infra.tpu_vm.queued`)
whose node is the same node, given in V2Vm's properties (`node_properties`): it waits for
capacity, and its hosts' IPs are not known to Pulumi (`host_ips` is empty; `rayslice status`
reads the node once the request is ACTIVE).
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_gcp as gcp

from rayslice import catalog
from rayslice.capacity_table import cell_for
from rayslice.cloud.bodies import TPU_ACCELERATOR_TYPES
from rayslice.infra.firewall import slice_tags
from rayslice.infra.hosts import SliceArgs
from rayslice.infra.labels import resource_labels
from rayslice.infra.metadata import REPLACE_ON_METADATA
from rayslice.infra.tpu_vm.queued import queued_slice
from rayslice.names import CLOUD_PLATFORM_SCOPE
from rayslice.spec import ClusterSpec

# The Cloud TPU API's AcceleratorConfig.type per catalog generation.
API_ACCELERATOR_TYPES = TPU_ACCELERATOR_TYPES
# Creating or deleting a large slice takes far longer than the provider's 20-minute default.
TIMEOUTS = pulumi.CustomTimeouts(create="60m", delete="30m")


def accelerator_config(spec: ClusterSpec) -> gcp.tpu.V2VmAcceleratorConfigArgs:
    """The slice's generation and topology, exactly as the catalog derived them."""
    return gcp.tpu.V2VmAcceleratorConfigArgs(
        type=API_ACCELERATOR_TYPES[spec.tpu.generation], topology=spec.tpu.topology
    )


def scheduling(spec: ClusterSpec) -> gcp.tpu.V2VmSchedulingConfigArgs | None:
    """The V2Vm scheduling config of a direct create, as the stack's capacity cell writes it
    (``nodes.create``'s ``schedulingConfig``: spot, any matching reservation, or none)."""
    (call,) = cell_for(spec).calls
    config = dict(call.body.get("schedulingConfig") or {})
    if not config:
        return None
    args = gcp.tpu.V2VmSchedulingConfigArgs(
        spot=config.pop("spot", None), reserved=config.pop("reserved", None)
    )
    assert not config, f"capacity table fields without a V2Vm argument here: {sorted(config)}"
    return args


def shielded_instance_config(spec: ClusterSpec) -> gcp.tpu.V2VmShieldedInstanceConfigArgs | None:
    """Secure Boot where the catalog says the generation boots with it, else the API's default."""
    if catalog.generation(spec.tpu.generation).shielded_vm:
        return gcp.tpu.V2VmShieldedInstanceConfigArgs(enable_secure_boot=True)
    return None


def node_properties(spec: ClusterSpec, args: SliceArgs, index: int) -> dict[str, Any]:
    """A queued slice's node as V2Vm's properties (camelCase, as the engine hands them to
    `rayslice.cloud.bodies`): the fields `TpuVmSlice` gives its V2Vm, from the same helpers.
    The capacity is the request's (its tier, reservation or provisioning model: gcloud's
    queued-resources create sets none of it on the node), so the node carries none."""
    accelerator = accelerator_config(spec)
    shielded = shielded_instance_config(spec)
    return {
        "acceleratorConfig": {"type": accelerator.type, "topology": accelerator.topology},
        "runtimeVersion": spec.runtime_version,
        **({"shieldedInstanceConfig": {"enableSecureBoot": True}} if shielded else {}),
        "networkConfig": {
            "network": args.network,
            "subnetwork": args.subnetwork,
            "enableExternalIps": spec.external_ips,
        },
        "serviceAccount": {"email": args.service_account_email, "scopes": [CLOUD_PLATFORM_SCOPE]},
        "metadata": args.metadata(),
        "labels": resource_labels(spec, "tpu-slice", index),
        "tags": slice_tags(spec, index),
        "description": description(spec, index),
    }


def description(spec: ClusterSpec, index: int) -> str:
    """The slice's node description, the same whether created directly or through a request."""
    return f"rayslice {spec.name}: slice {index} of {spec.slices} ({spec.accelerator_type})"


class TpuVmSlice(pulumi.ComponentResource):
    """A slice and the internal IPs of its hosts (worker 0 first)."""

    slice_name: pulumi.Output[str]
    host_ips: pulumi.Output[list[str]]

    def __init__(self, name: str, args: SliceArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("rayslice:infra:TpuVmSlice", name, None, opts)
        spec, index = args.spec, args.index
        if spec.queued:
            request = queued_slice(
                f"{name}-request",
                spec,
                spec.slice_name(index),
                node_properties(spec, args, index),
                # A queued resource has no update method: any change makes a new request, after
                # the old one (and its node) is gone, as the provider's diff says too.
                pulumi.ResourceOptions(
                    parent=self,
                    depends_on=list(args.depends_on),
                    replace_on_changes=["*"],
                    delete_before_replace=True,
                ),
            )
            self.slice_name = request.id.apply(lambda _: spec.slice_name(index))
            self.host_ips = pulumi.Output.from_input([])
            self.register_outputs({"slice_name": self.slice_name, "host_ips": self.host_ips})
            return
        metadata = args.metadata()
        vm = gcp.tpu.V2Vm(
            f"{name}-vm",
            name=spec.slice_name(index),
            project=spec.project,
            zone=spec.zone,
            accelerator_config=accelerator_config(spec),
            runtime_version=spec.runtime_version,
            scheduling_config=scheduling(spec),
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
            description=description(spec, index),
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=list(args.depends_on),
                replace_on_changes=[REPLACE_ON_METADATA],
                delete_before_replace=True,
                custom_timeouts=TIMEOUTS,
            ),
        )
        self.slice_name = vm.name
        self.host_ips = vm.network_endpoints.apply(
            lambda endpoints: [e.ip_address for e in endpoints or [] if e.ip_address]
        )
        # Repeated from the annotations: registered outputs are what `pulumi stack` shows.
        self.register_outputs({"slice_name": self.slice_name, "host_ips": self.host_ips})
