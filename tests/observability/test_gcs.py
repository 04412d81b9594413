"""The record's GCS bucket, against an emulation of the three Cloud Storage JSON API calls it
makes, each checked against the API's discovery document (storage.v1): its path, its method and
its query parameters."""

from __future__ import annotations

import urllib.parse
from typing import Any

import pytest

from rayslice.infra.record_bucket import object_condition
from rayslice.local.google.cloud_api.iam import EmulatedIam
from rayslice.local.google.cloud_api.routes import ApiError
from rayslice.observability import gcs, record
from rayslice.observability.gcs import GcsBucket
from tests.recovery import discovery

BUCKET = "rayslice-record-p1"


class Response:
    def __init__(self, status: int, body: Any = None, content: bytes = b""):
        self.status_code, self._body, self.content, self.text = status, body, content, str(body)

    def json(self) -> Any:
        return self._body

    def iter_content(self, size: int) -> Any:
        return (self.content[i : i + size] for i in range(0, len(self.content), size))

    def close(self) -> None:
        pass


class StorageEmulator:
    """objects.insert (simple media upload, `ifGenerationMatch`), objects.get (`alt=media`, or
    the object's metadata without it) and objects.list (`prefix`, two results a page), with the
    paths and parameters the discovery document gives them."""

    def __init__(self, iam: EmulatedIam | None = None, token: str = "") -> None:
        self.objects: dict[str, bytes] = {}
        self.created: dict[str, str] = {}
        self.iam, self.token = iam, token  # the caller's grants, checked on every insert
        self.doc = discovery.document("storage")
        self.methods = self.doc["resources"]["objects"]["methods"]

    def _check(self, method: str, params: dict[str, str], http: str) -> None:
        described = self.methods[method]
        assert described["httpMethod"] == http
        allowed = set(described["parameters"]) | set(self.doc["parameters"]) | {"uploadType"}
        assert set(params) <= allowed, set(params) - allowed

    def request(
        self, method: str, url: str, *, timeout: float, params: dict[str, str] | None = None, **kw: Any
    ) -> Response:
        path = urllib.parse.urlsplit(url).path
        params = params or {}
        upload = self.methods["insert"]["mediaUpload"]["protocols"]["simple"]["path"]
        base = "/" + self.doc["servicePath"]
        if path == upload.replace("{bucket}", BUCKET):
            self._check("insert", params, method)
            assert params["uploadType"] == "media" and params["ifGenerationMatch"] == "0"
            if self.iam is not None:
                try:
                    where = {"bucket": BUCKET, "object": params["name"]}
                    self.iam.authorize(self.token, "storage.objects.insert", None, where)
                except ApiError as exc:
                    return Response(exc.code, exc.body())
            if params["name"] in self.objects:
                return Response(412, {"error": "conditionNotMet"})
            self.objects[params["name"]] = kw["data"]
            self.created[params["name"]] = f"2026-12-07T10:00:{len(self.objects):02d}.000Z"
            return Response(200, {"name": params["name"]})
        if path == base + self.methods["list"]["path"].replace("{bucket}", BUCKET):
            self._check("list", params, method)
            names = sorted(n for n in self.objects if n.startswith(params.get("prefix", "")))
            start = int(params.get("pageToken", "0"))
            page = {"items": [{"name": n} for n in names[start : start + 2]]}
            return Response(200, page | ({"nextPageToken": str(start + 2)} if start + 2 < len(names) else {}))
        prefix = base + self.methods["get"]["path"].split("{object}")[0].replace("{bucket}", BUCKET)
        if path.startswith(prefix):
            self._check("get", params, method)
            name = urllib.parse.unquote(path[len(prefix) :])
            if name not in self.objects:
                return Response(404, "no")
            if params == {"alt": "media"}:
                return Response(200, content=self.objects[name])
            assert not params  # the object's metadata (the API's "object" resource)
            return Response(200, {"name": name, "timeCreated": self.created[name]})
        return Response(404, f"no such method: {method} {path}")


