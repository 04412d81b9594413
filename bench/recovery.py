"""Recovery on the simulator: from a preemption until every host has rejoined and until training
resumes, as shares of the cold bring-up measured in the same run.

The scenario is the recovery issue's acceptance: a CPU head VM and two Spot multi-host slices,
tpu7x-16 on compute (five simulated hosts, the real boot script on each, the recovery controller
started by the head's; the issue named v6e-16, whose 8 hosts cost the test suite twice the CPU;
tpu-vm, which has no TPU7x, keeps it);
``rayslice run jax_train --max-restarts 2`` trains on ``<cluster>-slice-1`` with orbax
checkpoints every 10 steps; once step 20 is saved, ``rayslice local preempt <cluster>-slice-1``
powers that slice off. Nothing else is done by hand: the controller sees the slice preempted
through the cloud API emulation and recreates it, the hosts boot and rejoin Ray, and `rayslice
run` resubmits the job, which resumes from its checkpoint.

Three clocks, all in this process:

* cold bring-up: from ``Simulation.create`` until every host is an alive Ray node (the baseline);
* rejoin: from the preemption until every host of the slice is an alive Ray node again;
* resume: from the preemption until the job prints ``resumed from step K``.

Run as root: ``.venv/bin/python bench/recovery.py [--platform compute|tpu-vm]`` (several minutes).
tests/integration/test_recovery.py runs the same scenario (`preempt_during_training`) and checks
its outcome rather than its times.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray.job_submission import JobStatus

from rayslice import cli
from rayslice import spec as spec_module
from rayslice.jobs import connection
from rayslice.local.simulation.simulator import Simulation
from rayslice.names import slice_name

RAYSLICE = str(Path(sys.executable).with_name("rayslice"))
BRING_UP_TIMEOUT_S = 600
RUN_TIMEOUT_S = 1500
PREEMPT_AFTER_STEP = 20
# The slices per platform: the Cloud TPU API does not serve TPU7x, so tpu-vm keeps the v6e-16.
ACCELERATOR_TYPE = {"compute": "tpu7x-16", "tpu-vm": "v6e-16"}
RESUMED = re.compile(r"resumed from step (\d+)$", re.M)


def cluster_spec(platform: str) -> spec_module.ClusterSpec:
    """The acceptance cluster: head VM plus two multi-host slices on Spot (recovery on by default)."""
    raw = {
        "platform": platform,
        "acceleratorType": ACCELERATOR_TYPE[platform],
        "slices": 2,
        "capacity": "spot",
    }
    return spec_module.load(raw, require_zone=False)


def alive_nodes(sim: Simulation) -> list[dict[str, Any]]:
    """The head's alive Ray nodes; none while it does not answer (the head may be starting)."""
    try:
        return sim.ray_nodes()
    except (OSError, ValueError, KeyError):
        return []


def alive_tpu_nodes(sim: Simulation) -> list[dict[str, Any]]:
    return [n for n in alive_nodes(sim) if n["resources"].get("TPU")]


