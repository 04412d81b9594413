"""The twin's Compute Engine: instances, MIGs and their per-instance configs, resize requests,
addresses, images, and what happens to a MIG's hosts (preemption, host error, Compute Engine's
recovery).

Behaviour, by source:

- A MIG creates instances up to its target size, named ``<baseInstanceName>-<4 characters>``
  (compute v1 discovery document, InstanceGroupManager.targetSize "The target number of running
  instances for this managed instance group"; baseInstanceName "The base instance name is a
  prefix that you want to attach to the names of all VMs in a MIG").
- ``createInstances`` adds one named instance per per-instance config and raises the target size
  by as many (discovery, instanceGroupManagers.createInstances: "Creates instances with
  per-instance configurations in this managed instance group"; the provider creates a
  PerInstanceConfig through it, magic-modules mmv1/products/compute/PerInstanceConfig.yaml, one
  call per config; rayslice's SliceHosts sends every host of a bulk slice in one call).
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
  "To restart a Spot VMs instance or MIG, you must delete and then recreate it"). (A TPU node's
  preemption: `rayslice.cloud.twin.tpu`.)
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

- Bulk mode (Compute Engine, "About bulk mode",
  https://cloud.google.com/compute/docs/instance-groups/about-bulk-mode; the MIG's
  ``targetSizePolicy.mode`` BULK, compute v1 discovery InstanceGroupManagerTargetSizePolicy.mode:
  "if the MIG is unable to create even one VM, the MIG waits until all VMs can be created at the
  same time"): a bulk MIG creates all its hosts at once or none. Its hosts come from its target
  size (at insert or by ``resize``) or one ``createInstances``, and only while its target size is
  0: growth of a bulk MIG whose target size is above 0 is refused (`BulkModeError`), and so is
  any resize request (bulk mode "does not support resize requests"; rule
  bulk-no-resize-request, run by `insert_resize_request` itself, so the emulated HTTP API refuses
  it as the program does). It shrinks by a resize to 0, which deletes every host and withdraws a
  wait, or, once no bulk instance operation is in progress (its hosts exist), to any smaller size
  (the page's limitations: to reduce to a non-zero size, ``bulkInstanceOperation.inProgress`` must
  be false; read in its Chinese copy, the English page's limitations were not readable here).
  While the zone lacks hosts for all of it, it waits with its target size set and one
  placeholder managed instance per host ("During this waiting period, the MIG creates managed
  instances": name, ``currentAction`` CREATING, no ``instanceStatus``, no VM, nothing billed),
  and its ``status.bulkInstanceOperation`` says so ("View or cancel bulk creation of instances
  in a MIG"; compute v1 discovery, InstanceGroupManagerStatusBulkInstanceOperation):
  ``inProgress`` true and ``lastProgressCheck`` with the check's ``timestamp`` and
  ``error.errors[].code`` ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS. When the hosts come, it
  creates them all under the placeholders' names (auto-named, or as the ``createInstances``
  named them) and ``inProgress`` turns false. A resize to 0 drops the placeholders.
- Individual mode (the default; "About bulk mode": "If there is not enough capacity to create
  all the instances specified in the target size, then the MIG creates as many instances as
  possible with the available capacity and attempts to create the remaining instances as
  capacity becomes available"; "Overview of adding instances all at once in a MIG": individual
  creation "can lead to partial provisioning"): an insert, resize or ``createInstances`` creates
  what the zone has, and lists each other instance as CREATING with no ``instanceStatus`` and
  ``lastAttempt.errors.errors[]`` ZONE_RESOURCE_POOL_EXHAUSTED (ManagedInstance.lastAttempt:
  "Information about the last attempt to create or delete the instance"); each is created, under
  its name, when a host comes (one host each, in the order they came). The target size counts
  them; deleting one, or shrinking the MIG (instances not created go first), withdraws it.
- ``createInstances`` naming an instance that exists in the zone is refused and creates nothing:
  an instance's name is unique in its project and zone (compute v1 discovery, Instance.name "The
  name of the resource ... must be 1-63 characters long", and Compute Engine's naming convention
  "Resource names must be unique" within their scope,
  https://cloud.google.com/compute/docs/naming-resources).
- An internal address in use by an instance cannot be deleted (`AddressInUseError`): Compute
  Engine, "Reserve a static internal IP address"
  (https://cloud.google.com/compute/docs/ip-addresses/reserve-static-internal-ip-address),
  "Release a static internal IPv4 address": an address still used by a resource is released only
  once the resource stops using it; the twin refuses the delete and changes nothing.
- A Spot preemption of a Compute Engine instance is recorded as a zone operation of type
  ``compute.instances.preempted`` (Google's sample "List preemption history", compute_preemptible_history
  in GoogleCloudPlatform/python-docs-samples, filters zoneOperations.list on
  ``operationType="compute.instances.preempted"``), shaped as the compute v1 discovery document's
  Operation (`preemptions`).
- Over time (`rayslice.cloud.twin.clock`): after a host error or a maintenance event
  (`host_error`, `maintenance`) Compute Engine restarts the stopped hosts together where
  ``scheduling.automaticRestart`` is on (compute v1 discovery, Scheduling.automaticRestart:
  "Specifies whether the instance should be automatically restarted if it is terminated by
  Compute Engine ... By default, this is set to true"; Spot instances "cannot be automatically
  restarted"; Cloud TPU, "Failure recovery of TPU instances": with automatic restart off "a
  failure leaves the instance TERMINATED"): on healthy hardware (a new
  ``resourceStatus.physicalHost``, `_Vm.physical_host`) after `Timings.restart_after_s`, or, for
  a reservation in All Capacity mode (`all_capacity`: the mode is set with Google, no field of
  the v1 API carries it), repaired in place on the same host after `Timings.repair_in_place_s`
  (Cloud TPU, "TPU capacity modes": "Hardware failures are repaired on the existing host without
  automatically relocating instances"). A host with automatic restart off stays TERMINATED.
  An instance with ``scheduling.maxRunDuration`` ("the instance termination action will be
  performed at the end of the run duration") is deleted or stopped per its
  ``instanceTerminationAction`` when it ends (`ended` lists them); a run of 0 s or less is
  refused before any host is made (`TwinEventError`, rule run-ends-after-it-starts). The end of
  a calendar reservation's period (`end_reservation`, scheduled by a test with `at`) ends every
  instance that consumes it the same way.
- The bill (`rayslice.cloud.billing`): each MIG's RUNNING hosts at the catalog's price for the
  template's provisioning model, all of them wasted while the MIG is not whole (fewer RUNNING
  hosts than its target size); each RUNNING lone VM, never wasted.
- Capacity (`rayslice.cloud.twin.state`): a MIG resize request (compute v1 discovery,
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
  nothing.
"""

