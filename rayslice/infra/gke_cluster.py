"""The GKE cluster of ``platform=gke``: a cluster (or an existing one), a CPU pool for the Ray
head and one TPU node pool per slice, shaped by the catalog.

Each node pool is planned by a pure function (`tpu_pool_plans`) before the component registers
anything; it asserts that the catalog's shape is one GKE accepts (`shape_problems`). User input
was validated by `rayslice.spec.load` before that. The component only turns plans into resources.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from rayslice import catalog
from rayslice.infra.labels import resource_labels
from rayslice.infra.network import ClusterNetwork, region_of
from rayslice.names import CLOUD_PLATFORM_SCOPE
from rayslice.spec import ClusterSpec

RELEASE_CHANNEL = "REGULAR"
# GKE puts this taint on every TPU node; the pools declare it so the pods' toleration and the
# nodes' taint are one fact (`TPU_TAINT`), checked together in the tests.
TPU_TAINT = {"key": "google.com/tpu", "value": "present", "effect": "NO_SCHEDULE"}
# Pulumi/GKE spell taint effects in upper snake case, Kubernetes in camel case.
K8S_TAINT_EFFECT = {
    "NO_SCHEDULE": "NoSchedule",
    "PREFER_NO_SCHEDULE": "PreferNoSchedule",
    "NO_EXECUTE": "NoExecute",
}
WORKLOAD_POLICY_TYPE = "HIGH_THROUGHPUT"
NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"
OAUTH_SCOPES = [CLOUD_PLATFORM_SCOPE]


@dataclass(frozen=True)
class TpuPoolPlan:
    """One TPU node pool = one slice: what GKE needs to place `hosts` nodes as one slice."""

    name: str
    slice_index: int
    machine_type: str
    node_count: int
    topology: str
    # COMPACT placement with a tpu_topology (multi-host), a workload policy (tpu7x/tpu7
    # multi-host), or no placement at all (single host).
    placement: str | None
    zone: str
    spot: bool
    reservation: str | None


def head_pool_name(spec: ClusterSpec) -> str:
    return f"{spec.name}-head"


def tpu_pool_plans(spec: ClusterSpec) -> list[TpuPoolPlan]:
    """One pool per slice from the catalog's GKE shape of the spec's accelerator type.

    `rayslice.spec.load` has refused every bad choice of the user's (unknown topology, a name
    too long for a pool). What is asserted here is the catalog's own consistency with GKE, so
    a catalog bug stops the program before a pool of the wrong shape is declared.
    """
    tpu = spec.tpu
    assert spec.zone is not None and tpu.machine_type and tpu.gke_accelerator, "spec was validated for gke"
    problems = shape_problems(tpu)
    assert not problems, "catalog shape GKE would refuse: " + "; ".join(problems)
    return [
        TpuPoolPlan(
            name=spec.slice_name(i),
            slice_index=i,
            machine_type=tpu.machine_type,
            node_count=tpu.hosts,
            topology=tpu.topology,
            placement=tpu.placement,
            zone=spec.zone,
            spot=spec.capacity == "spot",
            reservation=spec.reservation if spec.capacity == "reserved" else None,
        )
        for i in range(spec.slices)
    ]


def shape_problems(tpu: catalog.TpuType) -> list[str]:
    """How a GKE shape breaks GKE's rules for TPU node pools (empty when it is sound).

    The topology must exist for the generation, hosts x chips per host must fill it, the
    machine type must be the one that carries it, and multi-host pools need COMPACT placement,
    or a workload policy on the generations whose pools take no ``tpu_topology`` (tpu7x).
    """
    generation = catalog.generation(tpu.generation)
    try:
        shape = catalog.lookup(f"{tpu.generation}-{tpu.topology}", "gke")
    except catalog.CatalogError as exc:
        return [f"topology {tpu.topology} does not exist for {tpu.generation} on GKE ({exc})"]
    problems = []
    if tpu.hosts * tpu.chips_per_host != shape.chips:
        problems.append(
            f"{tpu.hosts} hosts x {tpu.chips_per_host} chips = {tpu.hosts * tpu.chips_per_host} chips, "
            f"but topology {tpu.topology} has {shape.chips}; use {shape.hosts} hosts of {shape.machine_type}"
        )
    if tpu.machine_type != shape.machine_type:
        problems.append(
            f"machine type {tpu.machine_type} does not carry topology {tpu.topology}; use {shape.machine_type}"
        )
    wanted = None if tpu.hosts == 1 else "workload-policy" if generation.gke_workload_policy else "COMPACT"
    if tpu.placement != wanted:
        problems.append(
            f"{tpu.hosts}-host {tpu.generation} node pools need placement {wanted!r}, not {tpu.placement!r}"
        )
    return problems


def tpu_node_selector(spec: ClusterSpec) -> dict[str, str]:
    """The node labels GKE gives every node of the spec's TPU pools (the workers' selector)."""
    assert spec.tpu.gke_accelerator is not None, "spec was validated for gke"
    return {
        "cloud.google.com/gke-tpu-accelerator": spec.tpu.gke_accelerator,
        "cloud.google.com/gke-tpu-topology": spec.tpu.topology,
    }


def head_node_selector(spec: ClusterSpec) -> dict[str, str]:
    """The head pod's selector: the CPU pool made for it."""
    return {NODE_POOL_LABEL: head_pool_name(spec)}


