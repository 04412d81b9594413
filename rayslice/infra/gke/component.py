"""The Pulumi components of ``platform=gke``: `GkeTpuCluster` (what `TpuRayCluster` hands the
platform to) and `KubeRay` (the operator plus the objects `kuberay.manifests` builds).

`GkeTpuCluster.exports` is what the stack exports for ``platform=gke``; the pure parts (pool
plans, manifests, commands) live in `nodes`, `kuberay` and `access`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from rayslice.infra import access as shared_access
from rayslice.infra.gke import access
from rayslice.infra.gke.cluster import GkeCluster, GkeClusterArgs
from rayslice.infra.gke.kuberay import (
    CHART,
    CHART_REPO,
    KUBERAY_VERSION,
    OPERATOR_NAMESPACE,
    OPERATOR_VALUES,
    manifests,
)
from rayslice.infra.network import ClusterNetwork
from rayslice.names import slice_name
from rayslice.spec import ClusterSpec
from rayslice.startup_scripts.locks import Lock


def _k8s_object(name: str, obj: dict, opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    """One manifest from `kuberay.manifests` as the matching Pulumi Kubernetes resource."""
    kind = obj["kind"]
    if kind == "Namespace":
        return k8s.core.v1.Namespace(name, metadata=obj["metadata"], opts=opts)
    if kind == "ServiceAccount":
        return k8s.core.v1.ServiceAccount(
            name,
            metadata=obj["metadata"],
            automount_service_account_token=obj["automountServiceAccountToken"],
            opts=opts,
        )
    if kind == "ConfigMap":
        return k8s.core.v1.ConfigMap(name, metadata=obj["metadata"], data=obj["data"], opts=opts)
    if kind == "Service":
        return k8s.core.v1.Service(name, metadata=obj["metadata"], spec=obj["spec"], opts=opts)
    if kind == "NetworkPolicy":
        return k8s.networking.v1.NetworkPolicy(name, metadata=obj["metadata"], spec=obj["spec"], opts=opts)
    raise AssertionError(f"kuberay.manifests returned a {kind}, which KubeRay does not register")


@dataclass(frozen=True)
class KubeRayArgs:
    spec: ClusterSpec
    provider: k8s.Provider  # reaches the GKE cluster
    operator_node_pool: pulumi.Resource  # a pool the operator pod can run on (the head pool)
    # The stack's lock (`rayslice.startup_scripts.stack_locks`); None: hosts install the preset's.
    lock: Lock | None = None


class KubeRay(pulumi.ComponentResource):
    """The KubeRay operator (Helm release or the GKE add-on) and the Ray cluster's objects."""

    ray_cluster_name: pulumi.Output[str]

    def __init__(self, name: str, args: KubeRayArgs, opts: pulumi.ResourceOptions | None = None):
        spec = args.spec
        objects = manifests(spec, lock=args.lock)
        super().__init__("rayslice:infra:KubeRay", name, None, opts)
        on_cluster = pulumi.ResourceOptions(parent=self, provider=args.provider)
        operator: list[pulumi.Resource] = [args.operator_node_pool]
        if spec.kuberay == "helm":
            operator = [
                k8s.helm.v3.Release(
                    f"{name}-operator",
                    name=CHART,
                    chart=CHART,
                    version=KUBERAY_VERSION,
                    repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=CHART_REPO),
                    namespace=OPERATOR_NAMESPACE,
                    create_namespace=True,
                    values=OPERATOR_VALUES,
                    opts=pulumi.ResourceOptions.merge(
                        on_cluster, pulumi.ResourceOptions(depends_on=[args.operator_node_pool])
                    ),
                )
            ]
        namespace_object, *namespaced_objects, cluster = objects
        namespace = _k8s_object(f"{name}-namespace", namespace_object, on_cluster)
        # Created once the namespace exists (and deleted before it goes).
        in_namespace = pulumi.ResourceOptions.merge(
            on_cluster, pulumi.ResourceOptions(depends_on=[namespace])
        )
        prerequisites = [
            namespace,
            *(
                _k8s_object(f"{name}-{obj['kind'].lower()}-{obj['metadata']['name']}", obj, in_namespace)
                for obj in namespaced_objects
            ),
        ]
        ray_cluster = k8s.apiextensions.CustomResource(
            f"{name}-raycluster",
            api_version=cluster["apiVersion"],
            kind=cluster["kind"],
            metadata=cluster["metadata"],
            spec=cluster["spec"],
            opts=pulumi.ResourceOptions.merge(
                on_cluster, pulumi.ResourceOptions(depends_on=[*operator, *prerequisites])
            ),
        )
        self.ray_cluster_name = ray_cluster.id.apply(lambda _: spec.name)
        # Declared above and repeated here so it is the component's recorded output.
        self.register_outputs({"ray_cluster_name": self.ray_cluster_name})


@dataclass(frozen=True)
class GkeTpuClusterArgs:
    spec: ClusterSpec
    network: ClusterNetwork | None  # where rayslice creates the cluster; None with gkeCluster
    # The stack's lock (`rayslice.startup_scripts.stack_locks`); None: hosts install the preset's.
    lock: Lock | None = None


class GkeTpuCluster(pulumi.ComponentResource):
    """A GKE cluster with one TPU node pool per slice and a KubeRay RayCluster on it.

    `exports` is what `TpuRayCluster` exports for ``platform=gke``; the annotated attributes
    below are its Output-valued entries.
    """

    cluster_name: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    ray_cluster_name: pulumi.Output[str]
    get_credentials_command: pulumi.Output[str]
    node_service_account: pulumi.Output[str]
    exports: dict[str, Any]

    def __init__(self, name: str, args: GkeTpuClusterArgs, opts: pulumi.ResourceOptions | None = None):
        spec = args.spec
        super().__init__("rayslice:infra:GkeTpuCluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.gke = GkeCluster(f"{name}-cluster", GkeClusterArgs(spec=spec, network=args.network), child)
        provider = k8s.Provider(f"{name}-k8s", kubeconfig=self.gke.kubeconfig, opts=child)
        self.kuberay = KubeRay(
            f"{name}-kuberay",
            KubeRayArgs(spec=spec, provider=provider, operator_node_pool=self.gke.head_pool, lock=args.lock),
            child,
        )
        self.cluster_name = self.gke.cluster_name
        self.kubeconfig = self.gke.kubeconfig
        self.ray_cluster_name = self.kuberay.ray_cluster_name
        self.node_service_account = self.gke.node_service_account
        self.get_credentials_command = self.cluster_name.apply(
            lambda n: access.get_credentials_command(spec, n)
        )
        self.exports = {
            "gke_cluster_name": self.cluster_name,
            "kubeconfig": self.kubeconfig,
            "get_credentials_command": self.get_credentials_command,
            "ray_cluster_name": self.ray_cluster_name,
            "node_service_account": self.node_service_account,
            "node_pools": pulumi.Output.all(self.gke.head_pool.name, *[p.name for p in self.gke.tpu_pools]),
            "slice_names": [slice_name(spec.name, i) for i in range(spec.slices)],
            "dashboard_tunnel_command": access.dashboard_tunnel_command(spec),
            "jobs_api_address": access.jobs_api_address(spec),
            "local_jobs_api_address": shared_access.local_jobs_api_address(),
            "ray_token_command": access.token_command(spec),
        }
        self.register_outputs(self.exports)
