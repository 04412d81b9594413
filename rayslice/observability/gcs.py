"""The record's bucket on the cloud: a GCS bucket through the Cloud Storage JSON API v1.

Three calls of the API's discovery document (storage.v1, revision 20261009):

- ``objects.insert``, simple media upload: ``POST /upload/storage/v1/b/{bucket}/o?uploadType=media
  &name=NAME`` with ``ifGenerationMatch=0``, so that an existing object is never replaced (the
  record writes each object once, `rayslice.observability.record`);
- ``objects.get`` with ``alt=media``: ``GET /storage/v1/b/{bucket}/o/{object}``, the object's
  name percent-encoded as one path segment, streamed and cut off at `record.MAX_OBJECT_BYTES`;
  without ``alt=media`` the object's metadata, whose ``timeCreated`` orders cluster records;
- ``objects.list``: ``GET /storage/v1/b/{bucket}/o?prefix=P`` page by page (``items[].name``,
  ``nextPageToken``).

The identity is the caller's Application Default Credentials with the
``devstorage.read_write`` scope (on a host: its service account, which the record bucket's IAM
binding lets create and read objects; docs/history.md).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
import urllib.parse
from dataclasses import dataclass
from typing import Any

import requests

from rayslice.errors import NoCredentials
from rayslice.observability.record import MAX_KEYS, MAX_OBJECT_BYTES, check_key, is_key

ENDPOINT = "https://storage.googleapis.com/"
ENDPOINT_ENV = "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE"  # gcloud's spelling of the override
SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
# objects.insert's precondition "ifGenerationMatch": 0 means "only if no live object has this name".
CREATE_ONLY = "0"
READ_BLOCK = 1024 * 1024


@dataclass(frozen=True)
class GcsBucket:
    name: str
    session: requests.Session
    endpoint: str = ENDPOINT

    @classmethod
    def default(cls, name: str) -> GcsBucket:
        try:
            import google.auth
            from google.auth.transport.requests import AuthorizedSession

            credentials, _ = google.auth.default(scopes=[SCOPE])
        except Exception as exc:  # DefaultCredentialsError and import errors alike
            raise NoCredentials(
                f"no credentials to read or write gs://{name} ({exc}): run "
                "`gcloud auth application-default login`"
            ) from None
        return cls(name, AuthorizedSession(credentials), os.environ.get(ENDPOINT_ENV) or ENDPOINT)

    def _url(self, path: str) -> str:
        return f"{self.endpoint.rstrip('/')}/{path}"

    def _call(self, method: str, url: str, **kwargs: Any) -> Any:
        response = self.session.request(method, url, timeout=30, **kwargs)
        if response.status_code == 412:
            raise FileExistsError(f"gs://{self.name}: the object exists and is never replaced")
        if response.status_code >= 300:
            raise OSError(f"Cloud Storage answered {response.status_code}: {response.text[:300]}")
        return response

    def write(self, key: str, data: bytes) -> None:
        params = {"uploadType": "media", "name": check_key(key), "ifGenerationMatch": CREATE_ONLY}
        url = self._url(f"upload/storage/v1/b/{self.name}/o")
        self._call(
            "POST", url, params=params, data=data, headers={"Content-Type": "application/octet-stream"}
        )

    def _object_url(self, key: str) -> str:
        return self._url(f"storage/v1/b/{self.name}/o/{urllib.parse.quote(check_key(key), safe='')}")

    def read(self, key: str) -> bytes:
        """The object's bytes, streamed and refused (`OSError`) past `MAX_OBJECT_BYTES`: a job
        may have written a huge one."""
        response = self._call("GET", self._object_url(key), params={"alt": "media"}, stream=True)
        with contextlib.closing(response):
            data = bytearray()
            for block in response.iter_content(READ_BLOCK):
                data += block
                if len(data) > MAX_OBJECT_BYTES:
                    raise OSError(
                        errno.EFBIG, f"gs://{self.name}/{key} holds more than {MAX_OBJECT_BYTES} bytes"
                    )
        return bytes(data)

    def created(self, key: str) -> float:
        """The object's ``timeCreated`` (objects.get, its metadata), as unix seconds."""
        stamp = self._call("GET", self._object_url(key)).json().get("timeCreated")
        try:
            return datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise OSError(f"gs://{self.name}/{key}: no creation time ({str(stamp)[:40]!r})") from None

    def list(self, prefix: str = "") -> list[str]:
        """Every object name under `prefix`, page by page; refused (`OSError`) past `MAX_KEYS`."""
        names: list[str] = []
        params = {"prefix": prefix}
        while True:
            page = self._call("GET", self._url(f"storage/v1/b/{self.name}/o"), params=params).json()
            names += [str(item["name"]) for item in page.get("items", [])]
            if len(names) > MAX_KEYS:
                raise OSError(errno.E2BIG, f"more than {MAX_KEYS} objects under gs://{self.name}/{prefix}")
            if not page.get("nextPageToken"):
                return sorted(n for n in names if is_key(n))  # any other name is not the record's
            params = {"prefix": prefix, "pageToken": page["nextPageToken"]}
