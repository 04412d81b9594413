"""`rayslice history` and `rayslice goodput` on a record made by the tests, and the workload
metrics sent to an emulated Cloud Monitoring endpoint that checks them against the API's
discovery document (tests/fixtures/cloud-monitoring-v3)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import requests
from click.testing import CliRunner

from rayslice.observability import commands, goodput, monitoring, record
from tests import serving
from tests.recovery import discovery

PREFIX = "clusters/rayslice/ab12cd"


def make_record(root: Path) -> None:
    """A cluster record as `local up`, `rayslice run --max-restarts` and `local down` leave it."""
    rec = record.ClusterRecord(record.FolderBucket(root), PREFIX)
    info = {"cluster": "rayslice", "run_id": "ab12cd", "accelerator_type": "v5litepod-8", "started": 1000.0}
    rec.write_json(record.CLUSTER_INFO, info | {"summary": "2 x v5litepod-8 on tpu-vm (simulator)"})
    first = record.open_journal(
        str(root / PREFIX), "raysubmit_1", None, "python -m rayslice.workloads.jax_train", now=1000.0
    )
    assert isinstance(first, record.JobJournal)
    first.lines("slice rayslice-slice-1\n", now=1002.0)
    for i in range(25):
        first.lines(f"step {i:3d}  loss 0.50000\n", now=1006.0 + i)
    first.end("FAILED", now=1040.0)
    first.mark(record.MARK_NODE_DIED, now=1041.0)
    first.mark(record.MARK_WHOLE_AGAIN, now=1090.0)
    second = record.open_journal(
        str(root / PREFIX), "raysubmit_2", "raysubmit_1", "python -m rayslice.workloads.jax_train", now=1095.0
    )
    second.lines("slice rayslice-slice-1\n", now=1097.0)
    second.lines("resumed from step 20\n", now=1100.0)
    for i in range(20, 30):
        second.lines(f"step {i:3d}  loss 0.40000\n", now=1083.0 + i)
    second.end("SUCCEEDED", now=1114.0)
    event = {"time": "1970-01-01T00:17:25+00:00", "slice": "rayslice-slice-1", "seen": "node state PREEMPTED"}
    rec.write_text(
        "events/controller.jsonl", json.dumps(event | {"action": "recreate", "outcome": "recreated"})
    )
    rec.write_text(record.CLUSTER_ENDED, json.dumps({"ended": 1200.0}))
    # A job `rayslice run` did not follow: listed with its status, its log untimed.
    rec.write_json(
        "jobs/raysubmit_3/submitted.json",
        {"job_id": "raysubmit_3", "entrypoint": "python x.py", "submitted": 1150.0},
    )
    rec.write_json("jobs/raysubmit_3/ended.json", {"status": "STOPPED", "ended": 1160.0})
    rec.write_text("jobs/raysubmit_3/log-000001.jsonl", record.untimed_log("hello from x"))


def invoke(*args: str) -> Any:
    command = commands.history_command if args[0] == "history" else commands.goodput_command
    return CliRunner().invoke(command, args[1:])


def test_history_lists_the_clusters_and_their_jobs_with_status(tmp_path: Path) -> None:
    make_record(tmp_path)
    result = invoke("history", "--record", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "rayslice/ab12cd  up 1970-01-01 00:16:40, down 1970-01-01 00:20:00" in result.output
    assert "raysubmit_1  SUCCEEDED  2 attempt(s)  python -m rayslice.workloads.jax_train" in result.output
    assert "raysubmit_3  STOPPED    1 attempt(s)  python x.py" in result.output


def test_history_shows_a_clusters_events_jobs_and_goodput(tmp_path: Path) -> None:
    make_record(tmp_path)
    result = invoke("history", "--record", str(tmp_path), "ab12cd")
    assert result.exit_code == 0, result.output
    assert "rayslice-slice-1: node state PREEMPTED -> recreate: recreated" in result.output
    assert "goodput of raysubmit_1:" in result.output and "steps lost 5" in result.output


def test_history_shows_a_jobs_log_by_id_every_attempt(tmp_path: Path) -> None:
    make_record(tmp_path)
    result = invoke("history", "--record", str(tmp_path), "--job", "raysubmit_2")
    assert result.exit_code == 0, result.output
    assert "==== raysubmit_1 FAILED" in result.output and "==== raysubmit_2 SUCCEEDED" in result.output
    assert "1970-01-01 00:18:20  resumed from step 20" in result.output
    assert "hello from x" in invoke("history", "--record", str(tmp_path), "--job", "raysubmit_3").output
    missing = invoke("history", "--record", str(tmp_path), "--job", "raysubmit_9")
    assert missing.exit_code != 0 and "no job raysubmit_9" in str(missing.exception or missing.output)


def test_goodput_reports_the_newest_run_and_its_lost_steps(tmp_path: Path) -> None:
    make_record(tmp_path)
    result = invoke("goodput", "--record", str(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["job_id"] == "raysubmit_1" and report["steps_lost"] == 5
    assert report["named_share"] >= goodput.NAMED_SHARE_WANTED
    assert report["infrastructure_recovery_parts_s"] == pytest.approx(
        {"RECREATION": 15.0, "REJOIN": 45.0, "RESUBMISSION": 5.0}
    )


def test_the_record_root_comes_from_the_flag_the_environment_or_a_finder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert commands.record_root("/x") == "/x"
    monkeypatch.setenv(commands.RECORD_ROOT_ENV, str(tmp_path))
    assert commands.record_root(None) == str(tmp_path)


# ---- Cloud Monitoring, emulated ---------------------------------------------------------------


class MonitoringEndpoint(BaseHTTPRequestHandler):
    """`projects.timeSeries.create` as the discovery document describes it: its path and its
    request body's schema; anything else is refused, as the API would."""

    received: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        method = discovery.method("monitoring", "monitoring.projects.timeSeries.create")
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        problems = []
        parts = self.path.strip("/").split("/")  # flatPath v3/projects/{projectsId}/timeSeries
        if (
            method["httpMethod"] != "POST"
            or len(parts) != 4
            or parts[:2] != ["v3", "projects"]
            or parts[3] != "timeSeries"
        ):
            problems.append(f"no such method: POST {self.path}")
        problems += discovery.problems(
            "monitoring", {"$ref": method["request"]["$ref"]}, body, "body", request=True
        )
        for series in body.get("timeSeries", []):
            if not series["metric"]["type"].startswith(monitoring.METRIC_PREFIX):
                problems.append(f"not a workload metric: {series['metric']['type']}")
        type(self).received.append(body)
        self.send_response(400 if problems else 200)
        self.end_headers()
        self.wfile.write(json.dumps({"problems": problems}).encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[MonitoringEndpoint]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), MonitoringEndpoint)
    serving.start(server)
    monkeypatch.setenv(monitoring.ENDPOINT_ENV, f"http://127.0.0.1:{server.server_address[1]}/")
    MonitoringEndpoint.received = []
    yield MonitoringEndpoint
    server.shutdown()


