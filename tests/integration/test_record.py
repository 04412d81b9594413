"""The record on a simulated cluster: every machine writes its logs into the cluster's record
folder as it runs (its record shipper), not at `rayslice local down`, and nothing secret gets in
(issue 42, item 5). That the record outlives `local down` and `rayslice history` reads it there is
test_readme.py's (the quick start ends with `local down`)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from rayslice.local.simulation.simulator import Simulation
from rayslice.observability import record
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
    assert f"a careless job prints {record.REDACTED}" in _driver_log(cluster)
    for host in cluster.plan.machines:  # every machine's boot log, as it booted and joined
        assert "boot: rayslice host script" in shipped[f"{record.HOSTS_DIR}/{host.name}/{record.BOOT_LOG}"]
    files = [p for p in cluster.record_folder.rglob("*") if p.is_file()]
    assert files and not any(token.encode() in p.read_bytes() for p in files)
