"""A stateful twin of one Google Cloud project's Compute Engine and TPU resources.

The Pulumi program's resources are applied to it (`rayslice.infra.mocks`, through the REST
bodies of `rayslice.cloud.bodies`), and the emulated HTTP APIs of the simulator
(`rayslice.local.google.cloud_api`) act on the same instance, so what `rayslice preview` checks,
what the simulator boots and what recovery recreates is one state. It keeps Google's documented
behaviour, each with its source beside the code, and refuses a request that breaks one of the
rules of `rayslice.cloud.rules` (the same functions the policy pack runs) with a
`CloudRuleError` naming the resource, the rule and the source.

Behaviour, by source:

- A MIG creates instances up to its target size, named ``<baseInstanceName>-<4 characters>``
  (compute v1 discovery document, InstanceGroupManager.targetSize "The target number of running
  instances for this managed instance group"; baseInstanceName "The base instance name is a
  prefix that you want to attach to the names of all VMs in a MIG").
- ``createInstances`` adds one named instance per per-instance config and raises the target size
  by as many (discovery, instanceGroupManagers.createInstances: "Creates instances with
  per-instance configurations in this managed instance group"; the provider creates a
  PerInstanceConfig through it, magic-modules mmv1/products/compute/PerInstanceConfig.yaml).
  No source says Google refuses a MIG larger than its workload policy's topology, so the twin
  creates what was asked and `audit` reports it (rule instances-match-topology).
- ``deleteInstances`` deletes the named members at once and lowers the target size by as many
  (discovery, instanceGroupManagers.deleteInstances: "Flags the specified instances in the
  managed instance group for immediate deletion ... This method reduces the targetSize of the
  managed instance group by the number of instances that you delete"); the MIG stays. Its
  validation follows InstanceGroupManagersDeleteInstancesRequest (same document): an instance
  that is not a member fails the request "If this field [skipInstancesOnValidationError] is set
  to false", else it is skipped; "a malformed instance URL or a reference to an instance that
  exists in a zone or region other than the group's" always fails it; ``instances`` are "a full
  URL or a partial URL, such as zones/[ZONE]/instances/[INSTANCE_NAME]", a bare name only for a
  queued instance (which the twin never has), "One cannot specify both URLs and names". A failed
  request deletes nothing. What becomes of a deleted instance's per-instance config is not in
  the discovery document, and the stored copies of Google's "Preserved state" page
  (compute/docs/instance-groups/preserved-state, section "Deleting an instance") end before
  that section; the one other source, pulumi-gcp's PerInstanceConfig with
  ``remove_instance_on_destroy`` (magic-modules custom_delete/per_instance_config.go.tmpl),
  deletes its config by sending ``deleteInstances`` alone, which only holds if the config goes
  with the instance. The twin removes it with the instance; a caller that must not depend on
  this lists the configs afterwards and deletes any left (`delete_per_instance_configs`).
- ``deletePerInstanceConfigs`` (discovery: "Deletes selected per-instance configurations")
  removes the named configs; one whose instance still exists stays listed as
  ``UNAPPLIED_DELETION`` ("The per-instance configuration has been deleted, but the deletion is
  not yet applied", PerInstanceConfig.status) until the instance goes. What Google answers for
  a name with no config is not documented: the twin fails the request and deletes nothing, so
  a caller that only deletes the configs it listed works whichever way Google answers.
- A lost instance (preempted, failed) is recreated under its name when the MIG's
  ``instanceLifecyclePolicy.defaultActionOnFailure`` is REPAIR (the default) and left as it is
  with DO_NOTHING (discovery, InstanceGroupManagerInstanceLifecyclePolicy.defaultActionOnFailure:
  "REPAIR (default): MIG automatically repairs a failed VM by recreating it"; "DO_NOTHING: MIG
  does not repair a failed VM").
- Spot preemption applies each instance's ``scheduling.instanceTerminationAction``: STOP leaves
  it TERMINATED (discovery, Instance.status TERMINATED "The instance has stopped (either by
  explicit action or underlying failure)"), DELETE removes it ("Delete the VM."). Nothing comes
  back unless the lifecycle policy repairs it or someone recreates it ("Request TPU Spot VMs":
  "To restart a Spot VMs instance or MIG, you must delete and then recreate it"). A TPU node
  turns PREEMPTED (tpu v2 discovery document, Node.state).
- An image is made from a disk (images.insert ``sourceDisk``) only while no running instance
  uses it: Google's sample "Create a disk image"
  (https://cloud.google.com/compute/docs/samples/compute-images-create) refuses a disk attached
  to a running instance unless ``forceCreate`` ("proceeds even if the disk is attached to a
  running instance. This may compromise integrity of the image!"), which the provider never
  sends (`bodies`). An instance's boot disk is named after the instance unless its
  ``initializeParams.diskName`` says otherwise (discovery, AttachedDiskInitializeParams.diskName:
  "If not specified, the default is to use the name of the instance"). An instance declared with
  ``desiredStatus: TERMINATED`` is stopped after its insert (`stop_instance`), as the provider
  does.
- Internal IPs come from the declared subnetwork's ``ipCidrRange``, the first address being the
  gateway (Compute Engine, "Subnets": "the first two ... in the primary IPv4 range are reserved"
  -- .0 network and .1 gateway); a reserved INTERNAL address keeps its IP for the instance that
  names it (per-instance config ``preservedState.internalIPs``, Instance ``networkIP``).
- A Compute Engine TPU host serves ``accelerator-type`` as the host reports it (``v7x-16`` on
  TPU7x), ``worker-id``, ``worker-network-endpoints`` and ``tpu-env``
  (`rayslice.platforms.COMPUTE_TPU_ATTRIBUTES`, whose comment gives the published log); a
  Cloud TPU API worker the attributes of `rayslice.platforms.TPU_API_ATTRIBUTES`. Where no
  source gives an order, the worker id of a MIG's instance is its creation order.

- Capacity (`rayslice.cloud.capacity`, sources there): every direct create (a MIG's target
  size, ``createInstances``, an instance, a TPU node) takes its hosts from the zone's capacity or
  fails with ``ZONE_RESOURCE_POOL_EXHAUSTED`` and creates nothing; a zone never given a number
  has room for everything. A MIG resize request (compute v1 discovery,
  instanceGroupManagerResizeRequests.insert; "About resize requests in a MIG") is ACCEPTED at
  once and waits while the zone lacks hosts for all of it; when they come, the MIG creates all
  ``resizeBy`` instances at once, auto-named ``<baseInstanceName>-<4 characters>`` ("resizeBy:
  ... The MIG automatically generates the names of the VMs"), raises its target size by as many
  (resizeBy: "The group's target size will be increased by this number") and the request turns
  SUCCEEDED. The v1 resize request has no deadline field (Dynamic Workload Scheduler "persists
  the request" until capacity comes), so it waits until it is cancelled or its MIG is deleted.
  ``cancel`` takes only an ACCEPTED request ("Cancel is only possible for requests that are
  accepted in the queue", discovery, instanceGroupManagerResizeRequests.cancel; gcloud's
  ``resize-requests cancel``: "You can only cancel a resize request when it is in the ACCEPTED
  state"): it turns CANCELLED and no longer waits. ``delete`` takes only an inactive one
  ("Deletes the specified, inactive resize request. Requests that are still active cannot be
  deleted. Deleting request does not delete instances that were provisioned previously",
  discovery; gcloud's ``resize-requests delete``: "You can only delete a request when it is in a
  state SUCCEEDED, FAILED, or CANCELLED"). How Google answers either call for a request in
  another state is not documented: the twin refuses it (`ResizeRequestStateError`), changing
  nothing. Deleting a
  slice (MIG or TPU node) gives its hosts back to the zone; a preempted host's capacity stays
  with Google.

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

Core-level (no platform code): `rayslice preview` (infra) and the simulator (local) both use it.
"""

