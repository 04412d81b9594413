"""A local wheelhouse for simulated hosts, which have no internet (as an offline site keeps one).

It holds exactly the files of the spec's preset lock (`variables.preset_lock`, downloaded by
their hashes), what the boot script resolves beside it (`variables.host_requirements`), plus
the uv release the boot script pins, the head's package cache's lock (`variables.CACHE_LOCK`,
installed when hosts install from an index: the simulated internet's, `internet`) and the
recovery controller VM's lock (`controller.controller_lock`), for this machine's Python and
platform. Its users are the
bring-up benchmark (`bringup.py`) and the tests' `wheelhouse` fixture, never the package.

The wheelhouse is read first: when it already holds a wheel for every requirement, nothing is
downloaded (no network, a few seconds); only otherwise does pip top it up from the package index.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from rayslice.errors import SimulatorError
from rayslice.spec import ClusterSpec
from rayslice.startup_scripts.controller import controller_lock
from rayslice.startup_scripts.variables import (
    CACHE_LOCK,
    UV_VERSION,
    UV_WHEEL_SHA256,
    host_requirements,
    preset_lock,
)


def _download(directory: Path, arguments: list[str], *source: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
            *source,
            "--dest",
            str(directory),
            *arguments,
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )


def _requirement_sets(spec: ClusterSpec, work: Path) -> list[list[str]]:
    """pip's arguments for each part of the wheelhouse. The lock (with uv, pinned by the hashes the
        boot script checks) is downloaded as it is, hash-checked, with no dependency resolved: the
        wheelhouse then holds the very files the lock names, which the hosts' --require-hashes
        install checks again, and so are the locks of the package cache and the controller. The rest
    (the user's lines) is resolved, under the
        lock's versions."""
    lock = preset_lock(spec)
    uv = f"uv=={UV_VERSION} " + " ".join(f"--hash=sha256:{digest}" for digest in UV_WHEEL_SHA256)
    rest = list(host_requirements(spec))
    # The locks of rayslice's own VM packages (the head's package cache, the recovery controller's
    # libraries), each downloaded by its hashes as its VM installs it.
    shipped = []
    for name, body in (("package-cache", CACHE_LOCK.read().body), ("controller", controller_lock().body)):
        (work / f"{name}.txt").write_text(body)
        shipped.append(
            ["--require-hashes", "--no-deps", "--only-binary", ":all:", "-r", str(work / f"{name}.txt")]
        )
    if lock is None:
        return [[f"uv=={UV_VERSION}", *rest], *shipped]
    hashed, pins = work / "lock.txt", work / "pins.txt"
    hashed.write_text(f"{lock.body}{uv}\n")
    pins.write_text("".join(f"{pin}\n" for pin in lock.pins()))
    beside = [["--constraint", str(pins), *rest]] if rest else []
    return [["--require-hashes", "--no-deps", "-r", str(hashed)], *beside, *shipped]


def ensure_wheelhouse(directory: Path, spec: ClusterSpec) -> Path:
    """Make `directory` hold the wheels `spec`'s hosts install (downloading what it lacks); returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        for arguments in _requirement_sets(spec, Path(work)):
            if _download(directory, arguments, "--no-index", "--find-links", str(directory)).returncode == 0:
                continue
            result = _download(directory, arguments)
            if result.returncode != 0:
                errors = " ".join(line for line in result.stderr.splitlines() if "ERROR" in line)
                raise SimulatorError(
                    f"could not build the wheelhouse in {directory}: {errors or result.stderr[-500:]}"
                )
    return directory
