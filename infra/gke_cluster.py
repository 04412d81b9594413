"""The GKE cluster of ``platform=gke``: a cluster (or an existing one), a CPU pool for the Ray
head and one TPU node pool per slice, shaped by the catalog.

Each node pool is planned by a pure function (`tpu_pool_plans`) and checked (`plan_problems`)
before any resource is registered, so a shape the catalog and GKE disagree on fails with a
message instead of a half-created cluster. The component then only turns plans into resources.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from rayslice import catalog
from rayslice.infra.labels import resource_labels
from rayslice.infra.network import region_of
from rayslice.spec import ClusterSpec

# GKE refuses node pool names longer than this.
NODE_POOL_NAME_MAX = 40
RELEASE_CHANNEL = "REGULAR"
# GKE puts this taint on every TPU node; the pools declare it so the pods' toleration and the
# nodes' taint are one fact (`TPU_TAINT`), checked together in the tests.
TPU_TAINT = {"key": "google.com/tpu", "value": "present", "effect": "NO_SCHEDULE"}
# Pulumi/GKE spell taint effects in upper snake case, Kubernetes in camel case.
K8S_TAINT_EFFECT = {"NO_SCHEDULE": "NoSchedule", "PREFER_NO_SCHEDULE": "PreferNoSchedule", "NO_EXECUTE": "NoExecute"}
WORKLOAD_POLICY_TYPE = "HIGH_THROUGHPUT"
NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"
OAUTH_SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]


class GkePlanError(ValueError):
    """The GKE resources planned for a spec are inconsistent; nothing was created."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("cannot plan the GKE cluster:\n" + "\n".join(f"  - {p}" for p in problems))


@dataclass(frozen=True)
class TpuPoolPlan:
    """One TPU node pool = one slice: what GKE needs to place `hosts` nodes as one slice."""

    name: str
    slice_index: int
    machine_type: str
    node_count: int
    chips_per_host: int
    topology: str
    gke_accelerator: str
    generation: str
    # COMPACT placement with a tpu_topology (multi-host), a workload policy (tpu7x/tpu7
    # multi-host), or no placement at all (single host).
    placement: str | None
    zone: str
    spot: bool
    reservation: str | None


def head_pool_name(spec: ClusterSpec) -> str:
    return f"{spec.name}-head"


def tpu_pool_plans(spec: ClusterSpec) -> list[TpuPoolPlan]:
    """One pool per slice from the catalog's GKE shape of the spec's accelerator type."""
    tpu = spec.tpu
    assert spec.zone is not None and tpu.machine_type and tpu.gke_accelerator, "spec was validated for gke"
    return [
        TpuPoolPlan(
            name=spec.slice_name(i),
            slice_index=i,
            machine_type=tpu.machine_type,
            node_count=tpu.hosts,
            chips_per_host=tpu.chips_per_host,
            topology=tpu.topology,
            gke_accelerator=tpu.gke_accelerator,
            generation=tpu.generation,
            placement=tpu.placement,
            zone=spec.zone,
            spot=spec.capacity == "spot",
            reservation=spec.reservation if spec.capacity == "reserved" else None,
        )
        for i in range(spec.slices)
    ]


def plan_problems(spec: ClusterSpec, plans: list[TpuPoolPlan]) -> list[str]:
    """Everything wrong with the planned pools, each problem saying what to do.

    The spec has already been validated; these rules hold the catalog's shape to what GKE will
    accept (rules the lead may move into spec validation: topology, host count, placement, names).
    """
    problems = []
    longest = max((head_pool_name(spec), *(p.name for p in plans)), key=len)
    if len(longest) > NODE_POOL_NAME_MAX:
        problems.append(
            f"node pool name {longest!r} is {len(longest)} characters; GKE allows {NODE_POOL_NAME_MAX}: "
            f"shorten name to at most {NODE_POOL_NAME_MAX - (len(longest) - len(spec.name))} characters"
        )
    for plan in plans:
        problems.extend(_pool_problems(plan))
    return problems


