"""The emulated Cloud TPU v2 API: ``projects.locations.nodes`` get / list / delete / create /
getGuestAttributes, ``projects.locations.queuedResources`` get / create / delete (v2alpha1, the
version `rayslice.recovery.cloud.QUEUED_VERSION` reads them with) and
``projects.locations.operations.get``.

A queued resource is the twin's (`rayslice.cloud.twin.CloudTwin.create_queued_resource`): its
create's operation is done once the request is accepted, whether or not the zone has room for it;
it waits for capacity (`rayslice local capacity`), and fails at its deadline. A delete without
``force`` is refused (400 FAILED_PRECONDITION) while its node exists.

A create is refused, as Google refuses it (HTTP 400 INVALID_ARGUMENT), when its Node breaks one
of Google's rules (`rayslice.cloud.rules`, checked by the project's twin, `rayslice.cloud.twin`,
with the functions `rayslice preview` and the policy pack run): e.g. both ``networkConfig``
and ``networkConfigs``, which the tpu v2 discovery document says "are mutually exclusive ... If
both are specified, an error will be returned". The error names the node, the rule and source.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from rayslice.cloud.bodies import QUEUED_RESOURCE, TPU_NODE, Request
from rayslice.cloud.capacity import CapacityExhausted
from rayslice.cloud.twin.state import CloudRuleError, Create
from rayslice.local.google.cloud_api.project import EmulatedProject
from rayslice.local.google.cloud_api.routes import ApiError, guest_entries, resource_key


class TpuApi(EmulatedProject):
    """TPU nodes: seeded READY by `add_node`, or created and deleted through the API."""

    def add_node(self, project: str, zone: str, name: str, **fields: Any) -> dict[str, Any]:
        """A READY TPU node with `fields` (camelCase Node fields)."""
        with self.lock:
            return copy.deepcopy(self.state.create_node(project, zone, name, fields))

    def tpu_get(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        return copy.deepcopy(self._node(p))

    def tpu_list(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        nodes = [
            n for (pr, z, _), n in sorted(self.state.nodes.items()) if (pr, z) == (p["project"], p["zone"])
        ]
        return {"nodes": copy.deepcopy(nodes)}

    def tpu_delete(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        node = self._node(p)
        node["state"] = "DELETING"

        def finish() -> str | None:
            self.state.delete_node(p["project"], p["zone"], p["name"])
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
        path = f"projects/{p['project']}/locations/{p['zone']}/nodes/{name}"
        request = Request("tpu", "tpu.projects.locations.nodes.create", "Node", name, body or {})
        try:
            self.state.admit(Create(TPU_NODE, path, request, p["project"], p["zone"], None))
        except CloudRuleError as exc:
            raise ApiError(400, "INVALID_ARGUMENT", "; ".join(str(v) for v in exc.violations)) from exc
        try:
            node = self.state.create_node(p["project"], p["zone"], name, body or {})
        except CapacityExhausted as exc:
            message = str(exc)
            return self._tpu_operation(p["project"], p["zone"], "create", path, lambda: message)
        node["state"] = "CREATING"
        failing = self._take_failure()

        def finish() -> str | None:
            if failing:
                self.state.delete_node(*key)
                return "There is no more capacity in the zone (emulated stockout)"
            node["state"] = "READY"
            self._hook(self.on_slice_up, name)
            return None

        return self._tpu_operation(p["project"], p["zone"], "create", node["name"], finish)

    def queued_get(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        record = self.state.queued_resource(*resource_key(p))
        if record is None:
            raise ApiError(404, "NOT_FOUND", f"queued resource {p['name']} was not found")
        return record

    def queued_create(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        name = q.get("queuedResourceId", "")
        if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name):
            raise ApiError(400, "INVALID_ARGUMENT", f"invalid queuedResourceId {name!r}")
        if (p["project"], p["zone"], name) in self.state.queued:
            raise ApiError(409, "ALREADY_EXISTS", f"queued resource {name} already exists")
        path = f"projects/{p['project']}/locations/{p['zone']}/queuedResources/{name}"
        method = "tpu.projects.locations.queuedResources.create"
        request = Request("tpu-v2alpha1", method, "QueuedResource", name, body or {})
        try:
            self.state.admit(Create(QUEUED_RESOURCE, path, request, p["project"], p["zone"], None))
        except CloudRuleError as exc:
            raise ApiError(400, "INVALID_ARGUMENT", "; ".join(str(v) for v in exc.violations)) from exc
        self.state.create_queued_resource(p["project"], p["zone"], name, body or {})
        return self._tpu_operation(p["project"], p["zone"], "create", path, lambda: None)

    def queued_delete(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        record = self.state.queued_resource(*resource_key(p))
        if record is None:
            raise ApiError(404, "NOT_FOUND", f"queued resource {p['name']} was not found")
        force = q.get("force") == "true"
        if not force and any(n.get("queuedResource") == record["name"] for n in self.state.nodes.values()):
            raise ApiError(
                400, "FAILED_PRECONDITION", f"queued resource {p['name']} still has its node; use force"
            )

        def finish() -> str | None:
            self.state.delete_queued_resource(*resource_key(p), force=force)
            return None

        return self._tpu_operation(p["project"], p["zone"], "delete", record["name"], finish)

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
            answer.append({"queryPath": query, "queryValue": {"items": guest_entries(attributes, query)}})
        return {"guestAttributes": answer}

    def tpu_operation(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        key = f"projects/{p['project']}/locations/{p['zone']}/operations/{p['name']}"
        if key not in self._operations:
            raise ApiError(404, "NOT_FOUND", f"operation {key} not found")
        return self._maybe_finish(key)

    def _node(self, p: dict[str, str]) -> dict[str, Any]:
        node = self.state.nodes.get(resource_key(p))
        if node is None:
            raise ApiError(404, "NOT_FOUND", f"node {p['name']} was not found")
        return node
