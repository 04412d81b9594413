"""The record's GCS bucket, against an emulation of the three Cloud Storage JSON API calls it
makes, each checked against the API's discovery document (storage.v1): its path, its method and
its query parameters."""

from __future__ import annotations

import urllib.parse
from typing import Any

import pytest

from rayslice.observability import record
from rayslice.observability.gcs import GcsBucket
from tests.recovery import discovery

BUCKET = "rayslice-record-p1"


class Response:
    def __init__(self, status: int, body: Any = None, content: bytes = b""):
        self.status_code, self._body, self.content, self.text = status, body, content, str(body)

    def json(self) -> Any:
        return self._body


class StorageEmulator:
    """objects.insert (simple media upload, `ifGenerationMatch`), objects.get (`alt=media`) and
    objects.list (`prefix`, two results a page), with the paths and parameters the discovery
    document gives them."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.doc = discovery.document("storage")
        self.methods = self.doc["resources"]["objects"]["methods"]

    def _check(self, method: str, params: dict[str, str], http: str) -> None:
        described = self.methods[method]
        assert described["httpMethod"] == http
        allowed = set(described["parameters"]) | set(self.doc["parameters"]) | {"uploadType"}
        assert set(params) <= allowed, set(params) - allowed

    def request(
        self, method: str, url: str, *, params: dict[str, str], timeout: float, **kw: Any
    ) -> Response:
        path = urllib.parse.urlsplit(url).path
        upload = self.methods["insert"]["mediaUpload"]["protocols"]["simple"]["path"]
        base = "/" + self.doc["servicePath"]
        if path == upload.replace("{bucket}", BUCKET):
            self._check("insert", params, method)
            assert params["uploadType"] == "media" and params["ifGenerationMatch"] == "0"
            if params["name"] in self.objects:
                return Response(412, {"error": "conditionNotMet"})
            self.objects[params["name"]] = kw["data"]
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
            assert params == {"alt": "media"}
            name = urllib.parse.unquote(path[len(prefix) :])
            return Response(200, content=self.objects[name]) if name in self.objects else Response(404, "no")
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
