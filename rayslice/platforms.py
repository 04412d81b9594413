"""The two VM platforms side by side: what differs between ``compute`` and ``tpu-vm``, declared once.

Both run the same boot script on TPU hosts in the cluster's VPC. They differ in what a slice is
in the cloud API (which also decides how the recovery controller reads and recreates it), and
in who names the hosts and tells each host which worker it is. Infra, the boot script's
attributes, the simulator, the recovery controller and `rayslice status` read an entry of
`VM_PLATFORMS` and never compare a platform's name. GKE is not a VM platform (a slice is a node
pool, a host a pod) and has no entry.

The recovery controller imports this module, so it ships in the controller's bundle
(`rayslice.recovery.bundle`) and, like the rest of that bundle, needs only the standard library
and `rayslice.names`, on Python 3.10 too.
"""

from __future__ import annotations

from dataclasses import dataclass

from rayslice.names import ATTR_SLICE_HOSTS, ATTR_SLICE_NAME, slice_host_names

# What one slice is in the cloud API.
TPU_NODE = "tpu-node"  # a Cloud TPU v2 Node: created, read and deleted whole by the TPU API
MIG = "mig"  # a Compute Engine managed instance group of TPU VM instances
SLICE_RESOURCES = (TPU_NODE, MIG)

# The identity attributes the Cloud TPU API puts into each host's metadata (a TPU VM's
# `instance/attributes/`): the slice's accelerator type and node id, the worker's number, every
# worker's address (``unknown:unknown:<ip>`` entries) and the runtime's environment.
TPU_API_ATTRIBUTES = (
    "accelerator-type",
    "agent-worker-number",
    "instance-id",
    "worker-network-endpoints",
    "tpu-env",
)
# The identity attributes a Compute Engine TPU host of a MIG slice has. Google's Compute Engine
# TPU pages do not list them; a published guide's check of a real TPU7x slice (two
# tpu7x-standard-4t hosts of a MIG with a workload policy) does: "Qwen3.5-397B-A17B-FP8 Inference
# on TPU v7x — TPU VM Edition", part 3, step 1.5 "Verify the ICI interconnect": the attribute
# listing "Should include: accelerator-type tpu-env worker-id worker-network-endpoints etc.",
# `accelerator-type` "Should output: v7x-16 (note: no "tpu" prefix)", `worker-id` "(Host 0 = 0,
# Host 1 = 1)" and TOPOLOGY in `tpu-env`. It shows no `agent-worker-number` or `instance-id`,
# and not the format of `worker-network-endpoints`, so neither is relied on there.
COMPUTE_TPU_ATTRIBUTES = ("accelerator-type", "worker-id", "worker-network-endpoints", "tpu-env")


@dataclass(frozen=True)
class VmPlatform:
    """One VM platform: the facts that differ from the other one."""

    name: str  # the spec's ``platform`` value
    # TPU_NODE or MIG. The controller recreates a TPU node by deleting it and creating it again
    # from its recorded Node fields; a MIG by deleting it, inserting it again with target size 0
    # and creating its hosts from their recorded per-instance configs (names and addresses).
    slice_resource: str
    # The metadata attributes Google's API itself gives each host (TPU_API_ATTRIBUTES or
    # COMPUTE_TPU_ATTRIBUTES); the simulator serves exactly these.
    google_attributes: tuple[str, ...]
    # True: rayslice names each host (`names.host_name`, fixed by the MIG's per-instance
    # configs) and writes the slice's name and its hosts' names in worker order into every
    # host's metadata (`identity_attributes`), for a host whose Google attributes do not tell it
    # which worker it is. On Compute Engine only one published log shows Google's attributes,
    # so both are there: a host reads Google's when it has them and rayslice's otherwise (the
    # boot script takes its worker number and host list from one of the two, never a mix).
    # False: Google names the workers and its attributes identify them.
    rayslice_names_hosts: bool
    # True: the slices' boot disks come from an image the stack names (an instance template's
    # sourceImage), so a stack may boot them from a host image (`hostImage`, `rayslice image`).
    # False: the TPU API picks the image from the runtime version.
    host_images: bool

    def identity_attributes(
        self, slice_name: str, hosts: int, *, cloud_names: bool = False
    ) -> dict[str, str]:
        """The identity attributes rayslice writes for slice `slice_name` of `hosts` hosts (none
        where Google's own attributes identify the workers). `cloud_names`: the cloud names this
        slice's hosts (a flex-start MIG's resize request: "The MIG automatically generates the
        names of the VMs", Compute Engine, "About resize requests in a MIG"), so no list of
        names can be written: only the slice's name, and the hosts identify themselves by
        Google's attributes."""
        if not self.rayslice_names_hosts:
            return {}
        if cloud_names:
            return {ATTR_SLICE_NAME: slice_name}
        return {
            ATTR_SLICE_NAME: slice_name,
            ATTR_SLICE_HOSTS: ",".join(slice_host_names(slice_name, hosts)),
        }


COMPUTE = VmPlatform(
    name="compute",
    slice_resource=MIG,
    google_attributes=COMPUTE_TPU_ATTRIBUTES,
    rayslice_names_hosts=True,
    host_images=True,
)
TPU_VM = VmPlatform(
    name="tpu-vm",
    slice_resource=TPU_NODE,
    google_attributes=TPU_API_ATTRIBUTES,
    rayslice_names_hosts=False,
    host_images=False,
)
VM_PLATFORMS = {platform.name: platform for platform in (COMPUTE, TPU_VM)}
