"""The emulated API surface: each route with its discovery method id and schemas, the record of
a served call, the API's error answer, and what both APIs' handlers share (a resource's key,
guest-attribute entries).

tests/recovery/test_api_shapes.py checks `ROUTES` against the paths and HTTP methods of the
discovery documents that google-api-python-client ships, and every recorded `Call`'s bodies
against their schemas.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_NAME = r"[^/:?]+"


@dataclass(frozen=True)
class Route:
    """One emulated API method: HTTP method, path pattern, discovery id, request/response schema."""

    api: str  # "tpu", "tpu-v2alpha1", "compute" or "container" (a key of tests/recovery/discovery.py's FILES)
    method: str
    pattern: re.Pattern[str]
    method_id: str
    handler: str
    request_schema: str | None
    response_schema: str


def _route(
    api: str, method: str, path: str, method_id: str, handler: str, request: str | None, response: str
) -> Route:
    regex = re.sub(r"\{(\w+)\}", lambda m: f"(?P<{m.group(1)}>{_NAME})", path)
    return Route(api, method, re.compile(f"^{regex}$"), method_id, handler, request, response)


_TPU = "/v2/projects/{project}/locations/{zone}"
# Queued resources are read and recreated through v2alpha1 (`rayslice.recovery.cloud.QUEUED_VERSION`).
_TPU_ALPHA = "/v2alpha1/projects/{project}/locations/{zone}"
_GCE = "/compute/v1/projects/{project}/zones/{zone}"
_GKE = "/v1/projects/{project}/locations/{location}/clusters/{cluster}"
ROUTES = (
    _route("tpu", "GET", _TPU + "/nodes/{name}", "tpu.projects.locations.nodes.get", "tpu_get", None, "Node"),
    _route(
        "tpu",
        "GET",
        _TPU + "/nodes",
        "tpu.projects.locations.nodes.list",
        "tpu_list",
        None,
        "ListNodesResponse",
    ),
    _route(
        "tpu",
        "DELETE",
        _TPU + "/nodes/{name}",
        "tpu.projects.locations.nodes.delete",
        "tpu_delete",
        None,
        "Operation",
    ),
    _route(
        "tpu",
        "POST",
        _TPU + "/nodes",
        "tpu.projects.locations.nodes.create",
        "tpu_create",
        "Node",
        "Operation",
    ),
    _route(
        "tpu",
        "POST",
        _TPU + "/nodes/{name}:getGuestAttributes",
        "tpu.projects.locations.nodes.getGuestAttributes",
        "tpu_guest_attributes",
        "GetGuestAttributesRequest",
        "GetGuestAttributesResponse",
    ),
    _route(
        "tpu-v2alpha1",
        "GET",
        _TPU_ALPHA + "/queuedResources/{name}",
        "tpu.projects.locations.queuedResources.get",
        "queued_get",
        None,
        "QueuedResource",
    ),
    _route(
        "tpu-v2alpha1",
        "POST",
        _TPU_ALPHA + "/queuedResources",
        "tpu.projects.locations.queuedResources.create",
        "queued_create",
        "QueuedResource",
        "Operation",
    ),
    _route(
        "tpu-v2alpha1",
        "DELETE",
        _TPU_ALPHA + "/queuedResources/{name}",
        "tpu.projects.locations.queuedResources.delete",
        "queued_delete",
        None,
        "Operation",
    ),
    _route(
        "tpu",
        "GET",
        _TPU + "/operations/{name}",
        "tpu.projects.locations.operations.get",
        "tpu_operation",
        None,
        "Operation",
    ),
    _route(
        "compute",
        "GET",
        _GCE + "/instanceGroupManagers/{name}",
        "compute.instanceGroupManagers.get",
        "mig_get",
        None,
        "InstanceGroupManager",
    ),
    _route(
        "compute",
        "DELETE",
        _GCE + "/instanceGroupManagers/{name}",
        "compute.instanceGroupManagers.delete",
        "mig_delete",
        None,
        "Operation",
    ),
    _route(
        "compute",
        "POST",
        _GCE + "/instanceGroupManagers",
        "compute.instanceGroupManagers.insert",
        "mig_insert",
        "InstanceGroupManager",
        "Operation",
    ),
    _route(
        "compute",
        "POST",
        _GCE + "/instanceGroupManagers/{name}/listManagedInstances",
        "compute.instanceGroupManagers.listManagedInstances",
        "mig_instances",
        None,
        "InstanceGroupManagersListManagedInstancesResponse",
    ),
    _route(
        "compute",
        "POST",
        _GCE + "/instanceGroupManagers/{name}/listPerInstanceConfigs",
        "compute.instanceGroupManagers.listPerInstanceConfigs",
        "mig_configs",
        None,
        "InstanceGroupManagersListPerInstanceConfigsResp",
    ),
    _route(
        "compute",
        "POST",
        _GCE + "/instanceGroupManagers/{name}/createInstances",
        "compute.instanceGroupManagers.createInstances",
        "mig_create_instances",
        "InstanceGroupManagersCreateInstancesRequest",
        "Operation",
    ),
    _route(
        "compute",
        "POST",
        _GCE + "/instanceGroupManagers/{name}/deleteInstances",
        "compute.instanceGroupManagers.deleteInstances",
        "mig_delete_instances",
        "InstanceGroupManagersDeleteInstancesRequest",
        "Operation",
    ),
    _route(
        "compute",
        "POST",
        _GCE + "/instanceGroupManagers/{name}/deletePerInstanceConfigs",
        "compute.instanceGroupManagers.deletePerInstanceConfigs",
        "mig_delete_configs",
        "InstanceGroupManagersDeletePerInstanceConfigsReq",
        "Operation",
    ),
    _route(
        "compute",
        "POST",
        _GCE + "/instanceGroupManagers/{name}/resize",
        "compute.instanceGroupManagers.resize",
        "mig_resize",
        None,
        "Operation",
    ),
    _route(
        "compute",
        "POST",
        _GCE + "/instanceGroupManagers/{name}/resizeRequests",
        "compute.instanceGroupManagerResizeRequests.insert",
        "resize_request_insert",
        "InstanceGroupManagerResizeRequest",
        "Operation",
    ),
    _route(
        "compute",
        "GET",
        _GCE + "/operations",
        "compute.zoneOperations.list",
        "compute_operations",
        None,
        "OperationList",
    ),
    _route(
        "compute",
        "GET",
        _GCE + "/operations/{name}",
        "compute.zoneOperations.get",
        "compute_operation",
        None,
        "Operation",
    ),
    _route(
        "compute",
        "GET",
        _GCE + "/instances/{name}/getGuestAttributes",
        "compute.instances.getGuestAttributes",
        "instance_guest",
        None,
        "GuestAttributes",
    ),
    _route(
        "container",
        "GET",
        _GKE + "/nodePools/{name}",
        "container.projects.locations.clusters.nodePools.get",
        "pool_get",
        None,
        "NodePool",
    ),
    _route(
        "container",
        "GET",
        _GKE + "/nodePools",
        "container.projects.locations.clusters.nodePools.list",
        "pool_list",
        None,
        "ListNodePoolsResponse",
    ),
)


@dataclass
class Call:
    """One request as served: what a test asserts on, and what the shape test validates."""

    method: str
    path: str
    query: dict[str, str]
    method_id: str | None
    request: Any
    status: int
    response: Any


class ApiError(Exception):
    def __init__(self, code: int, status: str, message: str):
        self.code, self.status, self.message = code, status, message
        super().__init__(message)

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "status": self.status}}


def resource_key(p: dict[str, str]) -> tuple[str, str, str]:
    return (p["project"], p["zone"], p["name"])


def match_route(method: str, path: str) -> tuple[Route | None, dict[str, str]]:
    for route in ROUTES:
        if route.method == method and (found := route.pattern.match(path)):
            return route, found.groupdict()
    return None, {}


def guest_entries(attributes: dict[str, dict[str, str]], query: str) -> list[dict[str, str]]:
    """Entries under ``<namespace>/`` or ``<namespace>/<key>`` (empty query: all)."""
    namespace, _, key = query.partition("/")
    return [
        {"namespace": ns, "key": k, "value": v}
        for ns, values in sorted(attributes.items())
        for k, v in sorted(values.items())
        if (not namespace or ns == namespace) and (not key or k == key)
    ]
