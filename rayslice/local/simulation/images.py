"""Host images on the simulator: a directory of files every slice host's root starts with.

On Compute Engine a host booted from an image (``hostImage``) finds on its boot disk what the
image builder left there: the venv with its install marker, and uv (`rayslice.infra.image`). A
simulated host's disk is its root directory, so its image is a directory holding those same
files below the same paths (``opt/rayslice/``), copied into each slice host's root before its
first boot, as Compute Engine copies an image into each new boot disk. The CPU head VM and the
controller VM boot their own images on the cloud too, so they get none.

`capture` makes one from a simulated host that installed (the simulator's image builder: a host
booted with a wheelhouse package source); the venv is relocatable (the boot script creates it
with ``uv venv --relocatable``), so it runs below another simulation's root.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rayslice.errors import SimulatorError

# What a host's install leaves below its root, and what an image therefore holds.
IMAGE_DIR = Path("opt/rayslice")
INSTALL_MARKER = IMAGE_DIR / "venv" / ".rayslice-install"  # the boot script's INSTALL_MARKER


def capture(root: Path, image: Path) -> str:
    """Copy the install below host root `root` into the new image directory `image`; the
    fingerprint of the install it holds."""
    marker = root / INSTALL_MARKER
    if not marker.is_file():
        raise SimulatorError(
            f"{root} holds no finished install ({INSTALL_MARKER} is missing): boot the host with a "
            "wheelhouse package source and wait until it has installed"
        )
    if image.exists():
        raise SimulatorError(f"{image} exists; an image is made once, into a new directory")
    shutil.copytree(root / IMAGE_DIR, image / IMAGE_DIR, symlinks=True)
    return marker.read_text()


def check(image: Path) -> None:
    """Refuse a directory that is not an image `capture` made."""
    if not (image / INSTALL_MARKER).is_file():
        raise SimulatorError(
            f"{image} is not a simulated host image ({INSTALL_MARKER} is missing); make one with "
            "Simulation.capture_image"
        )


def install(image: Path, root: Path) -> None:
    """Put the image's files below host root `root`, as a boot disk made from it holds them."""
    shutil.copytree(image / IMAGE_DIR, root / IMAGE_DIR, symlinks=True)
