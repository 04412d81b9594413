"""The simulator's record bucket: a folder beside the state dir that `rayslice local down` keeps.

A real cluster writes its record to a GCS bucket that `pulumi destroy` keeps
(`rayslice.infra.record_bucket`); the simulator plays that bucket with ``<state dir>.record``
(`recorded.record_root`; ``.state/local.record`` by default), private to its owner like the state
dir, in the same layout (`rayslice.observability.record`). It sits beside the state dir, not in
it, because `local down` removes the state dir whole; every simulation run in that state dir
adds its own cluster record (``clusters/<name>/<run id>/``):

- `local up` writes the cluster's ``cluster.json`` (`start`);
- every machine (hosts, head, the controller's VM) ships its logs there as they grow (its record
  shipper, `rayslice.observability.shipper`). A machine sees only its own part of the folder, at
  `RecordedSimulation.record_mount`: its ``hosts/<host>/``, and on the controller's VM its
  ``events/<host>/`` too (`HostPower.record_mounts`), as a machine of a real cluster may create
  objects under those prefixes only (the record bucket's IAM conditions);
- `rayslice run` writes each job's submission, timed log and end as the job runs (it finds the
  folder through `default_cluster`'s ``record``), under ``jobs/``, where no machine writes;
- `local down` (`collect`) first powers every machine off, so that none runs while the
  machine's root reads and writes the folder, then adds what no machine writes: each machine's
  console (the serial port output of a VM, which its owner reads from outside it), the Jobs API's
  list of jobs with their status (asked for before the power-off), the log of a job `rayslice
  run` did not follow (from the driver log the head shipped), and the goodput of each training
  run; then ``ended.json``. Root reads and writes there through `record.FolderBucket`, which
  follows no link a machine planted in its own folder and reads regular files only.

Every text is redacted (`redaction.redact`), with the simulation's Ray token and the cloud API
emulation's admin token as known secrets.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rayslice.local.host.private_files import ensure_private_dir
from rayslice.local.simulation.recorded import record_root
from rayslice.local.simulation.simulator import Simulation
from rayslice.local.simulation.state import CLOUD_API_ENDPOINT_FILE
from rayslice.observability import history, record, untrusted

# What the controller's boot script names its event log (controller.sh.j2, EVENTS), under the
# host's root.
CONTROLLER_EVENTS = Path("var/log/rayslice/recovery-events.jsonl")
JOBS_API_TIMEOUT_S = 5.0
JOB_DRIVER_LOG = re.compile(r"job-driver-(.+)\.log")


def location(sim: Simulation) -> str:
    """The simulation's cluster record as a folder, for `rayslice run` (`default_cluster`)."""
    return str(sim.record_folder)


def cluster_record(sim: Simulation) -> record.ClusterRecord:
    bucket = record.FolderBucket(ensure_private_dir(record_root(sim.state_dir)))
    return record.ClusterRecord(
        bucket, record.cluster_prefix(sim.spec().name, sim.plan.run_id), _secrets(sim)
    )


def _secrets(sim: Simulation) -> tuple[str, ...]:
    """The simulation's secrets by value: its Ray token and the emulation's admin token."""
    found = []
    with contextlib.suppress(OSError):
        found.append(sim.token_file.read_text().strip())
    try:
        endpoint = json.loads((sim.state_dir / CLOUD_API_ENDPOINT_FILE).read_text())
        found += [str(v) for k, v in endpoint.items() if "token" in k.lower()]
    except (OSError, ValueError, AttributeError):
        pass
    return tuple(s for s in found if s)


def controller_events(sim: Simulation) -> list[dict[str, Any]]:
    """The recovery controller's events so far, from its VM's event log (a running simulation),
    as the record holds them (`record.events`)."""
    if sim.plan.controller is None:
        return []
    log = sim.paths(sim.plan.controller.name).root / CONTROLLER_EVENTS
    entries = []
    for line in log.read_text().splitlines() if log.is_file() else []:
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    return entries


def start(sim: Simulation) -> None:
    """The cluster's ``cluster.json``, when `local up` has made it."""
    spec = sim.spec()
    cluster_record(sim).write_json(
        record.CLUSTER_INFO,
        {
            "cluster": spec.name,
            "run_id": sim.plan.run_id,
            "accelerator_type": spec.accelerator_type,
            "started": time.time(),
            "summary": f"{spec.slices} x {spec.accelerator_type} on {spec.platform} (simulator)",
            "config": dict(sim.plan.config),
        },
    )