def wait(condition: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Poll until `condition` holds; returns the monotonic time it first did."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(0.5)
    return time.monotonic()


def stop_job(sim: Simulation, entrypoint: str) -> None:
    """Stop the cluster's running job whose entrypoint names `entrypoint`, through the Jobs API
    (ending `rayslice run` alone would leave the job running on the cluster)."""
    token = sim.token_file if sim.token_file.exists() else None
    client = connection.connect(connection.choose_target(sim.dashboard_url(), token))
    for job in client.list_jobs():
        if job.status == JobStatus.RUNNING and entrypoint in job.entrypoint and job.submission_id:
            client.stop_job(job.submission_id)


def bring_up(spec: spec_module.ClusterSpec, state_dir: Path) -> tuple[Simulation, float]:
    """Create and boot the simulation; returns it and the seconds until every host is a Ray node."""
    start = time.monotonic()
    sim = Simulation.create(spec, state_dir)
    try:
        sim.boot_all()
        wait(lambda: len(alive_nodes(sim)) == spec.total_hosts + 1, BRING_UP_TIMEOUT_S, "cold bring-up")
    except BaseException:
        sim.destroy()
        raise
    return sim, time.monotonic() - start


@dataclass
class Trace:
    """What `preempt_during_training` saw, with monotonic times."""

    victim: str
    preempted_at: float = 0.0
    rejoined_at: float = 0.0
    resumed_at: float = 0.0
    returncode: int | None = None
    stdout: list[str] = field(default_factory=list)
    stderr: str = ""

    @property
    def output(self) -> str:
        return "".join(self.stdout)


def _checkpointed(directory: Path, step: int) -> bool:
    """Whether orbax has committed a checkpoint of `step` or later (committed steps are bare numbers)."""
    return any(p.name.isdigit() and int(p.name) >= step for p in directory.iterdir())


def preempt_during_training(
    sim: Simulation, checkpoints: Path, *, steps: int = 60, notice_s: float = 0
) -> Trace:
    """Train on slice 1, preempt it once step `PREEMPT_AFTER_STEP` is saved (its hosts get the
    preemption notice `notice_s` before they power off; none by default, as the figures in
    docs/benchmarks.md were measured), follow the recovery."""
    spec = sim.spec()
    trace = Trace(victim=slice_name(spec.name, 1))
    argv = [RAYSLICE, "run", "jax_train", "--address", sim.dashboard_url(), "--max-restarts", "2"]
    if sim.token_file.exists():
        argv += ["--token-file", str(sim.token_file)]
    argv += ["--", "--steps", str(steps), "--slice", trace.victim]
    argv += ["--checkpoint-dir", str(checkpoints), "--checkpoint-every", "10"]
    env = {"PATH": str(Path(sys.executable).parent), "HOME": os.environ.get("HOME", "/root")}
    job = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert job.stdout is not None and job.stderr is not None
    stderr = job.stderr

    def read_stderr() -> None:
        trace.stderr = stderr.read()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()

    def watch() -> None:  # stdout line by line: the resume line's time is the clock's end
        assert job.stdout is not None
        for line in job.stdout:
            trace.stdout.append(line)
            if not trace.resumed_at and RESUMED.search(line.rstrip("\n")):
                trace.resumed_at = time.monotonic()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        wait(
            lambda: job.poll() is not None or _checkpointed(checkpoints, PREEMPT_AFTER_STEP),
            RUN_TIMEOUT_S,
            f"a checkpoint of step {PREEMPT_AFTER_STEP}",
        )
        if job.poll() is not None:
            ended = f"the job ended before step {PREEMPT_AFTER_STEP}"
            raise RuntimeError(f"{ended}:\n{trace.output}{trace.stderr}")
        before = {n["id"] for n in alive_tpu_nodes(sim)}
        trace.preempted_at = time.monotonic()
        preempt = ["local", "preempt", "--state-dir", str(sim.state_dir), "--notice-s", str(notice_s)]
        if cli.main([*preempt, trace.victim]) != 0:
            raise RuntimeError(f"rayslice local preempt {trace.victim} failed")
        if job.poll() is not None:  # the preemption returns once the hosts are off
            ended = f"the job ended before {trace.victim} powered off, {notice_s:g} s after the notice"
            raise RuntimeError(f"{ended}; give it more steps or a shorter notice:\n{trace.output}")
        hosts = spec.tpu.hosts

        def rejoined() -> bool:
            nodes = alive_tpu_nodes(sim)
            fresh = [n for n in nodes if n["id"] not in before]
            return len(nodes) == spec.total_hosts and len(fresh) == hosts

        trace.rejoined_at = wait(rejoined, RUN_TIMEOUT_S, f"the hosts of {trace.victim} rejoining")
        trace.returncode = job.wait(timeout=RUN_TIMEOUT_S)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        watcher.join(timeout=10)
        reader.join(timeout=10)
    return trace


def report(platform: str, cold_s: float, trace: Trace, date: str) -> str:
    rejoin = trace.rejoined_at - trace.preempted_at
    resume = trace.resumed_at - trace.preempted_at
    rows = [
        ("cold bring-up (create, boot, every host joined)", cold_s),
        ("preemption -> every host of the slice rejoined", rejoin),
        ("preemption -> training resumed from its checkpoint", resume),
    ]
    lines = [
        f"recovery on the simulator, {platform}: head VM + 2 x {ACCELERATOR_TYPE[platform]} Spot, {date}",
        f"{'':52} {'seconds':>8} {'of cold bring-up':>17}",
    ]
    lines += [f"{label:52} {seconds:8.1f} {seconds / cold_s:17.2f}" for label, seconds in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--platform", choices=("compute", "tpu-vm"), default="compute")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rayslice-bench-") as tmp:
        sim, cold = bring_up(cluster_spec(args.platform), Path(tmp) / "sim")
        try:
            # In the simulation's shared folder: every host writes and reads it (`Plan.shared_dir`).
            checkpoints = Path(tempfile.mkdtemp(prefix="checkpoints-", dir=sim.plan.shared_dir))
            trace = preempt_during_training(sim, checkpoints)
        finally:
            sim.destroy()
    if trace.returncode != 0 or not trace.resumed_at:
        print(trace.output, trace.stderr, file=sys.stderr)
        print(f"the job did not recover (exit {trace.returncode})", file=sys.stderr)
        return 1
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(report(args.platform, cold, trace, date))
    return 0


if __name__ == "__main__":
    sys.exit(main())
