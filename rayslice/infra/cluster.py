"""`TpuRayCluster`: the whole cluster from one `ClusterSpec`, importable by any Pulumi program.

    from rayslice import spec
    from rayslice.infra import TpuRayCluster, TpuRayClusterArgs

    ml = spec.load({"acceleratorType": "v6e-16", "zone": "us-east5-b"})
    cluster = TpuRayCluster("ml", TpuRayClusterArgs(spec=ml))
    pulumi.export("jobs", cluster.jobs_api_address)

A program that declares its own VPC passes it as Pulumi inputs, and rayslice creates none:

    vpc = gcp.compute.Network("vpc", auto_create_subnetworks=False)
    subnet = gcp.compute.Subnetwork("tpu", network=vpc.id, region="us-east5", ip_cidr_range="10.8.0.0/20")
    TpuRayCluster("ml", TpuRayClusterArgs(spec=ml, network=ExistingNetwork(vpc.name, subnet.name)))

It declares the network (a VPC with Cloud NAT unless one is given by the spec's ``network`` key
or by `TpuRayClusterArgs.network`; none for an existing ``gkeCluster``, which has its own) and
hands the rest to the platform's component, which owns the outputs:

- ``compute``: `ComputeCluster` (rayslice.infra.compute), slices as Compute Engine MIGs;
- ``tpu-vm``: `TpuVmCluster` (rayslice.infra.tpu_vm), slices as Cloud TPU VMs;
- ``gke``: `GkeTpuCluster` (rayslice.infra.gke), node pools and a KubeRay RayCluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi

from rayslice.errors import InvalidInput
from rayslice.infra.compute import ComputeCluster
from rayslice.infra.gke import GkeTpuCluster, GkeTpuClusterArgs
from rayslice.infra.hosts import VmSliceCluster, VmSliceClusterArgs
from rayslice.infra.network import ClusterNetwork, ClusterNetworkArgs, ExistingNetwork, existing_network
from rayslice.infra.tpu_vm import TpuVmCluster
from rayslice.platforms import MIG, TPU_NODE, VM_PLATFORMS
from rayslice.spec import ClusterSpec
from rayslice.startup_scripts.locks import Lock

# The component that declares each kind of slice (`rayslice.platforms.VmPlatform.slice_resource`:
# a MIG or a TPU node); gke's takes other arguments, see `_platform`.
SLICE_COMPONENTS: dict[str, type[VmSliceCluster]] = {MIG: ComputeCluster, TPU_NODE: TpuVmCluster}


@dataclass(frozen=True)
class TpuRayClusterArgs:
    spec: ClusterSpec  # validated: build it with `rayslice.spec.load`
    # A VPC the calling program declares or looks up; the spec then names none.
    network: ExistingNetwork | None = None
    # The stack's lock (`rayslice.startup_scripts.stack_locks`); None: hosts install the preset's.
    lock: Lock | None = None

    def __post_init__(self) -> None:
        if self.network is not None and (self.spec.network or self.spec.gke_cluster):
            raise InvalidInput(
                "TpuRayClusterArgs.network is given, and the spec sets "
                f"{'network' if self.spec.network else 'gkeCluster'} too: name the network one way "
                "only (an existing GKE cluster brings its own)"
            )


class TpuRayCluster(pulumi.ComponentResource):
    """A Ray cluster on TPU slices, with the outputs a user needs to reach it.

    `exports` maps output names to values: the platform component's `exports`. `infra/__main__.py`
    exports exactly these, and `register_outputs` records them. `jobs_api_address`, the one
    output every platform has, is also an attribute.
    """

    jobs_api_address: pulumi.Output[str]
    exports: dict[str, Any]

    def __init__(self, name: str, args: TpuRayClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("rayslice:infra:TpuRayCluster", name, None, opts)
        spec = args.spec
        child = pulumi.ResourceOptions(parent=self)
        existing = args.network or existing_network(spec)
        self.network = (
            None
            if spec.gke_cluster
            else ClusterNetwork(f"{name}-network", ClusterNetworkArgs(spec=spec, existing=existing), child)
        )
        self.platform = self._platform(name, spec, args.lock, child)
        self.exports = dict(self.platform.exports)
        self.jobs_api_address = pulumi.Output.from_input(self.exports["jobs_api_address"])
        self.register_outputs(self.exports)

    def _platform(
        self, name: str, spec: ClusterSpec, lock: Lock | None, child: pulumi.ResourceOptions
    ) -> Any:
        if spec.platform == "gke":
            return GkeTpuCluster(
                f"{name}-gke", GkeTpuClusterArgs(spec=spec, network=self.network, lock=lock), child
            )
        if self.network is None:  # the spec allows gkeCluster with platform=gke only
            raise AssertionError("a VM platform always has a network")
        component = SLICE_COMPONENTS[VM_PLATFORMS[spec.platform].slice_resource]
        return component(
            f"{name}-{spec.platform}", VmSliceClusterArgs(spec=spec, network=self.network, lock=lock), child
        )
