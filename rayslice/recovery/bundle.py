"""The recovery controller as one runnable zip, carried to the head VM in its metadata.

The head VM installs Ray from the package index, where rayslice itself may not be: the
controller must reach the head from the machine that deploys it, in the version that deploys
it. So infra puts this zip (a `zipapp`: ``python recovery.pyz ARGS`` runs
`rayslice.recovery.controller.main`) base64-encoded into the head's metadata attribute
`names.ATTR_RECOVERY_BUNDLE`, and the head's boot script writes it out and runs it under its
supervisor with the venv's Python, which has the two libraries it imports (google-auth and
requests, `RUNTIME_REQUIREMENTS`).

It holds only the modules the controller imports (`MODULES`; tests run it with nothing else
importable) and is byte-for-byte reproducible: fixed timestamps and order, so the head's
metadata, and with it the head VM, changes only when this code does. These modules must run on
Python 3.10 too: an offline head (packageIndex set) uses its image's python3, which is 3.10 on
Ubuntu 22.04, where rayslice itself needs 3.11.
"""

from __future__ import annotations

import base64
import io
import zipfile
from importlib import resources

# The controller's import closure inside rayslice (checked by tests/recovery/test_bundle.py).
MODULES = (
    "rayslice/__init__.py",
    "rayslice/errors.py",
    "rayslice/names.py",
    "rayslice/platforms.py",
    "rayslice/recovery/__init__.py",
    "rayslice/recovery/cloud.py",
    "rayslice/recovery/controller.py",
    "rayslice/recovery/events.py",
)
# What the controller imports from outside the standard library; the head installs these.
RUNTIME_REQUIREMENTS = ("google-auth", "requests")
MAIN = (
    '"""rayslice recovery controller (see rayslice/recovery/controller.py)."""\n'
    "import sys\n\n"
    "from rayslice.recovery.controller import main\n\n"
    "sys.exit(main())\n"
)
_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can carry


def _add(archive: zipfile.ZipFile, name: str, text: str) -> None:
    info = zipfile.ZipInfo(name, date_time=_EPOCH)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    archive.writestr(info, text)


def build() -> bytes:
    """The zipapp's bytes: `MODULES` from this installation of rayslice, plus ``__main__.py``."""
    package = resources.files("rayslice")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        _add(archive, "__main__.py", MAIN)
        for module in MODULES:
            source = package.joinpath(*module.split("/")[1:])
            _add(archive, module, source.read_text(encoding="utf-8"))
    return buffer.getvalue()


def encoded() -> str:
    """`build()` as the base64 text the metadata attribute holds."""
    return base64.b64encode(build()).decode("ascii")
