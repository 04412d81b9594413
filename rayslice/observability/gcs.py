"""The record's bucket on the cloud: a GCS bucket through the Cloud Storage JSON API v1.

Three calls of the API's discovery document (storage.v1, revision 20261009):

- ``objects.insert``, simple media upload: ``POST /upload/storage/v1/b/{bucket}/o?uploadType=media
  &name=NAME`` with ``ifGenerationMatch=0``, so that an existing object is never replaced (the
  record writes each object once, `rayslice.observability.record`);
- ``objects.get`` with ``alt=media``: ``GET /storage/v1/b/{bucket}/o/{object}``, the object's
  name percent-encoded as one path segment;
- ``objects.list``: ``GET /storage/v1/b/{bucket}/o?prefix=P`` page by page (``items[].name``,
  ``nextPageToken``).

The identity is the caller's Application Default Credentials with the
``devstorage.read_write`` scope (on a host: its service account, which the record bucket's IAM
binding lets create and read objects; docs/history.md).
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass
from typing import Any

import requests

from rayslice.errors import NoCredentials
from rayslice.observability.record import check_key

ENDPOINT = "https://storage.googleapis.com/"
ENDPOINT_ENV = "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE"  # gcloud's spelling of the override
SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
# objects.insert's precondition "ifGenerationMatch": 0 means "only if no live object has this name".
CREATE_ONLY = "0"


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

    def read(self, key: str) -> bytes:
        quoted = urllib.parse.quote(check_key(key), safe="")
        response = self._call(
            "GET", self._url(f"storage/v1/b/{self.name}/o/{quoted}"), params={"alt": "media"}
        )
        return bytes(response.content)

    def list(self, prefix: str = "") -> list[str]:
        names: list[str] = []
        params = {"prefix": prefix}
        while True:
            page = self._call("GET", self._url(f"storage/v1/b/{self.name}/o"), params=params).json()
            names += [str(item["name"]) for item in page.get("items", [])]
            if not page.get("nextPageToken"):
                return sorted(names)
            params = {"prefix": prefix, "pageToken": page["nextPageToken"]}
