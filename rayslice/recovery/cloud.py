"""The Cloud TPU v2, Compute Engine v1 and GKE (container v1) calls that the recovery controller,
`rayslice status` and the program's dynamic providers (`rayslice.infra.tpu_vm.queued`) make,
each one method of `CloudClient`, on the REST plumbing of `rayslice.cloud.rest` (session, base
URLs and their overrides, errors mapped to `rayslice.errors`, paging, operation polling).

Every mutating call takes the set of names it may touch and refuses any other
(`RefusedResource`): the controller's own check is the first guard, this is the second.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import requests

from rayslice.cloud.rest import (
    COMPUTE_DEFAULT,
    COMPUTE_ENDPOINT_ENV,
    CONTAINER_DEFAULT,
    CONTAINER_ENDPOINT_ENV,
    TPU_DEFAULT,
    TPU_ENDPOINT_ENV,
    RestClient,
    endpoint,
    quote,
    tpu_operation_done,
    zone_operation_done,
)
from rayslice.cloud.states import PREEMPTED_OPERATION
from rayslice.errors import CloudError, InvalidInput
from rayslice.names import host_name, host_worker

# The Cloud TPU API version that reads, deletes and recreates queued resources: v2alpha1's
# QueuedResource is v2's plus the flex-start fields (provisioningModel, runDuration), so a
# request made through either reads back whole, and one recreated from it keeps its capacity.
QUEUED_VERSION = "v2alpha1"


class RefusedResource(InvalidInput):
    """A call would touch a resource that is not one of this cluster's slices: never sent."""


@dataclass(frozen=True)
class Location:
    """Where the cluster lives: its project and zone."""

    project: str
    zone: str


