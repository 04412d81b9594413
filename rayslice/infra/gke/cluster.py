"""The GKE side of ``platform=gke``: a cluster (or an existing one), the nodes' own service
account, a CPU pool for the Ray head and one TPU node pool per slice.

The pools are planned by `nodes.tpu_pool_plans` (pure); this module only turns plans into
resources. User input was validated by `rayslice.spec`; the catalog's shapes are checked
against xpk's table by the tests, not again here.

Access: a cluster rayslice creates has private nodes, master authorized networks from
``gkeAuthorizedNetworks`` (none: the control plane answers on its private endpoint only), and
GKE Dataplane V2, which enforces the NetworkPolicies of `kuberay.network_policies`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_gcp as gcp
import pulumiverse_time as time

from rayslice.catalog import region_of
from rayslice.errors import InvalidInput
from rayslice.infra import identity
from rayslice.infra.gke import nodes
from rayslice.infra.labels import resource_labels
from rayslice.infra.network import ClusterNetwork
from rayslice.names import CLOUD_PLATFORM_SCOPE
from rayslice.spec import SECONDS_PER_HOUR, ClusterSpec

# Values below are container v1 API enums; tests/infra/gke/test_api_enums.py checks each one
# against the discovery document google-api-python-client ships.
RELEASE_CHANNEL = "REGULAR"
WORKLOAD_METADATA_MODE = "GKE_METADATA"  # pods see the GKE metadata server, not the node's
# Dataplane V2 (eBPF) enforces Kubernetes NetworkPolicy with no extra add-on; the container API's
# NetworkConfig.datapathProvider enum documents it.
DATAPATH_PROVIDER = "ADVANCED_DATAPATH"
PLACEMENT_TYPE = "COMPACT"
RESERVATION_AFFINITY = "SPECIFIC_RESERVATION"
RESERVATION_KEY = "compute.googleapis.com/reservation-name"
# A flex-start TPU pool, as xpk creates one (AI-Hypercomputer/xpk src/xpk/core/capacity.py,
# CapacityType.FLEX_START: "--flex-start --enable-autoscaling --location-policy=ANY
# --reservation-affinity=none --no-enable-autorepair --max-nodes=<hosts per slice>", and
# nodepool.py "--num-nodes=0"): it starts with no node and the cluster autoscaler grows it when
# the RayCluster's pending TPU pods ask, once flex-start has the capacity (GKE, "About flex-start
# provisioning mode", https://cloud.google.com/kubernetes-engine/docs/concepts/dws: "GKE
# automatically provisions VMs ... when capacity becomes available"). Each field below is a
# pulumi-gcp NodePool input (node_config.flex_start "Enables Flex Start provisioning model for
# the node pool"; node_config.max_run_duration "The runtime of each node in the node pool in
# seconds, terminated by 's'"; autoscaling.total_min/max_node_count, location_policy "ANY";
# management.auto_repair) with the container v1 field it becomes (NodeConfig.flexStart,
# NodeConfig.maxRunDuration, NodePoolAutoscaling, NodeManagement.autoRepair). No queued
# provisioning: it needs ProvisioningRequest objects (docs/capacity.md says why rayslice has none).
FLEX_LOCATION_POLICY = (
    "ANY"  # NodePoolAutoscaling.locationPolicy: "picks zones that have the highest capacity"
)
NO_RESERVATION = "NO_RESERVATION"  # ReservationAffinity.consumeReservationType (--reservation-affinity=none)
WORKLOAD_POLICY_TYPE = "HIGH_THROUGHPUT"  # compute v1 ResourcePolicyWorkloadPolicy.type
OAUTH_SCOPES = [CLOUD_PLATFORM_SCOPE]


def authorized_networks(spec: ClusterSpec) -> tuple[str, ...]:
    """The CIDR ranges that may reach the control plane's public endpoint (may be empty)."""
    return tuple(spec.gke_authorized_networks)


