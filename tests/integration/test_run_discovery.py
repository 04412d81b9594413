"""`rayslice run` with no address finds the simulated slice in the default state dir, and sends
its token there; the same slice named with --address gets no token unless one is given. (Given
one with --token-file, it runs: every `rayslice_run` of test_workloads_on_ray.py on this cluster
names it so.)

The shared single-host v6e-4 simulation with token auth (the default): the cheapest slice that
proves the discovery path a new user takes after `rayslice local up`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rayslice.local.simulation.state import STATE_DIR_ENV
from tests.integration.clusters import on

RAYSLICE = str(Path(sys.executable).with_name("rayslice"))


def rayslice(*argv: str, state_dir: Path, cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [RAYSLICE, *argv],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={
            "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
            "HOME": os.environ.get("HOME", "/root"),
            STATE_DIR_ENV: str(state_dir),
        },
    )
    print(result.stdout[-3000:], result.stderr[-3000:])  # shown when a test fails
    return result


@on("v6e-4")
def test_run_finds_the_simulated_slice_and_its_token(cluster, tmp_path):
    assert cluster.token_file.is_file()  # token auth is on: a request without it is refused
    job = tmp_path / "job" / "hello.py"
    job.parent.mkdir()
    job.write_text("import sys\nprint('hello from', sys.argv[1:])\n")
    found = rayslice("run", str(job), "--", "x y", state_dir=cluster.state_dir, cwd=tmp_path)
    assert found.returncode == 0
    assert "hello from ['x y']" in found.stdout
    assert f"to {cluster.dashboard_url()}" in found.stderr
    named = rayslice(
        "run", "--address", cluster.dashboard_url(), str(job), state_dir=cluster.state_dir, cwd=tmp_path
    )
    assert named.returncode == 3, "the simulator's token must not go to an address the user named"
    assert "uses token auth and no token was sent: pass --token-file" in named.stderr
    assert "Traceback" not in named.stderr
