"""A small REST client for the few Cloud TPU v2, Compute Engine v1 and GKE (container v1) calls
recovery and `rayslice status` make.

Why not google-api-python-client: the controller and `rayslice status` make about ten calls,
and a plain `AuthorizedSession` keeps every request visible (and testable against the discovery
documents in tests/recovery/test_api_shapes.py) without building a discovery client at start.

Endpoints. The base URLs are Google's (the discovery documents' ``rootUrl`` + ``servicePath``)
unless overridden with the variables gcloud itself reads for its ``api_endpoint_overrides``
properties, ``CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU``, ``CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE`` and
``CLOUDSDK_API_ENDPOINT_OVERRIDES_CONTAINER``.
The simulator's emulation (`rayslice.local.google.cloud_api.emulator`) is reached only through these: there is
no second code path. An override that is not https is accepted only for a loopback, private or
RFC 6598 shared IP address, so a bearer token never crosses the internet in clear.

Every mutating call takes the set of names it may touch and refuses any other
(`RefusedResource`): the controller's own check is the first guard, this is the second.

Failures leave this module as `rayslice.errors` classes, translated once in `_request`: 401/403
and refused credentials as `NoCredentials`, any other error status, a connection that fails or
times out and an answer that is not JSON as `CloudError` naming the call (exit 3 from the CLI).
"""

from __future__ import annotations

import ipaddress
import os
import time
import urllib.parse
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import google.auth
import google.auth.exceptions
import requests
from google.auth.transport.requests import AuthorizedSession

from rayslice.cloud.states import PREEMPTED_OPERATION
from rayslice.errors import CloudError, InvalidInput, NoCredentials
from rayslice.names import CLOUD_PLATFORM_SCOPE, host_name, host_worker

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
# The Cloud TPU API version that reads, deletes and recreates queued resources: v2alpha1's
# QueuedResource is v2's plus the flex-start fields (provisioningModel, runDuration), so a
# request made through either reads back whole, and one recreated from it keeps its capacity.
QUEUED_VERSION = "v2alpha1"
# RFC 6598 shared address space: not routed on the internet (the simulator's bridges use it).
SHARED_ADDRESS_SPACE = ipaddress.ip_network("100.64.0.0/10")


class RefusedResource(InvalidInput):
    """A call would touch a resource that is not one of this cluster's slices: never sent."""


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


@dataclass(frozen=True)
class Location:
    """Where the cluster lives: its project and zone."""

    project: str
    zone: str


