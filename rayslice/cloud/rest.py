"""The REST plumbing of rayslice's clients of Google's Cloud TPU, Compute Engine and GKE APIs: the
session, the base URLs, one call with its errors mapped, paging, 404 as "not there", and the
polling of long-running operations.

One client is built on it, `rayslice.recovery.cloud.CloudClient`, which the recovery controller,
`rayslice status` and the program's dynamic providers (`rayslice.infra.tpu_vm.queued`) share;
the controller ships this module in its zipapp (`rayslice.recovery.bundle`), so it imports only
the standard library, google-auth, requests and rayslice's errors and names, and runs on the
controller VM's Python 3.10.

Why not google-api-python-client: rayslice makes about fifteen calls, and a plain
`AuthorizedSession` keeps every request visible (and testable against the discovery documents in
tests/recovery/test_api_shapes.py) without building a discovery client at start.

Endpoints. The base URLs are Google's (the discovery documents' ``rootUrl`` + ``servicePath``)
unless overridden with the variables gcloud itself reads for its ``api_endpoint_overrides``
properties, ``CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU``, ``CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE``
and ``CLOUDSDK_API_ENDPOINT_OVERRIDES_CONTAINER``. The simulator's emulation
(`rayslice.local.google.cloud_api.emulator`) is reached only through these: there is no second
code path. An override that is not https is accepted only for a loopback, private or RFC 6598
shared IP address, so a bearer token never crosses the internet in clear.

Failures leave this module as `rayslice.errors` classes, translated once in `RestClient.request`:
401/403 and refused credentials as `NoCredentials`, any other error status, a connection that
fails or times out and an answer that is not JSON as `CloudError` naming the call (exit 3 from
the CLI).
"""

from __future__ import annotations

import ipaddress
import os
import time
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import google.auth
import google.auth.exceptions
import requests
from google.auth.transport.requests import AuthorizedSession
from google.oauth2 import service_account

from rayslice.errors import CloudError, InvalidInput, NoCredentials
from rayslice.names import CLOUD_PLATFORM_SCOPE

# Discovery documents: tpu.v2 rootUrl "https://tpu.googleapis.com/" (paths start with "v2/"),
# compute.v1 rootUrl "https://compute.googleapis.com/" + servicePath "compute/v1/", container.v1
# rootUrl "https://container.googleapis.com/" (paths start with "v1/").
TPU_DEFAULT = "https://tpu.googleapis.com/"
COMPUTE_DEFAULT = "https://compute.googleapis.com/compute/v1/"
CONTAINER_DEFAULT = "https://container.googleapis.com/"
TPU_ENDPOINT_ENV = "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU"
COMPUTE_ENDPOINT_ENV = "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE"
CONTAINER_ENDPOINT_ENV = "CLOUDSDK_API_ENDPOINT_OVERRIDES_CONTAINER"
REQUEST_TIMEOUT_S = 30.0
# RFC 6598 shared address space: not routed on the internet (the simulator's bridges use it).
SHARED_ADDRESS_SPACE = ipaddress.ip_network("100.64.0.0/10")


def endpoint(env: str, default: str, environ: Mapping[str, str] | None = None) -> str:
    """The base URL for one API: the override in `env` if set, else Google's. Ends with '/'."""
    value = (environ if environ is not None else os.environ).get(env, "").strip()
    if not value:
        return default
    url = urllib.parse.urlsplit(value)
    if url.scheme not in ("https", "http") or not url.hostname:
        raise InvalidInput(f"{env}={value!r} is not an http(s) URL")
    if url.scheme == "http":
        try:
            address = ipaddress.ip_address(url.hostname)
        except ValueError:
            address = None
        if address is None or not (
            address.is_loopback or address.is_private or address in SHARED_ADDRESS_SPACE
        ):
            raise InvalidInput(
                f"{env}={value!r}: plain http is allowed only to a loopback or private IP address "
                "(credentials would cross the network in clear); use https"
            )
    return value if value.endswith("/") else value + "/"


def default_session() -> AuthorizedSession:
    """A session with Application Default Credentials; `NoCredentials` (exit 3) if there are none."""
    try:
        credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    except google.auth.exceptions.DefaultCredentialsError as exc:
        raise NoCredentials(
            "no Google Cloud credentials found (Application Default Credentials): run "
            "`gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a "
            f"credentials file ({exc})"
        ) from exc
    return AuthorizedSession(credentials)


def key_file_session(path: Path) -> AuthorizedSession:
    """A session with the service-account key at `path` (a found cluster's, `rayslice.clusters`):
    only a service-account key is loaded from the file, whatever else it may claim to be;
    `NoCredentials` (exit 3) if it cannot be used."""
    try:
        credentials = service_account.Credentials.from_service_account_file(
            str(path), scopes=[CLOUD_PLATFORM_SCOPE]
        )
    except (OSError, ValueError, KeyError) as exc:
        raise NoCredentials(f"cannot use the service-account key {path}: {exc!r}") from None
    return AuthorizedSession(credentials)


