"""The twin's GKE (container v1): node pools, whose nodes are the Compute Engine instances of one
MIG each (`rayslice.cloud.twin.compute`).

- GKE node pools (container v1 discovery document, NodePool): each pool's nodes are Compute
  Engine instances of one MIG, which the pool names in ``instanceGroupUrls`` ("The resource URLs
  of the managed instance groups associated with this node pool"), made from an instance
  template of the pool's machine type (both named ``gke-<cluster>-<pool>`` by the twin; GKE adds
  a hash, and nothing reads the names, only the URLs). A pool of ``initialNodeCount`` nodes is a
  direct create: in a zone without room for all of them it is kept in ERROR with a
  ``GCE_STOCKOUT`` condition, creates no node, and its create fails with the message GKE gives
  ("Not all instances running in IGM ... [GCE_STOCKOUT] ... does not have enough resources
  available to fulfill the request"; "GCP behavior is to create a node pool in error state",
  magic-modules pull request 5225, which is why the provider records such a pool). Google's MIG
  goes on retrying; the twin does not. A flex-start pool (``config.flexStart``) is RUNNING with
  no node and waits, as a resize request does, for the zone to have all
  ``autoscaling.totalMaxNodeCount`` nodes; then its MIG creates them at once (GKE, "About
  flex-start provisioning mode": GKE "provisions VMs ... when capacity becomes available"; the
  twin stands in for the cluster autoscaler, which grows the pool for the RayCluster's pending
  TPU pods). Deleting a pool deletes its MIG, gives its nodes back and withdraws its wait.

What happens to a pool's nodes (the events of the capacity table's gke cells):

- A node that fails, or whose host goes into maintenance (`fail_node_pool`): a multi-host TPU
  slice node pool is one atomic unit, and "when one node needs repair GKE shuts down every TPU VM
  of the slice" (Cloud TPU, "Introduction to TPUs in GKE",
  https://cloud.google.com/tpu/docs/tpus-in-gke): every node of the pool stops (TERMINATED),
  and the nodes' MIG does not recreate them one by one. GKE's auto-repair then brings the slice
  back whole (`repair_node_pool`), only where the pool has it on (container v1 discovery,
  NodeManagement.autoRepair: "If enabled, the nodes in this node pool will be monitored and, if
  they fail health checks too many times, an automatic repair action will be triggered"), which is
  on unless the pool's create turned it off (GKE, "Auto-repair nodes",
  https://cloud.google.com/kubernetes-engine/docs/how-to/node-auto-repair: "In Standard clusters,
  node auto-repair is enabled by default for new node pools"); with it off (flex-start pools, as
  xpk makes them: ``--no-enable-autorepair``) the nodes stay down.
- A Spot preemption (`preempt_node_pool`): the twin's preemption of the pool's MIG
  (`rayslice.cloud.twin.compute`: recorded as a ``compute.instances.preempted`` operation), whose
  lifecycle policy recreates the nodes (the twin's pool MIGs keep the default, REPAIR; no source
  read says which policy GKE gives the MIGs of its TPU node pools).
- The end of a flex-start run (`end_node_pool_run`): "The maximum duration for the nodes to
  exist" (container v1 discovery, NodeConfig.maxRunDuration) has passed: the pool's nodes are
  deleted (its MIG resized to 0, the hosts given back); the pool stays. It is on the twin's
  schedule from the moment the nodes are made (`rayslice.cloud.twin.clock`).
- A failed node's Compute Engine instance is not restarted by Compute Engine in the twin: the
  slice's repair is GKE's (`repair_node_pool`).
- The bill (`rayslice.cloud.billing`): each node as the Compute Engine VM it is (Spot or
  flex-start per NodeConfig.spot / flexStart), and GKE's management fee per cluster while the
  twin holds a pool of it.
"""

from __future__ import annotations

import copy
from typing import Any

from rayslice.cloud import billing, bodies
from rayslice.cloud.billing import Line
from rayslice.cloud.capacity import CapacityExhausted
from rayslice.cloud.capacity import Request as CapacityRequest
from rayslice.cloud.rules import FLEX_START, SPOT
from rayslice.cloud.states import GCE_STOCKOUT, POOL_ERROR, POOL_RUNNING
from rayslice.cloud.twin.compute import API_ROOT, ComputeTwin
from rayslice.cloud.twin.state import Create, TwinHost, rfc3339, short_name