class CloudClient:
    """The calls recovery and status make, each one method; responses are the API's JSON."""

    def __init__(
        self,
        session: requests.Session,
        location: Location,
        *,
        tpu_base: str | None = None,
        compute_base: str | None = None,
        container_base: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
        poll_interval_s: float = 5.0,
    ):
        self.session = session
        self.location = location
        self.tpu_base = tpu_base or endpoint(TPU_ENDPOINT_ENV, TPU_DEFAULT)
        self.compute_base = compute_base or endpoint(COMPUTE_ENDPOINT_ENV, COMPUTE_DEFAULT)
        self.container_base = container_base or endpoint(CONTAINER_ENDPOINT_ENV, CONTAINER_DEFAULT)
        self.sleep = sleep
        self.poll_interval_s = poll_interval_s

    # ---- plumbing ----------------------------------------------------------------------------

    def _request(
        self, method: str, url: str, *, params: Mapping[str, str] | None = None, body: Any = None
    ) -> dict[str, Any]:
        """One API call; every way it can fail leaves as a `rayslice.errors` class (see above)."""
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

    def _tpu(self, path: str, version: str = "v2") -> str:
        loc = self.location
        return f"{self.tpu_base}{version}/projects/{_q(loc.project)}/locations/{_q(loc.zone)}/{path}"

    def _compute(self, path: str) -> str:
        loc = self.location
        return f"{self.compute_base}projects/{_q(loc.project)}/zones/{_q(loc.zone)}/{path}"

    def _container(self, cluster: str, path: str) -> str:
        loc = self.location
        return (
            f"{self.container_base}v1/projects/{_q(loc.project)}/locations/{_q(loc.zone)}"
            f"/clusters/{_q(cluster)}/{path}"
        )

    @staticmethod
    def _guard(name: str, allowed: Collection[str]) -> None:
        if name not in allowed:
            raise RefusedResource(
                f"refusing to touch {name!r}: it is not one of this cluster's slices "
                f"({', '.join(sorted(allowed)) or 'none'})"
            )

    @classmethod
    def _guard_hosts(cls, mig: str, hosts: Sequence[str], allowed: Collection[str]) -> None:
        """`_guard` for `mig`, and every one of `hosts` must be a name infra gives that MIG's
        hosts (`rayslice.names.host_name`): a call never names another group's instance."""
        cls._guard(mig, allowed)
        if not hosts:
            raise InvalidInput(f"no instances of {mig!r} named")
        foreign = [h for h in hosts if host_worker(mig, h) is None]
        if foreign:
            raise RefusedResource(
                f"refusing to touch {', '.join(map(repr, foreign))}: not hosts of {mig!r} "
                f"({host_name(mig, 0)!r}, {host_name(mig, 1)!r}, ...)"
            )

    # ---- Cloud TPU v2 (tpu.v2.json: projects.locations.nodes / operations) --------------------

    def get_node(self, name: str) -> dict[str, Any] | None:
        """The node, or None when it does not exist."""
        try:
            return self._request("GET", self._tpu(f"nodes/{_q(name)}"))
        except CloudError as exc:
            if exc.status == 404:
                return None
            raise

    def list_nodes(self) -> list[dict[str, Any]]:
        nodes: list[dict[str, Any]] = []
        token = ""
        while True:
            page = self._request("GET", self._tpu("nodes"), params={"pageToken": token} if token else None)
            nodes.extend(page.get("nodes", []))
            token = page.get("nextPageToken", "")
            if not token:
                return nodes

    def delete_node(self, name: str, allowed: Collection[str]) -> dict[str, Any]:
        self._guard(name, allowed)
        return self._request("DELETE", self._tpu(f"nodes/{_q(name)}"))

    def create_node(self, name: str, body: Mapping[str, Any], allowed: Collection[str]) -> dict[str, Any]:
        self._guard(name, allowed)
        return self._request("POST", self._tpu("nodes"), params={"nodeId": name}, body=dict(body))

    def node_guest_attributes(self, name: str, query_path: str, worker: int) -> list[dict[str, str]]:
        """One worker's guest attribute entries under `query_path` (namespace/key/value)."""
        try:
            answer = self._request(
                "POST",
                self._tpu(f"nodes/{_q(name)}:getGuestAttributes"),
                body={"queryPath": query_path, "workerIds": [str(worker)]},
            )
        except CloudError as exc:
            if exc.status == 404:
                return []
            raise
        entries: list[dict[str, str]] = []
        for attributes in answer.get("guestAttributes", []):
            entries.extend(attributes.get("queryValue", {}).get("items", []))
        return entries

    # ---- Cloud TPU queued resources (tpu.v2alpha1.json: projects.locations.queuedResources) ---

    def get_queued_resource(self, name: str) -> dict[str, Any] | None:
        """The queued resource (read through `QUEUED_VERSION`), or None when it does not exist."""
        try:
            return self._request("GET", self._tpu(f"queuedResources/{_q(name)}", QUEUED_VERSION))
        except CloudError as exc:
            if exc.status == 404:
                return None
            raise

    def create_queued_resource(
        self, name: str, body: Mapping[str, Any], allowed: Collection[str], *, version: str = QUEUED_VERSION
    ) -> dict[str, Any]:
        """queuedResources.create: a request that waits for capacity. `version`: the program sends
        v2 unless the request needs v2alpha1's fields (`rayslice.infra.tpu_vm.queued`); the
        controller recreates through `QUEUED_VERSION`, the version it read the request with."""
        self._guard(name, allowed)
        return self._request(
            "POST", self._tpu("queuedResources", version), params={"queuedResourceId": name}, body=dict(body)
        )

    def delete_queued_resource(self, name: str, allowed: Collection[str], *, force: bool) -> dict[str, Any]:
        """queuedResources.delete; `force` deletes its node first."""
        self._guard(name, allowed)
        params = {"force": "true"} if force else None
        return self._request(
            "DELETE", self._tpu(f"queuedResources/{_q(name)}", QUEUED_VERSION), params=params
        )

    def wait_tpu_operation(self, operation: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
        """Polls a TPU long-running operation until done or `timeout_s`; returns its last state."""
        deadline = time.monotonic() + timeout_s
        current = dict(operation)
        while not current.get("done"):
            if time.monotonic() >= deadline:
                return current
            self.sleep(self.poll_interval_s)
            current = self._request("GET", f"{self.tpu_base}v2/{current['name']}")
        return current

    # ---- GKE (container.v1.json: projects.locations.clusters.nodePools) ----------------------

    def get_node_pool(self, cluster: str, name: str) -> dict[str, Any] | None:
        """The node pool of the zonal cluster `cluster`, or None when it does not exist."""
        try:
            return self._request("GET", self._container(cluster, f"nodePools/{_q(name)}"))
        except CloudError as exc:
            if exc.status == 404:
                return None
            raise

    # ---- Compute Engine v1 (compute.v1.json: instanceGroupManagers, zoneOperations, instances) -

    def get_mig(self, name: str) -> dict[str, Any] | None:
        try:
            return self._request("GET", self._compute(f"instanceGroupManagers/{_q(name)}"))
        except CloudError as exc:
            if exc.status == 404:
                return None
            raise

    def list_managed_instances(self, name: str) -> list[dict[str, Any]]:
        return self._paged(f"instanceGroupManagers/{_q(name)}/listManagedInstances", "managedInstances")

    def list_per_instance_configs(self, name: str) -> list[dict[str, Any]]:
        return self._paged(f"instanceGroupManagers/{_q(name)}/listPerInstanceConfigs", "items")

    def list_resize_requests(self, name: str) -> list[dict[str, Any]]:
        """instanceGroupManagerResizeRequests.list: the MIG's resize requests."""
        return self._paged(f"instanceGroupManagers/{_q(name)}/resizeRequests", "items", method="GET")

    def resize_mig(self, name: str, size: int, allowed: Collection[str]) -> dict[str, Any]:
        """instanceGroupManagers.resize (``size``, a query parameter: "The number of running
        instances that the managed instance group should maintain at any given time", compute v1
        discovery). A bulk MIG (flex-start) grows only from 0 and shrinks by a resize to 0
        (Compute Engine, "About bulk mode")."""
        self._guard(name, allowed)
        return self._request(
            "POST", self._compute(f"instanceGroupManagers/{_q(name)}/resize"), params={"size": str(size)}
        )

    def list_preemptions(self) -> list[dict[str, Any]]:
        """zoneOperations.list of the zone's Spot preemptions (``operationType =
        "compute.instances.preempted"``, the filter of Google's sample "List preemption history",
        compute_preemptible_history), oldest first: each names the instance in ``targetLink``."""
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            params = {"filter": f'operationType="{PREEMPTED_OPERATION}"'}
            if token:
                params["pageToken"] = token
            page = self._request("GET", self._compute("operations"), params=params)
            items.extend(page.get("items", []))
            token = page.get("nextPageToken", "")
            if not token:
                return items

    def _paged(self, path: str, field: str, method: str = "POST") -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            page = self._request(method, self._compute(path), params={"pageToken": token} if token else None)
            items.extend(page.get(field, []))
            token = page.get("nextPageToken", "")
            if not token:
                return items

    def delete_mig(self, name: str, allowed: Collection[str]) -> dict[str, Any]:
        self._guard(name, allowed)
        return self._request("DELETE", self._compute(f"instanceGroupManagers/{_q(name)}"))

    def insert_mig(self, body: Mapping[str, Any], allowed: Collection[str]) -> dict[str, Any]:
        self._guard(str(body.get("name")), allowed)
        return self._request("POST", self._compute("instanceGroupManagers"), body=dict(body))

    def create_instances(
        self, name: str, instances: list[Mapping[str, Any]], allowed: Collection[str]
    ) -> dict[str, Any]:
        self._guard(name, allowed)
        return self._request(
            "POST",
            self._compute(f"instanceGroupManagers/{_q(name)}/createInstances"),
            body={"instances": [dict(i) for i in instances]},
        )

    def delete_instances(
        self, mig: str, instance_names: Sequence[str], allowed: Collection[str], *, skip_missing: bool = True
    ) -> dict[str, Any]:
        """instanceGroupManagers.deleteInstances: delete these hosts of `mig` and lower its target
        size by as many; the MIG stays. Instances are named by partial URL, "zones/[ZONE]/instances/
        [INSTANCE_NAME]" (compute v1 discovery, InstanceGroupManagersDeleteInstancesRequest).
        `skip_missing` sends skipInstancesOnValidationError: a host already gone is skipped rather
        than failing the operation, so a scale-down retried after a partial one completes.

        Whether Google deletes the hosts' per-instance configs with them is not settled by the
        sources (`rayslice.cloud.twin`'s docstring): after the operation, list the MIG's configs and
        pass any of these names still there to `delete_per_instance_configs`."""
        self._guard_hosts(mig, instance_names, allowed)
        return self._delete_instances(mig, instance_names, skip_missing)

    def _delete_instances(
        self, mig: str, instance_names: Sequence[str], skip_missing: bool
    ) -> dict[str, Any]:
        zone = self.location.zone
        body = {
            "instances": [f"zones/{_q(zone)}/instances/{name}" for name in instance_names],
            "skipInstancesOnValidationError": skip_missing,
        }
        return self._request(
            "POST", self._compute(f"instanceGroupManagers/{_q(mig)}/deleteInstances"), body=body
        )

    def delete_per_instance_configs(
        self, mig: str, instance_names: Sequence[str], allowed: Collection[str]
    ) -> dict[str, Any]:
        """instanceGroupManagers.deletePerInstanceConfigs of these hosts of `mig` (body ``names``,
        InstanceGroupManagersDeletePerInstanceConfigsReq). Name only configs that
        `list_per_instance_configs` returned: what Google answers for a name without one is not
        documented (the twin fails the operation)."""
        self._guard_hosts(mig, instance_names, allowed)
        return self._request(
            "POST",
            self._compute(f"instanceGroupManagers/{_q(mig)}/deletePerInstanceConfigs"),
            body={"names": list(instance_names)},
        )

    def instance_guest_attributes(self, instance: str, query_path: str) -> list[dict[str, str]]:
        """An instance's guest attribute entries under `query_path`; [] when there are none."""
        try:
            answer = self._request(
                "GET",
                self._compute(f"instances/{_q(instance)}/getGuestAttributes"),
                params={"queryPath": query_path},
            )
        except CloudError as exc:
            if exc.status == 404:  # no attribute under that path yet, or no such instance
                return []
            raise
        return list(answer.get("queryValue", {}).get("items", []))

    def wait_zone_operation(self, operation: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
        """Polls a zonal Compute operation until status DONE or `timeout_s`; returns its last state."""
        deadline = time.monotonic() + timeout_s
        current = dict(operation)
        while current.get("status") != "DONE":
            if time.monotonic() >= deadline:
                return current
            self.sleep(self.poll_interval_s)
            current = self._request("GET", self._compute(f"operations/{_q(current['name'])}"))
        return current


def operation_error(operation: Mapping[str, Any]) -> str | None:
    """The error of a finished operation (either API's shape), or None if it succeeded."""
    error = operation.get("error")
    if not error:
        return None
    if "errors" in error:  # Compute: {"errors": [{"code", "message"}]}
        return "; ".join(f"{e.get('code', '')}: {e.get('message', '')}" for e in error["errors"])
    return f"{error.get('code', '')}: {error.get('message', '')}"  # google.rpc.Status


def managed_instance_name(instance: Mapping[str, Any]) -> str:
    """A MIG's managed instance's name: ``name`` where the answer has it, else the last part of its
    ``instance`` URL (compute v1 ManagedInstance); "" when it has neither."""
    return str(instance.get("name") or str(instance.get("instance", "")).rsplit("/", 1)[-1])


def _q(segment: str) -> str:
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
