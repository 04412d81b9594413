"""Pulumi components that declare the cloud side of a rayslice cluster (`rayslice.infra`).

`TpuRayCluster` is the entry point; `infra/__main__.py` builds one from the stack's config,
and any other Pulumi program can build one from a `ClusterSpec`.
"""

from rayslice.infra.cluster import TpuRayCluster, TpuRayClusterArgs

__all__ = ["TpuRayCluster", "TpuRayClusterArgs"]
