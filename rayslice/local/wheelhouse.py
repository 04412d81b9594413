"""A local wheelhouse for simulated hosts, which have no internet (as an offline site keeps one).

It holds exactly what the boot script installs for a spec (`variables.requirement_lines`) plus
the uv release the boot script pins, downloaded once from the package index with pip for this
machine's Python and platform.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rayslice.errors import SimulatorError
from rayslice.spec import ClusterSpec
from rayslice.startup_scripts.variables import UV_VERSION, requirement_lines


def ensure_wheelhouse(directory: Path, spec: ClusterSpec) -> Path:
    """Download (or top up) the wheels `spec`'s hosts install into `directory`; returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
            "--dest",
            str(directory),
            *requirement_lines(spec),
            # The version the boot script pins by hash: any other would fail --require-hashes.
            f"uv=={UV_VERSION}",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if result.returncode != 0:
        errors = [line for line in result.stderr.splitlines() if "ERROR" in line]
        raise SimulatorError(
            f"could not build the wheelhouse in {directory}: {' '.join(errors) or result.stderr[-500:]}"
        )
    return directory
