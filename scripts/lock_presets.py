"""Write the presets' locks (rayslice/startup_scripts/locks/<preset>.lock) and the recovery
controller's (locks/controller.lock) from the package index.

Each preset's requirement lines plus Ray (`variables.whole_lock_header`) are resolved with uv for
the hosts' Python and platform (`locks.PLATFORM`), with the sha256 of each file a host may
install. Run it after changing a preset, `DEFAULT_RAY_VERSION` or to take newer releases, and
commit the locks: a changed lock replaces the hosts of every stack that deploys it.

    .venv/bin/python scripts/lock_presets.py [PRESET ... | controller]

The controller's lock (`rayslice.startup_scripts.controller`) holds google-auth and requests
with their dependencies, resolved for the controller VM's Python (`bundle.PYTHON`), wheels only.

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
from rayslice.startup_scripts.variables import PRESETS, whole_lock_header


def main(names: list[str]) -> None:
    for name in names or [*sorted(PRESETS), controller.LOCK_NAME]:
        if name == controller.LOCK_NAME:
            lock = locks.compile_lock(
                locks.uv_binary(), controller.lock_header(), also_pythons=controller.LOCK_ALSO_PYTHONS
            )
            path = controller.LOCK_FILE
        else:
            lock = locks.compile_lock(locks.uv_binary(), whole_lock_header(name, DEFAULT_RAY_VERSION))
            path = locks.LOCK_DIR / f"{name}.lock"
        write(path, lock)


def write(path: Path, lock: locks.Lock) -> None:
    path.write_text(lock.text)
    print(f"{path}: {len(lock.pins())} packages, {len(lock.text)} bytes, digest {lock.digest}")


if __name__ == "__main__":
    main(sys.argv[1:])