class CloudClient(RestClient):
    """The calls recovery, status and the providers make, each one method; responses are the
    API's JSON."""

    def __init__(
        self,
        session: requests.Session,
        location: Location,
        *,
        tpu_base: str | None = None,
        compute_base: str | None = None,
        container_base: str | None = None,
        environ: Mapping[str, str] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        poll_interval_s: float = 5.0,
    ):
        """Each API's base URL: the one given, else the endpoint override in `environ` (this
        process's environment when None; a found cluster's, `rayslice.clusters.CloudAccess`),
        else Google's (`rayslice.cloud.rest.endpoint`)."""
        super().__init__(session, sleep=sleep, poll_interval_s=poll_interval_s)
        self.location = location
        self.tpu_base = tpu_base or endpoint(TPU_ENDPOINT_ENV, TPU_DEFAULT, environ)
        self.compute_base = compute_base or endpoint(COMPUTE_ENDPOINT_ENV, COMPUTE_DEFAULT, environ)
        self.container_base = container_base or endpoint(CONTAINER_ENDPOINT_ENV, CONTAINER_DEFAULT, environ)

    # ---- plumbing ----------------------------------------------------------------------------

    def _tpu(self, path: str, version: str = "v2") -> str:
        loc = self.location
        return f"{self.tpu_base}{version}/projects/{quote(loc.project)}/locations/{quote(loc.zone)}/{path}"

    def _compute(self, path: str) -> str:
        loc = self.location
        return f"{self.compute_base}projects/{quote(loc.project)}/zones/{quote(loc.zone)}/{path}"

    def _container(self, cluster: str, path: str) -> str:
        loc = self.location
        return (
            f"{self.container_base}v1/projects/{quote(loc.project)}/locations/{quote(loc.zone)}"
            f"/clusters/{quote(cluster)}/{path}"
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
        return self.get_or_none(self._tpu(f"nodes/{quote(name)}"))

    def list_nodes(self) -> list[dict[str, Any]]:
        return self.pages("GET", self._tpu("nodes"), "nodes")

    def delete_node(self, name: str, allowed: Collection[str]) -> dict[str, Any]:
        self._guard(name, allowed)
        return self.request("DELETE", self._tpu(f"nodes/{quote(name)}"))

    def create_node(self, name: str, body: Mapping[str, Any], allowed: Collection[str]) -> dict[str, Any]:
        self._guard(name, allowed)
        return self.request("POST", self._tpu("nodes"), params={"nodeId": name}, body=dict(body))

    def node_guest_attributes(self, name: str, query_path: str, worker: int) -> list[dict[str, str]]:
        """One worker's guest attribute entries under `query_path` (namespace/key/value)."""
        try:
            answer = self.request(
                "POST",
                self._tpu(f"nodes/{quote(name)}:getGuestAttributes"),
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
        return self.get_or_none(self._tpu(f"queuedResources/{quote(name)}", QUEUED_VERSION))

    def create_queued_resource(
        self, name: str, body: Mapping[str, Any], allowed: Collection[str], *, version: str = QUEUED_VERSION
    ) -> dict[str, Any]:
        """queuedResources.create: a request that waits for capacity. `version`: the program sends
        v2 unless the request needs v2alpha1's fields (`rayslice.infra.tpu_vm.queued`); the
        controller recreates through `QUEUED_VERSION`, the version it read the request with."""
        self._guard(name, allowed)
        return self.request(
            "POST", self._tpu("queuedResources", version), params={"queuedResourceId": name}, body=dict(body)
        )

    def delete_queued_resource(self, name: str, allowed: Collection[str], *, force: bool) -> dict[str, Any]:
        """queuedResources.delete; `force` deletes its node first."""
        self._guard(name, allowed)
        params = {"force": "true"} if force else None
        return self.request(
            "DELETE", self._tpu(f"queuedResources/{quote(name)}", QUEUED_VERSION), params=params
        )

    def wait_tpu_operation(self, operation: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
        """Polls a TPU long-running operation until done or `timeout_s`; returns its last state."""
        return self.wait(
            operation, timeout_s, done=tpu_operation_done, url=lambda op: f"{self.tpu_base}v2/{op['name']}"
        )

    # ---- GKE (container.v1.json: projects.locations.clusters.nodePools) ----------------------

    def get_node_pool(self, cluster: str, name: str) -> dict[str, Any] | None:
        """The node pool of the zonal cluster `cluster`, or None when it does not exist."""
        return self.get_or_none(self._container(cluster, f"nodePools/{quote(name)}"))

    # ---- Compute Engine v1 (compute.v1.json: instanceGroupManagers, zoneOperations, instances) -

    def get_mig(self, name: str) -> dict[str, Any] | None:
        return self.get_or_none(self._compute(f"instanceGroupManagers/{quote(name)}"))

    def list_managed_instances(self, name: str) -> list[dict[str, Any]]:
        return self._paged(f"instanceGroupManagers/{quote(name)}/listManagedInstances", "managedInstances")

    def list_per_instance_configs(self, name: str) -> list[dict[str, Any]]:
        return self._paged(f"instanceGroupManagers/{quote(name)}/listPerInstanceConfigs", "items")

    def list_resize_requests(self, name: str) -> list[dict[str, Any]]:
        """instanceGroupManagerResizeRequests.list: the MIG's resize requests."""
        return self._paged(f"instanceGroupManagers/{quote(name)}/resizeRequests", "items", method="GET")

    def resize_mig(self, name: str, size: int, allowed: Collection[str]) -> dict[str, Any]:
        """instanceGroupManagers.resize (``size``, a query parameter: "The number of running
        instances that the managed instance group should maintain at any given time", compute v1
        discovery). A bulk MIG (flex-start) grows only from 0 and shrinks by a resize to 0
        (Compute Engine, "About bulk mode")."""
        self._guard(name, allowed)
        return self.request(
            "POST", self._compute(f"instanceGroupManagers/{quote(name)}/resize"), params={"size": str(size)}
        )

    def list_preemptions(self) -> list[dict[str, Any]]:
        """zoneOperations.list of the zone's Spot preemptions (``operationType =
        "compute.instances.preempted"``, the filter of Google's sample "List preemption history",
        compute_preemptible_history), oldest first: each names the instance in ``targetLink``."""
        params = {"filter": f'operationType="{PREEMPTED_OPERATION}"'}
        return self.pages("GET", self._compute("operations"), "items", params)

    def _paged(self, path: str, field: str, method: str = "POST") -> list[dict[str, Any]]:
        return self.pages(method, self._compute(path), field)

    def delete_mig(self, name: str, allowed: Collection[str]) -> dict[str, Any]:
        self._guard(name, allowed)
        return self.request("DELETE", self._compute(f"instanceGroupManagers/{quote(name)}"))

    def insert_mig(self, body: Mapping[str, Any], allowed: Collection[str]) -> dict[str, Any]:
        self._guard(str(body.get("name")), allowed)
        return self.request("POST", self._compute("instanceGroupManagers"), body=dict(body))

    def create_instances(
        self, name: str, instances: list[Mapping[str, Any]], allowed: Collection[str]
    ) -> dict[str, Any]:
        self._guard(name, allowed)
        return self.request(
            "POST",
            self._compute(f"instanceGroupManagers/{quote(name)}/createInstances"),
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
        sources (`rayslice.cloud.twin.compute`'s docstring): after the operation, list the MIG's configs and
        pass any of these names still there to `delete_per_instance_configs`."""
        self._guard_hosts(mig, instance_names, allowed)
        return self._delete_instances(mig, instance_names, skip_missing)

    def _delete_instances(
        self, mig: str, instance_names: Sequence[str], skip_missing: bool
    ) -> dict[str, Any]:
        zone = self.location.zone
        body = {
            "instances": [f"zones/{quote(zone)}/instances/{name}" for name in instance_names],
            "skipInstancesOnValidationError": skip_missing,
        }
        return self.request(
            "POST", self._compute(f"instanceGroupManagers/{quote(mig)}/deleteInstances"), body=body
        )

    def delete_per_instance_configs(
        self, mig: str, instance_names: Sequence[str], allowed: Collection[str]
    ) -> dict[str, Any]:
        """instanceGroupManagers.deletePerInstanceConfigs of these hosts of `mig` (body ``names``,
        InstanceGroupManagersDeletePerInstanceConfigsReq). Name only configs that
        `list_per_instance_configs` returned: what Google answers for a name without one is not
        documented (the twin fails the operation)."""
        self._guard_hosts(mig, instance_names, allowed)
        return self.request(
            "POST",
            self._compute(f"instanceGroupManagers/{quote(mig)}/deletePerInstanceConfigs"),
            body={"names": list(instance_names)},
        )

    def instance_guest_attributes(self, instance: str, query_path: str) -> list[dict[str, str]]:
        """An instance's guest attribute entries under `query_path`; [] when there are none."""
        try:
            answer = self.request(
                "GET",
                self._compute(f"instances/{quote(instance)}/getGuestAttributes"),
                params={"queryPath": query_path},
            )
        except CloudError as exc:
            if exc.status == 404:  # no attribute under that path yet, or no such instance
                return []
            raise
        return list(answer.get("queryValue", {}).get("items", []))

    def wait_zone_operation(self, operation: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
        """Polls a zonal Compute operation until status DONE or `timeout_s`; returns its last state."""
        return self.wait(
            operation,
            timeout_s,
            done=zone_operation_done,
            url=lambda op: self._compute(f"operations/{quote(op['name'])}"),
        )


def managed_instance_name(instance: Mapping[str, Any]) -> str:
    """A MIG's managed instance's name: ``name`` where the answer has it, else the last part of its
    ``instance`` URL (compute v1 ManagedInstance); "" when it has neither."""
    return str(instance.get("name") or str(instance.get("instance", "")).rsplit("/", 1)[-1])
