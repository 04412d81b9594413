"""The simulated TPU runtime: what makes a simulated host look like a TPU host to any program.

A real TPU VM has chips at ``/dev/accel*`` and libtpu, which gives a JAX or PyTorch/XLA process
the chips it holds and, on a multi-host slice, joins the processes of all hosts into one program.
A simulated host has neither, so `install` (called once by `rayslice.local.host.boot`, inside the
host's private mount namespace) gives it both edges:

- ``/dev/accel0..N-1`` (empty files in the host's private ``/dev``, see `confinement`), N = the
  chips per host of the host's accelerator type, so Ray counts the chips as on hardware and
  ``ray.util.tpu.get_num_tpu_chips_on_node()`` answers N;
- an environment (`environment`) that puts ``site/`` on PYTHONPATH: its ``sitecustomize`` loads
  ``rayslice_simulated_tpu`` in every Python process the host starts (Ray's raylet and workers
  included), which maps chips onto CPU devices for JAX and torch_xla (see that module).

The head VM and anything outside a simulated host get neither. Nothing in `rayslice.workloads`
knows about it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rayslice import catalog, names

SITE_DIR = Path(__file__).resolve().parent / "site"
ENABLE_VAR = "RAYSLICE_SIMULATED_TPU"
COORDINATOR_PORT_VAR = "RAYSLICE_SIMULATED_TPU_COORDINATOR_PORT"


def environment() -> dict[str, str]:
    """What a simulated TPU host's processes inherit so that the runtime loads in each of them."""
    return {
        "PYTHONPATH": str(SITE_DIR),
        ENABLE_VAR: "1",
        COORDINATOR_PORT_VAR: str(names.JAX_COORDINATOR_PORT),
    }


def chips_per_host(tree: dict[str, Any]) -> int:
    """Chips of one host, from its metadata tree; 0 for a host that is not a TPU host.

    A Compute Engine TPU instance's machine type says how many chips it has (its catalog
    shapes); a Cloud TPU VM has no TPU machine type but names its accelerator type and its
    slice's hosts (the type's chips over the hosts).
    """
    instance = tree.get("instance", {})
    attributes = instance.get("attributes", {})
    machine_type = str(instance.get("machine-type", "")).rsplit("/", 1)[-1]
    if machine_type:
        for platform in catalog.PLATFORMS:
            for shape in catalog.table(platform).values():
                if shape.machine_type == machine_type:
                    return shape.chips_per_host
    accelerator_type = attributes.get("accelerator-type")
    endpoints = attributes.get("worker-network-endpoints")
    if isinstance(accelerator_type, str) and isinstance(endpoints, str):
        hosts = len([e for e in endpoints.split(",") if e])
        return catalog.lookup(accelerator_type, "tpu-vm").chips // max(hosts, 1)
    return 0


def install(tree: dict[str, Any], dev: Path = Path("/dev")) -> dict[str, str]:
    """Give this host TPU chips in `dev`; return the environment to add.

    `tree` is the host's metadata tree. Runs as root in the host's own mount namespace after
    `confinement` made its private /dev (a tmpfs, so the files vanish with the host). Returns {}
    for a host that is not a TPU VM (the CPU head VM).
    """
    chips = chips_per_host(tree)
    for chip in range(chips):
        (dev / f"accel{chip}").touch(mode=0o666)
    return environment() if chips else {}