def _pool_problems(plan: TpuPoolPlan) -> list[str]:
    problems = []
    generation = catalog.generation(plan.generation)
    try:
        shape = catalog.lookup(f"{plan.generation}-{plan.topology}", "gke")
    except catalog.CatalogError as exc:
        return [f"{plan.name}: topology {plan.topology} does not exist for {plan.generation} on GKE ({exc})"]
    if plan.node_count * plan.chips_per_host != shape.chips:
        problems.append(
            f"{plan.name}: {plan.node_count} hosts x {plan.chips_per_host} chips = "
            f"{plan.node_count * plan.chips_per_host} chips, but topology {plan.topology} has {shape.chips}; "
            f"use {shape.hosts} hosts of {shape.machine_type}"
        )
    if plan.machine_type != shape.machine_type:
        problems.append(f"{plan.name}: machine type {plan.machine_type} does not carry topology {plan.topology}; use {shape.machine_type}")
    if plan.node_count > 1 and generation.gke_workload_policy and plan.placement != "workload-policy":
        problems.append(
            f"{plan.name}: multi-host {plan.generation} node pools need a workload policy "
            f"(placement {plan.placement!r} given); GKE refuses COMPACT + tpu_topology for {plan.generation}"
        )
    if plan.node_count > 1 and not generation.gke_workload_policy and plan.placement != "COMPACT":
        problems.append(f"{plan.name}: multi-host {plan.generation} node pools need COMPACT placement, not {plan.placement!r}")
    return problems


def check_plans(spec: ClusterSpec) -> list[TpuPoolPlan]:
    """The pools for `spec`, or GkePlanError listing every problem."""
    plans = tpu_pool_plans(spec)
    problems = plan_problems(spec, plans)
    if problems:
        raise GkePlanError(problems)
    return plans


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
    return json.dumps({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": {"server": f"https://{endpoint}", "certificate-authority-data": ca_certificate}}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
        "current-context": context,
        "users": [{"name": context, "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": "gke-gcloud-auth-plugin",
            "installHint": "gcloud components install gke-gcloud-auth-plugin",
            "provideClusterInfo": True,
        }}}],
    })


@dataclass(frozen=True)
class GkeClusterArgs:
    spec: ClusterSpec
    # The VPC and subnetwork of a created cluster (ignored with spec.gke_cluster).
    network: pulumi.Input[str] | None = None
    subnetwork: pulumi.Input[str] | None = None


