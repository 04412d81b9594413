"""On a real TPU host: how its chips show, next to what the simulated TPU runtime counts and what
the catalog says this generation's hosts show. Exits 1 where they disagree.

The simulator gives each simulated host the device files of `catalog.Generation.chip_devices`;
this is the check of that fact against hardware. It needs only the standard library, this
checkout and, for the generation, ``TPU_ACCELERATOR_TYPE`` (set on TPU VMs and GKE TPU nodes) or
``--accelerator-type``. Run from the repository root on the host:

    python3 scripts/tpu_host_devices.py [--accelerator-type v5litepod-4]

Results on hardware are recorded in docs/simulated-tpu-runtime.md.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rayslice import catalog  # noqa: E402 - after the checkout is on the path

RUNTIME = REPO / "rayslice/local/host/tpu_runtime/site/rayslice_simulated_tpu.py"


def _runtime():
    spec = importlib.util.spec_from_file_location("rayslice_simulated_tpu", RUNTIME)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


Functions = dict[str, dict[str, str | None]]  # PCI function -> its vendor and device ids


def observe() -> tuple[list[str], list[str], dict[str, Functions]]:
    """The host's /dev/accel* files, /dev/vfio entries and each VFIO group's PCI functions."""
    try:
        vfio = sorted(os.listdir("/dev/vfio"))
    except OSError:
        vfio = []
    groups: dict[str, Functions] = {}
    for group in (e for e in vfio if e.isdigit()):
        devices = Path("/sys/kernel/iommu_groups") / group / "devices"
        functions = sorted(p.name for p in devices.iterdir()) if devices.is_dir() else []
        groups[group] = {
            f: {"vendor": _read(devices / f / "vendor"), "device": _read(devices / f / "device")}
            for f in functions
        }
    return sorted(p for p in glob.glob("/dev/accel*") if not os.path.isdir(p)), vfio, groups


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator-type", default=os.environ.get("TPU_ACCELERATOR_TYPE"))
    args = parser.parse_args()
    if not args.accelerator_type:
        parser.error("no TPU_ACCELERATOR_TYPE on this host: pass --accelerator-type")
    generation = catalog.generation_of(args.accelerator_type)
    if generation is None:
        parser.error(f"{args.accelerator_type!r} is no TPU type the catalog knows")
    accel, vfio, groups = observe()
    runtime = _runtime()
    google = [g for g in groups if runtime._google_group(f"/sys/kernel/iommu_groups/{g}/devices")]
    shows = "accel" if accel else "vfio" if google else "none"
    os.environ.setdefault(runtime.DEVICES_PER_CHIP_VAR, str(generation.devices_per_chip))
    chips = runtime.host_chips()
    report = {
        "accelerator_type": args.accelerator_type,
        "observed": {"accel": accel, "vfio": vfio, "groups": groups},
        "shows": shows,
        "catalog_says": generation.chip_devices,
        "runtime_counts_chips": chips,
    }
    print(json.dumps(report, indent=1))
    return 0 if shows == generation.chip_devices and chips > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
