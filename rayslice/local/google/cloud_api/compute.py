"""The emulated Compute Engine v1 API: ``instanceGroupManagers`` get / delete / insert /
listManagedInstances / listPerInstanceConfigs / createInstances, ``zoneOperations.get`` and
``instances.getGuestAttributes``."""

from __future__ import annotations

import copy
import secrets
from typing import Any

from rayslice.local.google.cloud_api.project import EmulatedProject
from rayslice.local.google.cloud_api.routes import ApiError, guest_entries, resource_key


class ComputeApi(EmulatedProject):
    """MIGs, their managed instances and per-instance configs; instances' guest attributes."""

    def add_mig(self, project: str, zone: str, name: str, hosts: list[str], **fields: Any) -> None:
        """A MIG of RUNNING hosts named `hosts`, each with a per-instance config (as infra makes)."""
        with self.lock:
            key = (project, zone, name)
            self.state.migs[key] = self._new_mig(
                project, zone, {"name": name, **fields, "targetSize": len(hosts)}
            )
            self.state.configs[key] = [{"name": host, "status": "EFFECTIVE"} for host in hosts]
            self.state.instances[key] = [self._instance(project, zone, host) for host in hosts]

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
        key = resource_key(p)

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
        return {"managedInstances": copy.deepcopy(self.state.instances[resource_key(p)])}

    def mig_configs(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        self._mig(p)
        return {"items": copy.deepcopy(self.state.configs[resource_key(p)])}

    def mig_create_instances(self, p: dict[str, str], q: dict[str, str], body: Any) -> Any:
        mig = self._mig(p)
        key = resource_key(p)
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

    def _mig(self, p: dict[str, str]) -> dict[str, Any]:
        mig = self.state.migs.get(resource_key(p))
        if mig is None:
            raise ApiError(404, "NOT_FOUND", f"The resource instanceGroupManagers/{p['name']} was not found")
        return mig
