"""A local wheelhouse for simulated hosts, which have no internet (as an offline site keeps one).

It holds exactly what the boot script installs for a spec (`variables.requirement_lines`) plus
the uv release the boot script pins and the head's package cache (`variables.CACHE_REQUIREMENTS`,
installed when hosts install from an index: the simulated internet's, `internet`), for this
machine's Python and platform. Its users are the
bring-up benchmark (`bringup.py`) and the tests' `wheelhouse` fixture, never the package.

The wheelhouse is read first: when it already holds a wheel for every requirement, nothing is
downloaded (no network, a few seconds); only otherwise does pip top it up from the package index.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rayslice.errors import SimulatorError
from rayslice.spec import ClusterSpec
from rayslice.startup_scripts.variables import CACHE_REQUIREMENTS, UV_VERSION, requirement_lines


def _download(directory: Path, requirements: list[str], *source: str) -> subprocess.CompletedProcess[str]:
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
            *requirements,
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )


def ensure_wheelhouse(directory: Path, spec: ClusterSpec) -> Path:
    """Make `directory` hold the wheels `spec`'s hosts install (downloading what it lacks); returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    # The version the boot script pins by hash: any other would fail --require-hashes.
    requirements = [*requirement_lines(spec), f"uv=={UV_VERSION}", *CACHE_REQUIREMENTS]
    if _download(directory, requirements, "--no-index", "--find-links", str(directory)).returncode == 0:
        return directory
    result = _download(directory, requirements)
    if result.returncode != 0:
        errors = [line for line in result.stderr.splitlines() if "ERROR" in line]
        raise SimulatorError(
            f"could not build the wheelhouse in {directory}: {' '.join(errors) or result.stderr[-500:]}"
        )
    return directory