class GkeCluster(pulumi.ComponentResource):
    """The cluster, its head pool and its TPU pools; `kubeconfig` reaches its API server."""

    cluster_name: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    head_pool: gcp.container.NodePool
    tpu_pools: list[gcp.container.NodePool]

    def __init__(self, name: str, args: GkeClusterArgs, opts: pulumi.ResourceOptions | None = None):
        spec = args.spec
        plans = check_plans(spec)  # before anything is registered
        super().__init__("rayslice:infra:GkeCluster", name, None, opts)
        assert spec.zone is not None
        child = pulumi.ResourceOptions(parent=self)
        if spec.gke_cluster is None:
            cluster = self._create_cluster(name, spec, args, child)
            self.cluster_name = cluster.name
            endpoint, ca = cluster.endpoint, cluster.master_auth.cluster_ca_certificate
            pool_opts = pulumi.ResourceOptions(parent=cluster)
        else:
            existing = gcp.container.get_cluster_output(name=spec.gke_cluster, location=spec.zone, project=spec.project, opts=pulumi.InvokeOptions(parent=self))
            self.cluster_name = pulumi.Output.from_input(spec.gke_cluster)
            endpoint, ca = existing.endpoint, existing.master_auths[0].cluster_ca_certificate
            pool_opts = child
        self.kubeconfig = pulumi.Output.secret(pulumi.Output.all(self.cluster_name, endpoint, ca).apply(lambda v: kubeconfig(*v)))
        self.head_pool = gcp.container.NodePool(
            f"{name}-head", name=head_pool_name(spec), project=spec.project, cluster=self.cluster_name,
            location=spec.zone, node_locations=[spec.zone], node_count=1,
            node_config=gcp.container.NodePoolNodeConfigArgs(
                machine_type=spec.head_machine_type, oauth_scopes=OAUTH_SCOPES,
                resource_labels=resource_labels(spec, "head"),
                workload_metadata_config=gcp.container.NodePoolNodeConfigWorkloadMetadataConfigArgs(mode="GKE_METADATA"),
            ),
            opts=pool_opts,
        )
        policy = self._workload_policy(name, spec, child) if any(p.placement == "workload-policy" for p in plans) else None
        self.tpu_pools = [self._tpu_pool(name, spec, plan, policy, pool_opts) for plan in plans]
        # Declared above and repeated here so they are the component's recorded outputs.
        self.register_outputs({
            "cluster_name": self.cluster_name,
            "kubeconfig": self.kubeconfig,
            "head_pool": self.head_pool.name,
            "tpu_pools": [p.name for p in self.tpu_pools],
        })

    def _create_cluster(self, name: str, spec: ClusterSpec, args: GkeClusterArgs, child: pulumi.ResourceOptions) -> gcp.container.Cluster:
        project = pulumi.Output.from_input(spec.project) if spec.project else gcp.organizations.get_client_config_output().project
        addons = gcp.container.ClusterAddonsConfigArgs(
            ray_operator_configs=[gcp.container.ClusterAddonsConfigRayOperatorConfigArgs(enabled=True)]
        ) if spec.kuberay == "addon" else None
        return gcp.container.Cluster(
            f"{name}-cluster", name=spec.name, project=spec.project, location=spec.zone,
            network=args.network, subnetwork=args.subnetwork,
            # Every pool is declared below; GKE insists on creating a first one, removed at once.
            remove_default_node_pool=True, initial_node_count=1,
            release_channel=gcp.container.ClusterReleaseChannelArgs(channel=RELEASE_CHANNEL),
            workload_identity_config=gcp.container.ClusterWorkloadIdentityConfigArgs(
                workload_pool=project.apply(lambda p: f"{p}.svc.id.goog")),
            # Nodes get no external IP; egress goes through the network's Cloud NAT.
            private_cluster_config=gcp.container.ClusterPrivateClusterConfigArgs(enable_private_nodes=True, enable_private_endpoint=False),
            ip_allocation_policy=gcp.container.ClusterIpAllocationPolicyArgs(),
            addons_config=addons,
            resource_labels=resource_labels(spec, "gke-cluster"),
            # `pulumi destroy` must be able to remove what `pulumi up` created.
            deletion_protection=False,
            opts=child,
        )

    def _workload_policy(self, name: str, spec: ClusterSpec, child: pulumi.ResourceOptions) -> gcp.compute.ResourcePolicy:
        assert spec.zone is not None
        return gcp.compute.ResourcePolicy(
            f"{name}-workload-policy", name=f"{spec.name}-tpu-policy", project=spec.project, region=region_of(spec.zone),
            workload_policy=gcp.compute.ResourcePolicyWorkloadPolicyArgs(type=WORKLOAD_POLICY_TYPE, accelerator_topology=spec.tpu.topology),
            opts=child,
        )

    def _tpu_pool(self, name: str, spec: ClusterSpec, plan: TpuPoolPlan, policy: gcp.compute.ResourcePolicy | None,
                  opts: pulumi.ResourceOptions) -> gcp.container.NodePool:
        if plan.placement == "COMPACT":
            placement = gcp.container.NodePoolPlacementPolicyArgs(type="COMPACT", tpu_topology=plan.topology)
        elif plan.placement == "workload-policy":
            assert policy is not None
            placement = gcp.container.NodePoolPlacementPolicyArgs(type="COMPACT", policy_name=policy.name)
        else:
            placement = None
        reservation = gcp.container.NodePoolNodeConfigReservationAffinityArgs(
            consume_reservation_type="SPECIFIC_RESERVATION", key="compute.googleapis.com/reservation-name",
            values=[plan.reservation],
        ) if plan.reservation else None
        return gcp.container.NodePool(
            f"{name}-slice-{plan.slice_index}", name=plan.name, project=spec.project, cluster=self.cluster_name,
            location=plan.zone, node_locations=[plan.zone], node_count=plan.node_count, placement_policy=placement,
            node_config=gcp.container.NodePoolNodeConfigArgs(
                machine_type=plan.machine_type, spot=plan.spot, reservation_affinity=reservation,
                taints=[gcp.container.NodePoolNodeConfigTaintArgs(**TPU_TAINT)], oauth_scopes=OAUTH_SCOPES,
                resource_labels=resource_labels(spec, "tpu-host", plan.slice_index),
                workload_metadata_config=gcp.container.NodePoolNodeConfigWorkloadMetadataConfigArgs(mode="GKE_METADATA"),
            ),
            opts=opts,
        )