def test_the_workload_metrics_have_the_apis_shape_and_the_librarys_labels(
    tmp_path: Path, endpoint: type[MonitoringEndpoint], monkeypatch: pytest.MonkeyPatch
) -> None:
    make_record(tmp_path)
    monkeypatch.setattr(monitoring, "_default_session", requests.Session)
    args = [
        "goodput",
        "--record",
        str(tmp_path),
        "--cloud-monitoring",
        "--project",
        "p1",
        "--location",
        "us-east5-b",
    ]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    [body] = endpoint.received
    by_type: dict[str, list[dict[str, Any]]] = {}
    for series in body["timeSeries"]:
        by_type.setdefault(series["metric"]["type"].removeprefix(monitoring.METRIC_PREFIX), []).append(series)
    assert set(by_type) == {
        "goodput_time",
        "badput_time",
        "disruptions",
        "max_productive_steps",
        "total_elapsed_time",
    }
    sources = {s["metric"]["labels"]["badput_source"] for s in by_type["badput_time"]}
    assert (
        set(goodput.BADPUT_TYPES) <= sources and "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION.REJOIN" in sources
    )
    [disruptions] = by_type["disruptions"]
    assert disruptions["points"][0]["value"] == {"int64Value": "1"}
    assert disruptions["resource"] == {
        "type": "compute.googleapis.com/Workload",
        "labels": {"location": "us-east5-b", "workload_id": "raysubmit_1", "replica_id": "0"},
    }
    assert disruptions["metric"]["labels"]["accelerator_type"] == "v5litepod-8"


def test_a_refused_write_is_a_clear_error(endpoint: type[MonitoringEndpoint]) -> None:
    bad = {"timeSeries": [{"metric": {"type": "custom.googleapis.com/x"}, "unknownField": 1}]}
    with pytest.raises(monitoring.NoCredentials, match="refused the workload metrics \\(400\\)"):
        monitoring.send(bad, "p1", session=requests.Session())


def test_cloud_monitoring_needs_a_project_and_a_location(tmp_path: Path) -> None:
    make_record(tmp_path)
    result = invoke("goodput", "--record", str(tmp_path), "--cloud-monitoring")
    assert result.exit_code == 2 and "--project" in result.output


def test_a_job_is_found_in_an_older_clusters_record(tmp_path: Path) -> None:
    make_record(tmp_path)
    newer = record.ClusterRecord(record.FolderBucket(tmp_path), "clusters/rayslice/ef56gh")
    newer.write_json(record.CLUSTER_INFO, {"cluster": "rayslice", "run_id": "ef56gh", "started": 5000.0})
    assert (
        "==== raysubmit_1 FAILED"
        in invoke("history", "--record", str(tmp_path), "--job", "raysubmit_1").output
    )
    report = json.loads(invoke("goodput", "--record", str(tmp_path), "--json", "raysubmit_2").output)
    assert report["job_id"] == "raysubmit_1"  # a run is named by its first job
    assert invoke("goodput", "--record", str(tmp_path)).exit_code != 0  # the newest cluster ran no job


def test_a_record_given_by_its_own_location_is_the_one_read(tmp_path: Path) -> None:
    """The stack output ``record`` (gs://BUCKET/clusters/NAME/RUN) names one cluster record:
    history and goodput read that one, not whichever record of the bucket is newest."""
    make_record(tmp_path)
    newer = record.ClusterRecord(record.FolderBucket(tmp_path), "clusters/rayslice/ff00ff")
    newer.write_json(record.CLUSTER_INFO, {"cluster": "rayslice", "started": 9e9, "summary": "forged"})
    result = invoke("goodput", "--record", str(tmp_path / PREFIX))
    assert result.exit_code == 0, result.output
    assert "goodput of raysubmit_1 (.):" in result.output
    listed = invoke("history", "--record", str(tmp_path / PREFIX))
    assert "raysubmit_1  SUCCEEDED" in listed.output and "forged" not in listed.output
