"""`rayslice run` from a wheel installed into a fresh venv, against a real local Ray head.

The wheel is built from this checkout and installed with ``--no-deps`` into a new venv; the
heavy dependencies (Ray, JAX, ...) come from this project's venv through a ``.pth`` line that
adds its site-packages as a plain path (so its editable rayslice finder is never loaded). A
marker written into a shipped module of the INSTALLED copy only proves, on the cluster side, that
the job got the installed copy and not the checkout.

The Ray head, the client and the job share one sandbox: new network and PID namespaces (root),
so the head's ports collide with nothing on the machine and everything dies with the sandbox.
The job's script sits in a folder that also holds a `.venv/`, a `.state/` and a `ray-token`; the
job lists its working dir and must see none of them.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import REPO

MARKER = "INSTALLED_MARKER"  # a name added to rayslice/workloads/__init__.py, which every job ships


@pytest.fixture(scope="module")
def installed(tmp_path_factory, rayslice_wheel) -> Path:
    """A venv holding only the rayslice wheel (plus a path to this project's dependencies)."""
    work = tmp_path_factory.mktemp("wheel")
    venv = work / "venv"
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    (site / "zz_project_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # --ignore-installed: the venv's path already shows a rayslice 0.1.0 (the project's editable
    # install through the .pth line, or a checkout's egg-info on PYTHONPATH), which pip would
    # otherwise take for this wheel and install nothing.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--ignore-installed",
            str(rayslice_wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    with (site / "rayslice" / "workloads" / "__init__.py").open("a") as shipped:
        shipped.write(f"{MARKER} = 'installed'\n")
    return venv


def test_the_installed_copy_is_the_one_imported(installed, tmp_path):
    result = subprocess.run(
        [
            str(installed / "bin" / "python"),
            "-c",
            "import rayslice, ray; print(rayslice.__file__); print(ray.__file__)",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        timeout=120,
    )
    rayslice_file, ray_file = result.stdout.split()
    assert Path(rayslice_file).is_relative_to(installed), rayslice_file
    assert not Path(ray_file).is_relative_to(installed)  # Ray comes from the project venv, not a download


JOB = """\
import json, os, sys
import rayslice
from rayslice import workloads
from rayslice.workloads import _cluster
seen = sorted(os.path.relpath(os.path.join(d, f)) for d, dirs, files in os.walk(".") for f in files + dirs)
print("JOB " + json.dumps({"args": sys.argv[1:], "seen": seen, "rayslice": rayslice.__file__,
                          "marker": workloads.INSTALLED_MARKER}))
"""

SANDBOX = """\
set -euo pipefail
ip link set lo up
RAY_TMP=$(mktemp -d /tmp/rsw.XXXXXX)  # short: Ray's socket paths must stay under 108 bytes
trap 'ray stop --force > /dev/null 2>&1; rm -rf "$RAY_TMP"' EXIT  # only this PID namespace's Ray
ray start --head --node-ip-address=127.0.0.1 --port=6379 --dashboard-host=127.0.0.1 \\
  --dashboard-port=8265 --num-cpus=1 --object-store-memory=100000000 --disable-usage-stats \\
  --temp-dir="$RAY_TMP" > "$SANDBOX_TMP/ray-start.log" 2>&1
cd "$SANDBOX_TMP"
set +e
"$RAYSLICE" run "$@"
echo "RUN EXIT $?"
"""


def test_run_from_the_wheel_uploads_only_what_the_job_needs(installed, tmp_path):
    project = tmp_path / "project"
    for name, text in {
        "job.py": JOB,
        "data.txt": "input",
        ".venv/bin/python": "",
        ".state/local/state.json": "{}",
        ".state/local/ray-token": "secret",
        "ray-token": "secret",
    }.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    home = tmp_path / "home"
    home.mkdir()
    env = {
        # the head's `ray` and the job's `python` come from the project venv
        "PATH": f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(home),
        "RAY_AUTH_MODE": "disabled",
        "SANDBOX_TMP": str(tmp_path),
        "RAYSLICE": str(installed / "bin" / "rayslice"),
    }
    argv = [
        "run",
        str(project / "job.py"),
        "--address",
        "http://127.0.0.1:8265",
        "--",
        "--steps",
        "20",
        "a b",
    ]
    result = subprocess.run(
        [
            "unshare",
            "--net",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "bash",
            "-c",
            SANDBOX,
            "sandbox",
            *argv[1:],
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    log = (tmp_path / "ray-start.log").read_text() if (tmp_path / "ray-start.log").exists() else ""
    print(result.stdout[-5000:], result.stderr[-5000:], log[-2000:])  # shown when the test fails
    assert "RUN EXIT 0" in result.stdout, shlex.join(argv)
    [line] = [line for line in result.stdout.splitlines() if line.startswith("JOB ")]
    job = json.loads(line[4:])
    assert job["args"] == ["--steps", "20", "a b"]
    assert job["marker"] == "installed"
    assert not Path(job["rayslice"]).is_relative_to(REPO)
    assert job["seen"] == ["data.txt", "job.py"], job["seen"]