def kubeconfig(context: str, endpoint: str, ca_certificate: str) -> str:
    """A kubeconfig that authenticates with gke-gcloud-auth-plugin (no key is written anywhere)."""
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": context,
                    "cluster": {
                        "server": f"https://{endpoint}",
                        "certificate-authority-data": ca_certificate,
                    },
                }
            ],
            "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
            "current-context": context,
            "users": [
                {
                    "name": context,
                    "user": {
                        "exec": {
                            "apiVersion": "client.authentication.k8s.io/v1beta1",
                            "command": "gke-gcloud-auth-plugin",
                            "installHint": "gcloud components install gke-gcloud-auth-plugin",
                            "provideClusterInfo": True,
                        }
                    },
                }
            ],
        }
    )


def ip_allocation_policy(network: ClusterNetwork) -> gcp.container.ClusterIpAllocationPolicyArgs:
    """VPC-native pod and Service addresses: the created subnet's secondary ranges, or, in an
    existing subnetwork, ranges GKE adds to it itself (no names given)."""
    ranges = network.secondary_ranges
    if ranges is None:
        return gcp.container.ClusterIpAllocationPolicyArgs()
    return gcp.container.ClusterIpAllocationPolicyArgs(
        cluster_secondary_range_name=ranges.pods.name, services_secondary_range_name=ranges.services.name
    )


@dataclass(frozen=True)
class GkeClusterArgs:
    spec: ClusterSpec
    # The network a created cluster lives in; None with spec.gke_cluster (the cluster has one).
    network: ClusterNetwork | None = None


