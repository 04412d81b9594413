"""`GkeTpuCluster`: ``platform=gke`` end to end — the GKE cluster with its node pools, then
KubeRay and the Ray cluster on it, reached through a kubeconfig that never holds a key.

User input was validated by `rayslice.spec.load`; the pure planners this component calls
(`tpu_pool_plans`, `manifests`) only assert the catalog's consistency with GKE and KubeRay.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from rayslice.infra import access
from rayslice.infra.gke_cluster import GkeCluster, GkeClusterArgs
from rayslice.infra.kuberay import NAMESPACE, KubeRay, KubeRayArgs, head_service_name
from rayslice.infra.network import ClusterNetwork
from rayslice.names import DASHBOARD_PORT
from rayslice.spec import ClusterSpec


def get_credentials_command(spec: ClusterSpec, cluster_name: str) -> str:
    assert spec.zone is not None
    return shlex.join(
        [
            "gcloud",
            "container",
            "clusters",
            "get-credentials",
            cluster_name,
            f"--zone={spec.zone}",
            *([f"--project={spec.project}"] if spec.project else []),
        ]
    )


def dashboard_tunnel_command(spec: ClusterSpec) -> str:
    """Forward localhost:8265 to the head's dashboard / Jobs API (after get-credentials)."""
    return shlex.join(
        [
            "kubectl",
            "port-forward",
            "--namespace",
            NAMESPACE,
            f"service/{head_service_name(spec)}",
            f"{DASHBOARD_PORT}:{DASHBOARD_PORT}",
        ]
    )


def jobs_api_address(spec: ClusterSpec) -> str:
    """The Jobs API address from inside the GKE cluster."""
    return f"http://{head_service_name(spec)}.{NAMESPACE}.svc.cluster.local:{DASHBOARD_PORT}"


def token_command(spec: ClusterSpec) -> str | None:
    """Print the Ray token KubeRay generated (Secret named after the RayCluster)."""
    if spec.ray_auth != "token":
        return None
    return (
        shlex.join(
            [
                "kubectl",
                "get",
                "secret",
                "--namespace",
                NAMESPACE,
                spec.name,
                "--output=jsonpath={.data.auth_token}",
            ]
        )
        + " | base64 --decode"
    )


@dataclass(frozen=True)
class GkeTpuClusterArgs:
    spec: ClusterSpec
    network: ClusterNetwork | None  # where rayslice creates the cluster; None with gkeCluster


class GkeTpuCluster(pulumi.ComponentResource):
    """A GKE cluster with one TPU node pool per slice and a KubeRay RayCluster on it.

    `exports` is what `TpuRayCluster` exports for ``platform=gke``; the annotated attributes
    below are its Output-valued entries.
    """

    cluster_name: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    ray_cluster_name: pulumi.Output[str]
    get_credentials_command: pulumi.Output[str]
    exports: dict[str, Any]

    def __init__(self, name: str, args: GkeTpuClusterArgs, opts: pulumi.ResourceOptions | None = None):
        spec = args.spec
        super().__init__("rayslice:infra:GkeTpuCluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.gke = GkeCluster(f"{name}-cluster", GkeClusterArgs(spec=spec, network=args.network), child)
        provider = k8s.Provider(f"{name}-k8s", kubeconfig=self.gke.kubeconfig, opts=child)
        self.kuberay = KubeRay(
            f"{name}-kuberay",
            KubeRayArgs(spec=spec, provider=provider, operator_node_pool=self.gke.head_pool),
            child,
        )
        self.cluster_name = self.gke.cluster_name
        self.kubeconfig = self.gke.kubeconfig
        self.ray_cluster_name = self.kuberay.ray_cluster_name
        self.get_credentials_command = self.cluster_name.apply(lambda n: get_credentials_command(spec, n))
        self.exports = {
            "gke_cluster_name": self.cluster_name,
            "kubeconfig": self.kubeconfig,
            "get_credentials_command": self.get_credentials_command,
            "ray_cluster_name": self.ray_cluster_name,
            "node_pools": pulumi.Output.all(self.gke.head_pool.name, *[p.name for p in self.gke.tpu_pools]),
            "slice_names": [spec.slice_name(i) for i in range(spec.slices)],
            "dashboard_tunnel_command": dashboard_tunnel_command(spec),
            "jobs_api_address": jobs_api_address(spec),
            "local_jobs_api_address": access.local_jobs_api_address(),
            "ray_token_command": token_command(spec),
        }
        self.register_outputs(self.exports)