from __future__ import annotations

import copy
import ipaddress
import itertools
import re
import secrets
from dataclasses import dataclass
from typing import Any

from rayslice import catalog
from rayslice.capacity_table import in_bulk_mode
from rayslice.cloud import billing, bodies, rules
from rayslice.cloud.billing import Line
from rayslice.cloud.bodies import Request
from rayslice.cloud.capacity import ZONE_RESOURCE_POOL_EXHAUSTED
from rayslice.cloud.capacity import Request as CapacityRequest
from rayslice.cloud.states import INSTANCE_RUNNING, INSTANCE_TERMINATED, PREEMPTED_OPERATION
from rayslice.cloud.twin.clock import NoSuchResource, TwinEventError
from rayslice.cloud.twin.state import (
    DELETED,
    LONE_VM,
    MIG_HOST,
    CloudRuleError,
    Create,
    Hook,
    Subnet,
    TwinHost,
    TwinState,
    google_attributes,
    metadata_of,
    rfc3339,
    short_name,
)
from rayslice.errors import InvalidInput
from rayslice.platforms import COMPUTE_TPU_ATTRIBUTES

API_ROOT = "https://www.googleapis.com/compute/v1/"
IMAGE_DISK_SOURCE = (
    "Google's sample 'Create a disk image' (https://cloud.google.com/compute/docs/samples/"
    "compute-images-create): forceCreate 'proceeds even if the disk is attached to a running "
    "instance'; without it images.insert refuses such a disk"
)
REPAIR = "REPAIR"
# InstanceGroupManagerResizeRequest.state (compute v1 discovery document).
RESIZE_ACCEPTED, RESIZE_SUCCEEDED, RESIZE_FAILED = "ACCEPTED", "SUCCEEDED", "FAILED"
RESIZE_CANCELLED = "CANCELLED"
# The states in which a resize request may be cancelled, and deleted (module docstring, sources).
RESIZE_CANCELLABLE = frozenset({RESIZE_ACCEPTED})
RESIZE_DELETABLE = frozenset({RESIZE_SUCCEEDED, RESIZE_FAILED, RESIZE_CANCELLED})
# An instance as deleteInstances names it: a full URL or a partial one, "such as
# zones/[ZONE]/instances/[INSTANCE_NAME]" (compute v1 discovery, InstanceGroupManagersDeleteInstancesRequest).
_INSTANCE_URL = re.compile(
    r"^(?:https?://[^/]+/compute/v1/)?(?:projects/(?P<project>[^/]+)/)?zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)$"
)
UNAPPLIED_DELETION = "UNAPPLIED_DELETION"  # PerInstanceConfig.status (compute v1 discovery)
# PerInstanceConfig.status of an instance not created yet: "being applied to the instance, but is
# not yet effective".
APPLYING = "APPLYING"
CREATING = "CREATING"  # ManagedInstance.currentAction (compute v1 discovery)
# Why a bulk MIG waits, as its status.bulkInstanceOperation.lastProgressCheck gives it (Compute
# Engine, "View or cancel bulk creation of instances in a MIG").
BULK_EXHAUSTED = "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"


class InstanceValidationError(InvalidInput):
    """A deleteInstances or deletePerInstanceConfigs request Google fails; nothing was deleted."""


class ResizeRequestStateError(InvalidInput):
    """A resize request cancelled or deleted in a state that does not allow it; nothing changed."""


class BulkModeError(InvalidInput):
    """Growth of a bulk MIG whose target size is above 0 (module docstring, "About bulk mode");
    nothing changed."""


class DuplicateInstanceError(InvalidInput):
    """A createInstances that names an instance that exists in the zone; nothing was created."""


class AddressInUseError(InvalidInput):
    """An address deleted while an instance uses it; nothing changed."""


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
    status: str = INSTANCE_RUNNING
    # Where it runs (Instance.resourceStatus.physicalHost, "blockId/subBlockId/hostId"): a
    # restart on healthy hardware moves it, a repair in place does not.
    physical_host: str = ""
    # Whether it holds a host of its zone's capacity: a preempted Spot host's goes back to Google
    # at once ("Spot VMs": Compute Engine preempts them "to reclaim those resources"), so deleting the
    # stopped instance later frees nothing for the next create.
    holds_capacity: bool = True


