"""Carrying an allow-listed set of rayslice's own modules to a machine that has no rayslice.

Two things leave this machine without an installed rayslice: every job submitted with
`rayslice run` (a folder that Ray ships as `py_modules`, `rayslice.jobs.upload`) and the recovery
controller (a zipapp in the head VM's metadata, `rayslice.recovery.bundle`). Each names what it
ships as an allow-list of paths (``rayslice/errors.py``, ...), so a module that the far side never
runs (the Pulumi program, the simulator, the CLI) cannot ride along by accident; tests check that
each list is exactly its entry points' import closure.

Sources are read through `importlib.resources` from the rayslice that is imported, so a checkout,
an editable install and a wheel ship the same bytes.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterable
from importlib import resources
from pathlib import Path

_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can carry


def source(module: str) -> str:
    """The text of one allow-listed file, e.g. ``rayslice/recovery/cloud.py``."""
    package, *parts = module.split("/")
    return resources.files(package).joinpath(*parts).read_text(encoding="utf-8")


def write_tree(modules: Iterable[str], into: Path) -> Path:
    """Write `modules` under `into` (keeping their paths); returns `into`/rayslice."""
    for module in modules:
        path = into / module
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source(module), encoding="utf-8")
    return into / "rayslice"


def zipapp(modules: Iterable[str], main: str) -> bytes:
    """A zipapp of `modules` whose ``__main__.py`` is `main`, byte-for-byte reproducible: fixed
    timestamps, modes and order, so the same sources always give the same bytes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in [("__main__.py", main), *((m, source(m)) for m in modules)]:
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, text)
    return buffer.getvalue()