def private_endpoint_only(spec: ClusterSpec) -> bool:
    """No authorized network listed: the control plane gets no public endpoint at all."""
    return not authorized_networks(spec)


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


def existing_cluster_problems(
    spec: ClusterSpec,
    workload_pools: Sequence[str],
    datapath_provider: str,
    network_policy_enabled: bool,
) -> tuple[list[str], list[str]]:
    """What an existing ``gkeCluster`` lacks: (errors that stop the deployment, warnings).

    The container API documents that GKE_METADATA "can only be enabled if Workload Identity is
    enabled at the cluster level" (WorkloadMetadataConfig.mode in the container v1 discovery
    document), so pools created on a cluster without a workload pool would be refused by GKE
    half-way through ``pulumi up``. Without Dataplane V2 or Calico network policy the cluster
    accepts the NetworkPolicies but does not enforce them.
    """
    name, zone = spec.gke_cluster, spec.zone
    project = [f"--project={spec.project}"] if spec.project else []
    errors, warnings = [], []
    if not any(workload_pools):
        pool = f"{spec.project}.svc.id.goog" if spec.project else "PROJECT_ID.svc.id.goog"
        errors.append(
            f"GKE cluster {name!r} has no Workload Identity, and its node pools need GKE_METADATA "
            "(pods must not see the node's credentials). Enable it, then run `pulumi up` again: "
            + " ".join(
                [
                    "gcloud container clusters update",
                    str(name),
                    f"--zone={zone}",
                    f"--workload-pool={pool}",
                    *project,
                ]
            )
        )
    if datapath_provider != DATAPATH_PROVIDER and not network_policy_enabled:
        update = ["gcloud container clusters update", str(name), f"--zone={zone}", *project]
        warnings.append(
            f"GKE cluster {name!r} does not enforce NetworkPolicy (no Dataplane V2, network policy "
            "off): the Ray pods' ports are open to every pod in the cluster. Turn enforcement on "
            "(it recreates the nodes; docs/deploy-gke.md, Access): "
            + " ".join([*update, "--update-addons=NetworkPolicy=ENABLED"])
            + ", then "
            + " ".join([*update, "--enable-network-policy"])
        )
    return errors, warnings


def _check_existing(spec: ClusterSpec, cluster: Any) -> str:
    """Fail with the fix before any pool is created on an unsuitable existing cluster."""
    errors, warnings = existing_cluster_problems(
        spec,
        [c.workload_pool for c in cluster.workload_identity_configs or []],
        cluster.datapath_provider or "",
        any(p.enabled for p in cluster.network_policies or []),
    )
    for warning in warnings:
        pulumi.log.warn(warning)
    if errors:
        raise InvalidInput("; ".join(errors))
    return str(spec.gke_cluster)


@dataclass(frozen=True)
class GkeClusterArgs:
    spec: ClusterSpec
    # The network a created cluster lives in; None with spec.gke_cluster (the cluster has one).
    network: ClusterNetwork | None = None


