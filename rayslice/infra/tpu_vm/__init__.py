"""``platform: tpu-vm``: TPU slices on the Cloud TPU API (`TpuVmCluster`, `TpuVmSlice`)."""

from rayslice.infra.tpu_vm.component import TpuVmCluster
from rayslice.infra.tpu_vm.slice import TpuVmSlice

__all__ = ["TpuVmCluster", "TpuVmSlice"]
