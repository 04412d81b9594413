"""The emulated Compute Engine v1 API: ``instanceGroupManagers`` get / delete / insert / resize /
listManagedInstances / listPerInstanceConfigs / createInstances / deleteInstances /
deletePerInstanceConfigs, ``zoneOperations`` get / list (the preemptions) and
``instances.getGuestAttributes``.

A MIG create the zone has no capacity for (`rayslice.cloud.capacity`) is accepted and its
operation ends at once: an individual-mode MIG creates what the zone has and lists the rest as
still being created (each with its last attempt's ``ZONE_RESOURCE_POOL_EXHAUSTED``), a bulk MIG
waits with a placeholder per host (`rayslice.cloud.twin.compute`). A request whose run would end
before it starts is refused (400, the twin's rule). A createInstances or a resize that
bulk mode refuses, a createInstances naming an instance that exists, and a deleteInstances or
deletePerInstanceConfigs request the twin fails (`InstanceValidationError`: Google's discovery
document says "the operation fails") are accepted and their operation ends with the twin's
error, changing nothing. ``instanceGroupManagerResizeRequests.insert`` is served so that
a resize request on a bulk MIG is refused through the API too (the twin's rule
bulk-no-resize-request); no client of rayslice's sends one."""

from __future__ import annotations

import copy
from typing import Any

from rayslice.cloud.bodies import MIG, Request
from rayslice.cloud.states import PREEMPTED_OPERATION
from rayslice.cloud.twin.clock import TwinEventError
from rayslice.cloud.twin.compute import BulkModeError, DuplicateInstanceError, InstanceValidationError
from rayslice.cloud.twin.state import CloudRuleError, Create
from rayslice.local.google.cloud_api.project import EmulatedProject
from rayslice.local.google.cloud_api.routes import ApiError, guest_entries, resource_key

# "You can specify a maximum of 1000 instances with this method per request" (compute v1
# discovery document, instanceGroupManagers.deleteInstances).
MAX_DELETE_INSTANCES = 1000