CONTAINER_API_ROOT = "https://container.googleapis.com/v1/"
STANDARD = "STANDARD"  # Scheduling.provisioningModel of a VM that is neither Spot nor flex-start


class ContainerTwin(ComputeTwin):
    """The project's GKE node pools, over its Compute Engine (see the module docstring)."""

    def __init__(self, default_range: str | None = None, address_range: str | None = None) -> None:
        super().__init__(default_range, address_range)
        # GKE node pools by (project, location, cluster, pool), as nodePools.get returns them;
        # the instance templates the twin makes for their MIGs (by link), and each flex-start
        # pool's wait for capacity.
        self.node_pools: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self.pool_templates: dict[str, dict[str, Any]] = {}
        self._pool_waits: dict[tuple[str, str, str, str], CapacityRequest] = {}

    def _create(self, call: Create) -> dict[str, Any]:
        """Node pools (`target` is the pool's cluster)."""
        if call.type_token == bodies.NODE_POOL:
            body = call.request.body["nodePool"]
            self.create_node_pool(call.project, str(call.zone), short_name(call.target), body)
            return {}
        return super()._create(call)

    def _template_of(self, mig: dict[str, Any]) -> dict[str, Any] | None:
        """A node pool's MIG takes its hosts from the template the twin made for the pool."""
        found = super()._template_of(mig)
        if found is not None:
            return found
        made = (self.pool_templates.get(str(v.get("instanceTemplate"))) for v in mig.get("versions", []))
        return next((t for t in made if t is not None), None)

    def create_node_pool(
        self, project: str, location: str, cluster: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """nodePools.create: the pool, its instance template and its MIG, then its nodes (see the
        module docstring). A fixed pool the zone has no room for is kept in ERROR and
        `CapacityExhausted` is raised, as the create's operation fails."""
        pool = copy.deepcopy(body)
        name = str(pool["name"])
        key = (project, location, cluster, name)
        zone = str((pool.get("locations") or [location])[0])
        config = pool.get("config") or {}
        base = f"gke-{cluster}-{name}"
        template = f"{API_ROOT}projects/{project}/global/instanceTemplates/{base}"
        self.pool_templates[template] = {
            "properties": {
                "machineType": config.get("machineType", ""),
                "labels": dict(config.get("resourceLabels") or {}),
                # What the pool's nodes are billed as (NodeConfig.spot, flexStart).
                "scheduling": {"provisioningModel": _provisioning(config)},
            }
        }
        mig = self.insert_mig(
            project,
            zone,
            {"name": f"{base}-grp", "baseInstanceName": base, "versions": [{"instanceTemplate": template}]},
        )
        mig["creationTimestamp"] = rfc3339(self.clock.now)
        pool.update(
            selfLink=f"{CONTAINER_API_ROOT}projects/{project}/locations/{location}/clusters/{cluster}"
            f"/nodePools/{name}",
            instanceGroupUrls=[mig["selfLink"]],
            status=POOL_RUNNING,
        )
        self.node_pools[key] = pool

        def grow(count: int) -> None:
            self._add_auto_named(project, zone, mig, count)
            mig["targetSize"] = int(mig.get("targetSize", 0)) + count
            run = config.get("maxRunDuration")
            if count and run:
                seconds = float(str(run).removesuffix("s"))
                self.after(
                    seconds, f"node pool {name}'s maxRunDuration ends", lambda: self._pool_run_ends(key, pool)
                )

        if config.get("flexStart"):
            scaling = pool.get("autoscaling") or {}
            hosts = int(scaling.get("totalMaxNodeCount") or scaling.get("maxNodeCount") or 0)
            wait = CapacityRequest(
                f"{cluster}/{name}", zone, self._machine_of(mig), hosts, None, lambda: grow(hosts)
            )
            self._pool_waits[key] = wait
            self.capacity.submit(wait, self.clock.now)
            return pool
        count = int(pool.get("initialNodeCount") or 0)
        try:
            self.capacity.take(zone, self._machine_of(mig), count)
        except CapacityExhausted:
            message = (
                f"Google Compute Engine: Not all instances running in IGM. Expected {count}, running 0. "
                f"Current errors: [{GCE_STOCKOUT}]: The zone 'projects/{project}/zones/{zone}' does not "
                "have enough resources available to fulfill the request. Try a different zone, or try "
                "again later"
            )
            pool.update(
                status=POOL_ERROR,
                statusMessage=message,
                conditions=[
                    {"code": GCE_STOCKOUT, "canonicalCode": "RESOURCE_EXHAUSTED", "message": message}
                ],
            )
            raise
        grow(count)
        return pool

    def delete_node_pool(self, project: str, location: str, cluster: str, name: str) -> None:
        """nodePools.delete: its MIG and nodes (capacity given back), its wait withdrawn."""
        key = (project, location, cluster, name)
        pool = self.node_pools.pop(key, None)
        wait = self._pool_waits.pop(key, None)
        if wait is not None:
            self.capacity.cancel(wait)
        for zone, mig in _migs_of(pool or {}):
            self.delete_mig(project, zone, mig)

    def node_pools_of(self, project: str, location: str, cluster: str) -> list[dict[str, Any]]:
        """nodePools.list: the cluster's pools, by name."""
        return [
            copy.deepcopy(pool)
            for (p, loc, c, _), pool in sorted(self.node_pools.items())
            if (p, loc, c) == (project, location, cluster)
        ]

    # ---- the bill ------------------------------------------------------------------------------

    def _bill_lines(self) -> list[Line]:
        """GKE's management fee of each cluster that holds a node pool (the twin keeps no
        cluster of its own: a cluster is billed while the twin holds a pool of it); the pools'
        nodes bill as their MIG's instances (`ComputeTwin._bill_lines`)."""
        clusters = sorted({(p, loc, c) for (p, loc, c, _) in self.node_pools})
        fee = billing.gke_fee_per_hour()
        lines = [Line(f"projects/{p}/locations/{loc}/clusters/{c}", 0, fee) for p, loc, c in clusters]
        return [*lines, *super()._bill_lines()]

    # ---- what happens to a pool's nodes ----------------------------------------------------------

    def fail_node_pool(self, project: str, location: str, cluster: str, name: str) -> list[TwinHost]:
        """A node of pool `name` failed, or its host went into maintenance: GKE shuts the whole
        slice down, every node TERMINATED (module docstring). The nodes it hit, as they were."""
        pool = self.node_pools[(project, location, cluster, name)]
        return [
            h
            for zone, mig in _migs_of(pool)
            for h in self.host_error(project, zone, mig, repair=False, restart=False)
        ]

    def repair_node_pool(self, project: str, location: str, cluster: str, name: str) -> bool:
        """GKE's auto-repair of pool `name`: its stopped nodes run again, whole, where the pool
        has auto-repair on (module docstring); whether it did."""
        pool = self.node_pools[(project, location, cluster, name)]
        if not (pool.get("management") or {}).get("autoRepair", True):
            return False
        for zone, mig in _migs_of(pool):
            self.recover(project, zone, mig)
        return True

    def preempt_node_pool(self, project: str, location: str, cluster: str, name: str) -> list[TwinHost]:
        """A Spot preemption of pool `name`'s nodes (module docstring); the nodes it hit, as they
        were."""
        pool = self.node_pools[(project, location, cluster, name)]
        return [h for zone, mig in _migs_of(pool) for h in self.preempt(project, zone, mig)]

    def _pool_run_ends(self, key: tuple[str, str, str, str], pool: dict[str, Any]) -> None:
        """Pool `pool`'s nodes reached their ``maxRunDuration`` (scheduled when they were made):
        `end_node_pool_run`, unless the pool was deleted (or made anew) meanwhile."""
        if self.node_pools.get(key) is pool:
            self.end_node_pool_run(*key)

    def end_node_pool_run(self, project: str, location: str, cluster: str, name: str) -> None:
        """Pool `name`'s nodes reached their ``maxRunDuration``: they are deleted, the pool stays
        (module docstring)."""
        pool = self.node_pools[(project, location, cluster, name)]
        for zone, mig in _migs_of(pool):
            self.resize_mig(project, zone, mig, 0)


def _provisioning(config: dict[str, Any]) -> str:
    """The Compute Engine provisioning model of a node pool's nodes (container v1 discovery,
    NodeConfig.spot "Spot flag for enabling Spot VM", flexStart "Flex Start flag for enabling
    Flex Start VM")."""
    if config.get("spot") or config.get("preemptible"):
        return SPOT
    return FLEX_START if config.get("flexStart") else STANDARD


def _migs_of(pool: dict[str, Any]) -> list[tuple[str, str]]:
    """The (zone, name) of each MIG a node pool names in ``instanceGroupUrls``."""
    found = []
    for url in pool.get("instanceGroupUrls", []):
        parts = str(url).split("/")
        found.append((parts[parts.index("zones") + 1], short_name(url)))
    return found
