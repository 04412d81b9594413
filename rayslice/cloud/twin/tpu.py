"""The twin's Cloud TPU API: TPU nodes and queued resources, and what happens to them (a Spot
preemption, the end of a flex-start run).

Behaviour, by source:

- A node has one network endpoint per host of its shape (the catalog's), each with an address of
  its subnetwork; its hosts serve the attributes of `rayslice.platforms.TPU_API_ATTRIBUTES`
  (`rayslice.cloud.twin.state.google_attributes`).
- A Spot preemption turns a node PREEMPTED (tpu v2 discovery document, Node.state); nothing comes
  back unless someone recreates it ("Request TPU Spot VMs": "To restart a Spot VMs instance or
  MIG, you must delete and then recreate it"). A queued node's request turns SUSPENDED, and a
  preempted node's hosts stay with Google when it is deleted (`rayslice.cloud.capacity`).
- A queued resource (queuedResources.create; `rayslice.cloud.capacity`, sources there) is
  accepted at once, WAITING while the zone lacks room for its node, creates the node whole when
  the room comes (ACTIVE), and turns FAILED once its ``queueingPolicy.validUntilDuration`` has
  passed. A delete of a request whose node exists needs ``force`` (tpu v2alpha1 discovery
  document, queuedResources.delete ``force``: "all running nodes belonging to this queued
  resource will be deleted first"; without it "the queued resource will only be deleted if its
  nodes have already been deleted").
- A flex-start queued resource whose run duration ends: its node is deleted and the request turns
  SUSPENDED (Cloud TPU, "Request Cloud TPUs using flex-start": when the run duration ends "the
  TPU VMs are deleted and the queued resource moves to the SUSPENDED state"; `end_run`).

Over time (`rayslice.cloud.twin.clock`), by the states of the tpu v2 discovery document
(QueuedResourceState.state, Node.state):

- A queued resource is WAITING_FOR_RESOURCES until the zone has room; then PROVISIONING ("The
  associated resources are currently being provisioned") for `Timings.queued_provisioning_s`
  with its node CREATING, then ACTIVE with its node READY. Its ``validUntilDuration`` deadline is
  on the schedule: it turns FAILED then, whether or not anyone reads it. Its run
  (``runDuration.maxRunDuration``, v2alpha1) ends that long after it turned ACTIVE; a run of 0 s
  or less, or `end_run` on a request that never turned ACTIVE, is refused (`TwinEventError`, rule
  run-ends-after-it-starts). Losing its node to the service (a preemption, the end of a run)
  makes it SUSPENDING ("The resources ... are being deleted ... initiated by ... the Cloud TPU
  service") for `Timings.queued_suspending_s`, then SUSPENDED.
- A host error on a node (`node_host_error`) makes it REPAIRING ("being repaired and may be
  unusable"); the repair ends READY, or, when it fails, UNKNOWN ("unknown state after a failed
  repair"), which nothing brings back.
- The bill (`rayslice.cloud.billing`): a READY node's hosts at its generation's per-chip price
  for its capacity; a node in any other state, and a queued request, bill nothing.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from rayslice import catalog
from rayslice.cloud import billing, bodies
from rayslice.cloud.billing import Line
from rayslice.cloud.bodies import TPU_ACCELERATOR_TYPES
from rayslice.cloud.capacity import ACTIVE, FAILED, PROVISIONING, SUSPENDED, SUSPENDING, WAITING
from rayslice.cloud.capacity import Request as CapacityRequest
from rayslice.cloud.states import NODE_CREATING, NODE_PREEMPTED, NODE_READY, NODE_REPAIRING, NODE_UNKNOWN
from rayslice.cloud.twin.clock import NoSuchResource, TwinEventError
from rayslice.cloud.twin.state import (
    DELETED,
    TPU_WORKER,
    Create,
    TwinHost,
    TwinState,
    google_attributes,
    rfc3339,
)
from rayslice.errors import InvalidInput
from rayslice.platforms import TPU_API_ATTRIBUTES

DEADLINE_EXCEEDED = 4  # google.rpc.Code of a queued resource whose deadline passed (the twin's choice)
_API_GENERATIONS = {api: generation for generation, api in TPU_ACCELERATOR_TYPES.items()}


class TpuTwin(TwinState):
    """The project's Cloud TPU resources (see the module docstring)."""

    def __init__(self, default_range: str | None = None, address_range: str | None = None) -> None:
        super().__init__(default_range, address_range)
        self.nodes: dict[tuple[str, str, str], dict[str, Any]] = {}
        # TPU queued resources as Google returns them, by (project, zone, queued resource id).
        self.queued: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._queued_waits: dict[int, CapacityRequest] = {}  # id(queued resource record) -> its wait

    def _precheck(self, call: Create, urn: str | None) -> None:
        key = (call.project, str(call.zone), call.resource_name)
        held = {bodies.TPU_NODE: key in self.nodes, bodies.QUEUED_RESOURCE: key in self.queued}
        if held.get(call.type_token):
            self.already_exists(call, urn)
        super()._precheck(call, urn)

    def _create(self, call: Create) -> dict[str, Any]:
        """Queued resources and nodes."""
        if call.type_token == bodies.QUEUED_RESOURCE:
            record = self.create_queued_resource(
                call.project, str(call.zone), call.resource_name, call.request.body
            )
            return {"state": record["state"]["state"]}
        if call.type_token == bodies.TPU_NODE:
            node = self.create_node(call.project, str(call.zone), call.resource_name, call.request.body)
            return {
                "networkEndpoints": [
                    {"ipAddress": e["ipAddress"], "port": e.get("port", 8470)}
                    for e in node["networkEndpoints"]
                ]
            }
        return super()._create(call)

    def create_node(
        self,
        project: str,
        zone: str,
        name: str,
        body: dict[str, Any],
        *,
        taken: bool = False,
        ready: bool = True,
    ) -> dict[str, Any]:
        """nodes.create: a node with one network endpoint per host of its shape. `taken`: its
        hosts were already taken from the zone (by the queued resource that creates it).
        Without `ready` it is CREATING, its hosts not up yet (`_node_ready` ends that)."""
        node = copy.deepcopy(body)
        node.update(
            name=f"projects/{project}/locations/{zone}/nodes/{name}",
            id=str(next(self._ids)),
            createTime="2026-01-01T00:00:00Z",
            apiVersion="V2",
            state=NODE_READY if ready else NODE_CREATING,
        )
        config = body.get("networkConfig") or (body.get("networkConfigs") or [{}])[0]
        subnet = self._subnet(config.get("subnetwork"))
        hosts = node_hosts(body)
        if not taken:
            self.capacity.take(zone, node_kind(body), hosts)
        if "networkEndpoints" not in node:
            node["networkEndpoints"] = [
                {"ipAddress": subnet.take() if subnet else "", "port": 8470} for _ in range(hosts)
            ]
        self.nodes[(project, zone, name)] = node
        if ready:
            self._node_ready((project, zone, name))
        return node

    def _node_ready(self, key: tuple[str, str, str]) -> None:
        """Node `key` is READY: its hosts are up."""
        self.nodes[key]["state"] = NODE_READY
        for host in self._node_hosts(key):
            self._call(self.on_host_up, host)

    def delete_node(self, project: str, zone: str, name: str) -> None:
        hosts = self._node_hosts((project, zone, name))
        node = self.nodes.pop((project, zone, name), None)
        for host in hosts:
            self._call(self.on_host_down, replace(host, status=DELETED))
        if node is not None and node.get("state") != NODE_PREEMPTED:  # a preempted node's stay with Google
            self.capacity.give_back(zone, node_kind(node), len(hosts), self.clock.now)

    def create_queued_resource(
        self, project: str, zone: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """queuedResources.create: accepted at once, fulfilled whole when the zone has room for
        its node, FAILED past its deadline (see the module docstring). Returns the request as
        Google does."""
        now = self.clock.now
        path = f"projects/{project}/locations/{zone}/queuedResources/{name}"
        record = {
            **copy.deepcopy(body),
            "name": path,
            "createTime": rfc3339(now),
            "state": {"state": WAITING},
        }
        run = _run_seconds(body)  # refused (TwinEventError) before anything is made
        node = bodies.queued_node(body)
        node_id = str(((body.get("tpu") or {}).get("nodeSpec") or [{}])[0].get("nodeId") or name)
        duration = (body.get("queueingPolicy") or {}).get("validUntilDuration")
        deadline = now + float(str(duration).removesuffix("s")) if duration else None

        key = (project, zone, name)

        def active() -> None:
            if self.queued.get(key) is not record or (project, zone, node_id) not in self.nodes:
                return  # deleted while it was provisioning
            self._node_ready((project, zone, node_id))
            record["state"] = {"state": ACTIVE}
            if run is not None:
                self.after(
                    run,
                    f"queued resource {name}'s run duration ends",
                    lambda: self._queued_run_ends(key, record),
                )

        def fulfil() -> None:
            provisioning = self.timings.queued_provisioning_s
            self.create_node(
                project, zone, node_id, {**node, "queuedResource": path}, taken=True, ready=False
            )
            if provisioning > 0:
                record["state"] = {"state": PROVISIONING}
                self.after(provisioning, f"queued resource {name} is provisioned", active)
            else:
                active()

        wait = CapacityRequest(
            f"queuedResources/{name}", zone, node_kind(node), node_hosts(node), deadline, fulfil
        )
        self.queued[key] = record
        self._queued_waits[id(record)] = wait
        if deadline is not None:  # validUntilDuration: FAILED if still waiting then
            self.at(deadline, f"queued resource {name}'s deadline", lambda: self._expire(record))
        self.capacity.submit(wait, now)
        self._sync(record)
        return record

    def _expire(self, record: dict[str, Any]) -> None:
        """A queued resource's deadline: the capacity's waits past theirs fail, and so does it
        if it still waits (`_sync`)."""
        self.capacity.advance(self.clock.now)
        self._sync(record)

    def _queued_run_ends(self, key: tuple[str, str, str], record: dict[str, Any]) -> None:
        """The run duration of queued resource `key` ended (scheduled when it turned ACTIVE):
        `end_run`, unless it was deleted or already suspended meanwhile."""
        if self.queued.get(key) is record and record["state"]["state"] == ACTIVE:
            self.end_run(*key)

    def _sync(self, record: dict[str, Any]) -> None:
        """A waiting queued resource whose request failed (its deadline passed) turns FAILED."""
        wait = self._queued_waits.get(id(record))
        if wait is not None and wait.state == FAILED and record["state"]["state"] == WAITING:
            message = f"the queued resource could not be provisioned in time: {wait.reason}"
            record["state"] = {
                "state": FAILED,
                "failedData": {"error": {"code": DEADLINE_EXCEEDED, "message": message}},
            }

    def queued_resource(self, project: str, zone: str, name: str) -> dict[str, Any] | None:
        """queuedResources.get at the twin's clock; None when there is no such request."""
        if (project, zone, name) not in self.queued:
            return None
        self.capacity.advance(self.clock.now)
        record = self.queued[(project, zone, name)]
        self._sync(record)
        return copy.deepcopy(record)

    def delete_queued_resource(self, project: str, zone: str, name: str, *, force: bool = False) -> None:
        """queuedResources.delete: a waiting request is withdrawn; one whose node exists needs
        `force`, which deletes the node first (InvalidInput otherwise, nothing deleted)."""
        key = (project, zone, name)
        record = self.queued.get(key)
        if record is None:
            raise KeyError(f"no queued resource {name} in {project}/{zone}")
        node_key = next((k for k, n in self.nodes.items() if n.get("queuedResource") == record["name"]), None)
        if node_key is not None and not force:
            raise InvalidInput(
                f"queued resource {name} still has node {node_key[2]}: delete it first, or delete with force"
            )
        if node_key is not None:
            self.delete_node(*node_key)
        wait = self._queued_waits.pop(id(record), None)
        if wait is not None:
            self.capacity.cancel(wait)
        del self.queued[key]

    def _suspend_queued(self, node: dict[str, Any]) -> None:
        """A queued node's hosts were lost to the service: its request is SUSPENDED (see above)."""
        for record in self.queued.values():
            if record["name"] == node.get("queuedResource"):
                self._suspend(record)

    def _suspend(self, record: dict[str, Any]) -> None:
        """Queued resource `record` loses its node to the service: SUSPENDING, then SUSPENDED
        after `Timings.queued_suspending_s` (at once when 0)."""
        suspending = self.timings.queued_suspending_s

        def suspended() -> None:
            if record["state"]["state"] in (SUSPENDING, ACTIVE):
                record["state"] = {"state": SUSPENDED, "stateInitiator": "SERVICE"}

        if suspending > 0:
            record["state"] = {"state": SUSPENDING, "stateInitiator": "SERVICE"}
            self.after(suspending, f"{record['name']} is suspended", suspended)
        else:
            suspended()

    # ---- failures ------------------------------------------------------------------------------

    def preempt(
        self, project: str, zone: str, group: str, *, action: str | None = None, repair: bool = True
    ) -> list[TwinHost]:
        """A Spot preemption of TPU node `group` (PREEMPTED; its queued request SUSPENDED); the
        hosts it hit, as they were. Any other slice is the next API's."""
        key = (project, zone, group)
        if key not in self.nodes:
            return super().preempt(project, zone, group, action=action, repair=repair)
        hosts = self._node_hosts(key)
        self.nodes[key]["state"] = NODE_PREEMPTED
        self._suspend_queued(self.nodes[key])
        for host in hosts:
            self._call(self.on_host_down, replace(host, status=NODE_PREEMPTED))
        return hosts

    def end_run(self, project: str, zone: str, queued: str) -> None:
        """A flex-start queued resource's run duration ended: its node is deleted and the
        request turns SUSPENDED (module docstring)."""
        record = self.queued.get((project, zone, queued))
        if record is None:
            raise NoSuchResource(
                "run-ends-after-it-starts", f"no queued resource {queued} in {project}/{zone}"
            )
        if record["state"]["state"] != ACTIVE:
            raise TwinEventError(
                "run-ends-after-it-starts",
                f"queued resource {queued} is {record['state']['state']}: a run ends only once it is ACTIVE",
            )
        node_key = next((k for k, n in self.nodes.items() if n.get("queuedResource") == record["name"]), None)
        if node_key is not None:
            self.delete_node(*node_key)
        self._suspend(record)

    def node_host_error(
        self, project: str, zone: str, name: str, *, repaired: bool = True, after: float | None = None
    ) -> list[TwinHost]:
        """A host error on TPU node `name`: the node is REPAIRING, its hosts down, and the Cloud
        TPU service's repair ends `after` seconds later (default `Timings.node_repair_s`) READY,
        or, when it fails (`repaired` False), UNKNOWN ("unknown state after a failed repair"),
        which nothing brings back. The hosts it hit, as they were. `NoSuchResource` for a node the
        twin does not hold; `TwinEventError` for one that is not READY."""
        key = (project, zone, name)
        node = self.nodes.get(key)
        if node is None:
            raise NoSuchResource("host-error-on-existing-host", f"no TPU node {name} in {project}/{zone}")
        if node.get("state") != NODE_READY:
            raise TwinEventError(
                "host-error-on-existing-host", f"TPU node {name} is {node.get('state')}, not READY"
            )
        hosts = self._node_hosts(key)
        node["state"] = NODE_REPAIRING
        for host in hosts:
            self._call(self.on_host_down, replace(host, status=NODE_REPAIRING))

        def repair_ends() -> None:
            if self.nodes.get(key) is not node or node.get("state") != NODE_REPAIRING:
                return  # deleted meanwhile
            if repaired:
                self._node_ready(key)
            else:
                node["state"] = NODE_UNKNOWN
                self.bill.observe()

        outcome = "READY" if repaired else "UNKNOWN"
        self.after(
            self.timings.node_repair_s if after is None else after,
            f"node {name}'s repair ends {outcome}",
            repair_ends,
        )
        return hosts

    # ---- the bill ------------------------------------------------------------------------------

    def _bill_lines(self) -> list[Line]:
        """Each READY node's hosts, at its generation's per-chip price for its capacity (a node
        in any other state bills nothing; a queued request bills nothing until its node is
        READY). A READY node is whole: it has every worker of its shape."""
        lines = []
        for (project, zone, name), node in self.nodes.items():
            if node.get("state") != NODE_READY:
                continue
            hosts = len(node.get("networkEndpoints", [])) or node_hosts(node)
            price = self._node_host_price(node, zone)
            lines.append(
                Line(
                    f"projects/{project}/locations/{zone}/nodes/{name}",
                    hosts,
                    None if price is None else price * hosts,
                )
            )
        return [*lines, *super()._bill_lines()]

    def _node_host_price(self, node: dict[str, Any], zone: str) -> float | None:
        """USD per hour of one host of `node`: its chips at its generation's price for its
        capacity (tpu v2 discovery, SchedulingConfig: spot, preemptible, reserved; a queued
        request's ``spot``, ``reservationName`` or flex-start run duration)."""
        kind = node_kind(node)
        if not kind:
            return None
        chips = catalog.lookup(_tpu_api_type(node.get("acceleratorConfig") or {}) or node["acceleratorType"])
        per_host = chips.chips // max(1, chips.hosts)
        scheduling = node.get("schedulingConfig") or {}
        queued = next((r for r in self.queued.values() if r["name"] == node.get("queuedResource")), {})
        model = queued.get("provisioningModel")
        # QueuedResource.spot is an empty message when the request is Spot: present, not truthy.
        spot_request = queued.get("spot") is not None
        if scheduling.get("spot") or scheduling.get("preemptible") or spot_request or model == "SPOT":
            capacity = billing.SPOT
        elif scheduling.get("reserved") or queued.get("reservationName") or model == "RESERVATION_BOUND":
            capacity = billing.RESERVED
        elif model == "FLEX_START":
            capacity = billing.FLEX_START
        else:
            capacity = billing.ON_DEMAND
        return billing.tpu_host_hour_price(kind, per_host, zone, capacity)

    # ---- what the hosts see --------------------------------------------------------------------

    def _all_hosts(self) -> list[TwinHost]:
        return [*(h for key in self.nodes for h in self._node_hosts(key)), *super()._all_hosts()]

    def _node_hosts(self, key: tuple[str, str, str]) -> list[TwinHost]:
        node = self.nodes.get(key)
        if node is None:
            return []
        project, zone, name = key
        ips = [e.get("ipAddress", "") for e in node.get("networkEndpoints", [])]
        config = node.get("acceleratorConfig") or {}
        accelerator = node.get("acceleratorType") or _tpu_api_type(config)
        topology = config.get("topology") or (catalog.lookup(accelerator).topology if accelerator else "")
        metadata = {str(k): str(v) for k, v in (node.get("metadata") or {}).items()}
        return [
            TwinHost(
                name=f"{name}-w{worker}",
                project=project,
                zone=zone,
                group=name,
                kind=TPU_WORKER,
                worker=worker,
                status=str(node.get("state", NODE_READY)),
                ip=ip,
                machine_type=None,
                metadata={
                    **metadata,
                    **google_attributes(
                        TPU_API_ATTRIBUTES,
                        accelerator_type=accelerator,
                        topology=topology,
                        worker=worker,
                        ips=ips,
                        node_id=name,
                        project=project,
                        zone=zone,
                        runtime_version=str(node.get("runtimeVersion", "")),
                    ),
                },
                labels=dict(node.get("labels") or {}),
            )
            for worker, ip in enumerate(ips)
        ]


def _run_seconds(record: dict[str, Any]) -> float | None:
    """A flex-start queued resource's run duration in seconds (tpu v2alpha1 discovery,
    QueuedResource.runDuration.maxRunDuration, a google-duration such as ``86400s``), or None."""
    duration = (record.get("runDuration") or {}).get("maxRunDuration")
    if not duration:
        return None
    seconds = float(str(duration).removesuffix("s"))
    if seconds <= 0:
        raise TwinEventError(
            "run-ends-after-it-starts", f"a run duration of {duration} ends before the run starts"
        )
    return seconds


def node_hosts(body: dict[str, Any]) -> int:
    """How many hosts a Node of `body`'s shape has (the catalog's, on the TPU API)."""
    config = body.get("acceleratorConfig")
    if config:
        return catalog.lookup(f"{_API_GENERATIONS[config['type']]}-{config['topology']}").hosts
    if body.get("acceleratorType"):
        return catalog.lookup(str(body["acceleratorType"])).hosts
    return 1


def node_kind(body: dict[str, Any]) -> str:
    """What a TPU node's hosts count against in a zone's capacity: its generation (``v6e``)."""
    config = body.get("acceleratorConfig")
    if config:
        return _API_GENERATIONS[config["type"]]
    if body.get("acceleratorType"):
        return catalog.lookup(str(body["acceleratorType"])).generation
    return ""  # no type (the emulation's bare test nodes): a kind no zone limits


def _tpu_api_type(config: dict[str, Any]) -> str:
    if not config:
        return ""
    return catalog.lookup(f"{_API_GENERATIONS[config['type']]}-{config['topology']}").accelerator_type
