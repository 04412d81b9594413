"""``platform=gke``: GKE node pools per slice and a KubeRay RayCluster on them.

`TpuRayCluster` builds `GkeTpuCluster` with `GkeTpuClusterArgs(spec=..., network=...)` and
exports its `exports`. Pure builders live in `nodes` (pools), `kuberay` (Kubernetes objects)
and `access` (commands); `cluster` and `component` hold the Pulumi components.
"""

from rayslice.infra.gke.component import GkeTpuCluster, GkeTpuClusterArgs

__all__ = ["GkeTpuCluster", "GkeTpuClusterArgs"]
