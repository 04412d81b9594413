"""Pulumi components that declare the cloud side of a rayslice cluster (`rayslice.infra`).

`TpuRayCluster` is the entry point; the repository's `infra/__main__.py` builds one from the
stack's config, and any other Pulumi program can build one from a `ClusterSpec`, in a VPC of its
own (`ExistingNetwork`) if it has one (docs/use-as-a-library.md).
"""

from rayslice.infra.cluster import TpuRayCluster, TpuRayClusterArgs
from rayslice.infra.network import ExistingNetwork

__all__ = ["ExistingNetwork", "TpuRayCluster", "TpuRayClusterArgs"]
