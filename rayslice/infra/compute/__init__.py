"""``platform: compute``: TPU slices on Compute Engine (`ComputeCluster`, `ComputeSlice`)."""

from rayslice.infra.compute.component import ComputeCluster
from rayslice.infra.compute.slice import ComputeSlice

__all__ = ["ComputeCluster", "ComputeSlice"]
