"""`rayslice run --max-restarts` against real Ray: a node killed under a running task makes the
job fail with Ray's own node-death error, `rayslice run` waits for the node to come back and
submits again; a job that fails on its own is not restarted.

A head and one more node (with a `victim` resource) run on loopback inside new network and PID
namespaces, so ports collide with nothing and every process dies with the sandbox. The job's
first run holds a task on the victim node; the sandbox kills that node's raylet (found by its own
temp dir), waits for `rayslice run` to say it is waiting, and starts the node again.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

JOB = """\
import os, sys, time
import ray

mark = sys.argv[1]
ray.init()
if os.path.exists(mark):
    print("second run: done")
    sys.exit(0)
open(mark, "w").close()

@ray.remote(resources={"victim": 1}, max_retries=0)
def hold():
    open(mark + ".started", "w").close()
    time.sleep(300)

ray.get(hold.remote())
"""

OWN_FAILURE = "raise SystemExit('the job failed on its own')\n"

SANDBOX = r"""
set -uo pipefail
ip link set lo up
HEAD_TMP=$(mktemp -d /tmp/rsh.XXXXXX); VICTIM_TMP=$(mktemp -d /tmp/rsv.XXXXXX)
trap 'ray stop --force > /dev/null 2>&1; rm -rf "$HEAD_TMP" "$VICTIM_TMP" "$VICTIM_TMP.2"' EXIT
export RAY_health_check_period_ms=1000 RAY_health_check_failure_threshold=3
ray start --head --node-ip-address=127.0.0.1 --port=6379 --dashboard-host=127.0.0.1 --num-cpus=1 \
  --object-store-memory=80000000 --disable-usage-stats --temp-dir="$HEAD_TMP" >> "$WORK/ray.log" 2>&1
victim() {  # one more node on loopback, with its own ports and temp dir
  ray start --address=127.0.0.1:6379 --node-ip-address=127.0.0.1 --num-cpus=1 --resources='{"victim": 1}' \
    --object-store-memory=80000000 --disable-usage-stats --temp-dir="$1" --dashboard-agent-listen-port=52400 \
    --dashboard-agent-grpc-port=52401 --metrics-export-port=52402 --runtime-env-agent-port=52403 \
    >> "$WORK/ray.log" 2>&1
}
victim "$VICTIM_TMP"
cd "$WORK"
rayslice run --address http://127.0.0.1:8265 --max-restarts "$MAX_RESTARTS" --rejoin-timeout 180 \
  project/job.py -- "$WORK/mark" > run.out 2> run.err &
RUN=$!
if [ "$KILL" = yes ]; then
  for _ in $(seq 600); do [ -e "$WORK/mark.started" ] && break; sleep 0.2; done
  kill -9 "$(pgrep -f "raylet.*$VICTIM_TMP" | head -1)"
  for _ in $(seq 600); do grep -q "waiting for every slice" run.err && break; sleep 0.2; done
  mkdir -p "$VICTIM_TMP.2"; victim "$VICTIM_TMP.2"
fi
wait "$RUN"; echo "RUN EXIT $?"
"""


def sandbox(tmp_path: Path, job: str, *, kill: bool, max_restarts: int) -> tuple[str, str, str]:
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "job.py").write_text(job)
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(tmp_path),
        "RAY_AUTH_MODE": "disabled",
        "WORK": str(tmp_path),
        "KILL": "yes" if kill else "no",
        "MAX_RESTARTS": str(max_restarts),
    }
    result = subprocess.run(
        ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "bash", "-c", SANDBOX],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    out = (tmp_path / "run.out").read_text() if (tmp_path / "run.out").exists() else ""
    err = (tmp_path / "run.err").read_text() if (tmp_path / "run.err").exists() else ""
    log = (tmp_path / "ray.log").read_text() if (tmp_path / "ray.log").exists() else ""
    print(result.stdout[-2000:], result.stderr[-2000:], out[-4000:], err[-4000:], log[-2000:])
    return result.stdout, out, err


def test_a_job_whose_node_died_is_resubmitted_after_the_node_is_back(tmp_path):
    sandbox_out, out, err = sandbox(tmp_path, JOB, kill=True, max_restarts=1)
    assert "RUN EXIT 0" in sandbox_out
    assert "restart 1 of 1 after " in out
    assert "second run: done" in out
    assert err.count("rayslice: submitted") == 2


def test_a_job_that_fails_on_its_own_is_not_restarted(tmp_path):
    sandbox_out, out, err = sandbox(tmp_path, OWN_FAILURE, kill=False, max_restarts=2)
    assert "RUN EXIT 1" in sandbox_out
    assert "restart" not in out
    assert err.count("rayslice: submitted") == 1
