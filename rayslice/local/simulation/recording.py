"""The simulator's record bucket: a folder beside the state dir that `rayslice local down` keeps.

A real cluster writes its record to a GCS bucket that `pulumi destroy` keeps
(`rayslice.infra.record_bucket`); the simulator plays that bucket with ``<state dir>.record``
(`RECORD_SUFFIX`; ``.state/local.record`` by default), private to its owner like the state dir,
in the same layout (`rayslice.observability.record`). It sits beside the state dir, not in it,
because `local down` removes the state dir whole; every simulation run in that state dir adds
its own cluster record (``clusters/<name>/<run id>/``):

- `local up` writes the cluster's ``cluster.json`` (`start`);
- `rayslice run` writes each job's submission, timed log and end as the job runs (it finds the
  folder through `default_cluster`'s ``record``);
- `local down` (`collect`, before anything is removed) copies what the hosts hold: every boot
  log and console, the recovery controller's event log, Ray's job-driver logs and Ray events from
  the head, the Jobs API's list of jobs with their status, and the goodput of each training run;
  then ``ended.json``.

What the hosts write is copied at `down` rather than as it happens: a simulated host sees no
folder of the machine but the simulation's shared folder (`confinement`), which goes with the
simulation. Every text is redacted (`record.redact`), with the simulation's Ray token and the
cloud API emulation's admin token as known secrets.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rayslice.local.host.private_files import ensure_private_dir
from rayslice.local.simulation.simulator import Simulation
from rayslice.local.simulation.state import CLOUD_API_ENDPOINT_FILE, ROLE_CONTROLLER_VM
from rayslice.observability import history, record

# What the controller's boot script names its event log (controller.sh.j2, EVENTS), under the
# host's root.
CONTROLLER_EVENTS = Path("var/log/rayslice/recovery-events.jsonl")
# Ray's logs under a host's root: the boot script's RAY_TEMP_DIR ($ROOT/tmp/ray) holds one
# session_<date> folder per Ray start (session_latest is a link that resolves inside the host only).
RAY_SESSIONS = Path("tmp/ray")
JOBS_API_TIMEOUT_S = 5.0


RECORD_SUFFIX = ".record"


def record_root(state_dir: Path) -> Path:
    state_dir = Path(os.path.abspath(state_dir))
    return state_dir.with_name(state_dir.name + RECORD_SUFFIX)


def location(sim: Simulation) -> str:
    """The simulation's cluster record as a folder, for `rayslice run` (`default_cluster`)."""
    return str(record_root(sim.state_dir) / record.cluster_prefix(sim.spec().name, sim.plan.run_id))


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
    Best effort: a part that cannot be read is left out, never stops `down`."""
    rec = cluster_record(sim)
    keys = set(rec.bucket.list(rec.prefix))
    if rec.key(record.CLUSTER_INFO) not in keys:  # a simulation made before the record existed
        start(sim)

    def put(key: str, text: str) -> None:
        if rec.key(key) not in keys:
            rec.write_text(key, text)

    for host in sim.plan.machines:
        paths = sim.paths(host.name)
        for source, name in ((paths.boot_log, "boot.log"), (paths.console, "console.log")):
            if source.is_file():
                put(f"{record.HOSTS_DIR}/{host.name}/{name}", source.read_text(errors="replace"))
        if host.role == ROLE_CONTROLLER_VM and (paths.root / CONTROLLER_EVENTS).is_file():
            put(f"{record.EVENTS_DIR}/controller.jsonl", (paths.root / CONTROLLER_EVENTS).read_text())
    head = sim.paths(sim.plan.head.name).root / RAY_SESSIONS
    driver_logs: dict[str, str] = {}
    for session in sorted(head.glob("session_2*")):
        logs = session / "logs"
        for source in [*logs.glob("job-driver-*.log"), *(logs / "events").glob("*.log")]:
            if source.is_file() and not source.is_symlink():
                text = source.read_text(errors="replace")
                put(f"{record.RAY_DIR}/{session.name}/{source.name}", text)
                if source.name.startswith("job-driver-"):
                    driver_logs[source.name.removeprefix("job-driver-").removesuffix(".log")] = text
    _jobs_api(sim, rec, put, driver_logs)
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


def _jobs_api(
    sim: Simulation, rec: record.ClusterRecord, put: Callable[[str, str], None], driver_logs: dict[str, str]
) -> None:
    """The head's list of jobs with their status (Ray Jobs API ``GET /api/jobs/``), and for a
    job `rayslice run` did not follow, its submission and end from that list and its log from
    Ray's job-driver log (`driver_logs`, by job id), its lines' times unknown."""
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
        return  # the head is down already: what `rayslice run` recorded stays
    if not isinstance(listed, list):
        return
    put(f"{record.RAY_DIR}/jobs.json", json.dumps(listed, indent=1))
    known = {j.job_id for j in record.jobs(rec.bucket, rec.prefix)}
    for job in listed:
        job_id = str(job.get("submission_id") or job.get("job_id") or "")
        if not job_id or job_id in known or not record.KEY_PART.fullmatch(job_id):
            continue
        start_ms, end_ms = job.get("start_time"), job.get("end_time")
        submitted = {
            "job_id": job_id,
            "entrypoint": str(job.get("entrypoint", "")),
            "submitted": start_ms / 1000 if start_ms else None,
            "restart_of": None,
        }
        put(f"{record.JOBS_DIR}/{job_id}/{record.JOB_SUBMITTED}", json.dumps(submitted))
        ended = {"status": str(job.get("status", "UNKNOWN")), "ended": end_ms / 1000 if end_ms else None}
        put(f"{record.JOBS_DIR}/{job_id}/{record.JOB_ENDED}", json.dumps(ended))
        if job_id in driver_logs:
            put(
                f"{record.JOBS_DIR}/{job_id}/{record.JOB_LOG_PREFIX}000001.jsonl",
                record.untimed_log(driver_logs[job_id]),
            )
