"""A local wheelhouse for simulated hosts, which have no internet (as an offline site keeps one).

It holds exactly the files of the spec's preset lock (`variables.preset_lock`, downloaded by
their hashes), what the boot script resolves beside it (`variables.host_requirements`), plus
the uv release the boot script pins, the head's package cache (`variables.CACHE_REQUIREMENTS`,
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
    CACHE_REQUIREMENTS,
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
    install checks again. The rest (the package cache, the user's lines) is resolved, under the
    lock's versions."""
    lock = preset_lock(spec)
    uv = f"uv=={UV_VERSION} " + " ".join(f"--hash=sha256:{digest}" for digest in UV_WHEEL_SHA256)
    rest = [*CACHE_REQUIREMENTS, *host_requirements(spec)]
    recovery = work / "controller.txt"  # the recovery controller VM's lock, as it installs it
    recovery.write_text(controller_lock().body)
    locked = ["--require-hashes", "--no-deps", "--only-binary", ":all:", "-r", str(recovery)]
    if lock is None:
        return [[f"uv=={UV_VERSION}", *rest], locked]
    hashed, pins = work / "lock.txt", work / "pins.txt"
    hashed.write_text(f"{lock.body}{uv}\n")
    pins.write_text("".join(f"{pin}\n" for pin in lock.pins()))
    return [["--require-hashes", "--no-deps", "-r", str(hashed)], ["--constraint", str(pins), *rest], locked]


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
