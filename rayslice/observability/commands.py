"""`rayslice history` and `rayslice goodput`: a cluster's record, read back after the cluster is gone.

Both read a record root (`rayslice.observability.record`): ``--record LOCATION`` (a folder or
gs://BUCKET), else ``$RAYSLICE_RECORD_ROOT``, else the one a registered finder names (the
simulator's, under the ``rayslice.records`` entry point, so this module never imports the
simulator), which exists after `rayslice local down` too.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

import click

from rayslice.errors import EXIT_OK, InvalidInput
from rayslice.observability import goodput, history, monitoring, record
from rayslice.printable import escaped

RECORDS_GROUP = "rayslice.records"
RECORD_ROOT_ENV = "RAYSLICE_RECORD_ROOT"


def record_root(location: str | None) -> str:
    """--record, else $RAYSLICE_RECORD_ROOT, else the first registered finder's answer."""
    if location:
        return location
    if os.environ.get(RECORD_ROOT_ENV):
        return os.environ[RECORD_ROOT_ENV]
    for entry in entry_points(group=RECORDS_GROUP):
        finder: Callable[[], str | None] = entry.load()
        if (found := finder()) is not None:
            return found
    raise InvalidInput(
        f"no record to read: pass --record DIR|gs://BUCKET (or set {RECORD_ROOT_ENV}); the simulator's is "
        "in its state dir once `rayslice local up` ran"
    )


def record_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--record",
        "location",
        metavar="DIR|gs://BUCKET",
        help=f"The record root (default: ${RECORD_ROOT_ENV}, else the simulator's record folder).",
    )(func)


def _choose_cluster(bucket: record.Bucket, root: str, wanted: str | None) -> str:
    """The prefix of the cluster record `wanted` names (NAME, RUN_ID or NAME/RUN_ID; the newest
    that matches), or of the newest record."""
    found = record.clusters(bucket, root)
    if wanted:
        found = [p for p in found if p.endswith("/" + wanted) or f"/{wanted}/" in p + "/"]
    if not found:
        what = f"no cluster record matching {wanted!r}" if wanted else "no cluster record"
        raise InvalidInput(f"{what} in {root or 'the record root'}: `rayslice history` lists them")
    return found[-1]


def _find_job(
    bucket: record.Bucket, root: str, cluster: str | None, job_id: str
) -> tuple[str, history.TrainingRun]:
    """The cluster record and the training run that hold job `job_id` (any of its attempts),
    the newest first; only in `cluster`'s records when it is given."""
    prefixes = [_choose_cluster(bucket, root, cluster)] if cluster else record.clusters(bucket, root)
    for prefix in reversed(prefixes):
        for run in history.training_runs(record.jobs(bucket, prefix)):
            if job_id in (a.job_id for a in run.attempts):
                return prefix, run
    raise InvalidInput(f"no job {job_id} in the record: `rayslice history` lists the clusters and their jobs")


def _name(prefix: str) -> str:
    """A cluster record's NAME/RUN_ID, from its prefix ("." for a record given by its own location)."""
    return prefix.rsplit(f"{record.CLUSTERS_PREFIX}/", 1)[-1] or "."


