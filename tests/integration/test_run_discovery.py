"""`rayslice run` with no address finds the simulated slice in the default state dir, and sends
its token there; the same slice named with --address gets no token unless one is given. (Given
one with --token-file, it runs: every `rayslice_run` of test_workloads_on_ray.py on this cluster
names it so.)

The shared single-host v6e-4 simulation with token auth (the default): the cheapest slice that
proves the discovery path a new user takes after `rayslice local up`.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest

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


def _started(job: Path, *argv: str, state_dir: Path, cwd: Path) -> subprocess.Popen:
    """`rayslice run` of a job that prints "started" then sleeps, returned once the line is out."""
    process = subprocess.Popen(
        [RAYSLICE, "run", *argv, str(job)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env={
            "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
            "HOME": os.environ.get("HOME", "/root"),
            STATE_DIR_ENV: str(state_dir),
        },
    )
    started = threading.Event()

    def read(stdout: IO[str]) -> None:  # the log streams on; a thread keeps the pipe drained
        for line in stdout:
            if line.startswith("started"):
                started.set()

    threading.Thread(target=read, args=(process.stdout,), daemon=True).start()
    if not started.wait(120):
        process.kill()
        pytest.fail(f"the job did not start: {process.communicate()[1][-3000:]}")
    return process


def _job_status(cluster, job_id: str) -> str:
    from ray.job_submission import JobSubmissionClient

    token = cluster.token_file.read_text().strip()
    client = JobSubmissionClient(cluster.dashboard_url(), headers={"Authorization": f"Bearer {token}"})
    return str(client.get_job_status(job_id).value)


@on("v6e-4")
def test_an_interrupted_run_leaves_its_job_running_and_says_how_to_stop_it(cluster, tmp_path):
    job = tmp_path / "job" / "wait.py"
    job.parent.mkdir()
    job.write_text("import time\nprint('started', flush=True)\ntime.sleep(300)\n")
    process = _started(job, state_dir=cluster.state_dir, cwd=tmp_path)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    print(stderr[-3000:])
    assert process.returncode == 130
    said = re.search(
        r"job (raysubmit_\w+) keeps running on \S+; stop it with `rayslice run --stop \1`", stderr
    )
    assert said, "the interrupt must name the job that keeps running and the command that stops it"
    assert "Traceback" not in stderr
    job_id = said.group(1)
    assert _job_status(cluster, job_id) == "RUNNING"

    stopped = rayslice("run", "--stop", job_id, state_dir=cluster.state_dir, cwd=tmp_path)
    assert stopped.returncode == 0
    assert f"job {job_id} STOPPED" in stopped.stderr
    assert _job_status(cluster, job_id) == "STOPPED"
    unknown = rayslice("run", "--stop", "raysubmit_nosuchjob", state_dir=cluster.state_dir, cwd=tmp_path)
    assert unknown.returncode == 2 and "no job raysubmit_nosuchjob" in unknown.stderr


@on("v6e-4")
def test_a_run_told_to_stop_on_interrupt_stops_its_job_on_sigterm(cluster, tmp_path):
    job = tmp_path / "job" / "wait.py"
    job.parent.mkdir()
    job.write_text("import time\nprint('started', flush=True)\ntime.sleep(300)\n")
    process = _started(job, "--stop-on-interrupt", state_dir=cluster.state_dir, cwd=tmp_path)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    print(stderr[-3000:])
    assert process.returncode == 130
    said = re.search(r"asked Ray to stop job (raysubmit_\w+)", stderr)
    assert said and "Traceback" not in stderr
    deadline = time.monotonic() + 60
    while (status := _job_status(cluster, said.group(1))) != "STOPPED" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert status == "STOPPED"