def test_a_cluster_record_round_trips_through_the_storage_api() -> None:
    storage = StorageEmulator()
    bucket = GcsBucket(BUCKET, storage)  # type: ignore[arg-type]
    journal = record.JobJournal(record.ClusterRecord(bucket, "clusters/c/r"), "raysubmit_1", None, "x", 1.0)
    for i in range(3):
        journal.lines(f"step {i:3d}  loss 0.5\n", now=10.0 + 6 * i)  # a flush each time: 3 objects
    journal.end("SUCCEEDED", now=30.0)
    assert len(storage.objects) == 5
    [job] = record.jobs(bucket, "clusters/c/r")  # listed over three pages
    assert job.info["status"] == "SUCCEEDED" and [t for t, _ in job.lines] == [10.0, 16.0, 22.0]


def test_an_object_is_never_replaced() -> None:
    bucket = GcsBucket(BUCKET, StorageEmulator())  # type: ignore[arg-type]
    bucket.write("clusters/c/r/cluster.json", b"{}")
    with pytest.raises(FileExistsError):
        bucket.write("clusters/c/r/cluster.json", b"{}")
    with pytest.raises(OSError, match="404"):
        bucket.read("clusters/c/r/nothing.json")


def test_a_job_on_a_host_cannot_forge_the_controllers_events_or_hide_them() -> None:
    """The hosts' grant admits hosts/ only (`object_condition`, as identity binds it): a job that
    tries the forgery that hid every real event (one piece claiming the whole stream) is refused,
    and what it may write (a host's log) never reads as an event."""
    iam = EmulatedIam()
    iam.bind("hosts", ["storage.objects.create"], object_condition(BUCKET, ["clusters/c/r/hosts/"]))
    iam.bind("controller", ["storage.objects.create"], object_condition(BUCKET, ["clusters/c/r/events/"]))
    as_job = StorageEmulator(iam, "hosts")
    as_controller = StorageEmulator(iam, "controller")
    as_controller.objects = as_job.objects  # one bucket, two callers
    as_controller.created = as_job.created
    event = '{"time": "2026-12-06T10:00:01+00:00", "action": "recreate"}\n'
    controller = record.ClusterRecord(GcsBucket(BUCKET, as_controller), "clusters/c/r")  # type: ignore[arg-type]
    controller.write_piece("events/ctl", 0, event, "0a1b2c3d")
    job = record.ClusterRecord(GcsBucket(BUCKET, as_job), "clusters/c/r")  # type: ignore[arg-type]
    with pytest.raises(OSError, match="403"):
        job.write_text(record.chunk_key("events/ctl", 0, 999_999_999_999), '{"time": "9"}\n')
    with pytest.raises(OSError, match="403"):
        job.write_json("cluster.json", {"started": 9e9})
    job.write_text("hosts/h0/boot.log/000000000000-000000000009", "booted!!\n")
    reader = GcsBucket(BUCKET, as_job)  # type: ignore[arg-type]
    assert [e["action"] for e in record.events(reader, "clusters/c/r")] == ["recreate"]


def test_an_object_past_the_cap_is_refused_and_a_listing_past_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reads are streamed and cut off (a job may write a huge object), listings bounded."""
    storage = StorageEmulator()
    bucket = GcsBucket(BUCKET, storage)  # type: ignore[arg-type]
    for i in range(5):
        bucket.write(f"clusters/c/r/hosts/h/x{i}", b"y" * 100)
    monkeypatch.setattr(gcs, "MAX_OBJECT_BYTES", 99)
    monkeypatch.setattr(gcs, "READ_BLOCK", 10)
    with pytest.raises(OSError, match="more than 99 bytes"):
        bucket.read("clusters/c/r/hosts/h/x0")
    monkeypatch.setattr(gcs, "MAX_KEYS", 3)
    with pytest.raises(OSError, match="more than 3 objects"):
        bucket.list("clusters/")