def collect(sim: Simulation) -> str:
    """Copy what the hosts hold into the record (see the module docstring); returns its folder.

    The head's list of jobs is asked for first, then every machine is powered off, and only then
    is the record folder read and written: no host runs while the machine's root works there.
    Best effort: a part that cannot be read is left out, never stops `down`."""
    listed = _jobs_list(sim)
    sim.power_off_all([host.name for host in sim.plan.machines])
    rec = cluster_record(sim)
    keys = set(rec.bucket.list(rec.prefix))
    if rec.key(record.CLUSTER_INFO) not in keys:  # a simulation made before the record existed
        with contextlib.suppress(OSError):  # a name taken by something that is not a file
            start(sim)

    def put(key: str, text: str) -> None:
        if rec.key(key) in keys:
            return
        try:
            rec.write_text(key, text)
        except OSError as exc:  # the name is taken (a link, a FIFO): the rest is still written
            untrusted.skip(rec.key(key), f"not written: {exc.strerror or exc}")

    for host in sim.plan.machines:
        console = sim.paths(host.name).console
        if console.is_file():
            put(f"{record.HOSTS_DIR}/{host.name}/{record.CONSOLE_LOG}", console.read_text(errors="replace"))
    if listed is not None:
        _record_jobs(rec, put, listed, _driver_logs(rec, sim.plan.head.name))
    jobs = record.jobs(rec.bucket, rec.prefix)
    events = record.events(rec.bucket, rec.prefix)
    for run in history.training_runs(jobs):
        if any(t is not None for a in run.attempts for t, _ in a.lines):
            put(
                f"{record.JOBS_DIR}/{run.job_id}/{record.GOODPUT}",
                json.dumps(history.run_goodput(run, events).as_json()),
            )
    put(record.CLUSTER_ENDED, json.dumps({"ended": time.time()}))
    return str(rec.bucket.root / rec.prefix) if isinstance(rec.bucket, record.FolderBucket) else rec.prefix


def _driver_logs(rec: record.ClusterRecord, head: str) -> dict[str, str]:
    """The job-driver logs the head shipped (`rayslice.observability.shipper`), by job id."""
    shipped = record.streams(rec.bucket, rec.key(record.HOSTS_DIR, head, record.RAY_DIR))
    found: dict[str, str] = {}
    for key, text in shipped.items():
        match = JOB_DRIVER_LOG.fullmatch(key.rsplit("/", 1)[-1])
        if match:
            found[match[1]] = found.get(match[1], "") + text
    return found


def _jobs_list(sim: Simulation) -> list[Any] | None:
    """The head's list of jobs with their status (Ray Jobs API ``GET /api/jobs/``); None when the
    head is down already (what `rayslice run` recorded stays)."""
    import requests

    headers = {}
    if sim.token_file.is_file():
        headers["Authorization"] = f"Bearer {sim.token_file.read_text().strip()}"
    try:
        response = requests.get(
            f"{sim.dashboard_url()}/api/jobs/", headers=headers, timeout=JOBS_API_TIMEOUT_S
        )
        response.raise_for_status()
        listed = response.json()
    except (OSError, ValueError, requests.RequestException):
        return None
    return listed if isinstance(listed, list) else None


def _record_jobs(
    rec: record.ClusterRecord, put: Callable[[str, str], None], listed: list[Any], driver_logs: dict[str, str]
) -> None:
    """The head's list of jobs (`_jobs_list`), and for a job `rayslice run` did not follow, its
    submission and end from that list and its log from Ray's job-driver log (`driver_logs`, by
    job id), its lines' times unknown."""
    put(f"{record.RAY_DIR}/jobs.json", json.dumps(listed, indent=1))
    known = {j.job_id for j in record.jobs(rec.bucket, rec.prefix)}
    for job in listed:
        if not isinstance(job, dict):
            continue
        job_id = str(job.get("submission_id") or job.get("job_id") or "")
        if not job_id or job_id in known or not record.KEY_PART.fullmatch(job_id):
            continue
        start_ms, end_ms = job.get("start_time"), job.get("end_time")
        submitted = {
            "job_id": job_id,
            "entrypoint": str(job.get("entrypoint", "")),
            "submitted": start_ms / 1000 if isinstance(start_ms, int | float) and start_ms else None,
            "restart_of": None,
        }
        put(f"{record.JOBS_DIR}/{job_id}/{record.JOB_SUBMITTED}", json.dumps(submitted))
        ended_at = end_ms / 1000 if isinstance(end_ms, int | float) and end_ms else None
        ended = {"status": str(job.get("status", "UNKNOWN")), "ended": ended_at}
        put(f"{record.JOBS_DIR}/{job_id}/{record.JOB_ENDED}", json.dumps(ended))
        if job_id in driver_logs:
            put(
                f"{record.JOBS_DIR}/{job_id}/{record.JOB_LOG_PREFIX}000001.jsonl",
                record.untimed_log(driver_logs[job_id]),
            )
