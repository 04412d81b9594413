"""The recovery controller's VM: a small Compute Engine instance that runs only the controller.

The controller may delete and create TPU nodes or MIGs anywhere in the project (IAM cannot name
them, `rayslice.recovery.permissions`), so it runs apart from Ray: no Ray process and no user
code runs on this VM, it runs as its own service account (`ClusterIdentity`), which no host
holds, and nothing reaches it over the network: it has no external IP, even with
``externalIps``, and `firewall.controller_tag` is its only tag (neither the hosts' rule nor IAP's
SSH rule applies to it, and two rules deny it every IPv4 and IPv6 ingress). It boots its own
script (`rayslice.startup_scripts.controller`), always on-demand, and is replaced, not
patched, when that script or the controller changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi

from rayslice.infra.cpu_vm import cpu_vm
from rayslice.infra.firewall import controller_tag
from rayslice.infra.labels import resource_labels
from rayslice.infra.metadata import controller_metadata
from rayslice.names import ATTR_RECORD, CONTROLLER_VM_ROLE, controller_name
from rayslice.spec import ClusterSpec
from rayslice.startup_scripts.controller import render_controller

# The controller polls a few API calls every 30 s: the smallest shared-core machine is plenty.
CONTROLLER_MACHINE_TYPE = "e2-small"
CONTROLLER_DISK_GB = 10


@dataclass(frozen=True, kw_only=True)
class ControllerVmArgs:
    spec: ClusterSpec
    network: pulumi.Input[str]
    subnetwork: pulumi.Input[str | None]
    service_account_email: pulumi.Input[str]
    # The gs:// prefix of the cluster's record (`rayslice.infra.record_bucket`); None: no record.
    record: pulumi.Input[str] | None = None
    # Its grants and firewall rule, and the slices: the controller starts once they exist.
    depends_on: Sequence[pulumi.Resource] = ()


class ControllerVm(pulumi.ComponentResource):
    """The controller's instance."""

    instance_name: pulumi.Output[str]

    def __init__(self, name: str, args: ControllerVmArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("rayslice:infra:ControllerVm", name, None, opts)
        spec = args.spec
        metadata: dict[str, pulumi.Input[str]] = {**controller_metadata(spec, render_controller(spec))}
        if args.record is not None:  # where its record shipper writes the controller's decisions
            metadata[ATTR_RECORD] = args.record
        instance = cpu_vm(
            f"{name}-instance",
            spec=spec,
            name=controller_name(spec.name),
            machine_type=CONTROLLER_MACHINE_TYPE,
            disk_gb=CONTROLLER_DISK_GB,
            network=args.network,
            subnetwork=args.subnetwork,  # outbound only (Google's APIs); the firewall admits nothing
            service_account_email=args.service_account_email,
            metadata=metadata,
            labels=resource_labels(spec, CONTROLLER_VM_ROLE),
            tags=[controller_tag(spec)],
            # Never, `externalIps` or not: the controller serves nothing and needs only Google's
            # APIs, which Private Google Access or the network's NAT reach.
            external_ip=False,
            parent=self,
            depends_on=args.depends_on,
        )
        self.instance_name = instance.name
        # Repeated from the annotation: registered outputs are what `pulumi stack` shows.
        self.register_outputs({"instance_name": self.instance_name})
