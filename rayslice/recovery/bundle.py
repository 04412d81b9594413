"""The recovery controller as one runnable zip, carried to the controller VM in its metadata.

rayslice itself is not on the package index the controller VM could install from: the
controller must reach the VM from the machine that deploys it, in the version that deploys it.
So infra puts this zip (a `zipapp`: ``python recovery.pyz ARGS`` runs
`rayslice.recovery.controller.main`) base64-encoded into the controller VM's metadata attribute
`names.ATTR_RECOVERY_BUNDLE`, and that VM's boot script (`rayslice.startup_scripts.controller`)
checks its sha256 against the one rendered into the script, writes it out and runs it under its
supervisor with a Python that has the two libraries it imports (google-auth and requests,
`RUNTIME_REQUIREMENTS`), installed from a hash-pinned lock (``locks/controller.lock``).

Why those two are not inside the zip: google-auth (2.63) imports `cryptography`, a compiled
wheel of several MB, and a zip imports no compiled module; and google-auth with the pure-Python
rest (requests, urllib3, idna, certifi, charset-normalizer, pyasn1-modules) is about 950 KB
deflated, while one metadata value holds at most 256 KiB (Compute Engine's metadata limits).

It holds only the modules the controller imports (`MODULES`, shipped by `rayslice.shipping`;
tests run it with nothing else importable) and is byte-for-byte reproducible, so the VM's
metadata, and with it the VM, changes only when this code does. These modules must run on
`PYTHON`: the controller VM uses its image's python3, where rayslice itself needs 3.11.
"""

from __future__ import annotations

import base64

from rayslice import shipping

# The controller's import closure inside rayslice (checked by tests/recovery/test_bundle.py).
MODULES = (
    "rayslice/__init__.py",
    "rayslice/capacity_table.py",
    "rayslice/cloud/__init__.py",
    "rayslice/cloud/capacity.py",
    "rayslice/cloud/rest.py",
    "rayslice/cloud/states.py",
    "rayslice/errors.py",
    "rayslice/names.py",
    "rayslice/platforms.py",
    "rayslice/recovery/__init__.py",
    "rayslice/recovery/cloud.py",
    "rayslice/recovery/controller.py",
    "rayslice/recovery/demand.py",
    "rayslice/recovery/events.py",
    "rayslice/recovery/journal.py",
    "rayslice/recovery/kinds.py",
    "rayslice/recovery/permissions.py",
    "rayslice/recovery/scaling.py",
)
# The module whose `main` the zipapp runs; MODULES is its closure.
ENTRY = "rayslice.recovery.controller"
# What the controller imports from outside the standard library; its VM installs these.
RUNTIME_REQUIREMENTS = ("google-auth", "requests")
# The controller VM's python3: its image is ubuntu-2204-lts (`rayslice.infra.cpu_vm.CPU_VM_IMAGE`),
# whose python3 is 3.10. The bundle's modules are checked against it (tests/recovery/test_bundle.py).
PYTHON = "3.10"
MAIN = (
    '"""rayslice recovery controller (see rayslice/recovery/controller.py)."""\n'
    "import sys\n\n"
    f"from {ENTRY} import main\n\n"
    "sys.exit(main())\n"
)


def build() -> bytes:
    """The zipapp's bytes: `MODULES` from this installation of rayslice, plus ``__main__.py``."""
    return shipping.zipapp(MODULES, MAIN)


def encoded() -> str:
    """`build()` as the base64 text the metadata attribute holds."""
    return base64.b64encode(build()).decode("ascii")