from __future__ import annotations

import copy
import ipaddress
import itertools
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from rayslice import catalog
from rayslice.cloud import bodies, rules
from rayslice.cloud.bodies import TPU_ACCELERATOR_TYPES, Request
from rayslice.cloud.capacity import ACTIVE, FAILED, SUSPENDED, WAITING, Capacity, CapacityExhausted
from rayslice.cloud.capacity import Request as CapacityRequest
from rayslice.errors import InvalidInput
from rayslice.platforms import COMPUTE_TPU_ATTRIBUTES, TPU_API_ATTRIBUTES

API_ROOT = "https://www.googleapis.com/compute/v1/"
IMAGE_DISK_SOURCE = (
    "Google's sample 'Create a disk image' (https://cloud.google.com/compute/docs/samples/"
    "compute-images-create): forceCreate 'proceeds even if the disk is attached to a running "
    "instance'; without it images.insert refuses such a disk"
)
RUNNING, TERMINATED, DELETED = "RUNNING", "TERMINATED", "DELETED"
REPAIR = "REPAIR"
MIG_HOST, LONE_VM, TPU_WORKER = "mig", "vm", "tpu-node"
TPU_READY, TPU_PREEMPTED = "READY", "PREEMPTED"
# InstanceGroupManagerResizeRequest.state (compute v1 discovery document).
RESIZE_ACCEPTED, RESIZE_SUCCEEDED, RESIZE_FAILED = "ACCEPTED", "SUCCEEDED", "FAILED"
RESIZE_CANCELLED = "CANCELLED"
# The states in which a resize request may be cancelled, and deleted (module docstring, sources).
RESIZE_CANCELLABLE = frozenset({RESIZE_ACCEPTED})
RESIZE_DELETABLE = frozenset({RESIZE_SUCCEEDED, RESIZE_FAILED, RESIZE_CANCELLED})
# NodePool.status and StatusCondition.code / canonicalCode (container v1 discovery document).
POOL_PROVISIONING, POOL_RUNNING, POOL_ERROR, POOL_STOPPING = "PROVISIONING", "RUNNING", "ERROR", "STOPPING"
GCE_STOCKOUT = "GCE_STOCKOUT"  # "indicates that Google Compute Engine resources are temporarily unavailable"
CONTAINER_API_ROOT = "https://container.googleapis.com/v1/"
DEADLINE_EXCEEDED = 4  # google.rpc.Code of a queued resource whose deadline passed (the twin's choice)
# An instance as deleteInstances names it: a full URL or a partial one, "such as
# zones/[ZONE]/instances/[INSTANCE_NAME]" (compute v1 discovery, InstanceGroupManagersDeleteInstancesRequest).
_INSTANCE_URL = re.compile(
    r"^(?:https?://[^/]+/compute/v1/)?(?:projects/(?P<project>[^/]+)/)?zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)$"
)
UNAPPLIED_DELETION = "UNAPPLIED_DELETION"  # PerInstanceConfig.status (compute v1 discovery)


class CloudRuleError(InvalidInput):
    """Requests the twin refused, as Google would: each names the resource, rule and source."""

    def __init__(self, violations: list[rules.Violation]):
        self.violations = list(violations)
        theirs = "Google's documented rules; Google would refuse this deployment"
        if any(v.ours for v in self.violations):  # rayslice's own rules (rules.Rule.ours) too
            theirs = "Google's documented rules and rayslice's own; this deployment is refused"
        super().__init__(
            f"{len(self.violations)} violation(s) of {theirs}:\n"
            + "\n".join(f"  - {v}" for v in self.violations)
        )


class InstanceValidationError(InvalidInput):
    """A deleteInstances or deletePerInstanceConfigs request Google fails; nothing was deleted."""


class ResizeRequestStateError(InvalidInput):
    """A resize request cancelled or deleted in a state that does not allow it; nothing changed."""


@dataclass(frozen=True)
class TwinHost:
    """One host as the twin holds it and as a real one of its kind presents itself."""

    name: str
    project: str
    zone: str
    group: str | None  # MIG or TPU node; None for a lone VM
    kind: str  # MIG_HOST, LONE_VM or TPU_WORKER
    worker: int
    status: str
    ip: str
    machine_type: str | None
    metadata: dict[str, str]  # instance/attributes/: user metadata and Google's attributes
    labels: dict[str, str]