class GkeCluster(pulumi.ComponentResource):
    """The cluster, its head pool and its TPU pools; `kubeconfig` reaches its API server."""

    cluster_name: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    head_pool: gcp.container.NodePool
    tpu_pools: list[gcp.container.NodePool]

    def __init__(self, name: str, args: GkeClusterArgs, opts: pulumi.ResourceOptions | None = None):
        spec = args.spec
        plans = tpu_pool_plans(spec)  # before anything is registered
        super().__init__("rayslice:infra:GkeCluster", name, None, opts)
        assert spec.zone is not None
        child = pulumi.ResourceOptions(parent=self)
        if spec.gke_cluster is None:
            cluster = self._create_cluster(name, spec, args, child)
            self.cluster_name = cluster.name
            endpoint, ca = cluster.endpoint, cluster.master_auth.cluster_ca_certificate
            pool_opts = pulumi.ResourceOptions(parent=cluster)
        else:
            existing = gcp.container.get_cluster_output(
                name=spec.gke_cluster,
                location=spec.zone,
                project=spec.project,
                opts=pulumi.InvokeOptions(parent=self),
            )
            self.cluster_name = pulumi.Output.from_input(spec.gke_cluster)
            endpoint, ca = existing.endpoint, existing.master_auths[0].cluster_ca_certificate
            pool_opts = child
        self.kubeconfig = pulumi.Output.secret(
            pulumi.Output.all(self.cluster_name, endpoint, ca).apply(lambda v: kubeconfig(*v))
        )
        self.head_pool = gcp.container.NodePool(
            f"{name}-head",
            name=head_pool_name(spec),
            project=spec.project,
            cluster=self.cluster_name,
            location=spec.zone,
            node_locations=[spec.zone],
            node_count=1,
            node_config=gcp.container.NodePoolNodeConfigArgs(
                machine_type=spec.head_machine_type,
                oauth_scopes=OAUTH_SCOPES,
                resource_labels=resource_labels(spec, "head"),
                workload_metadata_config=gcp.container.NodePoolNodeConfigWorkloadMetadataConfigArgs(
                    mode="GKE_METADATA"
                ),
            ),
            opts=pool_opts,
        )
        policy = (
            self._workload_policy(name, spec, child)
            if any(p.placement == "workload-policy" for p in plans)
            else None
        )
        self.tpu_pools = [self._tpu_pool(name, spec, plan, policy, pool_opts) for plan in plans]
        # Declared above and repeated here so they are the component's recorded outputs.
        self.register_outputs(
            {
                "cluster_name": self.cluster_name,
                "kubeconfig": self.kubeconfig,
                "head_pool": self.head_pool.name,
                "tpu_pools": [p.name for p in self.tpu_pools],
            }
        )

    def _create_cluster(
        self, name: str, spec: ClusterSpec, args: GkeClusterArgs, child: pulumi.ResourceOptions
    ) -> gcp.container.Cluster:
        assert args.network is not None, "a created cluster needs the cluster network"
        project = (
            pulumi.Output.from_input(spec.project)
            if spec.project
            else gcp.organizations.get_client_config_output().project
        )
        addons = (
            gcp.container.ClusterAddonsConfigArgs(
                ray_operator_configs=[gcp.container.ClusterAddonsConfigRayOperatorConfigArgs(enabled=True)]
            )
            if spec.kuberay == "addon"
            else None
        )
        return gcp.container.Cluster(
            f"{name}-cluster",
            name=spec.name,
            project=spec.project,
            location=spec.zone,
            network=args.network.network,
            subnetwork=args.network.subnetwork,
            # Every pool is declared below; GKE insists on creating a first one, removed at once.
            remove_default_node_pool=True,
            initial_node_count=1,
            release_channel=gcp.container.ClusterReleaseChannelArgs(channel=RELEASE_CHANNEL),
            workload_identity_config=gcp.container.ClusterWorkloadIdentityConfigArgs(
                workload_pool=project.apply(lambda p: f"{p}.svc.id.goog")
            ),
            # Nodes get no external IP; egress goes through the network's Cloud NAT.
            private_cluster_config=gcp.container.ClusterPrivateClusterConfigArgs(
                enable_private_nodes=True, enable_private_endpoint=False
            ),
            ip_allocation_policy=ip_allocation_policy(args.network),
            addons_config=addons,
            resource_labels=resource_labels(spec, "gke-cluster"),
            # `pulumi destroy` must be able to remove what `pulumi up` created.
            deletion_protection=False,
            opts=child,
        )

    def _workload_policy(
        self, name: str, spec: ClusterSpec, child: pulumi.ResourceOptions
    ) -> gcp.compute.ResourcePolicy:
        assert spec.zone is not None
        return gcp.compute.ResourcePolicy(
            f"{name}-workload-policy",
            name=f"{spec.name}-tpu-policy",
            project=spec.project,
            region=region_of(spec.zone),
            workload_policy=gcp.compute.ResourcePolicyWorkloadPolicyArgs(
                type=WORKLOAD_POLICY_TYPE, accelerator_topology=spec.tpu.topology
            ),
            opts=child,
        )

    def _tpu_pool(
        self,
        name: str,
        spec: ClusterSpec,
        plan: TpuPoolPlan,
        policy: gcp.compute.ResourcePolicy | None,
        opts: pulumi.ResourceOptions,
    ) -> gcp.container.NodePool:
        if plan.placement == "COMPACT":
            placement = gcp.container.NodePoolPlacementPolicyArgs(type="COMPACT", tpu_topology=plan.topology)
        elif plan.placement == "workload-policy":
            assert policy is not None
            placement = gcp.container.NodePoolPlacementPolicyArgs(type="COMPACT", policy_name=policy.name)
        else:
            placement = None
        reservation = (
            gcp.container.NodePoolNodeConfigReservationAffinityArgs(
                consume_reservation_type="SPECIFIC_RESERVATION",
                key="compute.googleapis.com/reservation-name",
                values=[plan.reservation],
            )
            if plan.reservation
            else None
        )
        return gcp.container.NodePool(
            f"{name}-slice-{plan.slice_index}",
            name=plan.name,
            project=spec.project,
            cluster=self.cluster_name,
            location=plan.zone,
            node_locations=[plan.zone],
            node_count=plan.node_count,
            placement_policy=placement,
            node_config=gcp.container.NodePoolNodeConfigArgs(
                machine_type=plan.machine_type,
                spot=plan.spot,
                reservation_affinity=reservation,
                taints=[gcp.container.NodePoolNodeConfigTaintArgs(**TPU_TAINT)],
                oauth_scopes=OAUTH_SCOPES,
                resource_labels=resource_labels(spec, "tpu-host", plan.slice_index),
                workload_metadata_config=gcp.container.NodePoolNodeConfigWorkloadMetadataConfigArgs(
                    mode="GKE_METADATA"
                ),
            ),
            opts=opts,
        )
