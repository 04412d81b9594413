"""How a user reaches a GKE Ray cluster: the commands and addresses `GkeTpuCluster` exports.

Each command is one line a user pastes into a shell (docs/deploy-gke.md shows where), so every
argument is shell-quoted here.
"""

from __future__ import annotations

import shlex

from rayslice.infra.gke.kuberay import head_service_name, namespace_name
from rayslice.names import DASHBOARD_PORT
from rayslice.spec import ClusterSpec


def get_credentials_command(spec: ClusterSpec, cluster_name: str) -> str:
    """Write a kubectl context for the cluster (its private endpoint when no authorized
    network is listed: run it from inside the VPC, or list your range in gkeAuthorizedNetworks)."""
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
            *([] if spec.gke_authorized_networks else ["--internal-ip"]),
        ]
    )


def dashboard_tunnel_command(spec: ClusterSpec) -> str:
    """Forward localhost:8265 to the head's dashboard / Jobs API (after get-credentials)."""
    return shlex.join(
        [
            "kubectl",
            "port-forward",
            "--namespace",
            namespace_name(spec),
            f"service/{head_service_name(spec)}",
            f"{DASHBOARD_PORT}:{DASHBOARD_PORT}",
        ]
    )


def jobs_api_address(spec: ClusterSpec) -> str:
    """The Jobs API address from inside the GKE cluster (from this RayCluster's own pods only:
    the NetworkPolicy refuses every other pod)."""
    return f"http://{head_service_name(spec)}.{namespace_name(spec)}.svc.cluster.local:{DASHBOARD_PORT}"


def token_command(spec: ClusterSpec) -> str | None:
    """A shell command line that prints the Ray token KubeRay generated (the Secret named after
    the RayCluster, key ``auth_token``, base64 in the API).

    It is a pipeline, so it must run in a shell: paste it inside ``$(...)`` or give it to
    ``sh -c`` (docs/deploy-gke.md). Every word is quoted so the jsonpath reaches kubectl intact.
    """
    if spec.ray_auth != "token":
        return None
    kubectl = shlex.join(
        [
            "kubectl",
            "get",
            "secret",
            f"--namespace={namespace_name(spec)}",
            spec.name,
            "--output=jsonpath={.data.auth_token}",
        ]
    )
    return f"{kubectl} | base64 --decode"