@dataclass
class _Vm:
    """A Compute Engine instance."""

    project: str
    zone: str
    name: str
    group: str | None
    worker: int
    ip: str
    properties: dict[str, Any]  # the instance's properties (machineType, metadata, scheduling, ...)
    status: str = RUNNING


@dataclass
class _Subnet:
    network: ipaddress.IPv4Network
    used: set[str] = field(default_factory=set)

    def take(self, wanted: str | None = None) -> str:
        if wanted:
            self.used.add(wanted)
            return wanted
        for address in itertools.islice(self.network.hosts(), 1, None):  # .1 is the gateway
            if str(address) not in self.used:
                self.used.add(str(address))
                return str(address)
        raise InvalidInput(f"subnetwork {self.network} has no free address")


Hook = Callable[[TwinHost], None]


def _short(link: Any) -> str:
    """The name at the end of a self link (``...?uniqueId=`` dropped)."""
    return str(link).split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]


def _metadata(holder: dict[str, Any]) -> dict[str, str]:
    return {i["key"]: str(i["value"]) for i in holder.get("metadata", {}).get("items", [])}


class CloudTwin:
    """The project's resources. Keyed by (project, zone or region or "global", name)."""

    def __init__(self, default_range: str | None = None, address_range: str | None = None) -> None:
        """`default_range`: where a subnetwork the twin never saw created (an existing one)
        takes its addresses. `address_range`: where every subnetwork, declared or existing,
        takes them (the simulator's free range; a declared ``ipCidrRange`` still goes through
        the rules but hands out none); its first address is the gateway, as in a subnetwork."""
        # What the recovery controller reads through the emulated APIs (shared with them).
        self.nodes: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.migs: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.instances: dict[tuple[str, str, str], list[dict[str, Any]]] = {}  # managed instances
        self.configs: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        self.vms: dict[tuple[str, str, str], _Vm] = {}
        self.resources: dict[str, rules.Resource] = {}  # self link -> what the rules read
        self.subnets: dict[str, _Subnet] = {}  # subnetwork name -> its range
        self.addresses: dict[str, str] = {}  # address name -> IP
        # Where a subnetwork the twin never saw created (an existing one) takes its addresses.
        self.default_subnet = _Subnet(ipaddress.IPv4Network(default_range)) if default_range else None
        # One pool for every subnetwork when the addresses must come from a given range.
        self.address_pool = _Subnet(ipaddress.IPv4Network(address_range)) if address_range else None
        self.refused: list[rules.Violation] = []
        self.on_host_up: Hook | None = None
        self.on_host_down: Hook | None = None
        # Free hosts per zone and type, and the requests that wait for them (`capacity`); the
        # clock dates requests and decides deadlines (tests set it).
        self.capacity = Capacity()
        self.clock: Callable[[], float] = time.time
        # A MIG's resize requests as Google returns them, and what each waits on.
        self.resize_requests: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        self._waits: dict[
            int, CapacityRequest
        ] = {}  # id(resize request / queued resource record) -> its wait
        # TPU queued resources as Google returns them, by (project, zone, queued resource id).
        self.queued: dict[tuple[str, str, str], dict[str, Any]] = {}
        # GKE node pools by (project, location, cluster, pool), as nodePools.get returns them;
        # the instance templates the twin makes for their MIGs (by link), and each flex-start
        # pool's wait for capacity.
        self.node_pools: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self.pool_templates: dict[str, dict[str, Any]] = {}
        self._pool_waits: dict[tuple[str, str, str, str], CapacityRequest] = {}
        self._ids = itertools.count(1)

    # ---- applying the program's resources ------------------------------------------------------

    def apply(
        self,
        type_token: str,
        name: str,
        request: Request,
        *,
        project: str,
        zone: str | None = None,
        region: str | None = None,
        target: str | None = None,
        urn: str | None = None,
    ) -> dict[str, Any]:
        """One create call for Pulumi resource `name`; the outputs Google returns for it.
        `target` is the resource the call's URL names besides the project and zone (a
        per-instance config's MIG); `urn` the Pulumi URN a violation names (see `admit`).

        A broken rule raises `CloudRuleError` and creates nothing (also kept in `refused`)."""
        if type_token == bodies.IMAGE:
            self._check_source_disk(name, request, project=project, urn=urn)
        link = self.admit(
            type_token, name, request, project=project, zone=zone, region=region, target=target, urn=urn
        )
        resource_name = request.name or name
        outputs: dict[str, Any] = {}
        if _COLLECTIONS.get(type_token):
            outputs = {"selfLink": link, "selfLinkUnique": f"{link}?uniqueId={next(self._ids)}"}
        if type_token == bodies.SUBNETWORK:
            self.subnets[resource_name] = _Subnet(ipaddress.IPv4Network(request.body["ipCidrRange"]))
        elif type_token == bodies.ADDRESS:
            subnet = self._subnet(request.body.get("subnetwork"))
            wanted = request.body.get("address")
            outputs["address"] = self.addresses[resource_name] = (
                subnet.take(wanted) if subnet else str(wanted or "")
            )
        elif type_token == bodies.MIG:
            self.insert_mig(project, str(zone), request.body)
        elif type_token == bodies.PER_INSTANCE_CONFIG:
            mig = self._mig_named(project, str(zone), str(target), name)
            self.create_instances(project, str(zone), mig, request.body["instances"])
        elif type_token == bodies.RESIZE_REQUEST:
            self.insert_resize_request(project, str(zone), _short(target), request.body)
        elif type_token == bodies.INSTANCE:
            self.capacity.take(str(zone), _short(request.body.get("machineType", "")), 1)
            vm = self._new_vm(project, str(zone), resource_name, None, 0, request.body)
            outputs["networkInterfaces"] = [{"networkIp": vm.ip}]
        elif type_token == bodies.NODE_POOL:
            self.create_node_pool(project, str(zone), _short(target), request.body["nodePool"])
        elif type_token == bodies.QUEUED_RESOURCE:
            outputs["state"] = self.create_queued_resource(project, str(zone), resource_name, request.body)[
                "state"
            ]["state"]
        elif type_token == bodies.TPU_NODE:
            node = self.create_node(project, str(zone), resource_name, request.body)
            outputs["networkEndpoints"] = [
                {"ipAddress": e["ipAddress"], "port": e.get("port", 8470)} for e in node["networkEndpoints"]
            ]
        return outputs

    def admit(
        self,
        type_token: str,
        name: str,
        request: Request,
        *,
        project: str,
        zone: str | None = None,
        region: str | None = None,
        target: str | None = None,
        urn: str | None = None,
    ) -> str:
        """Check a create call against the rules and, if none is broken, record what it
        declares for later references; the resource's self link. A broken rule raises
        `CloudRuleError` (kept in `refused` too) and records nothing.

        Violations name the resource by `urn` (the Pulumi URN, so `rayslice preview` shows them
        beside the resource) or, for a call that has none (the HTTP APIs), its self link."""
        scope = f"zones/{zone}" if zone else f"regions/{region}" if region else "global"
        collection = _COLLECTIONS.get(type_token, "other")
        link = f"projects/{project}/{scope}/{collection}/{request.name or name}"
        refs = self._refs(type_token, request, target)
        resource = rules.Resource(type_token, urn or link, name, request, refs)
        try:
            self._check(resource)
        except CloudRuleError as exc:
            self.refused.extend(exc.violations)
            raise
        self.resources[link] = resource
        return link

    def _check_source_disk(self, name: str, request: Request, *, project: str, urn: str | None) -> None:
        """Refuse an image of a disk that a running instance this twin holds still uses."""
        disk = request.body.get("sourceDisk")
        if not disk:
            return
        parts = str(disk).split("?", 1)[0].split("/")
        zone = parts[parts.index("zones") + 1] if "zones" in parts else None
        for vm in self.vms.values():
            boot = next((d for d in vm.properties.get("disks", []) if d.get("boot")), None)
            disk_name = (boot or {}).get("initializeParams", {}).get("diskName") or vm.name
            if (
                (vm.project, disk_name) == (project, parts[-1])
                and zone in (None, vm.zone)
                and vm.status == RUNNING
            ):
                violation = rules.Violation(
                    urn=urn or f"projects/{project}/global/images/{request.name or name}",
                    resource=name,
                    rule="image-source-disk-in-use",
                    message=f"disk {parts[-1]} is the boot disk of instance {vm.name}, which is running: "
                    "stop the instance (desiredStatus TERMINATED) before imaging its disk",
                    source=IMAGE_DISK_SOURCE,
                )
                self.refused.append(violation)
                raise CloudRuleError([violation])

    def stop_instance(self, project: str, zone: str, name: str) -> None:
        """instances.stop: the instance is TERMINATED, its disks stay (discovery, Instance.status
        TERMINATED "The instance has stopped (either by explicit action or underlying failure)")."""
        vm = self.vms[(project, zone, name)]
        vm.status = TERMINATED
        self._hook(self.on_host_down, vm)

    def audit(self) -> list[rules.Violation]:
        """The rules that read the finished deployment (a MIG's final size, rules.Rule.at_end)."""
        stack = rules.Stack(self.resources.values())
        return rules.check(stack, [r for r in rules.RULES if r.at_end])

    def violations(self) -> list[rules.Violation]:
        """What Google would refuse of everything applied so far: each refused request, then the
        rules on the finished deployment (`audit`)."""
        return [*self.refused, *self.audit()]

    def _refs(self, type_token: str, request: Request, target: str | None) -> dict[str, frozenset[str]]:
        """What a request refers to, as Google resolves it: the `rules.Resource.urn` of each
        resource this twin holds (or the reference as given)."""
        body = request.body
        refs: dict[str, set[str]] = {}
        if type_token in (bodies.PER_INSTANCE_CONFIG, bodies.RESIZE_REQUEST) and target:
            refs["instanceGroupManager"] = {self._link(f"instanceGroupManagers/{_short(target)}")}
        if type_token == bodies.MIG:
            refs["versions"] = {self._link(v.get("instanceTemplate")) for v in body.get("versions", [])}
            policy = body.get("resourcePolicies", {}).get("workloadPolicy")
            if policy:
                refs["resourcePolicies"] = {self._link(policy)}
        return {
            k: frozenset(self.resources[u].urn if u in self.resources else u for u in v)
            for k, v in refs.items()
        }

    def _link(self, reference: Any) -> str:
        """The self link of a referenced resource this twin holds (or the reference as given)."""
        text = str(reference).split("?", 1)[0]
        for link in self.resources:
            if text == link or text.endswith(f"/{link}") or link.endswith(f"/{text}"):
                return link
        return text

    def _check(self, resource: rules.Resource) -> None:
        """Refuse `resource` if a rule finds fault with it or with it beside what it refers to."""
        wanted = {u for urns in resource.refs.values() for u in urns}
        related = [r for r in self.resources.values() if r.urn in wanted]
        stack = rules.Stack([resource, *related])
        found = [
            v for v in rules.check(stack, [r for r in rules.RULES if not r.at_end]) if v.urn == resource.urn
        ]
        if found:
            raise CloudRuleError(found)

    def _subnet(self, reference: Any) -> _Subnet | None:
        if self.address_pool is not None:
            return self.address_pool
        found = self.subnets.get(_short(reference)) if reference else None
        return found if found is not None else self.default_subnet

    # ---- Compute Engine ------------------------------------------------------------------------

    def insert_mig(self, project: str, zone: str, body: dict[str, Any]) -> dict[str, Any]:
        """instanceGroupManagers.insert: the MIG and its target size of auto-named instances."""
        name = str(body["name"])
        key = (project, zone, name)
        mig = copy.deepcopy(body)
        base = f"projects/{project}/zones/{zone}"
        mig.update(
            kind="compute#instanceGroupManager",
            id=str(next(self._ids)),
            zone=f"{API_ROOT}{base}",
            selfLink=f"{API_ROOT}{base}/instanceGroupManagers/{name}",
            instanceGroup=f"{API_ROOT}{base}/instanceGroups/{name}",
            creationTimestamp="2026-01-01T00:00:00.000-00:00",
        )
        mig.setdefault("targetSize", 0)
        self.capacity.take(zone, self._machine_of(mig), int(mig["targetSize"]))
        self.migs[key], self.instances[key], self.configs[key] = mig, [], []
        self.resize_requests[key] = []
        self._add_auto_named(project, zone, mig, int(mig["targetSize"]))
        return mig

    def _add_auto_named(self, project: str, zone: str, mig: dict[str, Any], count: int) -> None:
        """`count` instances named as a MIG names them: ``<baseInstanceName>-<4 characters>``,
        created together: ``on_host_up`` runs once all exist, so each host's attributes list
        every peer (a bulk MIG "creates VMs all at once")."""
        prefix = mig.get("baseInstanceName", mig["name"])
        created = []
        for _ in range(count):
            name = f"{prefix}-{secrets.token_hex(2)}"
            while (project, zone, name) in self.vms:
                name = f"{prefix}-{secrets.token_hex(2)}"
            self._add_to_mig(project, zone, mig, name, {}, announce=False)
            created.append(self.vms[(project, zone, name)])
        for vm in created:
            self._hook(self.on_host_up, vm)

    def _machine_of(self, mig: dict[str, Any]) -> str:
        """The machine type of a MIG's hosts (its template's), the kind its capacity counts."""
        template = self._template_of(mig)
        return _short((template or {}).get("properties", {}).get("machineType", ""))

    def insert_resize_request(
        self, project: str, zone: str, mig_name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """instanceGroupManagerResizeRequests.insert: accepted at once, fulfilled whole when the
        zone has all its hosts (see the module docstring). Returns the request as Google does."""
        key = (project, zone, mig_name)
        mig = self.migs.get(key)
        if mig is None:
            raise InvalidInput(f"resize request {body.get('name')}: no MIG {mig_name!r} in {project}/{zone}")
        name, hosts = str(body["name"]), int(body["resizeBy"])
        base = f"projects/{project}/zones/{zone}/instanceGroupManagers/{mig_name}"
        record = {
            **copy.deepcopy(body),
            "kind": "compute#instanceGroupManagerResizeRequest",
            "id": str(next(self._ids)),
            "creationTimestamp": _rfc3339(self.clock()),
            "zone": f"{API_ROOT}projects/{project}/zones/{zone}",
            "selfLink": f"{API_ROOT}{base}/resizeRequests/{name}",
            "state": RESIZE_ACCEPTED,
        }

        def fulfil() -> None:
            self._add_auto_named(project, zone, mig, hosts)
            mig["targetSize"] = int(mig.get("targetSize", 0)) + hosts
            record["state"] = RESIZE_SUCCEEDED

        self.resize_requests[key].append(record)
        wait = CapacityRequest(f"{mig_name}/{name}", zone, self._machine_of(mig), hosts, None, fulfil)
        self._waits[id(record)] = wait
        self.capacity.submit(wait, self.clock())
        return record

    def set_capacity(self, zone: str, kind: str, hosts: int) -> None:
        """The zone now has `hosts` free hosts of `kind` (a machine type, or a TPU generation on
        the TPU API): requests that now fit are fulfilled, in order."""
        self.capacity.set(zone, kind, hosts, self.clock())

    def resize_requests_of(self, project: str, zone: str, mig: str) -> list[dict[str, Any]]:
        """instanceGroupManagerResizeRequests.list: the MIG's requests, oldest first."""
        return copy.deepcopy(self.resize_requests.get((project, zone, mig), []))

    def cancel_resize_request(self, project: str, zone: str, mig: str, name: str) -> dict[str, Any]:
        """instanceGroupManagerResizeRequests.cancel: an ACCEPTED request turns CANCELLED and
        stops waiting for capacity (module docstring); the request as Google returns it."""
        record = self._resize_request(project, zone, mig, name, RESIZE_CANCELLABLE, "cancelled")
        wait = self._waits.pop(id(record), None)
        if wait is not None:
            self.capacity.cancel(wait)
        record["state"] = RESIZE_CANCELLED
        return copy.deepcopy(record)

    def delete_resize_request(self, project: str, zone: str, mig: str, name: str) -> None:
        """instanceGroupManagerResizeRequests.delete: an inactive request goes; the hosts it
        made stay in the MIG (module docstring)."""
        record = self._resize_request(project, zone, mig, name, RESIZE_DELETABLE, "deleted")
        self._waits.pop(id(record), None)
        self.resize_requests[(project, zone, mig)].remove(record)

    def _resize_request(
        self, project: str, zone: str, mig: str, name: str, allowed: frozenset[str], verb: str
    ) -> dict[str, Any]:
        """MIG `mig`'s request `name`, if its state is one of `allowed` (`ResizeRequestStateError`
        otherwise; `InvalidInput` when there is no such request)."""
        record = next(
            (r for r in self.resize_requests.get((project, zone, mig), []) if r["name"] == name), None
        )
        if record is None:
            raise InvalidInput(f"no resize request {name!r} of MIG {mig!r} in {project}/{zone}")
        if record["state"] not in allowed:
            raise ResizeRequestStateError(
                f"resize request {name} is {record['state']}: only a request that is "
                f"{' or '.join(sorted(allowed))} can be {verb}"
            )
        return record

    def create_instances(
        self, project: str, zone: str, mig: dict[str, Any], configs: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """instanceGroupManagers.createInstances: one named instance per config; the target
        size rises by as many. Returns the managed-instance records."""
        key = (project, zone, mig["name"])
        self.capacity.take(zone, self._machine_of(mig), len(configs))
        added = [self._add_to_mig(project, zone, mig, str(c["name"]), c) for c in configs]
        named = {str(c["name"]) for c in configs}  # a config of that name (deleted, unapplied) is replaced
        self.configs[key] = [c for c in self.configs[key] if c["name"] not in named]
        self.configs[key].extend({**copy.deepcopy(c), "status": "EFFECTIVE"} for c in configs)
        mig["targetSize"] = int(mig.get("targetSize", 0)) + len(configs)
        return added

    def delete_instances(
        self, project: str, zone: str, mig_name: str, instances: list[str], *, skip_invalid: bool
    ) -> list[str]:
        """instanceGroupManagers.deleteInstances: the named members are deleted with their
        per-instance configs and the target size drops by as many (module docstring, with the
        rules and their sources). Returns the names deleted; `InstanceValidationError` when the
        request fails (nothing deleted)."""
        key = (project, zone, mig_name)
        mig = self.migs[key]
        members = {r["name"] for r in self.instances[key]}
        urls = [i for i in instances if "/" in i]
        if urls and len(urls) < len(instances):
            raise InstanceValidationError("one cannot specify both instance URLs and names in one request")
        deleted: list[str] = []
        for item in instances:
            name: str | None = None  # a bare name names a queued instance, which the twin never has
            if "/" in item:
                found = _INSTANCE_URL.match(item)
                if found is None or found["zone"] != zone or found["project"] not in (None, project):
                    raise InstanceValidationError(
                        f"{item!r} is a malformed instance URL or names an instance outside {project}/{zone}"
                    )
                name = found["name"]
            if name is not None and name in members:
                if name not in deleted:
                    deleted.append(name)
            elif not skip_invalid:
                raise InstanceValidationError(
                    f"{item!r} is not a member of instance group manager {mig_name}"
                )
        gone = [v for v in self.vms.values() if (v.project, v.zone, v.group) == key and v.name in deleted]
        for vm in gone:
            self._remove_vm(vm)
        self.instances[key] = [r for r in self.instances[key] if r["name"] not in deleted]
        self.configs[key] = [c for c in self.configs[key] if c["name"] not in deleted]
        mig["targetSize"] = max(0, int(mig.get("targetSize", 0)) - len(deleted))
        self.capacity.give_back(zone, self._machine_of(mig), len(gone), self.clock())
        return deleted

    def delete_per_instance_configs(self, project: str, zone: str, mig_name: str, names: list[str]) -> None:
        """instanceGroupManagers.deletePerInstanceConfigs: each named config goes, or turns
        UNAPPLIED_DELETION while its instance exists; `InstanceValidationError` (nothing deleted)
        when one has no config (the twin's choice, module docstring)."""
        key = (project, zone, mig_name)
        have = {c["name"] for c in self.configs[key]}
        missing = [n for n in names if n not in have]
        if missing:
            raise InstanceValidationError(f"no per-instance config for {', '.join(missing)} in {mig_name}")
        members = {r["name"] for r in self.instances[key]}
        kept = []
        for config in self.configs[key]:
            if config["name"] not in names:
                kept.append(config)
            elif config["name"] in members:
                kept.append({**config, "status": UNAPPLIED_DELETION})
        self.configs[key] = kept

    def _add_to_mig(
        self,
        project: str,
        zone: str,
        mig: dict[str, Any],
        name: str,
        config: dict[str, Any],
        announce: bool = True,
    ) -> dict[str, Any]:
        key = (project, zone, mig["name"])
        template = self._template_of(mig)
        properties = copy.deepcopy(template.get("properties", {})) if template else {}
        preserved = config.get("preservedState", {})
        if preserved.get("metadata"):
            items = {**_metadata(properties), **preserved["metadata"]}
            properties["metadata"] = {"items": [{"key": k, "value": v} for k, v in items.items()]}
        ip = next(
            (
                self.addresses.get(_short(ip["ipAddress"].get("address")), ip["ipAddress"].get("literal"))
                for ip in preserved.get("internalIPs", {}).values()
                if ip.get("ipAddress")
            ),
            None,
        )
        # The lowest worker number no instance of the MIG holds: its creation order, unless
        # deleteInstances left a gap.
        taken = {v.worker for v in self.vms.values() if (v.project, v.zone, v.group) == key}
        worker = next(w for w in itertools.count() if w not in taken)
        self._new_vm(project, zone, name, mig["name"], worker, properties, ip=ip, announce=announce)
        record = {
            "instance": f"{API_ROOT}projects/{project}/zones/{zone}/instances/{name}",
            "name": name,
            "id": str(next(self._ids)),
            "currentAction": "NONE",
            "instanceStatus": RUNNING,
        }
        self.instances[key].append(record)
        return record

    def _template_of(self, mig: dict[str, Any]) -> dict[str, Any] | None:
        for version in mig.get("versions", []):
            found = self.resources.get(self._link(version.get("instanceTemplate")))
            if found is not None:
                return found.body
            made = self.pool_templates.get(str(version.get("instanceTemplate")))
            if made is not None:  # a GKE node pool's, made by the twin
                return made
        return None

    def _mig_named(self, project: str, zone: str, mig: str, config: str) -> dict[str, Any]:
        found = self.migs.get((project, zone, _short(mig)))
        if found is None:
            raise InvalidInput(f"per-instance config {config}: no MIG {mig!r} in {project}/{zone}")
        return found

    def _new_vm(
        self,
        project: str,
        zone: str,
        name: str,
        group: str | None,
        worker: int,
        properties: dict[str, Any],
        ip: str | None = None,
        announce: bool = True,
    ) -> _Vm:
        nics = properties.get("networkInterfaces") or [{}]
        subnet = self._subnet(nics[0].get("subnetwork"))
        wanted = ip or nics[0].get("networkIP")
        address = subnet.take(wanted) if subnet else str(wanted or "")
        vm = _Vm(project, zone, name, group, worker, address, properties)
        self.vms[(project, zone, name)] = vm
        if announce:
            self._hook(self.on_host_up, vm)
        return vm

    def _hook(self, hook: Hook | None, vm: _Vm) -> None:
        if hook is not None:
            hook(self._vm_host(vm))

    def delete_mig(self, project: str, zone: str, name: str) -> None:
        """instanceGroupManagers.delete: the MIG and every instance it holds."""
        key = (project, zone, name)
        mig = self.migs.get(key)
        held = [v for v in self.vms.values() if (v.project, v.zone, v.group) == key]
        for vm in held:
            self._remove_vm(vm)
        for record in self.resize_requests.pop(key, []):  # a MIG's requests go with it
            wait = self._waits.pop(id(record), None)
            if wait is not None:
                self.capacity.cancel(wait)
        for table in (self.migs, self.instances, self.configs):
            table.pop(key, None)
        if mig is not None:
            self.capacity.give_back(zone, self._machine_of(mig), len(held), self.clock())

    def _remove_vm(self, vm: _Vm) -> None:
        self.vms.pop((vm.project, vm.zone, vm.name), None)
        vm.status = DELETED
        self._hook(self.on_host_down, vm)

    # ---- GKE node pools ------------------------------------------------------------------------

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
            }
        }
        mig = self.insert_mig(
            project,
            zone,
            {"name": f"{base}-grp", "baseInstanceName": base, "versions": [{"instanceTemplate": template}]},
        )
        mig["creationTimestamp"] = _rfc3339(self.clock())
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

        if config.get("flexStart"):
            scaling = pool.get("autoscaling") or {}
            hosts = int(scaling.get("totalMaxNodeCount") or scaling.get("maxNodeCount") or 0)
            wait = CapacityRequest(
                f"{cluster}/{name}", zone, self._machine_of(mig), hosts, None, lambda: grow(hosts)
            )
            self._pool_waits[key] = wait
            self.capacity.submit(wait, self.clock())
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
        for url in (pool or {}).get("instanceGroupUrls", []):
            parts = str(url).split("/")
            self.delete_mig(project, parts[parts.index("zones") + 1], _short(url))

    def node_pools_of(self, project: str, location: str, cluster: str) -> list[dict[str, Any]]:
        """nodePools.list: the cluster's pools, by name."""
        return [
            copy.deepcopy(pool)
            for (p, loc, c, _), pool in sorted(self.node_pools.items())
            if (p, loc, c) == (project, location, cluster)
        ]

    # ---- Cloud TPU API -------------------------------------------------------------------------

    def create_node(
        self, project: str, zone: str, name: str, body: dict[str, Any], *, taken: bool = False
    ) -> dict[str, Any]:
        """nodes.create: a node with one network endpoint per host of its shape. `taken`: its
        hosts were already taken from the zone (by the queued resource that creates it)."""
        node = copy.deepcopy(body)
        node.update(
            name=f"projects/{project}/locations/{zone}/nodes/{name}",
            id=str(next(self._ids)),
            createTime="2026-01-01T00:00:00Z",
            apiVersion="V2",
            state=TPU_READY,
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
        for host in self._node_hosts((project, zone, name)):
            self._call(self.on_host_up, host)
        return node

    def delete_node(self, project: str, zone: str, name: str) -> None:
        hosts = self._node_hosts((project, zone, name))
        node = self.nodes.pop((project, zone, name), None)
        for host in hosts:
            self._call(self.on_host_down, replace(host, status=DELETED))
        if node is not None and node.get("state") != TPU_PREEMPTED:  # a preempted node's stay with Google
            self.capacity.give_back(zone, node_kind(node), len(hosts), self.clock())

    def create_queued_resource(
        self, project: str, zone: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """queuedResources.create: accepted at once, fulfilled whole when the zone has room for
        its node, FAILED past its deadline (see the module docstring). Returns the request as
        Google does."""
        now = self.clock()
        path = f"projects/{project}/locations/{zone}/queuedResources/{name}"
        record = {
            **copy.deepcopy(body),
            "name": path,
            "createTime": _rfc3339(now),
            "state": {"state": WAITING},
        }
        node = bodies.queued_node(body)
        node_id = str(((body.get("tpu") or {}).get("nodeSpec") or [{}])[0].get("nodeId") or name)
        duration = (body.get("queueingPolicy") or {}).get("validUntilDuration")
        deadline = now + float(str(duration).removesuffix("s")) if duration else None

        def fulfil() -> None:
            self.create_node(project, zone, node_id, {**node, "queuedResource": path}, taken=True)
            record["state"] = {"state": ACTIVE}

        wait = CapacityRequest(
            f"queuedResources/{name}", zone, node_kind(node), node_hosts(node), deadline, fulfil
        )
        self.queued[(project, zone, name)] = record
        self._waits[id(record)] = wait
        self.capacity.submit(wait, now)
        self._sync(record)
        return record

    def _sync(self, record: dict[str, Any]) -> None:
        """A waiting queued resource whose request failed (its deadline passed) turns FAILED."""
        wait = self._waits.get(id(record))
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
        self.capacity.advance(self.clock())
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
        wait = self._waits.pop(id(record), None)
        if wait is not None:
            self.capacity.cancel(wait)
        del self.queued[key]

    def _suspend_queued(self, node: dict[str, Any]) -> None:
        """A queued node's hosts were lost to the service: its request is SUSPENDED (see above)."""
        for record in self.queued.values():
            if record["name"] == node.get("queuedResource"):
                record["state"] = {"state": SUSPENDED, "stateInitiator": "SERVICE"}

    @staticmethod
    def _call(hook: Hook | None, host: TwinHost) -> None:
        if hook is not None:
            hook(host)

    # ---- failures ------------------------------------------------------------------------------

    def preempt(
        self, project: str, zone: str, group: str, *, action: str | None = None, repair: bool = True
    ) -> list[TwinHost]:
        """A Spot preemption of slice `group` (MIG or TPU node); the hosts it hit, as they were.

        Each MIG host is stopped or deleted per its termination action (or `action`, STOP or
        DELETE, when given); then its MIG's lifecycle policy applies unless `repair` is False."""
        key = (project, zone, group)
        if key in self.nodes:
            hosts = self._node_hosts(key)
            self.nodes[key]["state"] = TPU_PREEMPTED
            self._suspend_queued(self.nodes[key])
            for host in hosts:
                self._call(self.on_host_down, replace(host, status=TPU_PREEMPTED))
            return hosts
        if key not in self.migs:
            raise KeyError(f"no slice {group} in {project}/{zone}")
        hit = [v for v in self.vms.values() if (v.project, v.zone, v.group) == key and v.status == RUNNING]
        before = [self._vm_host(v) for v in hit]
        for vm in hit:
            self.lose(vm, deleted=(action or _termination(vm)) == rules.DELETE, repair=repair)
        return before

    def lose(self, vm: _Vm, *, deleted: bool, repair: bool = True) -> None:
        """Instance `vm` of a MIG failed or was preempted: stopped or deleted, then the MIG's
        lifecycle policy decides (REPAIR recreates it under its name; DO_NOTHING leaves it)."""
        key = (vm.project, vm.zone, str(vm.group))
        records = [r for r in self.instances.get(key, []) if r["name"] == vm.name]
        if deleted:
            self._remove_vm(vm)
            self.instances[key] = [r for r in self.instances.get(key, []) if r["name"] != vm.name]
        else:
            vm.status = TERMINATED
            for record in records:
                record["instanceStatus"] = TERMINATED
            self._hook(self.on_host_down, vm)
        mig = self.migs.get(key, {})
        action = mig.get("instanceLifecyclePolicy", {}).get("defaultActionOnFailure", REPAIR)
        if action == REPAIR and repair:
            self.vms[(vm.project, vm.zone, vm.name)] = vm
            vm.status = RUNNING
            if deleted and records:
                self.instances[key].append(
                    {**records[0], "id": str(next(self._ids)), "instanceStatus": RUNNING}
                )
            for record in records:
                record["instanceStatus"] = RUNNING
            self._hook(self.on_host_up, vm)

    # ---- what the hosts see --------------------------------------------------------------------

    def hosts(self, project: str | None = None, zone: str | None = None) -> list[TwinHost]:
        """Every instance and TPU worker that exists, by group and worker."""
        found = [self._vm_host(v) for v in self.vms.values()]
        for key in self.nodes:
            found += self._node_hosts(key)
        return sorted(
            (h for h in found if project in (None, h.project) and zone in (None, h.zone)),
            key=lambda h: (h.group or "", h.worker, h.name),
        )

    def host(self, name: str) -> TwinHost | None:
        return next((h for h in self.hosts() if h.name == name), None)

    def _vm_host(self, vm: _Vm) -> TwinHost:
        properties = vm.properties
        machine = _short(properties.get("machineType", "")) or None
        metadata = _metadata(properties)
        if vm.group is not None:
            metadata.update(self._compute_tpu_attributes(vm, machine))
        return TwinHost(
            name=vm.name,
            project=vm.project,
            zone=vm.zone,
            group=vm.group,
            kind=MIG_HOST if vm.group is not None else LONE_VM,
            worker=vm.worker,
            status=vm.status,
            ip=vm.ip,
            machine_type=machine,
            metadata=metadata,
            labels=dict(properties.get("labels") or {}),
        )

    def _compute_tpu_attributes(self, vm: _Vm, machine: str | None) -> dict[str, str]:
        """Google's attributes on a Compute Engine TPU host of a MIG with a workload policy."""
        shape = rules.tpu_machine(machine)
        mig = self.migs.get((vm.project, vm.zone, str(vm.group)))
        policy = (
            self.resources.get(self._link(mig.get("resourcePolicies", {}).get("workloadPolicy")))
            if mig
            else None
        )
        topology = policy.body.get("workloadPolicy", {}).get("acceleratorTopology") if policy else None
        if shape is None or not topology:
            return {}
        peers = sorted(
            (v for v in self.vms.values() if (v.project, v.zone, v.group) == (vm.project, vm.zone, vm.group)),
            key=lambda v: v.worker,
        )
        accelerator = catalog.lookup(f"{shape[0]}-{topology}", "compute").accelerator_type
        return google_attributes(
            COMPUTE_TPU_ATTRIBUTES,
            accelerator_type=accelerator,
            topology=topology,
            worker=vm.worker,
            ips=[p.ip for p in peers],
            node_id=str(vm.group),
            project=vm.project,
            zone=vm.zone,
            runtime_version="",
        )

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
                status=str(node.get("state", TPU_READY)),
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


def google_attributes(
    names: tuple[str, ...],
    *,
    accelerator_type: str,
    topology: str,
    worker: int,
    ips: list[str],
    node_id: str,
    project: str,
    zone: str,
    runtime_version: str,
) -> dict[str, str]:
    """The identity attributes `names` a TPU host of `accelerator_type` serves, valued as a real
    host serves them: the accelerator type as the host reports it (`catalog.reported_name`),
    endpoints as ``unknown:unknown:<ip>`` entries, `tpu-env` as ``KEY: 'value'`` lines."""
    reported = catalog.reported_name(accelerator_type) if accelerator_type else ""
    tpu_env = {
        "ACCELERATOR_TYPE": reported,
        "CONSUMER_PROJECT_ID": project,
        "NODE_ID": node_id,
        "RUNTIME_VERSION": runtime_version,
        "TOPOLOGY": topology,
        "WORKER_ID": str(worker),
        "ZONE": zone,
    }
    served = {
        "accelerator-type": reported,
        "agent-worker-number": str(worker),
        "worker-id": str(worker),
        "instance-id": node_id,
        "worker-network-endpoints": ",".join(f"unknown:unknown:{ip}" for ip in ips),
        "tpu-env": "".join(f"{key}: '{value}'\n" for key, value in tpu_env.items()),
    }
    return {key: served[key] for key in names}


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


def _rfc3339(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _tpu_api_type(config: dict[str, Any]) -> str:
    if not config:
        return ""
    return catalog.lookup(f"{_API_GENERATIONS[config['type']]}-{config['topology']}").accelerator_type


_API_GENERATIONS = {api: generation for generation, api in TPU_ACCELERATOR_TYPES.items()}
_COLLECTIONS = {
    bodies.TEMPLATE: "instanceTemplates",
    bodies.MIG: "instanceGroupManagers",
    bodies.RESOURCE_POLICY: "resourcePolicies",
    bodies.INSTANCE: "instances",
    bodies.ADDRESS: "addresses",
    bodies.FIREWALL: "firewalls",
    bodies.NETWORK: "networks",
    bodies.SUBNETWORK: "subnetworks",
    bodies.ROUTER: "routers",
    bodies.PER_INSTANCE_CONFIG: "perInstanceConfigs",
    bodies.TPU_NODE: "nodes",
    bodies.IMAGE: "images",
    bodies.RESIZE_REQUEST: "resizeRequests",
    bodies.QUEUED_RESOURCE: "queuedResources",
}


def _termination(vm: _Vm) -> str | None:
    return vm.properties.get("scheduling", {}).get("instanceTerminationAction")
