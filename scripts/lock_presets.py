"""Write the presets' locks (rayslice/startup_scripts/locks/<preset>.lock) and the recovery
controller's (locks/controller.lock) from the package index.

Each preset's requirement lines plus Ray (`variables.whole_lock_header`) are resolved with uv for
the hosts' Python and platform (`locks.PLATFORM`), with the sha256 of each file a host may
install. Run it after changing a preset, `DEFAULT_RAY_VERSION` or to take newer releases, and
commit the locks: a changed lock replaces the hosts of every stack that deploys it.

    .venv/bin/python scripts/lock_presets.py [NAME ...]

NAME is a preset, `controller` (the recovery controller VM's google-auth and requests,
`controller.LOCK`) or `package-cache` (the head's proxpi and gunicorn, `variables.CACHE_LOCK`):
those two are resolved for the oldest Python of `locks.IMAGE_PYTHONS`, wheels only.

The locks are resolved from PyPI alone. The `xla` preset's find-links pages (Google's libtpu
pages on storage.googleapis.com) are left out: they could not be reached where the locks were
generated, and the libtpu release torch_xla 2.9 pins (`libtpu==0.0.21`) is on PyPI. A locked
host installs only the files the lock names, so it needs no find-links either.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rayslice.spec import DEFAULT_RAY_VERSION
from rayslice.startup_scripts import controller, locks
from rayslice.startup_scripts.variables import CACHE_LOCK, PRESETS, whole_lock_header

# Locks of rayslice's own packages on its VMs, by name.
SHIPPED = {lock.name: lock for lock in (controller.LOCK, CACHE_LOCK)}


def main(names: list[str]) -> None:
    for name in names or [*sorted(PRESETS), *SHIPPED]:
        if name in SHIPPED:
            lock = SHIPPED[name].compile(locks.uv_binary())
            path = SHIPPED[name].path
        else:
            lock = locks.compile_lock(locks.uv_binary(), whole_lock_header(name, DEFAULT_RAY_VERSION))
            path = locks.LOCK_DIR / f"{name}.lock"
        write(path, lock)


def write(path: Path, lock: locks.Lock) -> None:
    path.write_text(lock.text)
    print(f"{path}: {len(lock.pins())} packages, {len(lock.text)} bytes, digest {lock.digest}")


if __name__ == "__main__":
    main(sys.argv[1:])