def _when(stamp: float | None) -> str:
    if not stamp:
        return "-"
    return datetime.datetime.fromtimestamp(float(stamp), datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _open(location: str | None) -> tuple[record.Bucket, str]:
    return record.open_location(record_root(location))


def _echo(text: str) -> None:
    """Print record text (entrypoints, log lines, events: what jobs wrote) with every terminal
    control character escaped (`rayslice.printable.escaped`), line by line, as `status` does."""
    click.echo("\n".join(escaped(line) for line in text.split("\n")))


def record_errors(command: Callable[..., int]) -> Callable[..., int]:
    """A record that cannot be read (a listing past its bound, a folder that is not one, an
    object the bucket refuses) is one line and exit 2, never a traceback."""

    @functools.wraps(command)
    def guarded(*args: Any, **kwargs: Any) -> int:
        try:
            return command(*args, **kwargs)
        except OSError as exc:
            raise InvalidInput(escaped(f"cannot read the record: {exc}")[:500]) from None

    return guarded


@click.command("history")
@record_option
@click.argument("cluster", required=False, metavar="[CLUSTER]")
@click.option("--job", "job_id", metavar="JOB_ID", help="Show this job's log (all its attempts).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@record_errors
def history_command(location: str | None, cluster: str | None, job_id: str | None, as_json: bool) -> int:
    """List past clusters and their jobs, or show one cluster: its events, jobs and goodput.

    CLUSTER is a cluster name, a run id or NAME/RUN_ID (the newest that matches). The record
    outlives the cluster: it is read after `rayslice local down` or `pulumi destroy`.
    """
    bucket, root = _open(location)
    if cluster is None and job_id is None:
        rows: list[dict[str, Any]] = []
        for prefix in record.clusters(bucket, root):
            info = record.cluster_info(bucket, prefix)
            runs = history.training_runs(record.jobs(bucket, prefix))
            rows.append({"cluster": _name(prefix), "info": info, "jobs": [_run_row(r) for r in runs]})
        if as_json:
            click.echo(json.dumps(rows, indent=1))
            return EXIT_OK
        if not rows:
            _echo("no cluster records yet")
        for row in rows:
            _echo(_cluster_line(row["cluster"], row["info"]))
            for job in row["jobs"]:
                _echo(_job_line(job))
        return EXIT_OK
    if job_id is not None:
        prefix, run = _find_job(bucket, root, cluster, job_id)
        for attempt in run.attempts:
            _echo(f"==== {attempt.job_id} {attempt.info.get('status')} ({attempt.info.get('entrypoint')})")
            for stamp, line in attempt.lines:
                _echo(f"{_when(stamp)}  {line}" if stamp is not None else line)
        return EXIT_OK
    prefix = _choose_cluster(bucket, root, cluster)
    jobs = record.jobs(bucket, prefix)
    info = record.cluster_info(bucket, prefix)
    events = record.events(bucket, prefix)
    runs = history.training_runs(jobs)
    if as_json:
        shown = {
            "cluster": info,
            "events": events,
            "jobs": [_run_row(r) | {"goodput": _goodput_json(r, events)} for r in runs],
        }
        click.echo(json.dumps(shown, indent=1))
        return EXIT_OK
    _echo(_cluster_line(_name(prefix), info))
    _echo(f"\nevents ({len(events)}):")
    for event in events:
        what = f"{event.get('seen')} -> {event.get('action')}: {event.get('outcome')}"
        _echo(f"  {event['time']}  {event.get('slice')}: {what}")
    _echo(f"\njobs ({len(runs)}):")
    for run in runs:
        row = _run_row(run)
        _echo(f"  {row['job_id']}  {row['status']:<9}  {row['attempts']} attempt(s)  {row['entrypoint']}")
    for run in runs:
        report = _report(run, events)
        if report is not None:
            _echo("\n" + goodput.format_report(report, f"goodput of {run.job_id}:"))
    hosts_prefix = record.join(prefix, record.HOSTS_DIR) + "/"
    host_keys = [k.removeprefix(hosts_prefix).split("/") for k in bucket.list(hosts_prefix)]
    hosts = sorted({parts[0] for parts in host_keys if len(parts) > 1 and parts[1] == record.BOOT_LOG})
    if hosts:
        _echo(f"\nboot logs of {len(hosts)} host(s) under {prefix}/{record.HOSTS_DIR}/")
    return EXIT_OK


def _run_row(run: history.TrainingRun) -> dict[str, Any]:
    return {
        "job_id": run.job_id,
        "status": run.status,
        "attempts": len(run.attempts),
        "entrypoint": run.attempts[0].info.get("entrypoint", ""),
        "attempt_ids": [a.job_id for a in run.attempts],
    }


def _cluster_line(name: str, info: dict[str, Any]) -> str:
    ended = f", down {_when(info['ended'])}" if info.get("ended") else ""
    return f"{name}  up {_when(info.get('started'))}{ended}  {info.get('summary', '')}"


def _job_line(row: dict[str, Any]) -> str:
    return f"  {row['job_id']}  {row['status']:<9}  {row['attempts']} attempt(s)  {row['entrypoint']}"


def _report(run: history.TrainingRun, events: list[dict[str, Any]]) -> goodput.Report | None:
    """The run's goodput, if its log has timed lines (a job `rayslice run` followed)."""
    if not any(t is not None for a in run.attempts for t, _ in a.lines):
        return None
    return history.run_goodput(run, events)


def _goodput_json(run: history.TrainingRun, events: list[dict[str, Any]]) -> dict[str, object] | None:
    report = _report(run, events)
    return None if report is None else report.as_json()


@click.command("goodput")
@record_option
@click.option("--cluster", metavar="CLUSTER", help="The cluster record (default: the newest).")
@click.argument("job_id", required=False, metavar="[JOB_ID]")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--cloud-monitoring",
    is_flag=True,
    help="Also write the workload/* metrics to Cloud Monitoring (needs --project and --location, and "
    "credentials allowed monitoring.timeSeries.create; see docs/goodput.md).",
)
@click.option("--project", metavar="ID", help="With --cloud-monitoring: the project to write to.")
@click.option("--location", "zone", metavar="ZONE", help="With --cloud-monitoring: the workload's location.")
@record_errors
def goodput_command(
    location: str | None,
    cluster: str | None,
    job_id: str | None,
    as_json: bool,
    cloud_monitoring: bool,
    project: str | None,
    zone: str | None,
) -> int:
    """Goodput and badput of a training run, in ml-goodput-measurement's buckets.

    JOB_ID is the first job `rayslice run` submitted (default: the cluster's newest run). The
    run's attempts (--max-restarts), its log and the recovery controller's events come from the
    cluster's record, so this works after the cluster is gone.
    """
    if cloud_monitoring and not (project and zone):
        raise click.UsageError("--cloud-monitoring needs --project ID and --location ZONE")
    bucket, root = _open(location)
    if job_id is not None:
        prefix, found = _find_job(bucket, root, cluster, job_id)
        runs = [found]
    else:
        prefix = _choose_cluster(bucket, root, cluster)
        runs = history.training_runs(record.jobs(bucket, prefix))
    reports = [(r, _report(r, record.events(bucket, prefix))) for r in runs]
    timed = [(r, rep) for r, rep in reports if rep is not None]
    if not timed:
        raise InvalidInput(
            f"no training run with a timed log in {prefix}"
            + (f" for job {job_id}" if job_id else "")
            + ": goodput needs a job `rayslice run` followed"
        )
    run, report = timed[-1]
    if as_json:
        click.echo(json.dumps({"job_id": run.job_id, **report.as_json()}, indent=1))
    else:
        _echo(goodput.format_report(report, f"goodput of {run.job_id} ({_name(prefix)}):"))
    if cloud_monitoring:
        assert project and zone
        info = record.cluster_info(bucket, prefix)
        body = monitoring.time_series_body(
            report,
            workload_id=run.job_id,
            location=zone,
            accelerator_type=str(info.get("accelerator_type", "")),
            cluster=str(info.get("cluster", "")),
        )
        monitoring.send(body, project)
        _echo(f"wrote {len(body['timeSeries'])} workload/* time series to project {project}")
    return EXIT_OK
