"""``platform: tpu-vm``: slices created with the Cloud TPU API (`gcp.tpu.V2Vm`).

Google's TPU docs call this API legacy (bug fixes and security updates only; no TPU7x), but it
is the only VM path for v2 to v5e. Network, firewall, identity, head VM and outputs come from
`VmSliceCluster`; this module adds the slice and the TPU VM SSH commands.
"""

from __future__ import annotations

import pulumi

from rayslice.infra import access
from rayslice.infra.hosts import Slice, SliceArgs, VmSliceCluster
from rayslice.infra.tpu_vm.slice import TpuVmSlice
from rayslice.spec import ClusterSpec


class TpuVmCluster(VmSliceCluster):
    """A Ray cluster whose slices are Cloud TPU VMs."""

    TYPE = "rayslice:infra:TpuVmCluster"

    def make_slice(self, name: str, args: SliceArgs, opts: pulumi.ResourceOptions) -> Slice:
        return TpuVmSlice(name, args, opts)

    def slice_ssh(self, spec: ClusterSpec, index: int, zone: str) -> str:
        return access.tpu_ssh(spec.slice_name(index), zone, spec.project)

    def slice_dashboard_tunnel(self, spec: ClusterSpec, zone: str, head_ip: str) -> str:
        return access.tpu_dashboard_tunnel(spec.slice_name(0), zone, spec.project, head_ip)
