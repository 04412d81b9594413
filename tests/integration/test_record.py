"""The record on a simulated cluster: every machine writes its logs into the cluster's record
folder as it runs (its record shipper), not at `rayslice local down`, nothing secret gets in, and
a host reaches only its own folder of the record, where nothing it plants steers the machine's
root. That the record outlives `local down` and `rayslice history` reads it there is
test_readme.py's (the quick start ends with `local down`)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from rayslice.local.simulation import recording
from rayslice.local.simulation.simulator import Simulation
from rayslice.observability import nofollow, record, redaction
from tests.integration.clusters import on, run_command

# A job that prints the cluster's Ray token (the driver may read it: Ray's environment names its
# file) in its log, then keeps running until the file it is given appears (the test makes it once
# it has seen the job's log in the record) or 60 s have passed.
LEAKY_JOB = """
import os, sys, time

token = open(os.environ["RAY_AUTH_TOKEN_PATH"]).read().strip()
print("RECORD-PROBE start", flush=True)
print("a careless job prints", token, flush=True)
for tick in range(120):
    print("RECORD-PROBE tick", tick, flush=True)
    if os.path.exists(sys.argv[1]):
        break
    time.sleep(0.5)
"""


def _shipped(sim: Simulation) -> dict[str, str]:
    return record.streams(record.FolderBucket(sim.record_folder), "")


def _driver_log(sim: Simulation) -> str:
    """What the record holds of Ray's job-driver logs (shipped by the head)."""
    head = f"{record.HOSTS_DIR}/{sim.plan.head.name}/{record.RAY_DIR}/"
    return "".join(t for k, t in _shipped(sim).items() if k.startswith(head) and "/job-driver-" in k)


@on("v6e-4")
def test_a_jobs_log_is_in_the_record_while_it_runs_and_the_token_never_is(cluster, tmp_path: Path) -> None:
    job = tmp_path / "leaky.py"
    job.write_text(LEAKY_JOB)
    # The simulation's shared folder: the head, where the driver runs, sees it at the same path.
    seen = Path(tempfile.mkdtemp(prefix="record-", dir=cluster.plan.shared_dir)) / "seen"
    argv, env = run_command(cluster, str(job), str(seen))
    run = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 120
        while "RECORD-PROBE tick" not in _driver_log(cluster):
            assert run.poll() is None, "the job ended before its log reached the record"
            assert time.monotonic() < deadline, sorted(_shipped(cluster))
            time.sleep(0.5)
        assert run.poll() is None  # seen in the record while the job still runs
        seen.touch()
        assert run.wait(timeout=120) == 0
    finally:
        run.kill()
        shutil.rmtree(seen.parent, ignore_errors=True)
    token = cluster.token_file.read_text().strip()
    shipped = _shipped(cluster)
    assert f"a careless job prints {redaction.REDACTED}" in _driver_log(cluster)
    for host in cluster.plan.machines:  # every machine's boot log, as it booted and joined
        assert "boot: rayslice host script" in shipped[f"{record.HOSTS_DIR}/{host.name}/{record.BOOT_LOG}"]
    files = [p for p in cluster.record_folder.rglob("*") if p.is_file()]
    assert files and not any(token.encode() in p.read_bytes() for p in files)


@on("v6e-4")
def test_a_host_sees_only_its_own_record_folder_and_what_it_plants_there_steers_nothing(cluster) -> None:
    """A host (any job on it, as root in its namespaces) sees its own hosts/<host>/ of the record
    and nothing else of it; it cannot swap that folder for a link, and a link, a link to
    /proc/self/environ and a FIFO it plants inside are neither followed nor read by the machine's
    root (`record.FolderBucket`), which neither blocks nor writes outside the folder."""
    head = cluster.plan.head.name
    mount = cluster.record_mount
    own = f"{mount}/{record.HOSTS_DIR}/{head}"
    bash = str(Path("/bin/bash"))
    script = f"""
        set -u
        ls -A {mount}; ls -A {mount}/{record.HOSTS_DIR}
        test -e {mount}/{record.CLUSTER_INFO} && echo SAW-CLUSTER-JSON
        mv {own} {mount}/moved 2>/dev/null && echo MOVED
        rmdir {own} 2>/dev/null && echo REMOVED
        ln -sfT / {own} 2>/dev/null && test -L {own} && echo SWAPPED
        mkdir -p {own}/ray/session_2026_x
        ln -s / {own}/ray/planted-root
        ln -s /proc/self/environ {own}/ray/session_2026_x/job-driver-rayslice_probe.log
        mkfifo {own}/ray/session_2026_x/job-driver-rayslice_fifo.log
        echo planted
    """
    done = cluster.exec_in(head, [bash, "-c", script])
    try:
        assert done.stdout.split() == [record.HOSTS_DIR, head, "planted"], done.stdout + done.stderr
        folder = cluster.record_folder / record.HOSTS_DIR / head
        assert folder.is_dir() and not folder.is_symlink()
        assert (folder / "ray/planted-root").is_symlink()  # the host did plant them
        rec = recording.cluster_record(cluster)
        driver_logs = recording._driver_logs(rec, head)  # what `local down` reads: no block, no link
        assert "rayslice_probe" not in driver_logs and "rayslice_fifo" not in driver_logs
        with pytest.raises(nofollow.NotPlain):
            rec.write_text(f"{record.HOSTS_DIR}/{head}/ray/planted-root/rayslice-pwned", "x")
        assert not Path("/rayslice-pwned").exists()
        keys = rec.bucket.list(rec.prefix)
        assert not any("planted-root/" in k or "job-driver-rayslice_" in k for k in keys)
    finally:
        cluster.exec_in(head, [bash, "-c", f"rm -rf {own}/ray/planted-root {own}/ray/session_2026_x"])


@on("2 x tpu7x-16 spot")
def test_the_controllers_vm_writes_its_events_and_its_own_logs_and_nothing_else(cluster) -> None:
    """The controller's VM has its events/<vm>/ and hosts/<vm>/ of the record bound in, as its
    conditioned grant allows on the cloud; a host of a slice has no events/ at all."""
    controller = cluster.plan.controller
    assert controller is not None
    mount = cluster.record_mount
    bash = str(Path("/bin/bash"))
    probe = f"{mount}/{record.EVENTS_DIR}/{controller.name}/probe"
    seen = cluster.exec_in(controller.name, [bash, "-c", f"ls -A {mount}; echo x > {probe} && echo wrote"])
    try:
        assert seen.stdout.split() == [record.EVENTS_DIR, record.HOSTS_DIR, "wrote"], (
            seen.stdout + seen.stderr
        )
        assert (cluster.record_folder / record.EVENTS_DIR / controller.name / "probe").read_text() == "x\n"
    finally:
        cluster.exec_in(controller.name, ["rm", "-f", probe])
    host = cluster.plan.hosts[0].name
    listed = cluster.exec_in(host, [bash, "-c", f"ls -A {mount}"])
    assert listed.stdout.split() == [record.HOSTS_DIR], listed.stdout + listed.stderr
    boot_logs = cluster.record_folder / record.HOSTS_DIR / controller.name / record.BOOT_LOG
    deadline = time.monotonic() + 120
    while not (boot_logs.is_dir() and any(boot_logs.iterdir())):  # its shipper writes there
        assert time.monotonic() < deadline, "the controller's VM shipped no boot log"
        time.sleep(0.5)