class ComputeTwin(TwinState):
    """The project's Compute Engine resources (see the module docstring)."""

    def __init__(self, default_range: str | None = None, address_range: str | None = None) -> None:
        super().__init__(default_range, address_range)
        # What the recovery controller reads through the emulated APIs (shared with them).
        self.migs: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.instances: dict[tuple[str, str, str], list[dict[str, Any]]] = {}  # managed instances
        self.configs: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        self.vms: dict[tuple[str, str, str], _Vm] = {}
        self.addresses: dict[str, str] = {}  # address name -> IP
        # A MIG's resize requests as Google returns them, and what each waits on.
        self.resize_requests: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        self._resize_waits: dict[int, CapacityRequest] = {}  # id(resize request record) -> its wait
        # A bulk MIG's wait for all its hosts (module docstring, bulk mode), by MIG key.
        self._mig_waits: dict[tuple[str, str, str], CapacityRequest] = {}
        # An individual MIG's instance still being created, by (project, zone, instance name).
        self._instance_waits: dict[tuple[str, str, str], CapacityRequest] = {}
        # Zone operations Google records by itself (a Spot preemption), oldest first.
        self.operations: list[dict[str, Any]] = []
        # Reservations in All Capacity mode, by name (`declare_all_capacity`), and the instances
        # whose run duration ended, in order.
        self.all_capacity: set[str] = set()
        self.ended: list[str] = []

    # ---- applying the program's resources ------------------------------------------------------

    def _precheck(self, call: Create, urn: str | None) -> None:
        if call.type_token == bodies.IMAGE:
            self._check_source_disk(call.name, call.request, project=call.project, urn=urn)
        held = {
            bodies.MIG: (call.project, call.zone, call.resource_name) in self.migs,
            bodies.INSTANCE: (call.project, call.zone, call.resource_name) in self.vms,
            bodies.ADDRESS: call.resource_name in self.addresses,
        }
        if held.get(call.type_token):
            self.already_exists(call, urn)
        super()._precheck(call, urn)

    def _create(self, call: Create) -> dict[str, Any]:
        """Subnetworks, addresses, MIGs, per-instance configs, resize requests and instances."""
        body, project, zone = call.request.body, call.project, str(call.zone)
        outputs: dict[str, Any] = {}
        if call.type_token == bodies.SUBNETWORK:
            self.subnets[call.resource_name] = Subnet(ipaddress.IPv4Network(body["ipCidrRange"]))
        elif call.type_token == bodies.ADDRESS:
            subnet = self._subnet(body.get("subnetwork"))
            wanted = body.get("address")
            outputs["address"] = self.addresses[call.resource_name] = (
                subnet.take(wanted) if subnet else str(wanted or "")
            )
        elif call.type_token == bodies.MIG:
            self.insert_mig(project, zone, body)
        elif call.type_token in (bodies.PER_INSTANCE_CONFIG, bodies.SLICE_HOSTS):
            mig = self._mig_named(project, zone, str(call.target), call.name)
            self.create_instances(project, zone, mig, body["instances"])
        elif call.type_token == bodies.RESIZE_REQUEST:
            self.insert_resize_request(project, zone, short_name(call.target), body)
        elif call.type_token == bodies.INSTANCE:
            self.capacity.take(zone, short_name(body.get("machineType", "")), 1)
            vm = self._new_vm(project, zone, call.resource_name, None, 0, body)
            outputs["networkInterfaces"] = [{"networkIp": vm.ip}]
        else:
            return super()._create(call)
        return outputs

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
                and vm.status == INSTANCE_RUNNING
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

    def delete_address(self, name: str) -> None:
        """addresses.delete: refused (`AddressInUseError`, nothing changed) while an instance
        this twin holds uses the address's IP (module docstring)."""
        ip = self.addresses.get(name)
        if ip is None:
            raise KeyError(f"no address {name}")
        users = sorted(vm.name for vm in self.vms.values() if ip and vm.ip == ip and vm.status != DELETED)
        if users:
            raise AddressInUseError(
                f"address {name} ({ip}) is in use by instance(s) {', '.join(users)}: delete them first"
            )
        del self.addresses[name]
        subnet = self.address_pool or self.default_subnet
        for pool in [*self.subnets.values(), *([subnet] if subnet else [])]:
            pool.used.discard(ip)

    def stop_instance(self, project: str, zone: str, name: str) -> None:
        """instances.stop: the instance is TERMINATED, its disks stay (discovery, Instance.status
        TERMINATED "The instance has stopped (either by explicit action or underlying failure)")."""
        vm = self.vms[(project, zone, name)]
        vm.status = INSTANCE_TERMINATED
        self._hook(self.on_host_down, vm)

    def delete_instance(self, project: str, zone: str, name: str) -> None:
        """instances.delete of a standalone instance (a MIG's go with the MIG or its
        deleteInstances): the instance goes and its machine returns to the zone."""
        vm = self.vms[(project, zone, name)]
        self._remove_vm(vm)
        self.capacity.give_back(zone, short_name(vm.properties.get("machineType", "")), 1, self.clock.now)

    # ---- MIGs ----------------------------------------------------------------------------------

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
        size = int(mig["targetSize"])
        self._check_run(mig)
        self.migs[key], self.instances[key], self.configs[key] = mig, [], []
        self.resize_requests[key] = []
        if in_bulk_mode(mig):
            self._bulk_wait(project, zone, mig, size, [])
        else:
            self._create_individually(
                project, zone, mig, self._auto_names(project, zone, mig, size), named=False
            )
        return mig

    def _bulk_wait(
        self, project: str, zone: str, mig: dict[str, Any], size: int, configs: list[dict[str, Any]]
    ) -> None:
        """Bulk MIG `mig` waits for `size` hosts and creates them all at once when the zone has
        them: named by `configs` (one createInstances) or by the MIG (module docstring)."""
        if size <= 0:
            return
        key = (project, zone, mig["name"])
        named = configs or self._auto_names(project, zone, mig, size)
        placeholders = [self._placeholder(project, zone, str(c["name"])) for c in named]
        self.instances[key].extend(placeholders)
        machine = self._machine_of(mig)
        mig.setdefault("status", {})["bulkInstanceOperation"] = {
            "inProgress": True,
            "lastProgressCheck": {
                "timestamp": rfc3339(self.clock.now),
                "error": {
                    "errors": [{"code": BULK_EXHAUSTED, "message": _exhausted(project, zone, machine, size)}]
                },
            },
        }

        def fulfil() -> None:
            self._mig_waits.pop(key, None)
            self.instances[key] = [r for r in self.instances[key] if all(r is not p for p in placeholders)]
            if configs:
                self._add_configured(project, zone, mig, configs)
            else:
                self._add_auto_named(project, zone, mig, [str(c["name"]) for c in named])
            mig["status"]["bulkInstanceOperation"] = {
                "inProgress": False,
                "lastProgressCheck": {"timestamp": rfc3339(self.clock.now)},
            }

        wait = CapacityRequest(f"{mig['name']}/bulk", zone, machine, size, None, fulfil)
        self._mig_waits[key] = wait
        self.capacity.submit(wait, self.clock.now)

    def resize_mig(self, project: str, zone: str, name: str, size: int) -> None:
        """instanceGroupManagers.resize (compute v1 discovery: "Resizes the managed instance
        group. If you increase the size, the group creates new instances ... If you decrease the
        size, the group deletes instances"). A bulk MIG grows only from 0 (`BulkModeError`
        otherwise) and waits for all its hosts; a resize to 0 deletes every host and withdraws its
        wait; a resize to fewer hosts, not 0, is refused while that wait lasts (its bulk instance
        operation is in progress). Any other MIG takes or gives back hosts at once (auto-named;
        the newest go first)."""
        key = (project, zone, name)
        mig = self.migs[key]
        target = int(mig.get("targetSize", 0))
        if size == target:
            return
        self._check_run(mig)
        if in_bulk_mode(mig):
            if size == 0:
                self._shrink_to(project, zone, mig, 0)
                return
            if size < target:
                if key in self._mig_waits:
                    raise BulkModeError(
                        f"MIG {name} in bulk mode is still creating its {target} hosts: only a resize "
                        "to 0 removes hosts while a bulk instance operation is in progress"
                    )
                self._shrink_to(project, zone, mig, size)
                return
            if target > 0:
                raise BulkModeError(
                    f"MIG {name} is in bulk mode with target size {target}: hosts are added only "
                    "while its target size is 0 (resize it to 0 first)"
                )
            mig["targetSize"] = size
            self._bulk_wait(project, zone, mig, size, [])
            return
        if size > target:
            names = self._auto_names(project, zone, mig, size - target)
            self._create_individually(project, zone, mig, names, named=False)
            mig["targetSize"] = size
        else:
            self._shrink_to(project, zone, mig, size)

    def _shrink_to(self, project: str, zone: str, mig: dict[str, Any], size: int) -> None:
        """MIG `mig` down to `size` hosts (the highest workers go first); a bulk wait withdrawn."""
        key = (project, zone, mig["name"])
        wait = self._mig_waits.pop(key, None)
        if wait is not None:
            self.capacity.cancel(wait)
        # Instances not created yet go first (a bulk wait's placeholders, an individual MIG's
        # instances still being created), then the highest workers.
        excess = max(0, int(mig.get("targetSize", 0)) - size)
        waiting = [r["name"] for r in self.instances[key] if (project, zone, r["name"]) not in self.vms]
        dropped = set(waiting[::-1][:excess] if wait is None else waiting)
        self._withdraw(project, zone, dropped)
        if wait is not None:
            mig["status"]["bulkInstanceOperation"]["inProgress"] = False
        held = sorted(
            (v for v in self.vms.values() if (v.project, v.zone, v.group) == key), key=lambda v: v.worker
        )
        gone = held[max(0, size - (len(waiting) - len(dropped))) :]
        for vm in gone:
            self._remove_vm(vm)
        names = {vm.name for vm in gone} | dropped
        self.instances[key] = [r for r in self.instances[key] if r["name"] not in names]
        self.configs[key] = [c for c in self.configs[key] if c["name"] not in names]
        mig["targetSize"] = size
        self.capacity.give_back(zone, self._machine_of(mig), _holding(gone), self.clock.now)

    def _auto_names(self, project: str, zone: str, mig: dict[str, Any], count: int) -> list[dict[str, Any]]:
        """`count` new names as a MIG names its instances: ``<baseInstanceName>-<4 characters>``,
        none an instance or managed instance of the zone holds (as configs: ``{"name": ...}``)."""
        prefix = mig.get("baseInstanceName", mig["name"])
        taken = {k[2] for k in self.vms if k[:2] == (project, zone)}
        taken |= {r["name"] for k, held in self.instances.items() if k[:2] == (project, zone) for r in held}
        names: list[dict[str, Any]] = []
        while len(names) < count:
            name = f"{prefix}-{secrets.token_hex(2)}"
            if name not in taken:
                taken.add(name)
                names.append({"name": name})
        return names

    def _add_auto_named(self, project: str, zone: str, mig: dict[str, Any], names: list[str] | int) -> None:
        """Instances named as a MIG names them (`names`, or that many new ones), created
        together: ``on_host_up`` runs once all exist, so each host's attributes list every peer
        (a bulk MIG "creates VMs all at once")."""
        if isinstance(names, int):
            names = [str(c["name"]) for c in self._auto_names(project, zone, mig, names)]
        created = []
        for name in names:
            self._add_to_mig(project, zone, mig, name, {}, announce=False)
            created.append(self.vms[(project, zone, name)])
        for vm in created:
            self._hook(self.on_host_up, vm)

    def _create_individually(
        self, project: str, zone: str, mig: dict[str, Any], configs: list[dict[str, Any]], *, named: bool
    ) -> list[dict[str, Any]]:
        """An individual-mode MIG creates `configs`' instances: as many as the zone has hosts for
        now, the rest later, one by one as hosts come (module docstring, N1's quote); the
        managed-instance records of those created now. `named`: per-instance configs (from
        createInstances), else auto-named instances of the target size."""
        machine = self._machine_of(mig)
        free = self.capacity.free_of(zone, machine)
        now = len(configs) if free is None else min(free, len(configs))
        self.capacity.take(zone, machine, now)
        if named:
            added = self._add_configured(project, zone, mig, configs[:now], announce=True)
        else:
            before = len(self.instances[(project, zone, mig["name"])])
            self._add_auto_named(project, zone, mig, [str(c["name"]) for c in configs[:now]])
            added = self.instances[(project, zone, mig["name"])][before:]
        for config in configs[now:]:
            self._create_later(project, zone, mig, config, named=named)
        return added

    def _placeholder(self, project: str, zone: str, name: str) -> dict[str, Any]:
        """The managed instance of an instance the MIG is still creating: CREATING, no
        ``instanceStatus`` (compute v1 discovery, ManagedInstance.currentAction CREATING "The
        managed instance group is creating this instance. If the group fails to create this
        instance, it will try again until it is successful"; ManagedInstance.instance "The URL
        can exist even if the instance has not yet been created")."""
        return {
            "instance": f"{API_ROOT}projects/{project}/zones/{zone}/instances/{name}",
            "name": name,
            "id": str(next(self._ids)),
            "currentAction": CREATING,
        }

    def _create_later(
        self, project: str, zone: str, mig: dict[str, Any], config: dict[str, Any], *, named: bool
    ) -> None:
        """An individual MIG's instance the zone has no host for: listed as being created, with
        the last attempt's error (ManagedInstance.lastAttempt.errors), and created when a host
        comes (a wait of one host, in the order waits came)."""
        key, name, machine = (project, zone, mig["name"]), str(config["name"]), self._machine_of(mig)
        record = self._placeholder(project, zone, name)
        record["lastAttempt"] = {
            "errors": {
                "errors": [
                    {"code": ZONE_RESOURCE_POOL_EXHAUSTED, "message": _exhausted(project, zone, machine, 1)}
                ]
            }
        }
        self.instances[key].append(record)
        if named:
            self.configs[key] = [c for c in self.configs[key] if c["name"] != name]
            self.configs[key].append({**copy.deepcopy(config), "status": APPLYING})

        def fulfil() -> None:
            self._instance_waits.pop((project, zone, name), None)
            self.instances[key] = [r for r in self.instances[key] if r is not record]
            if named:
                self._add_configured(project, zone, mig, [config], announce=True)
            else:
                self._add_auto_named(project, zone, mig, [name])

        wait = CapacityRequest(f"{mig['name']}/{name}", zone, machine, 1, None, fulfil)
        self._instance_waits[(project, zone, name)] = wait
        self.capacity.submit(wait, self.clock.now)

    def _withdraw(self, project: str, zone: str, names: set[str]) -> None:
        """Instances still being created that go (deleted, or their MIG shrunk): no longer
        waited for (their records and configs are the caller's to drop)."""
        for name in names:
            wait = self._instance_waits.pop((project, zone, name), None)
            if wait is not None:
                self.capacity.cancel(wait)

    def _check_run(self, mig: dict[str, Any]) -> None:
        """Refuse (`TwinEventError`) hosts whose run would end before it starts, before any is
        made: the MIG's template's run duration (`_run_seconds`)."""
        _run_seconds((self._template_of(mig) or {}).get("properties") or {})

    def _machine_of(self, mig: dict[str, Any]) -> str:
        """The machine type of a MIG's hosts (its template's), the kind its capacity counts."""
        template = self._template_of(mig)
        return short_name((template or {}).get("properties", {}).get("machineType", ""))

    def insert_resize_request(
        self, project: str, zone: str, mig_name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """instanceGroupManagerResizeRequests.insert: accepted at once, fulfilled whole when the
        zone has all its hosts (see the module docstring). Returns the request as Google does."""
        key = (project, zone, mig_name)
        mig = self.migs.get(key)
        if mig is None:
            raise InvalidInput(f"resize request {body.get('name')}: no MIG {mig_name!r} in {project}/{zone}")
        self._refuse_on_bulk(mig, body)
        name, hosts = str(body["name"]), int(body["resizeBy"])
        base = f"projects/{project}/zones/{zone}/instanceGroupManagers/{mig_name}"
        record = {
            **copy.deepcopy(body),
            "kind": "compute#instanceGroupManagerResizeRequest",
            "id": str(next(self._ids)),
            "creationTimestamp": rfc3339(self.clock.now),
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
        self._resize_waits[id(record)] = wait
        self.capacity.submit(wait, self.clock.now)
        return record

    def _refuse_on_bulk(self, mig: dict[str, Any], body: dict[str, Any]) -> None:
        """Refuse a resize request on a bulk MIG, however it comes (the program's or the HTTP
        API's): the rule bulk-no-resize-request, run on the MIG as the twin holds it. Raises
        `CloudRuleError` (kept in `refused`); nothing is created."""
        link, name = str(mig["selfLink"]), str(body.get("name", ""))
        held = rules.Resource(
            bodies.MIG,
            link,
            mig["name"],
            Request(
                "compute", "compute.instanceGroupManagers.insert", "InstanceGroupManager", mig["name"], mig
            ),
            {},
        )
        asked = rules.Resource(
            bodies.RESIZE_REQUEST,
            f"{link}/resizeRequests/{name}",
            name,
            Request(
                "compute",
                "compute.instanceGroupManagerResizeRequests.insert",
                "InstanceGroupManagerResizeRequest",
                name,
                body,
            ),
            {"instanceGroupManager": frozenset({link})},
        )
        rule = [r for r in rules.RULES if r.id == "bulk-no-resize-request"]
        found = [v for v in rules.check(rules.Stack([held, asked]), rule) if v.urn == asked.urn]
        if found:
            self.refused.extend(found)
            raise CloudRuleError(found)

    def resize_requests_of(self, project: str, zone: str, mig: str) -> list[dict[str, Any]]:
        """instanceGroupManagerResizeRequests.list: the MIG's requests, oldest first."""
        return copy.deepcopy(self.resize_requests.get((project, zone, mig), []))

    def cancel_resize_request(self, project: str, zone: str, mig: str, name: str) -> dict[str, Any]:
        """instanceGroupManagerResizeRequests.cancel: an ACCEPTED request turns CANCELLED and
        stops waiting for capacity (module docstring); the request as Google returns it."""
        record = self._resize_request(project, zone, mig, name, RESIZE_CANCELLABLE, "cancelled")
        wait = self._resize_waits.pop(id(record), None)
        if wait is not None:
            self.capacity.cancel(wait)
        record["state"] = RESIZE_CANCELLED
        return copy.deepcopy(record)

    def delete_resize_request(self, project: str, zone: str, mig: str, name: str) -> None:
        """instanceGroupManagerResizeRequests.delete: an inactive request goes; the hosts it
        made stay in the MIG (module docstring)."""
        record = self._resize_request(project, zone, mig, name, RESIZE_DELETABLE, "deleted")
        self._resize_waits.pop(id(record), None)
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
        self._check_run(mig)
        target = int(mig.get("targetSize", 0))
        existing = sorted({str(c["name"]) for c in configs if (project, zone, str(c["name"])) in self.vms})
        if existing:
            raise DuplicateInstanceError(
                f"createInstances in {mig['name']}: instance(s) {', '.join(existing)} already exist in "
                f"{project}/{zone}; an instance name is unique in its zone"
            )
        if in_bulk_mode(mig):
            if target > 0:
                raise BulkModeError(
                    f"createInstances in MIG {mig['name']}, in bulk mode with target size {target}: "
                    "hosts are added only while its target size is 0"
                )
            mig["targetSize"] = len(configs)
            self._bulk_wait(project, zone, mig, len(configs), configs)
            return [
                r
                for r in self.instances[(project, zone, mig["name"])]
                if r["name"] in _names(configs) and (project, zone, r["name"]) in self.vms
            ]
        added = self._create_individually(project, zone, mig, configs, named=True)
        mig["targetSize"] = target + len(configs)
        return added

    def _add_configured(
        self,
        project: str,
        zone: str,
        mig: dict[str, Any],
        configs: list[dict[str, Any]],
        announce: bool = False,
    ) -> list[dict[str, Any]]:
        """The instances of `configs`, with their per-instance configs; without `announce`,
        created together (``on_host_up`` once all exist, as `_add_auto_named`)."""
        key = (project, zone, mig["name"])
        added = [self._add_to_mig(project, zone, mig, str(c["name"]), c, announce=announce) for c in configs]
        named = _names(configs)  # a config of that name (deleted, unapplied) is replaced
        self.configs[key] = [c for c in self.configs[key] if c["name"] not in named]
        self.configs[key].extend({**copy.deepcopy(c), "status": "EFFECTIVE"} for c in configs)
        if not announce:
            for name in named:
                self._hook(self.on_host_up, self.vms[(project, zone, name)])
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
        self._withdraw(project, zone, set(deleted))
        self.instances[key] = [r for r in self.instances[key] if r["name"] not in deleted]
        self.configs[key] = [c for c in self.configs[key] if c["name"] not in deleted]
        mig["targetSize"] = max(0, int(mig.get("targetSize", 0)) - len(deleted))
        self.capacity.give_back(zone, self._machine_of(mig), _holding(gone), self.clock.now)
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
            items = {**metadata_of(properties), **preserved["metadata"]}
            properties["metadata"] = {"items": [{"key": k, "value": v} for k, v in items.items()]}
        ip = next(
            (
                self.addresses.get(short_name(ip["ipAddress"].get("address")), ip["ipAddress"].get("literal"))
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
            "instanceStatus": INSTANCE_RUNNING,
        }
        self.instances[key].append(record)
        return record

    def _template_of(self, mig: dict[str, Any]) -> dict[str, Any] | None:
        """The body of the instance template a MIG's versions name, if the twin holds it."""
        for version in mig.get("versions", []):
            found = self.resources.get(self._link(version.get("instanceTemplate")))
            if found is not None:
                return found.body
        return None

    def _mig_named(self, project: str, zone: str, mig: str, config: str) -> dict[str, Any]:
        found = self.migs.get((project, zone, short_name(mig)))
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
        vm = _Vm(project, zone, name, group, worker, address, properties, physical_host=self._physical_host())
        self.vms[(project, zone, name)] = vm
        run = _run_seconds(properties)  # checked before any host was made (`_check_run`)
        if run is not None:
            self.after(run, f"instance {name}'s run duration ends", lambda: self._end_run(vm))
        if announce:
            self._hook(self.on_host_up, vm)
        return vm

    def _hook(self, hook: Hook | None, vm: _Vm) -> None:
        self._call(hook, self._vm_host(vm))

    def delete_mig(self, project: str, zone: str, name: str) -> None:
        """instanceGroupManagers.delete: the MIG and every instance it holds."""
        key = (project, zone, name)
        mig = self.migs.get(key)
        held = [v for v in self.vms.values() if (v.project, v.zone, v.group) == key]
        for vm in held:
            self._remove_vm(vm)
        bulk = self._mig_waits.pop(key, None)
        if bulk is not None:
            self.capacity.cancel(bulk)
        self._withdraw(project, zone, {r["name"] for r in self.instances.get(key, [])})
        for record in self.resize_requests.pop(key, []):  # a MIG's requests go with it
            wait = self._resize_waits.pop(id(record), None)
            if wait is not None:
                self.capacity.cancel(wait)
        for table in (self.migs, self.instances, self.configs):
            table.pop(key, None)
        if mig is not None:
            self.capacity.give_back(zone, self._machine_of(mig), _holding(held), self.clock.now)

    def _remove_vm(self, vm: _Vm) -> None:
        self.vms.pop((vm.project, vm.zone, vm.name), None)
        vm.status = DELETED
        self._hook(self.on_host_down, vm)

    # ---- failures ------------------------------------------------------------------------------

    def preempt(
        self, project: str, zone: str, group: str, *, action: str | None = None, repair: bool = True
    ) -> list[TwinHost]:
        """A Spot preemption of MIG `group`'s slice; the hosts it hit, as they were.

        Each MIG host is stopped or deleted per its termination action (or `action`, STOP or
        DELETE, when given); then its MIG's lifecycle policy applies unless `repair` is False."""
        key = (project, zone, group)
        if key not in self.migs:
            return super().preempt(project, zone, group, action=action, repair=repair)
        hit = [
            v
            for v in self.vms.values()
            if (v.project, v.zone, v.group) == key and v.status == INSTANCE_RUNNING
        ]
        before = [self._vm_host(v) for v in hit]
        for vm in hit:
            self._record_preemption(vm)
            self.lose(vm, deleted=(action or _termination(vm)) == rules.DELETE, repair=repair)
            vm.holds_capacity = vm.status == INSTANCE_RUNNING  # its MIG repaired it, else Google took it
        return before

    def _record_preemption(self, vm: _Vm) -> None:
        """The zone operation Compute Engine records for a preempted instance (compute v1
        discovery, Operation: operationType, targetLink, targetId, status DONE, user "system",
        statusMessage; the type and message as Google's preemption-history sample reads them)."""
        now = rfc3339(self.clock.now)
        number = next(self._ids)
        zone = f"{API_ROOT}projects/{vm.project}/zones/{vm.zone}"
        self.operations.append(
            {
                "kind": "compute#operation",
                "id": str(number),
                "name": f"systemevent-{number}",
                "zone": zone,
                "operationType": PREEMPTED_OPERATION,
                "targetLink": f"{zone}/instances/{vm.name}",
                "targetId": str(number),
                "status": "DONE",
                "statusMessage": "Instance was preempted.",
                "user": "system",
                "progress": 100,
                "insertTime": now,
                "startTime": now,
                "endTime": now,
                "selfLink": f"{zone}/operations/systemevent-{number}",
            }
        )

    def preemptions(self, project: str, zone: str) -> list[dict[str, Any]]:
        """zoneOperations.list filtered on ``operationType="compute.instances.preempted"``."""
        prefix = f"{API_ROOT}projects/{project}/zones/{zone}"
        return [copy.deepcopy(o) for o in self.operations if o["zone"] == prefix]

    def host_error(
        self,
        project: str,
        zone: str,
        group: str,
        *,
        repair: bool = True,
        restart: bool = True,
        restart_after: float | None = None,
    ) -> list[TwinHost]:
        """A host error or a host maintenance event on a MIG's slice: every host stops
        (TERMINATED, its disks kept) and the MIG's lifecycle policy applies unless `repair` is
        False; no preemption is recorded. Then, unless `restart` is False (GKE's nodes, whose
        repair is GKE's), Compute Engine restarts the hosts whose ``automaticRestart`` is on,
        together, `restart_after` seconds later (module docstring; default: the twin's
        `Timings`); a host with it off stays TERMINATED. The hosts it hit, as they were.
        `NoSuchResource` when the twin holds no such MIG."""
        key = (project, zone, group)
        if key not in self.migs:
            raise NoSuchResource("host-error-on-existing-host", f"no MIG {group} in {project}/{zone}")
        hit = [
            v
            for v in self.vms.values()
            if (v.project, v.zone, v.group) == key and v.status == INSTANCE_RUNNING
        ]
        before = [self._vm_host(v) for v in hit]
        for vm in hit:
            self.lose(vm, deleted=False, repair=repair)
        stopped = [vm for vm in hit if vm.status == INSTANCE_TERMINATED and _automatic_restart(vm)]
        if restart and stopped:
            self._restart_later(group, stopped, restart_after)
        return before

    def maintenance(self, project: str, zone: str, group: str, *, duration_s: float) -> list[TwinHost]:
        """A host maintenance event on a MIG's slice: a TPU VM cannot live-migrate (its
        ``onHostMaintenance`` is TERMINATE), so its hosts stop and Compute Engine restarts them
        (``automaticRestart``) once the `duration_s` maintenance is done (`host_error`)."""
        return self.host_error(project, zone, group, restart_after=duration_s)

    def _restart_later(self, group: str, stopped: list[_Vm], after: float | None) -> None:
        """Compute Engine restarts `stopped` together: on healthy hardware (a new physical
        host) after `Timings.restart_after_s`, or, in an All Capacity reservation, repaired in
        place (the same physical host, never relocated) after `Timings.repair_in_place_s`."""
        in_place = self._in_all_capacity(stopped[0])
        if after is None:
            after = self.timings.repair_in_place_s if in_place else self.timings.restart_after_s

        def restart() -> None:
            for vm in stopped:
                if self.vms.get((vm.project, vm.zone, vm.name)) is vm and vm.status == INSTANCE_TERMINATED:
                    if not in_place:
                        vm.physical_host = self._physical_host()
                    self._run_again(vm)

        how = "repairs in place" if in_place else "restarts on healthy hosts"
        self.after(after, f"Compute Engine {how} {len(stopped)} host(s) of {group}", restart)

    def _in_all_capacity(self, vm: _Vm) -> bool:
        """Whether `vm` consumes a reservation in All Capacity mode (`all_capacity`)."""
        affinity = vm.properties.get("reservationAffinity") or {}
        return any(short_name(v) in self.all_capacity for v in affinity.get("values") or [])

    def _physical_host(self) -> str:
        return f"block-1/subblock-1/host-{next(self._ids)}"

    def _run_again(self, vm: _Vm) -> None:
        """Stopped instance `vm` runs again under its name and address."""
        vm.status = INSTANCE_RUNNING
        for record in self.instances.get((vm.project, vm.zone, str(vm.group)), []):
            if record["name"] == vm.name:
                record["instanceStatus"] = INSTANCE_RUNNING
        self._hook(self.on_host_up, vm)

    def end_reservation(self, project: str, zone: str, reservation: str) -> list[str]:
        """Reservation `reservation`'s period ended (a future reservation in calendar mode:
        "Compute Engine deletes the reservation at its end time", and the VMs that consume it
        end with it, "About resize requests in a MIG"): each instance consuming it ends as at the
        end of its run (`_end_run`). The instances it ended; `NoSuchResource` when none consumes
        it (a period cannot end for hosts that never existed)."""
        hit = [
            vm
            for vm in list(self.vms.values())
            if vm.project == project
            and vm.zone == zone
            and reservation
            in [short_name(v) for v in (vm.properties.get("reservationAffinity") or {}).get("values") or []]
        ]
        if not hit:
            raise NoSuchResource(
                "period-ends-for-existing-hosts",
                f"no instance in {project}/{zone} consumes reservation {reservation}",
            )
        for vm in hit:
            self._end_run(vm)
        return [vm.name for vm in hit]

    def _end_run(self, vm: _Vm) -> None:
        """`vm`'s run duration ended (Scheduling.maxRunDuration: "the instance termination
        action will be performed at the end of the run duration"): deleted or stopped per its
        ``instanceTerminationAction``; a MIG's lifecycle policy does not bring it back, and a
        deleted host's machine returns to the zone."""
        if self.vms.get((vm.project, vm.zone, vm.name)) is not vm:
            return  # deleted (or recreated) before its run ended
        deleted = _termination(vm) == rules.DELETE
        machine = short_name(vm.properties.get("machineType", ""))
        if vm.group is not None:
            self.lose(vm, deleted=deleted, repair=False)
        elif deleted:
            self._remove_vm(vm)
        else:
            self.stop_instance(vm.project, vm.zone, vm.name)
        if deleted:
            self.capacity.give_back(vm.zone, machine, 1, self.clock.now)
        self.ended.append(vm.name)

    def recover(self, project: str, zone: str, group: str) -> None:
        """Compute Engine's recovery of a MIG's slice: its stopped hosts run again, whole, under
        their names and addresses (Cloud TPU, "Failure recovery of TPU instances": on-demand,
        flex-start and reserved slices are restarted on healthy hardware, together)."""
        key = (project, zone, group)
        for vm in [v for v in self.vms.values() if (v.project, v.zone, v.group) == key]:
            if vm.status == INSTANCE_TERMINATED:
                self._run_again(vm)

    def lose(self, vm: _Vm, *, deleted: bool, repair: bool = True) -> None:
        """Instance `vm` of a MIG failed or was preempted: stopped or deleted, then the MIG's
        lifecycle policy decides (REPAIR recreates it under its name; DO_NOTHING leaves it)."""
        key = (vm.project, vm.zone, str(vm.group))
        records = [r for r in self.instances.get(key, []) if r["name"] == vm.name]
        if deleted:
            self._remove_vm(vm)
            self.instances[key] = [r for r in self.instances.get(key, []) if r["name"] != vm.name]
        else:
            vm.status = INSTANCE_TERMINATED
            for record in records:
                record["instanceStatus"] = INSTANCE_TERMINATED
            self._hook(self.on_host_down, vm)
        mig = self.migs.get(key, {})
        action = mig.get("instanceLifecyclePolicy", {}).get("defaultActionOnFailure", REPAIR)
        if action == REPAIR and repair:
            self.vms[(vm.project, vm.zone, vm.name)] = vm
            vm.status = INSTANCE_RUNNING
            if deleted and records:
                self.instances[key].append(
                    {**records[0], "id": str(next(self._ids)), "instanceStatus": INSTANCE_RUNNING}
                )
            for record in records:
                record["instanceStatus"] = INSTANCE_RUNNING
            self._hook(self.on_host_up, vm)

    # ---- the bill ------------------------------------------------------------------------------

    def _bill_lines(self) -> list[Line]:
        """Each MIG's RUNNING hosts (all wasted while the MIG is not whole: fewer RUNNING hosts
        than its target size, or a member that is not RUNNING) and each RUNNING lone VM
        (`rayslice.cloud.billing`)."""
        lines = []
        for key, mig in self.migs.items():
            members = [v for v in self.vms.values() if (v.project, v.zone, v.group) == key]
            running = sum(1 for v in members if v.status == INSTANCE_RUNNING)
            target = int(mig.get("targetSize", 0))
            whole = running == target == len(members) == len(self.instances.get(key, []))
            price = _host_price(self._template_of(mig) or {}, key[1])
            lines.append(
                Line(
                    f"projects/{key[0]}/zones/{key[1]}/instanceGroupManagers/{key[2]}",
                    running,
                    None if price is None else price * running,
                    0 if whole else running,
                )
            )
        for vm in self.vms.values():
            if vm.group is None and vm.status == INSTANCE_RUNNING:
                price = _host_price({"properties": vm.properties}, vm.zone)
                lines.append(Line(f"projects/{vm.project}/zones/{vm.zone}/instances/{vm.name}", 1, price))
        return [*lines, *super()._bill_lines()]

    # ---- what the hosts see --------------------------------------------------------------------

    def _all_hosts(self) -> list[TwinHost]:
        return [*(self._vm_host(v) for v in self.vms.values()), *super()._all_hosts()]

    def _vm_host(self, vm: _Vm) -> TwinHost:
        properties = vm.properties
        machine = short_name(properties.get("machineType", "")) or None
        metadata = metadata_of(properties)
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


def _exhausted(project: str, zone: str, machine: str, hosts: int) -> str:
    """Compute Engine's message for a zone without the resources (Compute Engine,
    "Troubleshooting resource availability errors")."""
    return (
        f"The zone 'projects/{project}/zones/{zone}' does not have enough resources available to "
        f"fulfill the request ({hosts} x {machine or 'instance'}). Try a different zone, or try again later."
    )


def capacity_of(properties: dict[str, Any]) -> str:
    """The catalog capacity (price key) of an instance's properties: its provisioning model
    (compute v1 discovery, Scheduling.provisioningModel: SPOT, FLEX_START, RESERVATION_BOUND,
    STANDARD; ``preemptible`` the older Spot) or a specific reservation it consumes."""
    scheduling = properties.get("scheduling") or {}
    model = scheduling.get("provisioningModel")
    if model == rules.SPOT or scheduling.get("preemptible"):
        return billing.SPOT
    if model == rules.FLEX_START:
        return billing.FLEX_START
    affinity = (properties.get("reservationAffinity") or {}).get("consumeReservationType")
    if model == rules.RESERVATION_BOUND or affinity == "SPECIFIC_RESERVATION":
        return billing.RESERVED
    return billing.ON_DEMAND


def _host_price(template: dict[str, Any], zone: str) -> float | None:
    """USD per hour of one host made from `template` in `zone` (a TPU host by its chips)."""
    properties = template.get("properties") or {}
    machine = short_name(properties.get("machineType", ""))
    shape = rules.tpu_machine(machine)
    capacity = capacity_of(properties)
    if shape is not None:
        return billing.tpu_host_hour_price(shape[0], shape[1], zone, capacity)
    return billing.vm_hour_price(machine, zone, capacity) if machine else None


def _automatic_restart(vm: _Vm) -> bool:
    """Scheduling.automaticRestart: "By default, this is set to true"; Spot instances "cannot be
    automatically restarted" (compute v1 discovery)."""
    scheduling = vm.properties.get("scheduling") or {}
    spot = scheduling.get("provisioningModel") == rules.SPOT or scheduling.get("preemptible")
    return not spot and scheduling.get("automaticRestart", True) is not False


def _run_seconds(properties: dict[str, Any]) -> float | None:
    """An instance's run duration in seconds (Scheduling.maxRunDuration, a Duration), or None."""
    duration = (properties.get("scheduling") or {}).get("maxRunDuration")
    if not duration:
        return None
    seconds = float(duration.get("seconds", 0)) + float(duration.get("nanos", 0)) / 1e9
    if seconds <= 0:
        raise TwinEventError(
            "run-ends-after-it-starts", f"a run duration of {seconds} s ends before the run starts"
        )
    return seconds


def _holding(vms: list[_Vm]) -> int:
    """How many of `vms` hold a host of their zone's capacity (`_Vm.holds_capacity`)."""
    return sum(1 for vm in vms if vm.holds_capacity)


def _termination(vm: _Vm) -> str | None:
    return vm.properties.get("scheduling", {}).get("instanceTerminationAction")


def _names(configs: list[dict[str, Any]]) -> set[str]:
    return {str(c["name"]) for c in configs}
