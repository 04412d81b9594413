"""`rayslice run --max-restarts` against real Ray: a node killed under a running task makes the
job fail with Ray's own node-death error, `rayslice run` waits for the node to come back and
submits again; a job that fails on its own is not restarted.

A head and one more node (with a `victim` resource) run on loopback inside new network and PID
namespaces, so ports collide with nothing and every process dies with the sandbox. Both jobs run
on that one cluster, one after the other: first the one that fails on its own, then the one whose
first run holds a task on the victim node; the sandbox kills that node's raylet (found by its own
temp dir), waits for `rayslice run` to say it is waiting, and starts the node again.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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
# Ray streams libtpu's log folder (/tmp/tpu_logs unless TPU_LOG_DIR names one) into every job's
# output; any JAX process of the machine that loads libtpu writes there, and in a full run those
# lines pushed the node-death error out of the log tail `rayslice run` reads. An empty one here.
export TPU_LOG_DIR="$WORK/tpu_logs"; mkdir -p "$TPU_LOG_DIR"
ray start --head --node-ip-address=127.0.0.1 --port=6379 --dashboard-host=127.0.0.1 --num-cpus=1 \
  --object-store-memory=80000000 --disable-usage-stats --temp-dir="$HEAD_TMP" >> "$WORK/ray.log" 2>&1
victim() {  # one more node on loopback, with its own ports and temp dir
  ray start --address=127.0.0.1:6379 --node-ip-address=127.0.0.1 --num-cpus=1 --resources='{"victim": 1}' \
    --object-store-memory=80000000 --disable-usage-stats --temp-dir="$1" --dashboard-agent-listen-port=52400 \
    --dashboard-agent-grpc-port=52401 --metrics-export-port=52402 --runtime-env-agent-port=52403 \
    >> "$WORK/ray.log" 2>&1 && return
  # A start that failed: its raylet's and agent's own words go into the log the test prints.
  tail -n 30 "$1"/session_latest/logs/{raylet.out,dashboard_agent.log} >> "$WORK/ray.log" 2>&1
}
victim "$VICTIM_TMP"
run() {  # run CASE MAX_RESTARTS: `rayslice run` of $WORK/CASE/project/job.py, in the background
  cd "$WORK/$1"
  rayslice run --address http://127.0.0.1:8265 --max-restarts "$2" --rejoin-timeout 180 \
    project/job.py -- "$WORK/$1/mark" > run.out 2> run.err &
  RUN=$!
}
run own 2
wait "$RUN"; echo "own: RUN EXIT $?"
run killed 1
for _ in $(seq 600); do [ -e "$WORK/killed/mark.started" ] && break; sleep 0.2; done
kill -9 "$(pgrep -f "raylet.*$VICTIM_TMP" | head -1)"
for _ in $(seq 600); do grep -q "waiting for every slice" run.err && break; sleep 0.2; done
mkdir -p "$VICTIM_TMP.2"; victim "$VICTIM_TMP.2"
wait "$RUN"; echo "killed: RUN EXIT $?"
"""
CASES = {"own": OWN_FAILURE, "killed": JOB}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str, str]]:
    """Both cases on one sandboxed cluster: per case, the sandbox's output and `rayslice run`'s
    stdout and stderr."""
    work = tmp_path_factory.mktemp("sandbox")  # no "restart" in it: its path is in the output
    for case, job in CASES.items():
        (work / case / "project").mkdir(parents=True)
        (work / case / "project" / "job.py").write_text(job)
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(work),
        "RAY_AUTH_MODE": "disabled",
        "WORK": str(work),
    }
    result = subprocess.run(
        ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "bash", "-c", SANDBOX],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )

    def read(path: Path) -> str:
        return path.read_text() if path.exists() else ""

    print(result.stdout[-2000:], result.stderr[-2000:], read(work / "ray.log")[-8000:])
    return {
        case: (
            "\n".join(line for line in result.stdout.splitlines() if line.startswith(f"{case}: ")),
            read(work / case / "run.out"),
            read(work / case / "run.err"),
        )
        for case in CASES
    }


def test_a_job_whose_node_died_is_resubmitted_after_the_node_is_back(runs):
    sandbox_out, out, err = runs["killed"]
    print(out[-4000:], err[-4000:])
    assert "RUN EXIT 0" in sandbox_out
    assert "restart 1 of 1 after " in out
    assert "second run: done" in out
    assert err.count("rayslice: submitted") == 2


def test_a_job_that_fails_on_its_own_is_not_restarted(runs):
    sandbox_out, out, err = runs["own"]
    print(out[-4000:], err[-4000:])
    assert "RUN EXIT 1" in sandbox_out
    assert "restart" not in out
    assert err.count("rayslice: submitted") == 1
