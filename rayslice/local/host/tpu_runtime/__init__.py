"""The simulated TPU runtime: what makes a simulated host look like a TPU host to any program.

A real TPU VM has chips at ``/dev/accel*`` and libtpu, which gives a JAX or PyTorch/XLA process
the chips it holds and, on a multi-host slice, joins the processes of all hosts into one program.
A simulated host has neither, so `install` (called once by `rayslice.local.host.boot`, inside the
host's private mount namespace) gives it both edges:

- the chips' device files as the generation's hosts have them (`catalog.Generation.chip_devices`,
  empty files in the host's private ``/dev``, see `confinement`): ``/dev/accel0..N-1`` on v4 and
  older; on v5e and newer ``/dev/vfio/vfio`` and one ``/dev/vfio/<group>`` per TPU device, with
  each group's PCI vendor (Google's) in a private ``/sys/kernel/iommu_groups``, which Ray checks.
  So Ray's own TPU detection takes the path it takes on that hardware, and
  ``ray.util.tpu.get_num_tpu_chips_on_node()`` answers what it answers there (the devices: twice
  the chips on TPU7x);
- an environment (`environment`) that puts ``site/`` on PYTHONPATH: its ``sitecustomize`` loads
  ``rayslice_simulated_tpu`` in every Python process the host starts (Ray's raylet and workers
  included), which maps chips onto CPU devices for JAX and torch_xla (see that module), and a
  simulated ``libtpu`` package whose ``sdk`` reports what the chips run and where they sit.

The head VM and anything outside a simulated host get neither. Nothing in `rayslice.workloads`
knows about it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from rayslice import catalog, names

SITE_DIR = Path(__file__).resolve().parent / "site"
ENABLE_VAR = "RAYSLICE_SIMULATED_TPU"
COORDINATOR_PORT_VAR = "RAYSLICE_SIMULATED_TPU_COORDINATOR_PORT"
DEVICES_PER_CHIP_VAR = "RAYSLICE_SIMULATED_TPU_DEVICES_PER_CHIP"
HBM_BYTES_VAR = "RAYSLICE_SIMULATED_TPU_HBM_BYTES"
IOMMU_GROUPS = Path("/sys/kernel/iommu_groups")
GOOGLE_PCI_VENDOR = "0x1ae0"
VFIO_CONTAINER = "vfio"  # /dev/vfio/vfio, beside the groups on every VFIO host


def environment(generation: catalog.Generation) -> dict[str, str]:
    """What a simulated TPU host's processes inherit so that the runtime loads in each of them."""
    return {
        "PYTHONPATH": str(SITE_DIR),
        ENABLE_VAR: "1",
        COORDINATOR_PORT_VAR: str(names.JAX_COORDINATOR_PORT),
        DEVICES_PER_CHIP_VAR: str(generation.devices_per_chip),
        HBM_BYTES_VAR: str(generation.hbm_gib * 2**30),
    }


def chips_per_host(tree: dict[str, Any]) -> int:
    """Chips of one host, from its metadata tree; 0 for a host that is not a TPU host.

    A Compute Engine TPU instance's machine type says how many chips it has (its catalog
    shapes); a Cloud TPU VM has no TPU machine type but names its accelerator type and its
    slice's hosts (the type's chips over the hosts).
    """
    found = _host_shape(tree)
    return found[1] if found else 0


def _host_shape(tree: dict[str, Any]) -> tuple[catalog.Generation, int] | None:
    """The host's TPU generation and chips, from its metadata tree; None for a CPU VM."""
    instance = tree.get("instance", {})
    attributes = instance.get("attributes", {})
    machine_type = str(instance.get("machine-type", "")).rsplit("/", 1)[-1]
    if machine_type:
        for platform in catalog.PLATFORMS:
            for shape in catalog.table(platform).values():
                if shape.machine_type == machine_type:
                    return catalog.generation(shape.generation), shape.chips_per_host
    accelerator_type = attributes.get("accelerator-type")
    endpoints = attributes.get("worker-network-endpoints")
    if isinstance(accelerator_type, str) and isinstance(endpoints, str):
        hosts = len([e for e in endpoints.split(",") if e])
        shape = catalog.lookup(accelerator_type, "tpu-vm")
        return catalog.generation(shape.generation), shape.chips // max(hosts, 1)
    return None


def install(tree: dict[str, Any], dev: Path = Path("/dev"), groups: Path = IOMMU_GROUPS) -> dict[str, str]:
    """Give this host its TPU chips' device files in `dev` (and `groups`); return the environment
    to add.

    `tree` is the host's metadata tree. Runs as root in the host's own mount namespace after
    `confinement` made its private /dev (a tmpfs, so the files vanish with the host); on a VFIO
    generation it covers `groups` with a tmpfs of its own first, unless `groups` is not the
    machine's (a test's directory). Returns {} for a host that is not a TPU VM (the CPU head VM).
    """
    found = _host_shape(tree)
    if found is None:
        return {}
    generation, chips = found
    if generation.chip_devices == "accel":
        for chip in range(chips):
            (dev / f"accel{chip}").touch(mode=0o666)
        return environment(generation)
    if groups == IOMMU_GROUPS:
        if not groups.is_dir():  # sysfs is not writable: there is nowhere else to put the groups
            raise RuntimeError(
                f"this machine's kernel has no {groups} (built without IOMMU support), where a "
                f"simulated {generation.name} host shows its chips' VFIO groups as on hardware"
            )
        cover = ["mount", "-t", "tmpfs", "-o", "mode=0755,size=1m,nosuid,nodev,noexec", "tmpfs", str(groups)]
        subprocess.run(cover, check=True)
    (dev / "vfio").mkdir(exist_ok=True)
    (dev / "vfio" / VFIO_CONTAINER).touch(mode=0o666)
    for group in range(chips * generation.devices_per_chip):
        (dev / "vfio" / str(group)).touch(mode=0o666)
        device = groups / str(group) / "devices" / f"0000:00:{4 + group:02x}.0"  # one PCI function each
        device.mkdir(parents=True)
        (device / "vendor").write_text(GOOGLE_PCI_VENDOR + "\n")
    return environment(generation)
