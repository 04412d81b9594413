"""``platform: compute``: TPU slices as Compute Engine managed instance groups.

Google's current path for v5p, v6e and TPU7x outside GKE; Compute Engine repairs on-demand and
reserved slices as a whole after a hardware failure. Network, firewall, identity, head VM and
outputs come from `VmSliceCluster`; this module adds the slice and the Compute Engine SSH
commands (GA ``gcloud compute ssh --tunnel-through-iap`` to worker 0's instance).
"""

from __future__ import annotations

import pulumi

from rayslice.infra import access
from rayslice.infra.compute.slice import ComputeSlice
from rayslice.infra.hosts import Slice, SliceArgs, VmSliceCluster
from rayslice.names import host_name
from rayslice.spec import ClusterSpec


class ComputeCluster(VmSliceCluster):
    """A Ray cluster whose slices are Compute Engine TPU instances in MIGs."""

    TYPE = "rayslice:infra:ComputeCluster"

    def make_slice(self, name: str, args: SliceArgs, opts: pulumi.ResourceOptions) -> Slice:
        return ComputeSlice(name, args, opts)

    def slice_ssh(self, spec: ClusterSpec, index: int, zone: str) -> str:
        return access.vm_ssh(host_name(spec.slice_name(index), 0), zone, spec.project)

    def slice_dashboard_tunnel(self, spec: ClusterSpec, zone: str, head_ip: str) -> str:
        return access.vm_dashboard_tunnel(host_name(spec.slice_name(0), 0), zone, spec.project, head_ip)