class RestClient:
    """Calls to Google's JSON APIs through one session; responses are the API's JSON objects.
    `sleep` and `poll_interval_s` pace the polling of long-running operations (tests make them
    instant)."""

    def __init__(
        self,
        session: requests.Session,
        *,
        sleep: Callable[[float], None] = time.sleep,
        poll_interval_s: float = 5.0,
    ):
        self.session = session
        self.sleep = sleep
        self.poll_interval_s = poll_interval_s

    def request(
        self, method: str, url: str, *, params: Mapping[str, str] | None = None, body: Any = None
    ) -> dict[str, Any]:
        """One API call; every way it can fail leaves as a `rayslice.errors` class (module
        docstring)."""
        call = f"{method} {url}"
        try:
            response = self.session.request(method, url, params=params, json=body, timeout=REQUEST_TIMEOUT_S)
        except google.auth.exceptions.RefreshError as exc:
            raise NoCredentials(
                f"Google Cloud rejected the credentials ({exc}): run "
                "`gcloud auth application-default login` again"
            ) from exc
        except (requests.RequestException, google.auth.exceptions.TransportError) as exc:
            raise CloudError(call, None, _reason(exc)) from exc
        if response.status_code in (401, 403):
            raise NoCredentials(
                f"{call} was refused (HTTP {response.status_code}: {_message(response)}); "
                "check that your Application Default Credentials may read this project"
            )
        if response.status_code >= 400:
            raise CloudError(call, response.status_code, _message(response))
        if not response.content:
            return {}
        try:
            answer = response.json()
        except ValueError:  # requests' JSONDecodeError
            answer = None
        if not isinstance(answer, dict):
            raise CloudError(call, response.status_code, f"not a JSON object: {response.text[:200]}")
        return answer

    def get_or_none(self, url: str) -> dict[str, Any] | None:
        """A GET of one resource; None when the API answers 404 (it does not exist)."""
        try:
            return self.request("GET", url)
        except CloudError as exc:
            if exc.status == 404:
                return None
            raise

    def pages(
        self, method: str, url: str, field: str, params: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """Every item of a list call, page by page (``nextPageToken`` sent back as ``pageToken``):
        the `field` of each page, in order."""
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            asked = {**(params or {}), **({"pageToken": token} if token else {})}
            page = self.request(method, url, params=asked or None)
            items.extend(page.get(field, []))
            token = page.get("nextPageToken", "")
            if not token:
                return items

    def wait(
        self,
        operation: Mapping[str, Any],
        timeout_s: float,
        *,
        done: Callable[[Mapping[str, Any]], bool],
        url: Callable[[Mapping[str, Any]], str],
    ) -> dict[str, Any]:
        """Polls a long-running operation (GET `url` of it) until `done` or `timeout_s` has
        passed; returns its last state."""
        deadline = time.monotonic() + timeout_s
        current = dict(operation)
        while not done(current):
            if time.monotonic() >= deadline:
                return current
            self.sleep(self.poll_interval_s)
            current = self.request("GET", url(current))
        return current


def tpu_operation_done(operation: Mapping[str, Any]) -> bool:
    """A Cloud TPU (google.longrunning) operation is finished: ``done``."""
    return bool(operation.get("done"))


def zone_operation_done(operation: Mapping[str, Any]) -> bool:
    """A Compute Engine operation is finished: ``status`` DONE."""
    return operation.get("status") == "DONE"


def operation_error(operation: Mapping[str, Any]) -> str | None:
    """The error of a finished operation (either API's shape), or None if it succeeded."""
    error = operation.get("error")
    if not error:
        return None
    if "errors" in error:  # Compute: {"errors": [{"code", "message"}]}
        return "; ".join(f"{e.get('code', '')}: {e.get('message', '')}" for e in error["errors"])
    return f"{error.get('code', '')}: {error.get('message', '')}"  # google.rpc.Status


def quote(segment: str) -> str:
    """One path segment of a URL, percent-encoded whole (a ``/`` in it included)."""
    return urllib.parse.quote(segment, safe="")


def _reason(exc: BaseException) -> str:
    """Why a request got no answer, in a few words: the operating system's reason (e.g.
    "Connection refused") found under requests' and urllib3's wrappers, else the error itself."""
    if isinstance(exc, requests.Timeout):
        return f"no answer within {REQUEST_TIMEOUT_S:g} s"
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
        cause = getattr(cause, "reason", None) or cause.__cause__ or cause.__context__
    return f"{type(exc).__name__}: {str(exc)[:200]}"


def _message(response: requests.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:200]
