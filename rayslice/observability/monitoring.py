"""A goodput report as Cloud Monitoring's ``workload/*`` metrics (`rayslice goodput --cloud-monitoring`).

The metrics are the ones ml-goodput-measurement 0.2.3 writes (``ml_goodput_measurement/src/
monitoring.py``, ``_upload_goodput_metrics_to_gcm``): ``compute.googleapis.com/workload/
goodput_time`` (label ``goodput_source``), ``badput_time`` (label ``badput_source``: a
``BadputType`` name, a nested bucket flattened to ``TYPE.SUBTYPE``), ``disruptions``,
``max_productive_steps`` and ``total_elapsed_time``, each with label ``accelerator_type`` (and
``cluster_name`` when known), on the monitored resource ``compute.googleapis.com/Workload``
with labels ``location``, ``workload_id`` and ``replica_id``; one point each, stamped now.

They go in one ``projects.timeSeries.create`` call of the Cloud Monitoring API v3 (discovery
document monitoring.v3, revision 20260129: ``POST v3/{+name}/timeSeries`` with a
``CreateTimeSeriesRequest``; ``TypedValue.int64Value`` is a JSON string, ``doubleValue`` a
number; ``TimeInterval.endTime`` RFC 3339). The identity that sends them needs
``monitoring.timeSeries.create`` (role ``roles/monitoring.metricWriter``) and one of the method's
scopes; it is the caller's Application Default Credentials. Nothing is sent unless asked.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import requests

from rayslice.errors import NoCredentials
from rayslice.observability import goodput

METRIC_PREFIX = "compute.googleapis.com/workload/"
RESOURCE_TYPE = "compute.googleapis.com/Workload"
# The method's narrowest scope (monitoring.v3 discovery: projects.timeSeries.create scopes).
SCOPE = "https://www.googleapis.com/auth/monitoring.write"
ENDPOINT = "https://monitoring.googleapis.com/"
# gcloud's spelling of an endpoint override, which the simulator's and the tests' emulations use.
ENDPOINT_ENV = "CLOUDSDK_API_ENDPOINT_OVERRIDES_MONITORING"
REPLICA_ID = "0"  # ml-goodput-measurement's GCPOptions default


def time_series_body(
    report: goodput.Report,
    *,
    workload_id: str,
    location: str,
    accelerator_type: str,
    cluster: str = "",
    now: datetime.datetime | None = None,
) -> dict[str, Any]:
    """The ``CreateTimeSeriesRequest`` body for `report`."""
    end = (now or datetime.datetime.now(datetime.UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    resource = {
        "type": RESOURCE_TYPE,
        "labels": {"location": location, "workload_id": workload_id, "replica_id": REPLICA_ID},
    }
    common = {"accelerator_type": accelerator_type} | ({"cluster_name": cluster} if cluster else {})

    def series(metric: str, value: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
        return {
            "metric": {"type": METRIC_PREFIX + metric, "labels": {**labels, **common}},
            "resource": resource,
            "points": [{"interval": {"endTime": end}, "value": value}],
        }

    found = [series("goodput_time", {"doubleValue": report.productive_s}, {"goodput_source": "TOTAL"})]
    for bucket in goodput.BADPUT_TYPES:
        found.append(
            series(
                "badput_time", {"doubleValue": report.badput_s.get(bucket, 0.0)}, {"badput_source": bucket}
            )
        )
    for part, seconds in report.recovery_parts_s.items():
        label = f"{goodput.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION}.{part}"
        found.append(series("badput_time", {"doubleValue": seconds}, {"badput_source": label}))
    cumulative = {"window_type": "cumulative"}
    found.append(series("disruptions", {"int64Value": str(report.disruptions)}, cumulative))
    found.append(series("max_productive_steps", {"int64Value": str(max(report.last_step + 1, 0))}, {}))
    found.append(series("total_elapsed_time", {"doubleValue": report.wall_s}, cumulative))
    return {"timeSeries": found}


def send(body: dict[str, Any], project: str, session: requests.Session | None = None) -> None:
    """One ``projects.timeSeries.create`` call; `NoCredentials` (exit 3) when it cannot be made."""
    if session is None:
        session = _default_session()
    base = os.environ.get(ENDPOINT_ENV) or ENDPOINT
    url = f"{base.rstrip('/')}/v3/projects/{project}/timeSeries"
    try:
        response = session.post(url, json=body, timeout=30)
    except OSError as exc:
        raise NoCredentials(f"Cloud Monitoring could not be reached at {url}: {exc}") from None
    if response.status_code >= 300:
        raise NoCredentials(
            f"Cloud Monitoring refused the workload metrics ({response.status_code}): {response.text[:300]}"
        )


def _default_session() -> requests.Session:
    try:
        import google.auth
        from google.auth.transport.requests import AuthorizedSession

        credentials, _ = google.auth.default(scopes=[SCOPE])
    except Exception as exc:  # google.auth's DefaultCredentialsError and import errors alike
        raise NoCredentials(
            f"no credentials for Cloud Monitoring ({exc}): run `gcloud auth application-default login`"
        ) from None
    session: requests.Session = AuthorizedSession(credentials)
    return session
