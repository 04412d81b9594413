"""A local emulation of ONLY the cloud API calls that recovery and `rayslice status` make.

Served over real HTTP so the real client (`rayslice.recovery.cloud`, an ``AuthorizedSession``)
reaches it through its normal endpoint override (``CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU`` =
``<url>/``, ``CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE`` = ``<url>/compute/v1/``) and nothing
else. It emulates:

- Cloud TPU v2: ``projects.locations.nodes`` get / list / delete / create / getGuestAttributes,
  and ``projects.locations.operations.get`` (long-running operations, ``done`` after
  `op_polls` reads);
- Compute Engine v1: ``instanceGroupManagers`` get / delete / insert / listManagedInstances /
  listPerInstanceConfigs / createInstances, ``zoneOperations.get`` and
  ``instances.getGuestAttributes``;
- an OAuth token endpoint (``POST /token``, the JWT-bearer grant of service-account keys), so a
  client holds a real ``service_account`` ADC file whose ``token_uri`` points here (an
  ``authorized_user`` file cannot: google-auth always sends its refresh to Google's own token
  endpoint). The emulation made the key pair and checks the assertion's signature and audience;
  every API call must carry a token it issued (401 otherwise, as Google answers).

Each route names its discovery method id (`ROUTES`); tests/recovery/test_api_shapes.py checks
the route table against the paths and HTTP methods of the discovery documents that
google-api-python-client ships, and walks every request body and response body recorded in
`calls` against the schemas, so the emulation cannot drift from the real API.

`preempt` does what a preemption does to the resource (TPU node state PREEMPTED; a MIG's
instances gone or TERMINATED); every call is recorded in `calls`, so tests can assert what was
(and was not) touched. Guest attributes come from `guest` or, for a simulated host, from
`guest_source` (the simulator's metadata servers keep them).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import re
import secrets
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import google.auth.exceptions
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.auth import jwt

# google-auth signs every service-account assertion for Google's token endpoint, whatever
# token_uri the key file names; Google checks this audience, so the emulation does too.
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"
ADMIN_PREFIX = "/rayslice-local/preempt/"
ADMIN_HEADER = "X-Rayslice-Simulator"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
TPU_OPERATION_METADATA = "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"
TPU_NODE_TYPE = "type.googleapis.com/google.cloud.tpu.v2.Node"
_NAME = r"[^/:?]+"


@dataclass(frozen=True)
class Route:
    """One emulated API method: HTTP method, path pattern, discovery id, request/response schema."""

    api: str  # "tpu" or "compute"
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
_GCE = "/compute/v1/projects/{project}/zones/{zone}"
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


@dataclass
class _Operation:
    api: str
    body: dict[str, Any]
    polls_left: int
    finish: Callable[[], str | None]  # runs when the operation completes; returns an error or None


@dataclass
class CloudState:
    """What the emulated project holds, keyed by (project, zone, name)."""

    nodes: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    migs: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    instances: dict[tuple[str, str, str], list[dict[str, Any]]] = field(default_factory=dict)
    configs: dict[tuple[str, str, str], list[dict[str, Any]]] = field(default_factory=dict)


class CloudApiEmulator(ThreadingHTTPServer):
    """The emulated APIs on `address`; `url` is its base. Thread-safe; stop with `shutdown()`."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int] = ("127.0.0.1", 0),
        *,
        op_polls: int = 1,
    ):
        super().__init__(address, _Handler)
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self._key_id = secrets.token_hex(8)
        self.op_polls = op_polls
        self.state = CloudState()
        self.guest: dict[str, dict[str, dict[str, str]]] = {}  # instance -> namespace -> key -> value
        self.tpu_guest: dict[tuple[str, int], dict[str, dict[str, str]]] = {}  # (node, worker) -> ...
        self.guest_source: Callable[[str], dict[str, dict[str, str]] | None] | None = None
        self.worker_guest_source: Callable[[str, int], dict[str, dict[str, str]] | None] | None = None
        self.fail_creates = 0  # the next N create/insert operations end in an error
        # The simulator's hooks: a slice's hosts power off when its deletion finishes and boot
        # when its recreation finishes (called with the slice name, under the emulation's lock).
        self.on_slice_down: Callable[[str], None] | None = None
        self.on_slice_up: Callable[[str], None] | None = None
        # ``POST /rayslice-local/preempt/<slice>`` with header ADMIN_HEADER: `rayslice local preempt`.
        self.admin_token = ""
        self.admin_preempt: Callable[[str], Sequence[str]] | None = None
        self.calls: list[Call] = []
        self.tokens: set[str] = set()
        self._operations: dict[str, _Operation] = {}
        self._ids = itertools.count(1)
        self.lock = threading.RLock()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host if isinstance(host, str) else host.decode()}:{port}"

    def environment(self) -> dict[str, str]:
        """The endpoint overrides that send the real client here."""
        return {
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": f"{self.url}/",
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": f"{self.url}/compute/v1/",
        }

    def service_account_info(self, project: str = "rayslice-test") -> dict[str, str]:
        """A ``service_account`` key file (the ADC form) whose token requests come here."""
        pem = self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return {
            "type": "service_account",
            "project_id": project,
            "private_key_id": self._key_id,
            "private_key": pem.decode(),
            "client_email": f"emulated-user@{project}.iam.gserviceaccount.com",
            "client_id": "1",
            "token_uri": f"{self.url}/token",
        }

    # ---- seeding and faults (the simulator and tests; not part of any Google API) -------------

    def add_node(self, project: str, zone: str, name: str, **fields: Any) -> dict[str, Any]:
        """A READY TPU node with `fields` (camelCase Node fields)."""
        with self.lock:
            node = self._new_node(project, zone, name, fields)
            node["state"] = "READY"
            self.state.nodes[(project, zone, name)] = node
            return copy.deepcopy(node)

    def add_mig(self, project: str, zone: str, name: str, hosts: list[str], **fields: Any) -> None:
        """A MIG of RUNNING hosts named `hosts`, each with a per-instance config (as infra makes)."""
        with self.lock:
            key = (project, zone, name)
            self.state.migs[key] = self._new_mig(
                project, zone, {"name": name, **fields, "targetSize": len(hosts)}
            )
            self.state.configs[key] = [{"name": host, "status": "EFFECTIVE"} for host in hosts]
            self.state.instances[key] = [self._instance(project, zone, host) for host in hosts]

    def preempt(self, project: str, zone: str, name: str, *, mode: str = "gone") -> None:
        """A preemption: the node turns PREEMPTED, or the MIG's hosts are gone / TERMINATED."""
        with self.lock:
            key = (project, zone, name)
            if key in self.state.nodes:
                self.state.nodes[key]["state"] = "PREEMPTED"
                for worker in [w for (n, w) in self.tpu_guest if n == name]:
                    self.tpu_guest.pop((name, worker))
            elif key in self.state.migs:
                if mode == "gone":
                    self.state.instances[key] = []
                else:
                    for instance in self.state.instances[key]:
                        instance["instanceStatus"] = "TERMINATED"
            else:
                raise KeyError(f"no slice {name} in {project}/{zone}")

    def mutations(self) -> list[Call]:
        """Every served call that could change something (not GET, not a read-only POST)."""
        reads = {"getGuestAttributes", "listManagedInstances", "listPerInstanceConfigs"}
        return [
            c
            for c in self.calls
            if c.method in ("POST", "DELETE", "PATCH", "PUT")
            and c.method_id is not None
            and c.method_id.rsplit(".", 1)[-1] not in reads
        ]

    # ---- resources ---------------------------------------------------------------------------

    def _new_node(self, project: str, zone: str, name: str, fields: dict[str, Any]) -> dict[str, Any]:
        node = copy.deepcopy(fields)
        node.update(
            name=f"projects/{project}/locations/{zone}/nodes/{name}",
            id=str(next(self._ids)),
            createTime="2026-01-01T00:00:00Z",
            apiVersion="V2",
            state="CREATING",
        )
        return node

    def _new_mig(self, project: str, zone: str, body: dict[str, Any]) -> dict[str, Any]:
        mig = copy.deepcopy(body)
        base = f"projects/{project}/zones/{zone}"
        name = mig["name"]
        mig.update(
            kind="compute#instanceGroupManager",
            id=str(next(self._ids)),
            zone=f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}",
            selfLink=f"https://www.googleapis.com/compute/v1/{base}/instanceGroupManagers/{name}",
            instanceGroup=f"https://www.googleapis.com/compute/v1/{base}/instanceGroups/{name}",
            creationTimestamp="2026-01-01T00:00:00.000-00:00",
        )
        mig.setdefault("targetSize", 0)
        return mig

    def _instance(self, project: str, zone: str, host: str, *, running: bool = True) -> dict[str, Any]:
        instance: dict[str, Any] = {
            "instance": f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}/instances/{host}",
            "name": host,
            "id": str(next(self._ids)),
            "currentAction": "NONE" if running else "CREATING",
        }
        if running:
            instance["instanceStatus"] = "RUNNING"
        return instance

    def _tpu_operation(
        self, project: str, zone: str, verb: str, target: str, finish: Callable[[], str | None]
    ) -> dict[str, Any]:
        name = f"projects/{project}/locations/{zone}/operations/operation-{next(self._ids)}"
        body = {
            "name": name,
            "done": False,
            "metadata": {
                "@type": TPU_OPERATION_METADATA,
                "createTime": "2026-01-01T00:00:00Z",
                "target": target,
                "verb": verb,
                "apiVersion": "v2",
            },
        }
        self._operations[name] = _Operation("tpu", body, self.op_polls, finish)
        return self._maybe_finish(name)

    def _compute_operation(
        self, project: str, zone: str, kind: str, target: str, finish: Callable[[], str | None]
    ) -> dict[str, Any]:
        number = next(self._ids)
        name = f"operation-{number}"
        body = {
            "kind": "compute#operation",
            "id": str(number),
            "name": name,
            "operationType": kind,
            "status": "RUNNING",
            "progress": 0,
            "targetLink": target,
            "zone": f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}",
            "selfLink": f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}/operations/{name}",
        }
        self._operations[f"{project}/{zone}/{name}"] = _Operation("compute", body, self.op_polls, finish)
        return self._maybe_finish(f"{project}/{zone}/{name}")

    def _maybe_finish(self, key: str) -> dict[str, Any]:
        operation = self._operations[key]
        if operation.polls_left <= 0 and not _finished(operation):
            error = operation.finish()
            if operation.api == "tpu":
                operation.body["done"] = True
                if error:
                    operation.body["error"] = {"code": 13, "message": error}
                else:
                    operation.body["response"] = {"@type": TPU_NODE_TYPE}
            else:
                operation.body.update(status="DONE", progress=100)
                if error:
                    operation.body["error"] = {
                        "errors": [{"code": "RESOURCE_OPERATION_FAILED", "message": error}]
                    }
        operation.polls_left -= 1
        return copy.deepcopy(operation.body)

    @staticmethod
    def _hook(hook: Callable[[str], None] | None, name: str) -> None:
        if hook is not None:
            hook(name)

    def _take_failure(self) -> bool:
        if self.fail_creates > 0:
            self.fail_creates -= 1
            return True
        return False

    # ---- handlers: (route parameters, query, body) -> response body --------------------------

    def tpu_get(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        return copy.deepcopy(self._node(p))

    def tpu_list(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        nodes = [
            n for (pr, z, _), n in sorted(self.state.nodes.items()) if (pr, z) == (p["project"], p["zone"])
        ]
        return {"nodes": copy.deepcopy(nodes)}

    def tpu_delete(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        key = (p["project"], p["zone"], p["name"])
        node = self._node(p)
        node["state"] = "DELETING"

        def finish() -> str | None:
            self.state.nodes.pop(key, None)
            self._hook(self.on_slice_down, p["name"])
            return None

        return self._tpu_operation(p["project"], p["zone"], "delete", node["name"], finish)

    def tpu_create(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        name = q.get("nodeId", "")
        if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name):
            raise ApiError(400, "INVALID_ARGUMENT", f"invalid nodeId {name!r}")
        key = (p["project"], p["zone"], name)
        if key in self.state.nodes:
            raise ApiError(409, "ALREADY_EXISTS", f"node {name} already exists")
        node = self._new_node(p["project"], p["zone"], name, body or {})
        self.state.nodes[key] = node
        failing = self._take_failure()

        def finish() -> str | None:
            if failing:
                self.state.nodes.pop(key, None)
                return "There is no more capacity in the zone (emulated stockout)"
            node["state"] = "READY"
            self._hook(self.on_slice_up, name)
            return None

        return self._tpu_operation(p["project"], p["zone"], "create", node["name"], finish)

    def tpu_guest_attributes(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        node = self._node(p)
        hosts = len(node.get("networkEndpoints", [])) or 1
        workers = [int(w) for w in (body or {}).get("workerIds", [])] or list(range(hosts))
        query = (body or {}).get("queryPath", "")
        answer = []
        for worker in workers:
            attributes = self.tpu_guest.get((p["name"], worker), {})
            if self.worker_guest_source is not None:
                attributes = self.worker_guest_source(p["name"], worker) or attributes
            answer.append({"queryPath": query, "queryValue": {"items": _entries(attributes, query)}})
        return {"guestAttributes": answer}

    def tpu_operation(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        key = f"projects/{p['project']}/locations/{p['zone']}/operations/{p['name']}"
        if key not in self._operations:
            raise ApiError(404, "NOT_FOUND", f"operation {key} not found")
        return self._maybe_finish(key)

    def mig_get(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        mig = copy.deepcopy(self._mig(p))
        instances = self.state.instances[_key(p)]
        mig["currentActions"] = {
            "none": sum(1 for i in instances if i.get("currentAction") == "NONE"),
            "creating": sum(1 for i in instances if i.get("currentAction") == "CREATING"),
        }
        return mig

    def mig_delete(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        mig = self._mig(p)
        key = _key(p)

        def finish() -> str | None:
            for table in (self.state.migs, self.state.instances, self.state.configs):
                table.pop(key, None)
            self._hook(self.on_slice_down, p["name"])
            return None

        return self._compute_operation(p["project"], p["zone"], "delete", mig["selfLink"], finish)

    def mig_insert(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        name = str((body or {}).get("name", ""))
        key = (p["project"], p["zone"], name)
        if not name or key in self.state.migs:
            raise ApiError(
                409 if name else 400,
                "ALREADY_EXISTS" if name else "INVALID_ARGUMENT",
                f"cannot insert MIG {name!r}",
            )
        mig = self._new_mig(p["project"], p["zone"], body)
        self.state.migs[key] = mig
        self.state.configs[key] = []
        size = int(mig.get("targetSize", 0))
        base = mig.get("baseInstanceName", name)
        self.state.instances[key] = [
            self._instance(p["project"], p["zone"], f"{base}-{secrets.token_hex(2)}", running=False)
            for _ in range(size)
        ]
        failing = self._take_failure()

        def finish() -> str | None:
            if failing:
                for table in (self.state.migs, self.state.instances, self.state.configs):
                    table.pop(key, None)
                return "ZONE_RESOURCE_POOL_EXHAUSTED (emulated stockout)"
            for instance in self.state.instances.get(key, []):
                instance.update(currentAction="NONE", instanceStatus="RUNNING")
            if size:
                self._hook(self.on_slice_up, name)
            return None

        return self._compute_operation(p["project"], p["zone"], "insert", mig["selfLink"], finish)

    def mig_instances(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        self._mig(p)
        return {"managedInstances": copy.deepcopy(self.state.instances[_key(p)])}

    def mig_configs(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        self._mig(p)
        return {"items": copy.deepcopy(self.state.configs[_key(p)])}

    def mig_create_instances(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        mig = self._mig(p)
        key = _key(p)
        wanted = list((body or {}).get("instances", []))
        if not wanted or any("name" not in i for i in wanted):
            raise ApiError(400, "INVALID_ARGUMENT", "createInstances needs instances with names")
        instances = [self._instance(p["project"], p["zone"], i["name"], running=False) for i in wanted]
        self.state.instances[key].extend(instances)
        self.state.configs[key].extend({**copy.deepcopy(i), "status": "EFFECTIVE"} for i in wanted)
        mig["targetSize"] = int(mig.get("targetSize", 0)) + len(wanted)

        def finish() -> str | None:
            for instance in instances:
                instance.update(currentAction="NONE", instanceStatus="RUNNING")
            self._hook(self.on_slice_up, p["name"])
            return None

        return self._compute_operation(p["project"], p["zone"], "createInstances", mig["selfLink"], finish)

    def compute_operation(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        key = f"{p['project']}/{p['zone']}/{p['name']}"
        if key not in self._operations:
            raise ApiError(404, "NOT_FOUND", f"operation {p['name']} not found")
        return self._maybe_finish(key)

    def instance_guest(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        attributes = self.guest_source(p["name"]) if self.guest_source is not None else None
        if attributes is None:
            attributes = self.guest.get(p["name"])
        query = q.get("queryPath", "")
        items = _entries(attributes or {}, query)
        if not items:
            # Compute answers 404 when nothing lies under the queried path.
            raise ApiError(404, "NOT_FOUND", f"The resource guest attributes under {query!r} were not found")
        return {
            "kind": "compute#guestAttributes",
            "queryPath": query,
            "queryValue": {"items": items},
            "selfLink": f"https://www.googleapis.com/compute/v1/projects/{p['project']}/zones/{p['zone']}"
            f"/instances/{p['name']}/getGuestAttributes",
        }

    def _node(self, p: dict[str, str]) -> dict[str, Any]:
        node = self.state.nodes.get(_key(p))
        if node is None:
            raise ApiError(404, "NOT_FOUND", f"node {p['name']} was not found")
        return node

    def _mig(self, p: dict[str, str]) -> dict[str, Any]:
        mig = self.state.migs.get(_key(p))
        if mig is None:
            raise ApiError(404, "NOT_FOUND", f"The resource instanceGroupManagers/{p['name']} was not found")
        return mig

    # ---- HTTP ---------------------------------------------------------------------------------

    def serve(self, method: str, target: str, headers: dict[str, str], raw: bytes) -> tuple[int, Any]:
        url = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if url.path == "/token" and method == "POST":
            return self._token({k: v[-1] for k, v in parse_qs(raw.decode()).items()})
        if url.path.startswith(ADMIN_PREFIX) and method == "POST":
            return self._admin(url.path[len(ADMIN_PREFIX) :], headers)
        route, params = _match(method, url.path)
        body: Any = None
        with self.lock:
            call = Call(method, url.path, query, route.method_id if route else None, None, 0, None)
            self.calls.append(call)
            try:
                if route is None:
                    raise ApiError(404, "NOT_FOUND", f"{method} {url.path} is not an emulated API method")
                authorization = headers.get("authorization", "")
                if not authorization.startswith("Bearer ") or authorization[7:] not in self.tokens:
                    raise ApiError(
                        401, "UNAUTHENTICATED", "Request is missing valid authentication credentials."
                    )
                body = json.loads(raw) if raw else None
                call.request = body
                status, answer = 200, getattr(self, route.handler)(params, query, body)
            except ApiError as exc:
                status, answer = exc.code, exc.body()
            except (ValueError, TypeError, KeyError) as exc:
                status, answer = 400, ApiError(400, "INVALID_ARGUMENT", f"bad request: {exc}").body()
            call.status, call.response = status, answer
            return status, answer

    def _admin(self, name: str, headers: dict[str, str]) -> tuple[int, Any]:
        """The simulator's own preemption request (not a Google API): needs `admin_token`."""
        given = headers.get(ADMIN_HEADER.lower(), "")
        if (
            self.admin_preempt is None
            or not self.admin_token
            or not secrets.compare_digest(given, self.admin_token)
        ):
            return 403, {
                "error": {"code": 403, "message": "not the simulator", "status": "PERMISSION_DENIED"}
            }
        try:
            return 200, {"preempted": name, "hosts": list(self.admin_preempt(name))}
        except KeyError as exc:
            return 404, {"error": {"code": 404, "message": str(exc.args[0]), "status": "NOT_FOUND"}}

    def _token(self, form: dict[str, str]) -> tuple[int, Any]:
        """RFC 7523 JWT-bearer grant, as Google's token endpoint takes it from a service account."""
        public = self._key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        try:
            if form.get("grant_type") != JWT_BEARER:
                raise ValueError(f"unsupported grant_type {form.get('grant_type')!r}")
            jwt.decode(
                form.get("assertion", ""),
                certs={self._key_id: public.decode()},
                audience=GOOGLE_TOKEN_AUDIENCE,
            )
        except (ValueError, google.auth.exceptions.GoogleAuthError) as exc:
            return 400, {"error": "invalid_grant", "error_description": str(exc)}
        token = f"emulated-{secrets.token_urlsafe(16)}"
        with self.lock:
            self.tokens.add(token)
        return 200, {"access_token": token, "expires_in": 3600, "token_type": "Bearer"}


def _finished(operation: _Operation) -> bool:
    return bool(operation.body.get("done")) or operation.body.get("status") == "DONE"


def _key(p: dict[str, str]) -> tuple[str, str, str]:
    return (p["project"], p["zone"], p["name"])


def _match(method: str, path: str) -> tuple[Route | None, dict[str, str]]:
    for route in ROUTES:
        if route.method == method and (found := route.pattern.match(path)):
            return route, found.groupdict()
    return None, {}


def _entries(attributes: dict[str, dict[str, str]], query: str) -> list[dict[str, str]]:
    """Entries under ``<namespace>/`` or ``<namespace>/<key>`` (empty query: all)."""
    namespace, _, key = query.partition("/")
    return [
        {"namespace": ns, "key": k, "value": v}
        for ns, values in sorted(attributes.items())
        for k, v in sorted(values.items())
        if (not namespace or ns == namespace) and (not key or k == key)
    ]


class _Handler(BaseHTTPRequestHandler):
    server: CloudApiEmulator
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        status, body = self.server.serve(self.command, self.path, headers, raw)
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, format: str, *args: object) -> None:
        return None


def main(argv: list[str] | None = None) -> None:
    """Serve the emulation on HOST:PORT until killed (the simulator starts it this way)."""
    parser = argparse.ArgumentParser(prog="python -m rayslice.local.cloud_api")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    server = CloudApiEmulator((args.host, args.port))
    print(server.url, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