class ComputeApi(EmulatedProject):
    """MIGs, their managed instances and per-instance configs (kept by the twin, `state`);
    instances' guest attributes."""

    def add_mig(self, project: str, zone: str, name: str, hosts: list[str], **fields: Any) -> None:
        """A MIG of RUNNING hosts named `hosts`, each with a per-instance config (as infra makes)."""
        with self.lock:
            mig = self.state.insert_mig(project, zone, {"name": name, **fields, "targetSize": 0})
            self.state.create_instances(project, zone, mig, [{"name": host} for host in hosts])

    def mig_get(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        mig = copy.deepcopy(self._mig(p))
        instances = self.state.instances[resource_key(p)]
        mig["currentActions"] = {
            "none": sum(1 for i in instances if i.get("currentAction") == "NONE"),
            "creating": sum(1 for i in instances if i.get("currentAction") == "CREATING"),
        }
        return mig

    def mig_delete(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        mig = self._mig(p)

        def finish() -> str | None:
            self.state.delete_mig(p["project"], p["zone"], p["name"])
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
        request = Request(
            "compute", "compute.instanceGroupManagers.insert", "InstanceGroupManager", name, body
        )
        try:
            self.state.admit(Create(MIG, name, request, p["project"], p["zone"], None))
        except CloudRuleError as exc:
            raise ApiError(400, "INVALID_ARGUMENT", "; ".join(str(v) for v in exc.violations)) from exc
        try:
            mig = self.state.insert_mig(p["project"], p["zone"], body)
        except TwinEventError as exc:
            raise ApiError(400, "INVALID_ARGUMENT", str(exc)) from exc
        created = self._existing(key[:2], self.state.instances[key])
        _creating(created)
        failing = self._take_failure()

        def finish() -> str | None:
            if failing:
                self.state.delete_mig(*key)
                return "ZONE_RESOURCE_POOL_EXHAUSTED (emulated stockout)"
            _running(created)
            if created:
                self._hook(self.on_slice_up, name)
            return None

        return self._compute_operation(p["project"], p["zone"], "insert", mig["selfLink"], finish)

    def mig_instances(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        self._mig(p)
        return {"managedInstances": copy.deepcopy(self.state.instances[resource_key(p)])}

    def mig_configs(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        self._mig(p)
        return {"items": copy.deepcopy(self.state.configs[resource_key(p)])}

    def mig_create_instances(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        mig = self._mig(p)
        wanted = list((body or {}).get("instances", []))
        if not wanted or any("name" not in i for i in wanted):
            raise ApiError(400, "INVALID_ARGUMENT", "createInstances needs instances with names")
        try:
            created = self.state.create_instances(p["project"], p["zone"], mig, wanted)
        except TwinEventError as exc:
            raise ApiError(400, "INVALID_ARGUMENT", str(exc)) from exc
        except (BulkModeError, DuplicateInstanceError) as exc:  # the operation fails, nothing created
            message = str(exc)
            return self._compute_operation(
                p["project"], p["zone"], "createInstances", mig["selfLink"], lambda: message
            )
        _creating(created)

        def finish() -> str | None:
            _running(created)
            if created:  # not when every instance still waits for a host (individual mode) or a bulk wait
                self._hook(self.on_slice_up, p["name"])
            return None

        return self._compute_operation(p["project"], p["zone"], "createInstances", mig["selfLink"], finish)

    def mig_delete_instances(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        """deleteInstances: the twin deletes the instances at once, so the hosts power off (its
        ``on_host_down``); the operation is a zone operation, as createInstances'. Deleting the
        MIG's last instances is the slice going down (`on_slice_down`, when the operation ends)."""
        mig = self._mig(p)
        wanted = [str(i) for i in (body or {}).get("instances") or []]
        if len(wanted) > MAX_DELETE_INSTANCES:
            raise ApiError(
                400, "INVALID_ARGUMENT", f"deleteInstances takes at most {MAX_DELETE_INSTANCES} instances"
            )
        skip = bool((body or {}).get("skipInstancesOnValidationError", False))
        try:
            deleted = self.state.delete_instances(
                p["project"], p["zone"], p["name"], wanted, skip_invalid=skip
            )
        except InstanceValidationError as exc:
            return self._failed(p, "deleteInstances", mig["selfLink"], exc)
        emptied = bool(deleted) and not self.state.instances[resource_key(p)]

        def finish() -> str | None:
            if emptied:
                self._hook(self.on_slice_down, p["name"])
            return None

        return self._compute_operation(p["project"], p["zone"], "deleteInstances", mig["selfLink"], finish)

    def mig_delete_configs(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        mig = self._mig(p)
        wanted = [str(n) for n in (body or {}).get("names") or []]
        try:
            self.state.delete_per_instance_configs(p["project"], p["zone"], p["name"], wanted)
        except InstanceValidationError as exc:
            return self._failed(p, "deletePerInstanceConfigs", mig["selfLink"], exc)
        return self._compute_operation(
            p["project"], p["zone"], "deletePerInstanceConfigs", mig["selfLink"], lambda: None
        )

    def mig_resize(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        """instanceGroupManagers.resize: the twin changes the target size at once; a bulk MIG
        that may not grow (`BulkModeError`) fails the operation, changing nothing, and one that
        waits for capacity has its target size set and no instance until the zone has them all."""
        mig = self._mig(p)
        try:
            size = int(q.get("size", ""))
        except ValueError:
            raise ApiError(400, "INVALID_ARGUMENT", "resize needs size, a number of instances") from None
        before = {r["name"] for r in self.state.instances[resource_key(p)]}
        try:
            self.state.resize_mig(p["project"], p["zone"], p["name"], size)
        except BulkModeError as exc:
            message = str(exc)
            return self._compute_operation(
                p["project"], p["zone"], "resize", mig["selfLink"], lambda: message
            )
        except TwinEventError as exc:
            raise ApiError(400, "INVALID_ARGUMENT", str(exc)) from exc
        records = self.state.instances[resource_key(p)]
        created = self._existing((p["project"], p["zone"]), [r for r in records if r["name"] not in before])
        _creating(created)
        emptied = bool(before) and not records

        def finish() -> str | None:
            _running(created)
            if created:
                self._hook(self.on_slice_up, p["name"])
            if emptied:
                self._hook(self.on_slice_down, p["name"])
            return None

        return self._compute_operation(p["project"], p["zone"], "resize", mig["selfLink"], finish)

    def resize_request_insert(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        """instanceGroupManagerResizeRequests.insert: the twin's request (accepted, waiting for
        capacity); on a bulk MIG refused with the twin's rule (bulk mode "does not support resize
        requests"), 400 and nothing created."""
        self._mig(p)
        wanted = dict(body or {})
        if not wanted.get("name") or not str(wanted.get("resizeBy", "")).isdigit():
            raise ApiError(400, "INVALID_ARGUMENT", "a resize request needs a name and resizeBy")
        try:
            record = self.state.insert_resize_request(p["project"], p["zone"], p["name"], wanted)
        except CloudRuleError as exc:
            raise ApiError(400, "INVALID_ARGUMENT", "; ".join(str(v) for v in exc.violations)) from exc
        return self._compute_operation(p["project"], p["zone"], "insert", record["selfLink"], lambda: None)

    def compute_operations(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        """zoneOperations.list: the operations Compute Engine recorded by itself (the twin's
        `preemptions`); only the filter on the preemption type is understood, any other filter is
        refused rather than misread."""
        wanted = q.get("filter", "")
        if wanted.replace(" ", "") not in ("", f'operationType="{PREEMPTED_OPERATION}"'):
            raise ApiError(400, "INVALID_ARGUMENT", f"the emulated zoneOperations.list filter {wanted!r}")
        return {
            "kind": "compute#operationList",
            "id": f"projects/{p['project']}/zones/{p['zone']}/operations",
            "items": self.state.preemptions(p["project"], p["zone"]),
            "selfLink": f"https://www.googleapis.com/compute/v1/projects/{p['project']}/zones/{p['zone']}/operations",
        }

    def _failed(self, p: dict[str, str], kind: str, target: str, exc: InstanceValidationError) -> Any:
        """The operation of a request Google accepts and then fails: it ends with the error."""
        message = str(exc)
        return self._compute_operation(p["project"], p["zone"], kind, target, lambda: message)

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
        items = guest_entries(attributes or {}, query)
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

    def _existing(self, where: tuple[str, str], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The managed instances of `records` whose instance exists (not one the MIG is still
        creating: a bulk wait's placeholder, an individual MIG's instance waiting for a host)."""
        return [r for r in records if (*where, r["name"]) in self.state.vms]

    def _mig(self, p: dict[str, str]) -> dict[str, Any]:
        mig = self.state.migs.get(resource_key(p))
        if mig is None:
            raise ApiError(404, "NOT_FOUND", f"The resource instanceGroupManagers/{p['name']} was not found")
        return mig


def _creating(records: list[dict[str, Any]]) -> None:
    """Managed instances an operation is still creating (no status until they exist)."""
    for record in records:
        record["currentAction"] = "CREATING"
        record.pop("instanceStatus", None)


def _running(records: list[dict[str, Any]]) -> None:
    for record in records:
        record.update(currentAction="NONE", instanceStatus="RUNNING")