class GkeCluster(pulumi.ComponentResource):
    """The cluster, its nodes' service account, its head pool and its TPU pools."""

    cluster_name: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    node_service_account: pulumi.Output[str]
    head_pool: gcp.container.NodePool
    tpu_pools: list[gcp.container.NodePool]

    def __init__(self, name: str, args: GkeClusterArgs, opts: pulumi.ResourceOptions | None = None):
        spec = args.spec
        super().__init__("rayslice:infra:GkeCluster", name, None, opts)
        assert spec.zone is not None
        child = pulumi.ResourceOptions(parent=self)
        identity_ready = self._node_identity(name, spec, child)
        if spec.gke_cluster is None:
            cluster = self._create_cluster(name, spec, args, child)
            self.cluster_name = cluster.name
            ca = cluster.master_auth.cluster_ca_certificate
            endpoint = cluster.endpoint
            if private_endpoint_only(spec):  # no public endpoint: reached on the private one
                endpoint = cluster.private_cluster_config.private_endpoint
            parent: pulumi.Resource = cluster
        else:
            if authorized_networks(spec):
                pulumi.log.warn(
                    "gkeAuthorizedNetworks is not applied to an existing gkeCluster; manage its "
                    "authorized networks with `gcloud container clusters update "
                    "--enable-master-authorized-networks --master-authorized-networks=...`"
                )
            existing = gcp.container.get_cluster_output(
                name=spec.gke_cluster,
                location=spec.zone,
                project=spec.project,
                opts=pulumi.InvokeOptions(parent=self),
            )
            # Every pool takes its cluster from here: an unsuitable cluster stops them all.
            self.cluster_name = existing.apply(lambda c: _check_existing(spec, c))
            endpoint, ca = existing.endpoint, existing.master_auths[0].cluster_ca_certificate
            parent = self
        self.kubeconfig = pulumi.Output.secret(
            pulumi.Output.all(self.cluster_name, endpoint, ca).apply(lambda v: kubeconfig(*v))
        )
        pool_opts = pulumi.ResourceOptions(parent=parent, depends_on=[identity_ready])
        self.head_pool = gcp.container.NodePool(
            f"{name}-head",
            name=nodes.head_pool_name(spec),
            project=spec.project,
            cluster=self.cluster_name,
            location=spec.zone,
            node_locations=[spec.zone],
            node_count=1,
            node_config=self._node_config(spec, spec.head_machine_type, resource_labels(spec, "head")),
            opts=pool_opts,
        )
        plans = nodes.tpu_pool_plans(spec)
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
                "node_service_account": self.node_service_account,
                "head_pool": self.head_pool.name,
                "tpu_pools": [p.name for p in self.tpu_pools],
            }
        )

    def _node_identity(self, name: str, spec: ClusterSpec, child: pulumi.ResourceOptions) -> pulumi.Resource:
        """The nodes' own service account with `nodes.NODE_PROJECT_ROLES`, instead of the
        Compute Engine default account (which has Editor on the project in many projects).

        Returns what the pools wait for: the grants, then `identity.IAM_PROPAGATION_WAIT` (the
        same wait as the VM platforms' hosts).
        """
        account = gcp.serviceaccount.Account(
            f"{name}-nodes",
            account_id=identity.account_id(spec.name, identity.GKE_NODES),
            project=spec.project,
            display_name=f"rayslice {spec.name} GKE nodes",
            description="GKE nodes of a rayslice cluster: logs, metrics and node metadata only",
            opts=child,
        )
        grants = [
            gcp.projects.IAMMember(
                f"{name}-nodes-{role.split('/')[-1]}",
                project=account.project,
                role=role,
                member=account.member,
                opts=child,
            )
            for role in nodes.NODE_PROJECT_ROLES
        ]
        self.node_service_account = account.email
        return time.Sleep(
            f"{name}-nodes-iam-wait",
            create_duration=identity.IAM_PROPAGATION_WAIT,
            opts=pulumi.ResourceOptions(parent=self, depends_on=grants),
        )

    def _node_config(
        self, spec: ClusterSpec, machine_type: str, labels: dict[str, str], **extra: Any
    ) -> gcp.container.NodePoolNodeConfigArgs:
        return gcp.container.NodePoolNodeConfigArgs(
            machine_type=machine_type,
            service_account=self.node_service_account,
            oauth_scopes=OAUTH_SCOPES,
            resource_labels=labels,
            workload_metadata_config=gcp.container.NodePoolNodeConfigWorkloadMetadataConfigArgs(
                mode=WORKLOAD_METADATA_MODE
            ),
            **extra,
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
            name=spec.gke_cluster_name,
            project=spec.project,
            location=spec.zone,
            network=args.network.network,
            subnetwork=args.network.subnetwork,
            # Every pool is declared by GkeCluster; GKE insists on a first one, removed at once.
            remove_default_node_pool=True,
            initial_node_count=1,
            release_channel=gcp.container.ClusterReleaseChannelArgs(channel=RELEASE_CHANNEL),
            workload_identity_config=gcp.container.ClusterWorkloadIdentityConfigArgs(
                workload_pool=project.apply(lambda p: f"{p}.svc.id.goog")
            ),
            datapath_provider=DATAPATH_PROVIDER,
            # Nodes get no external IP (egress goes through the network's Cloud NAT); the
            # control plane has a public endpoint only when authorized networks are listed.
            private_cluster_config=gcp.container.ClusterPrivateClusterConfigArgs(
                enable_private_nodes=True, enable_private_endpoint=private_endpoint_only(spec)
            ),
            master_authorized_networks_config=gcp.container.ClusterMasterAuthorizedNetworksConfigArgs(
                cidr_blocks=[
                    gcp.container.ClusterMasterAuthorizedNetworksConfigCidrBlockArgs(
                        cidr_block=cidr, display_name=f"gkeAuthorizedNetworks[{i}]"
                    )
                    for i, cidr in enumerate(authorized_networks(spec))
                ],
                # Not "any Google Cloud address": only the ranges listed.
                gcp_public_cidrs_access_enabled=False,
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
        plan: nodes.TpuPoolPlan,
        policy: gcp.compute.ResourcePolicy | None,
        opts: pulumi.ResourceOptions,
    ) -> gcp.container.NodePool:
        placement: gcp.container.NodePoolPlacementPolicyArgs | None = None
        if plan.placement == "COMPACT":
            placement = gcp.container.NodePoolPlacementPolicyArgs(
                type=PLACEMENT_TYPE, tpu_topology=plan.topology
            )
        elif plan.placement == "workload-policy":
            assert policy is not None
            placement = gcp.container.NodePoolPlacementPolicyArgs(
                type=PLACEMENT_TYPE, policy_name=policy.name
            )
        reservation = None
        if plan.reservation:
            reservation = gcp.container.NodePoolNodeConfigReservationAffinityArgs(
                consume_reservation_type=RESERVATION_AFFINITY, key=RESERVATION_KEY, values=[plan.reservation]
            )
        elif plan.flex_start:
            reservation = gcp.container.NodePoolNodeConfigReservationAffinityArgs(
                consume_reservation_type=NO_RESERVATION
            )
        size: dict[str, Any] = {"node_count": plan.node_count}
        flex: dict[str, Any] = {}
        if plan.flex_start:
            assert plan.max_run_hours is not None, "the spec fills maxRunHours for flex-start"
            size = {
                "initial_node_count": 0,
                "autoscaling": gcp.container.NodePoolAutoscalingArgs(
                    total_min_node_count=0,
                    total_max_node_count=plan.node_count,
                    location_policy=FLEX_LOCATION_POLICY,
                ),
            }
            flex = {"flex_start": True, "max_run_duration": f"{plan.max_run_hours * SECONDS_PER_HOUR}s"}
        return gcp.container.NodePool(
            f"{name}-slice-{plan.slice_index}",
            # The cell's NodeManagement.autoRepair: off for flex-start as xpk's
            # --no-enable-autorepair (sources above), on otherwise.
            management=gcp.container.NodePoolManagementArgs(auto_repair=plan.auto_repair),
            name=plan.name,
            project=spec.project,
            cluster=self.cluster_name,
            location=plan.zone,
            node_locations=[plan.zone],
            placement_policy=placement,
            node_config=self._node_config(
                spec,
                plan.machine_type,
                resource_labels(spec, "tpu-host", plan.slice_index),
                spot=plan.spot,
                reservation_affinity=reservation,
                taints=[gcp.container.NodePoolNodeConfigTaintArgs(**nodes.TPU_TAINT)],
                **flex,
            ),
            opts=opts,
            **size,
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
