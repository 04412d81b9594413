"""Slice kinds: what the recovery controller, `rayslice status`, the simulator and the
controller's permissions need of one kind of slice, behind one interface (`SliceKind`).

A VM platform's slice is one of two things in the cloud API (`rayslice.platforms.VmPlatform.
slice_resource`), and each is one implementation here:

- `MigSlices` (``compute``): a Compute Engine managed instance group of TPU VMs. Observed
  through the MIG and its managed instances; recreated by deleting the MIG, inserting it again
  from its recorded fields in the mode the stack's cell gives (bulk on reserved capacity) and
  creating its named hosts from their recorded per-instance configs in one ``createInstances``
  (a flex-start MIG, bulk mode with its hosts named by the MIG, is inserted with its target size
  and waits for every host); hosts are added and removed whole
  (an elastic cluster); status lists the MIG's instances and, for flex-start, its wait.
- `TpuNodeSlices` (``tpu-vm``): a Cloud TPU node, or a queued resource that asks for one.
  Observed through the node (or its request); recreated by deleting the node (or the request,
  with ``force``) and creating it again from its recorded fields; no hosts are added or removed
  (no elastic slices: the capacity table allows ``minSlices`` on compute only); status lists the
  node's workers and, for a queued slice, its request.

`of(platform)` is the kind of a platform's slices (None for GKE, which runs no controller and
whose node pools `rayslice status` reads on their own). Nothing outside this module and the
platform table asks which platform or resource a slice is: a caller asks its kind.

What the controller does with what a kind observes (recreate, leave to Google, record an end) is
the controller's reconciliation (`rayslice.recovery.controller.reconcile`); a kind observes and
acts, and never decides.

The recovery controller imports this module, so it ships in the controller's bundle
(`rayslice.recovery.bundle`): standard library, google-auth and requests only, Python 3.10.
"""

from __future__ import annotations

import datetime
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rayslice import capacity_table, names
from rayslice.cloud.capacity import ACTIVE as QUEUED_ACTIVE
from rayslice.cloud.capacity import SUSPENDED as QUEUED_SUSPENDED
from rayslice.cloud.capacity import WAITING as QUEUED_WAITING
from rayslice.cloud.rest import operation_error
from rayslice.errors import CloudError, InvalidInput
from rayslice.platforms import MIG, TPU_NODE, VM_PLATFORMS
from rayslice.recovery import permissions
from rayslice.recovery.cloud import CloudClient, managed_instance_name
from rayslice.recovery.journal import CREATE_HOSTS, DELETE, INSERT, STEPS
from rayslice.recovery.permissions import RolePart

# Cloud TPU v2 Node.state values (tpu.v2.json) that mean the node will not come back by itself:
# UNKNOWN is "TPU node is in an unknown state after a failed repair", so nothing is left for
# Google to finish and the node is recreated at once, as a PREEMPTED one is.
TPU_TERMINATED = "TERMINATED"
TPU_UNKNOWN = "UNKNOWN"
TPU_BROKEN_STATES = frozenset({"PREEMPTED", TPU_TERMINATED, TPU_UNKNOWN})
# Compute v1 ManagedInstance.instanceStatus of a serving host; any other status breaks a slice
# that was once whole.
COMPUTE_SERVING_STATUS = "RUNNING"
# ManagedInstance.instanceStatus values of a host that is not serving and will not by itself.
COMPUTE_BROKEN_STATUSES = frozenset({"STOPPED", "STOPPING", "TERMINATED", "SUSPENDED", "SUSPENDING"})
# ManagedInstance.currentAction values of a MIG replacing a host on its own.
COMPUTE_REPLACING_ACTIONS = frozenset({"RECREATING"})
# What a recreated MIG does with a failed host (compute v1,
# InstanceGroupManagerInstanceLifecyclePolicy.defaultActionOnFailure): nothing; the controller
# recreates the slice whole (rule tpu-mig-do-nothing in rayslice.cloud.rules).
MIG_ACTION_ON_FAILURE = "DO_NOTHING"
# Node fields the TPU API refuses together. tpu.v2.json, Node.networkConfig and networkConfigs:
# "network_config and network_configs are mutually exclusive, you can only specify one of them.
# If both are specified, an error will be returned."; magic-modules mmv1/products/tpuv2/Vm.yaml:
# accelerator_config conflicts with accelerator_type (rule tpu-node-exclusive-fields). nodes.get
# may answer with both of a pair; the create call carries the first of each, the one rayslice's
# program sets (rayslice/infra/tpu_vm/slice.py: accelerator_config, network_config), and the
# second only for a node that has no first.
TPU_EXCLUSIVE_FIELDS = (("acceleratorConfig", "acceleratorType"), ("networkConfig", "networkConfigs"))
# Writable Node fields (tpu.v2.json: not readOnly) carried from the recorded node to the new one.
TPU_CREATE_FIELDS = (
    "acceleratorConfig",
    "acceleratorType",
    "bootDiskConfig",
    "cidrBlock",
    "dataDisks",
    "description",
    "labels",
    "metadata",
    "networkConfig",
    "networkConfigs",
    "runtimeVersion",
    "schedulingConfig",
    "serviceAccount",
    "shieldedInstanceConfig",
    "tags",
)
# Writable QueuedResource fields (tpu.v2alpha1.json, the version the client reads and recreates
# queued resources with: `rayslice.recovery.cloud.QUEUED_VERSION`) carried to the new request of
# a recreated queued slice, flex-start's included; its node keeps TPU_CREATE_FIELDS only. Not
# queueingPolicy: the program sets a relative validUntilDuration, which the API may answer as
# the absolute validUntilTime it became (tpu.v2alpha1.json QueueingPolicy offers both), a time
# already past for a request made again later; the new request waits without a deadline.
QUEUED_CREATE_FIELDS = (
    "bestEffort",
    "guaranteed",
    "provisioningModel",
    "reservationName",
    "runDuration",
    "spot",
    "tpu",
)
# QueuedResourceState.state values whose node is gone or going (tpu.v2.json).
QUEUED_BROKEN_STATES = frozenset({QUEUED_SUSPENDED, "SUSPENDING"})
# Writable InstanceGroupManager fields (compute.v1.json) carried to the recreated MIG, its bulk
# target-size policy included (the program sets it only where bulk mode is allowed, rule
# bulk-provisioning-model).
MIG_INSERT_FIELDS = (
    "allInstancesConfig",
    "autoHealingPolicies",
    "baseInstanceName",
    "description",
    "instanceLifecyclePolicy",
    "instanceTemplate",
    "listManagedInstancesResults",
    "name",
    "namedPorts",
    "resourcePolicies",
    "statefulPolicy",
    "targetSize",
    "targetSizePolicy",
    "updatePolicy",
    "versions",
)
# Where a host publishes its boot state, and what `rayslice status` says when it published none.
STATE_QUERY = f"{names.GUEST_ATTRIBUTE_NAMESPACE}/{names.STATE_KEY}"
UNKNOWN = "unknown (no state published)"
# A MIG slice with target size 0: on an elastic cluster, the controller adds its hosts when Ray's
# demand needs them (docs/elastic.md).
EMPTY = "EMPTY"
HOUR_S = datetime.timedelta(hours=1).total_seconds()

# Called with a recreation's step before its call is sent (`SliceKind.recreate`).
Begin = Callable[[str], None]
# `SliceKind.recreate`'s outcome when it stopped before the step it was told to pause before.
PAUSED = "deleted"


@dataclass
class Observation:
    """One look at one slice: `broken` says whether it needs the controller, `seen` what was seen."""

    broken: bool
    seen: str
    recorded: dict[str, Any] | None = None  # the spec to recreate from, when the slice exists
    whole: bool = False  # every host serving
    # The slice or its hosts are gone (nothing is left for Google to recover); False: its hosts
    # exist but do not serve, which Google may be recovering.
    gone: bool = True
    # The capacity cell the slice itself names (a queued slice's request, `capacity_table.queued_cell`);
    # None: the stack's.
    cell: capacity_table.Cell | None = None
    # The slice's capacity ended (a flex-start run or a calendar-mode reservation over; `seen`
    # says so in the cell's words): nothing is requested again.
    ended: bool = False
    # Some hosts made and the rest still being created (an individual-mode MIG makes what the
    # zone has, the rest later: Compute Engine, "About bulk mode"); `seen` says why from the
    # missing hosts' last attempt. The controller bounds how long this may last.
    partly: bool = False
    # Waiting for capacity for the whole slice (a bulk MIG's bulk instance operation in progress);
    # `seen` carries Google's reason when it gives one.
    waiting: bool = False


@dataclass(frozen=True)
class Operation:
    """How a kind's calls run: the names they may touch and how long an operation may take."""

    client: CloudClient
    allowed: Collection[str]  # this cluster's slice names (the client refuses any other)
    timeout_s: float


class SliceKind(ABC):
    """What every consumer needs of one kind of slice (the module docstring says which)."""

    resource: str  # `platforms.MIG` or `platforms.TPU_NODE`
    # The controller's custom roles for this kind (`rayslice.infra.identity` grants them), and
    # why they cannot be narrowed further (docs/recovery.md repeats it).
    role_parts: tuple[RolePart, ...]
    unnarrowed: str

    @abstractmethod
    def observe(
        self, client: CloudClient, name: str, *, was_whole: bool, cell: capacity_table.Cell | None
    ) -> Observation:
        """One look at slice `name`; `was_whole`: seen whole since it was (re)created; `cell`:
        the stack's capacity cell (None: an older controller's configuration)."""

    @abstractmethod
    def recreate(
        self,
        op: Operation,
        name: str,
        recorded: Mapping[str, Any],
        start: str,
        begin: Begin,
        *,
        cell: capacity_table.Cell | None,
        pause_before: str | None = None,
    ) -> str:
        """Recreates slice `name` from `recorded` (what `observe` recorded), from step `start` on
        (`rayslice.recovery.journal.STEPS`), calling `begin(step)` before each step's call is
        sent; `cell`: the stack's capacity cell, which says how the slice is made (None: an older
        controller's configuration); `pause_before`: the step not to begin (the delete done, the
        controller backs off before it asks again: returns `PAUSED`). Every step looks first, so
        a step a killed controller already sent is not sent again. Returns the outcome,
        ``failed: ...`` when it failed."""

    def end(self, op: Operation, name: str) -> str:
        """Stops what an ended slice still asks of Google (a MIG's target size, which could buy a
        new run); the outcome, empty when nothing was left to stop."""
        return ""

    @abstractmethod
    def status(
        self,
        client: CloudClient,
        name: str,
        hosts: int,
        *,
        waits: bool,
        cell: capacity_table.Cell | None = None,
    ) -> dict[str, Any]:
        """Slice `name` as `rayslice status` shows it (JSON-ready): its state, the state in a
        user's words (``meaning``) and its hosts; `hosts`: the spec's hosts per slice; `waits`:
        the slice waits for capacity (flex-start, queued); `cell`: the stack's capacity cell
        (who repairs the slice, and how long the controller leaves it)."""

    @abstractmethod
    def capacity_kind(self, machine_type: str | None, generation: str) -> str:
        """What a zone's capacity counts for these slices (`rayslice.cloud.capacity`)."""

    def _not_elastic(self) -> InvalidInput:
        """What the elastic methods raise on a kind that does not scale (the capacity table
        allows ``minSlices`` on compute only, and the spec refuses it elsewhere)."""
        return InvalidInput(f"{self.resource} slices are not elastic (minSlices is for compute)")

    def hosts_held(self, client: CloudClient, name: str) -> tuple[int, int]:
        """The slice's target size and the hosts it holds (being deleted included), for elastic
        scaling; (0, 0) when it is missing. Only MIG slices scale."""
        raise self._not_elastic()

    def add_hosts(
        self, op: Operation, name: str, instances: Sequence[Mapping[str, Any]], *, bulk: int | None
    ) -> str:
        """Gives the empty slice `name` its hosts: `instances` by name, or with `bulk`, that many
        hosts the MIG names when the zone has them all. Only MIG slices scale."""
        raise self._not_elastic()

    def remove_hosts(self, op: Operation, name: str, hosts: Sequence[str], *, bulk: bool, why: str) -> str:
        """Deletes the slice's `hosts` (with `bulk`, every host by a resize to 0) and keeps the
        slice, empty; `why` ends the outcome. Only MIG slices scale."""
        raise self._not_elastic()


def made_host(instance: Mapping[str, Any]) -> bool:
    """Whether a managed instance is a host that exists: compute v1 ManagedInstance.instanceStatus
    is empty while the instance does not exist (a host still to be created, or a bulk MIG's
    stand-in for a host to come)."""
    return bool(instance.get("instanceStatus"))


def bulk_waits(mig: Mapping[str, Any], made: int) -> bool:
    """Whether a bulk MIG waits for capacity for its hosts: its bulk instance operation is in
    progress (compute v1 InstanceGroupManagerStatus.bulkInstanceOperation.inProgress). A MIG
    that reports no bulk operation waits when its target size is set and it made no host."""
    operation = (mig.get("status") or {}).get("bulkInstanceOperation")
    if operation is not None:
        return bool(operation.get("inProgress"))
    return int(mig.get("targetSize", 0)) > 0 and made == 0


def _error_words(errors: Any) -> str:
    """An Error's ``errors[]`` (compute v1) as ``CODE: message``, each code once."""
    seen: dict[str, str] = {}
    for item in errors or []:
        code = str(item.get("code") or "UNKNOWN")
        seen.setdefault(code, str(item.get("message") or ""))
    return "; ".join(f"{code}: {message}" if message else code for code, message in seen.items())


def bulk_reason(mig: Mapping[str, Any]) -> str:
    """Why a bulk MIG waits, as Google last said it (bulkInstanceOperation.lastProgressCheck.error,
    e.g. ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS); empty when it said nothing."""
    operation = (mig.get("status") or {}).get("bulkInstanceOperation") or {}
    check = operation.get("lastProgressCheck") or {}
    return _error_words((check.get("error") or {}).get("errors"))


def _why_pending(instances: Sequence[Mapping[str, Any]]) -> str:
    """Why hosts are not made yet, from their managed instances' last attempt
    (ManagedInstance.lastAttempt.errors, e.g. ZONE_RESOURCE_POOL_EXHAUSTED); empty if none says."""
    attempts = [(i.get("lastAttempt") or {}).get("errors") or {} for i in instances]
    errors = [error for attempt in attempts for error in attempt.get("errors") or []]
    return _error_words(errors)


def _failed_op(verb: str, done: Mapping[str, Any]) -> str:
    return f"failed: {verb}: {operation_error(done) or 'did not finish'}"


def _zone_done(done: Mapping[str, Any]) -> bool:
    return done.get("status") == "DONE" and not operation_error(done)


def _tpu_done(done: Mapping[str, Any]) -> bool:
    return bool(done.get("done")) and not operation_error(done)


class MigSlices(SliceKind):
    """A slice that is a Compute Engine MIG (the module docstring; `rayslice.infra.compute`)."""

    resource = MIG
    role_parts = (
        RolePart("slices", permissions.COMPUTE_MIG_PERMISSIONS + permissions.COMPUTE_SUPPORT_PERMISSIONS),
        RolePart("templates", permissions.COMPUTE_TEMPLATE_PERMISSIONS, templates_only=True),
    )
    unnarrowed = (
        "IAM Conditions cannot name instance group managers, resource policies or zone "
        "operations, so the MIG permissions (compute.instanceGroupManagers.get, .delete, .create, "
        ".update), compute.resourcePolicies.use and compute.zoneOperations.get and .list hold for the "
        "whole project: the controller's account may read, delete, create and resize any MIG there and "
        "delete any MIG's instances (GKE's node-pool MIGs too). Only the controller's own code, which "
        "runs alone on its VM, keeps to this cluster's MIGs (an exact-name check). "
        "Only compute.instanceTemplates.useReadOnly is narrowed, to templates whose names start with "
        "one of this cluster's slice prefixes (templates get generated names, so a prefix, which "
        "another cluster named '<cluster>-slice-<i>' would also match, is as narrow as a condition "
        "can be)."
    )

    def observe(
        self, client: CloudClient, name: str, *, was_whole: bool, cell: capacity_table.Cell | None
    ) -> Observation:
        """The MIG and its managed instances (`rayslice.recovery.controller`'s docstring says
        what breaks a MIG slice)."""
        mig = client.get_mig(name)
        if mig is None:
            return Observation(True, "MIG missing")
        instances = client.list_managed_instances(name)
        configs = client.list_per_instance_configs(name)
        recorded: dict[str, Any] = {
            "mig": {key: mig[key] for key in MIG_INSERT_FIELDS if key in mig},
            "instances": [
                {key: config[key] for key in ("name", "preservedState") if key in config}
                for config in configs
            ],
        }
        target = int(mig.get("targetSize", 0))
        bulk = capacity_table.in_bulk_mode(mig)
        made = [i for i in instances if made_host(i)]
        ended = cell.events.get(capacity_table.RUN_DURATION) if cell is not None else None
        if target and not made and was_whole and ended and ended.action == capacity_table.END:
            # Every host deleted by Compute Engine while the MIG stays (and may wait to make them
            # again): the run duration (or the reservation's period) is over, as the capacity cell
            # says; the controller resizes it to 0 and asks nothing again.
            seen = f"MIG 0 of {target} instances: {ended.meaning}"
            return Observation(False, seen, recorded, ended=True)
        if bulk and not was_whole and bulk_waits(mig, len(made)):
            # Bulk mode creates every host at once when the zone has them, none before (its
            # managed instances meanwhile stand for the hosts to come).
            why = bulk_reason(mig) or _why_pending(instances)
            seen = f"MIG waits for capacity for {target} host(s)" + (f": {why}" if why else "")
            return Observation(False, seen, recorded, waiting=True)
        problems = []
        if len(instances) < target:
            problems.append(f"{len(instances)} of {target} instances")
        serving = 0
        down: list[tuple[str, str]] = []  # (host, what it is) of each host not serving
        for instance in instances:
            host = managed_instance_name(instance) or "?"
            status = instance.get("instanceStatus")
            action = instance.get("currentAction")
            if action in COMPUTE_REPLACING_ACTIONS:
                down.append((host, str(action)))
            elif status == COMPUTE_SERVING_STATUS:
                serving += 1
            elif status in COMPUTE_BROKEN_STATUSES or was_whole:
                down.append((host, str(status or action or "not running")))
        whole = target > 0 and serving == len(instances) == target
        if down:
            preempted = _preempted(client, {host for host, _ in down})
            problems += [
                f"host {_short(name, host)} {'preempted' if host in preempted else what}"
                for host, what in down
            ]
        if problems:
            gone = len(instances) < target
            return Observation(True, "MIG " + ", ".join(problems), recorded, gone=gone)
        if target and not whole and not bulk:
            # An individual-mode MIG made the hosts the zone had and makes the rest later.
            pending = [i for i in instances if i.get("instanceStatus") != COMPUTE_SERVING_STATUS]
            waiting = ", ".join(_short(name, managed_instance_name(i) or "?") for i in pending)
            why = _why_pending(pending) or "still being created"
            seen = f"MIG partly created: {serving} of {target} hosts running; {waiting}: {why}"
            return Observation(False, seen, recorded, partly=True)
        return Observation(False, f"MIG {serving} of {target} instances running", recorded, whole)

    def recreate(
        self,
        op: Operation,
        name: str,
        recorded: Mapping[str, Any],
        start: str,
        begin: Begin,
        *,
        cell: capacity_table.Cell | None,
        pause_before: str | None = None,
    ) -> str:
        """Delete the MIG, insert it again from its recorded fields (target size 0, its hosts
        named by one createInstances; a flex-start MIG with its target size, in bulk mode), the
        default action on failure DO_NOTHING: the controller, not the MIG, repairs a slice, and
        whole. The MIG's mode is the cell's: bulk where the cell says so (reservation-bound: its
        hosts in that one createInstances, sent while the target size is 0), else individual,
        whatever mode the recorded MIG had (an earlier rayslice made Spot MIGs bulk, which bulk
        mode refuses)."""
        client, wait = op.client, op.client.wait_zone_operation
        first = STEPS.index(start)
        if first <= STEPS.index(DELETE):
            begin(DELETE)
            if client.get_mig(name) is not None:
                done = wait(client.delete_mig(name, op.allowed), op.timeout_s)
                if not _zone_done(done):
                    return _failed_op("delete", done)
        if pause_before == INSERT:
            return PAUSED
        body = dict(recorded["mig"])
        instances = list(recorded["instances"])
        bulk = cell is not None and cell.mig_mode == capacity_table.BULK
        if instances:
            # createInstances below adds the named hosts, in one call, from target size 0.
            body["targetSize"] = 0
            if bulk:
                body["targetSizePolicy"] = {"mode": capacity_table.BULK}
            else:
                body.pop("targetSizePolicy", None)
        # else a bulk MIG (flex-start): inserted with its target size, it waits for every host.
        policy = dict(body.get("instanceLifecyclePolicy") or {})
        body["instanceLifecyclePolicy"] = {**policy, "defaultActionOnFailure": MIG_ACTION_ON_FAILURE}
        if first <= STEPS.index(INSERT):
            begin(INSERT)
            if client.get_mig(name) is None:  # else a killed controller's insert was accepted
                done = wait(client.insert_mig(body, op.allowed), op.timeout_s)
                if not _zone_done(done):
                    return _failed_op("insert", done)
        if instances:
            begin(CREATE_HOSTS)
            # Only the hosts not there yet: a name that exists is refused (an instance name is
            # unique in its zone), and a killed controller may have asked for them already.
            there = {managed_instance_name(i) for i in client.list_managed_instances(name)}
            missing = [i for i in instances if i.get("name") not in there]
            if not missing:
                return "recreated"
            mig = client.get_mig(name) or {}
            if int(mig.get("targetSize", 0)) > 0 and capacity_table.in_bulk_mode(mig):
                # A bulk MIG took a killed controller's createInstances (its target size is set)
                # and creates the hosts all at once when it can; it would refuse a second call.
                return "recreated; the MIG waits to create its hosts all at once"
            done = wait(client.create_instances(name, missing, op.allowed), op.timeout_s)
            if done.get("status") != "DONE":
                return "hosts requested, still in progress"
            if operation_error(done):
                return f"failed: createInstances: {operation_error(done)}"
        elif capacity_table.in_bulk_mode(body):
            return f"recreated; the MIG waits for capacity for {body.get('targetSize')} host(s)"
        return "recreated"

    def status(
        self,
        client: CloudClient,
        name: str,
        hosts: int,
        *,
        waits: bool,
        cell: capacity_table.Cell | None = None,
    ) -> dict[str, Any]:
        """The MIG's instances, each with its boot state, and its state in a user's words
        (``meaning``); with `waits` (a flex-start bulk MIG), or for any MIG in bulk mode (a
        reserved slice's waits for the reservation to hold every host), its wait for capacity
        too."""
        mig = client.get_mig(name)
        if mig is None:
            return {"name": name, "state": "MISSING", "hosts": []}
        waits = waits or capacity_table.in_bulk_mode(mig)
        target = int(mig.get("targetSize", 0))
        instances = client.list_managed_instances(name)
        rows = []
        # A bulk MIG's stand-ins for the hosts it waits for are no hosts: its wait says so.
        listed = [i for i in instances if made_host(i) or not capacity_table.in_bulk_mode(mig)]
        by_worker = sorted(map(managed_status, listed), key=_by_worker(name))
        for position, (host, status) in enumerate(by_worker):
            boot = (
                boot_state(client.instance_guest_attributes(host, STATE_QUERY))
                if status == "RUNNING"
                else UNKNOWN
            )
            worker = names.host_worker(name, host)
            rows.append(
                {
                    "worker": position if worker is None else worker,
                    "name": host,
                    "instance": status,
                    "boot": boot,
                }
            )
        made = sum(1 for i in instances if made_host(i))
        running = sum(1 for h in rows if h["instance"] == "RUNNING")
        if target == 0:  # an elastic cluster's slice without hosts, or one the controller is removing
            state = EMPTY if not rows else f"{EMPTY} ({len(rows)} host(s) being deleted)"
        else:
            state = "READY" if running == target else f"DEGRADED ({running} of {target} hosts running)"
        words = self._meaning(client, name, mig, instances, cell)
        found: dict[str, Any] = {"name": name, "state": state, "meaning": words, "hosts": rows}
        if not waits:
            return found
        joined = sum(1 for h in rows if h["boot"] == names.STATE_JOINED)
        request = bulk_wait_status(mig, made, joined) if target else None
        if request is not None and request["state"] == QUEUED_WAITING:
            found["state"] = f"REQUEST {request['state']}"  # no hosts yet: the wait is the slice's state
        return {**found, "request": request}

    def _meaning(
        self,
        client: CloudClient,
        name: str,
        mig: Mapping[str, Any],
        instances: Sequence[Mapping[str, Any]],
        cell: capacity_table.Cell | None,
    ) -> str:
        """The slice's state in a user's words: waiting for capacity (with Google's reason), partly
        created, preempted, being repaired by Google, ended, running."""
        target = int(mig.get("targetSize", 0))
        made = [i for i in instances if made_host(i)]
        running = [i for i in made if i.get("instanceStatus") == COMPUTE_SERVING_STATUS]
        if target == 0:
            return "no hosts (an elastic slice without demand, or a slice whose capacity ended)"
        if capacity_table.in_bulk_mode(mig) and bulk_waits(mig, len(made)):
            why = bulk_reason(mig) or _why_pending(instances) or "Google has not said why"
            return f"waiting for capacity for all {target} hosts: {why}"
        if len(running) == target:
            return "running"
        down = {managed_instance_name(i) for i in made if i.get("instanceStatus") != COMPUTE_SERVING_STATUS}
        preempted = _preempted(client, down) if down else set()
        if preempted:
            return (
                f"preempted: Google took back {len(preempted)} host(s); "
                "the recovery controller recreates the slice"
            )
        if down:
            if cell is not None and cell.repair_grace_s is not None:
                who = (
                    "Google is repairing it in place"
                    if cell.repaired_by == capacity_table.RAYSLICE
                    else ("being repaired by Google")
                )
                return (
                    f"{who} ({len(down)} host(s) down); the recovery controller recreates it if not "
                    f"back within {cell.repair_grace_s // 60} min"
                )
            return f"{len(down)} host(s) down; the recovery controller recreates the slice"
        if not made and cell is not None and cell.action(capacity_table.RUN_DURATION) == capacity_table.END:
            return "ended: its run (or its reservation's period) is over; nothing is asked again"
        why = _why_pending([i for i in instances if not made_host(i)]) or "still being created"
        return f"partly created: {len(running)} of {target} hosts running; the rest: {why}"

    def end(self, op: Operation, name: str) -> str:
        """A resize to 0 of an ended slice's MIG while its target size is set: its hosts are gone,
        and a MIG that keeps the size may make them again (a bulk MIG waits for them anew), which
        would be a second paid run."""
        mig = op.client.get_mig(name)
        if mig is None or not int(mig.get("targetSize", 0)):
            return ""
        return _resize(op, name, 0, "its capacity ended, so no new run is bought")

    def capacity_kind(self, machine_type: str | None, generation: str) -> str:
        """The hosts' machine type (Compute Engine counts instances of it)."""
        return machine_type or generation

    def hosts_held(self, client: CloudClient, name: str) -> tuple[int, int]:
        """The target size and the hosts that exist (a bulk MIG's stand-ins for hosts to come
        are no hosts: `made_host`)."""
        mig = client.get_mig(name)
        if mig is None:
            return 0, 0
        made = [i for i in client.list_managed_instances(name) if made_host(i)]
        return int(mig.get("targetSize", 0)), len(made)

    def add_hosts(
        self, op: Operation, name: str, instances: Sequence[Mapping[str, Any]], *, bulk: int | None
    ) -> str:
        """createInstances of the named hosts, all in one call (a bulk MIG takes them so, while its
        target size is 0, as an empty slice's is), or, with `bulk` (a flex-start MIG, whose hosts
        the MIG names), a resize from 0 to that many: bulk mode then creates them all at once when
        the zone has them (Compute Engine, "About bulk mode"; no resize request)."""
        if bulk is not None:
            return _resize(op, name, bulk, "waits for capacity")
        try:
            done = op.client.wait_zone_operation(
                op.client.create_instances(name, list(instances), op.allowed), op.timeout_s
            )
        except (CloudError, OSError) as exc:
            return f"failed: {exc}"
        if operation_error(done):
            return f"failed: createInstances: {operation_error(done)}"
        return f"{len(instances)} host(s) requested"

    def remove_hosts(self, op: Operation, name: str, hosts: Sequence[str], *, bulk: bool, why: str) -> str:
        """deleteInstances of `hosts`, or, with `bulk` (a bulk MIG, which sheds hosts by a resize
        to 0: Compute Engine, "About bulk mode"), a resize to 0, which deletes the hosts or
        withdraws the wait for them; then what is left of `hosts`' per-instance configs."""
        client, wait = op.client, op.client.wait_zone_operation
        if bulk:
            outcome = _resize(op, name, 0, why)
            if outcome.startswith("failed") or not hosts:
                return outcome
        else:
            outcome = f"{len(hosts)} host(s) deleted ({why})"
        try:
            if not bulk:
                done = wait(client.delete_instances(name, hosts, op.allowed), op.timeout_s)
                if operation_error(done):
                    return f"failed: deleteInstances: {operation_error(done)}"
            # Whether deleting a host also deletes its per-instance config is not said for every
            # case (rayslice/recovery/cloud.py); what is left is deleted, so the next
            # createInstances of the same names starts clean.
            left = [c["name"] for c in client.list_per_instance_configs(name) if c.get("name") in hosts]
            if left:
                done = wait(client.delete_per_instance_configs(name, left, op.allowed), op.timeout_s)
                if operation_error(done):
                    return f"failed: deletePerInstanceConfigs: {operation_error(done)}"
        except (CloudError, OSError) as exc:
            return f"failed: {exc}"
        return outcome


def _resize(op: Operation, name: str, size: int, why: str) -> str:
    """Slice `name`'s bulk MIG (flex-start) resized to `size`: from 0 to its hosts, which the MIG
    creates all at once when the zone has them, or to 0, which deletes them or withdraws the wait
    (Compute Engine, "About bulk mode")."""
    try:
        done = op.client.wait_zone_operation(op.client.resize_mig(name, size, op.allowed), op.timeout_s)
    except (CloudError, OSError) as exc:
        return f"failed: {exc}"
    if operation_error(done):
        return f"failed: resize to {size}: {operation_error(done)}"
    return f"MIG resized to {size} host(s): {why}"


def _preempted(client: CloudClient, hosts: set[str]) -> set[str]:
    """Which of `hosts` Compute Engine preempted: those named by a zone operation of type
    ``compute.instances.preempted`` (`CloudClient.list_preemptions`), so that an event says
    "preempted" rather than only the state a preemption leaves (TERMINATED, STOPPING). An
    unreadable list says nothing (the hosts keep their state's name)."""
    try:
        operations = client.list_preemptions()
    except (CloudError, OSError):
        return set()
    return {str(o.get("targetLink", "")).rsplit("/", 1)[-1] for o in operations} & hosts


def _short(slice_name: str, host: str) -> str:
    """A host as events name it: ``w2`` for rayslice's ``<slice>-w2``, else its whole name."""
    worker = names.host_worker(slice_name, host)
    return host if worker is None else f"w{worker}"


class TpuNodeSlices(SliceKind):
    """A slice that is a Cloud TPU node, direct or asked for by a queued resource
    (`rayslice.infra.tpu_vm`)."""

    resource = TPU_NODE
    role_parts = (RolePart("slices", permissions.TPU_PERMISSIONS),)
    unnarrowed = (
        "Cloud TPU does not recognize resource attributes in IAM Conditions, so the TPU "
        "permissions hold for every node and queued resource in the project: the controller's account "
        "may create, read and delete any TPU node or queued resource there. Only the controller's own "
        "code, which runs alone on its VM, keeps to this cluster's slices (an exact-name check)."
    )

    def observe(
        self, client: CloudClient, name: str, *, was_whole: bool, cell: capacity_table.Cell | None
    ) -> Observation:
        """The node; a queued slice (its request exists) through its request."""
        queued = client.get_queued_resource(names.request_name(name))
        if queued is not None:
            return self._observe_queued(client, name, queued)
        node = client.get_node(name)
        if node is None:
            return Observation(True, "node missing")
        state = str(node.get("state", "STATE_UNSPECIFIED"))
        recorded = _node_spec(node)
        # A TERMINATED node still exists, for the Cloud TPU service to bring back where it repairs
        # the capacity (the capacity table's choice for a host error); PREEMPTED is gone for good.
        gone = state != TPU_TERMINATED
        return Observation(
            state in TPU_BROKEN_STATES, f"node state {state}", recorded, state == "READY", gone
        )

    def _observe_queued(self, client: CloudClient, name: str, queued: Mapping[str, Any]) -> Observation:
        """A queued slice, through its request: while it waits, provisions or has FAILED (its
        deadline passed: the user's limit, not retried) it is left alone; SUSPENDED or SUSPENDING
        (its node deleted), or ACTIVE with its node broken or missing, breaks it."""
        recorded: dict[str, Any] = {"queued": _queued_spec(queued)}
        cell = capacity_table.queued_cell(queued)
        state = str((queued.get("state") or {}).get("state", "STATE_UNSPECIFIED"))
        seen = f"queued resource {state}"
        if state in QUEUED_BROKEN_STATES:
            # What SUSPENDED means depends on the capacity (`capacity_table`): a flex-start run or
            # a calendar-mode reservation that ended is over, and nothing is requested again.
            reaction = cell.events.get(capacity_table.SUSPENDED)
            if reaction is not None and reaction.action == capacity_table.END:
                return Observation(False, f"{seen}: {reaction.meaning}", recorded, ended=True)
            return Observation(True, seen, recorded)
        if state != QUEUED_ACTIVE:
            return Observation(False, seen, recorded)  # waiting, provisioning, or failed: left alone
        node = client.get_node(name)
        if node is None:
            return Observation(True, f"{seen}, node missing", recorded)
        node_state = str(node.get("state", "STATE_UNSPECIFIED"))
        broken = node_state in TPU_BROKEN_STATES
        # A TERMINATED node is left to the Cloud TPU service's repair where the cell says so, as a
        # direct node is; deleting its request would give the capacity up.
        seen = f"{seen}, node state {node_state}"
        gone = node_state != TPU_TERMINATED
        return Observation(broken, seen, recorded, node_state == "READY", gone, cell)

    def recreate(
        self,
        op: Operation,
        name: str,
        recorded: Mapping[str, Any],
        start: str,
        begin: Begin,
        *,
        cell: capacity_table.Cell | None,
        pause_before: str | None = None,
    ) -> str:
        """Delete the node and create it again with the same id from its recorded fields; a
        queued slice the way it was made: its request deleted with ``force`` (its node first) and
        made again under the same name, so it waits for capacity as the first did. (`cell` is not
        needed: the recorded node or request carries its capacity.)"""
        if "queued" in recorded:
            return self._recreate_queued(op, name, recorded["queued"], start, begin, pause_before)
        client, wait = op.client, op.client.wait_tpu_operation
        if STEPS.index(start) <= STEPS.index(DELETE):
            begin(DELETE)
            if client.get_node(name) is not None:
                done = wait(client.delete_node(name, op.allowed), op.timeout_s)
                if not _tpu_done(done):
                    return _failed_op("delete", done)
        if pause_before == INSERT:
            return PAUSED
        begin(INSERT)
        if client.get_node(name) is not None:
            return "recreated"  # a killed controller's create was accepted: the node is there
        done = wait(client.create_node(name, recorded, op.allowed), op.timeout_s)
        if not done.get("done"):
            return "create requested, still in progress"
        error = operation_error(done)
        return f"failed: create: {error}" if error else "recreated"

    def _recreate_queued(
        self,
        op: Operation,
        name: str,
        recorded: Mapping[str, Any],
        start: str,
        begin: Begin,
        pause_before: str | None,
    ) -> str:
        client, wait = op.client, op.client.wait_tpu_operation
        request = names.request_name(name)
        allowed = {names.request_name(s) for s in op.allowed}
        if STEPS.index(start) <= STEPS.index(DELETE):
            begin(DELETE)
            if client.get_queued_resource(request) is not None:
                done = wait(client.delete_queued_resource(request, allowed, force=True), op.timeout_s)
                if not _tpu_done(done):
                    return _failed_op("delete request", done)
        if pause_before == INSERT:
            return PAUSED
        begin(INSERT)
        if client.get_queued_resource(request) is None:  # else a killed controller made it
            done = wait(client.create_queued_resource(request, recorded, allowed), op.timeout_s)
            if not _tpu_done(done):
                return _failed_op("queued resource", done)
        return f"recreated; queued resource {request} waits for capacity"

    def status(
        self,
        client: CloudClient,
        name: str,
        hosts: int,
        *,
        waits: bool,
        cell: capacity_table.Cell | None = None,
    ) -> dict[str, Any]:
        """The node's workers, each with its boot state, and the node's state in a user's words;
        with `waits` (queued), its request too."""
        node = client.get_node(name)
        rows = (
            [
                {
                    "worker": worker,
                    "name": f"{name}/worker-{worker}",
                    "boot": boot_state(client.node_guest_attributes(name, STATE_QUERY, worker)),
                }
                for worker in range(hosts)
            ]
            if node is not None
            else []
        )
        state = "MISSING" if node is None else str(node.get("state", "STATE_UNSPECIFIED"))
        meaning = _node_meaning(state, cell)
        found: dict[str, Any] = {"name": name, "state": state, "meaning": meaning, "hosts": rows}
        if not waits:
            return found
        joined = sum(1 for h in rows if h["boot"] == names.STATE_JOINED)
        queued = client.get_queued_resource(names.request_name(name))
        request = queued_resource_status(queued, hosts, joined) if queued is not None else None
        if request is not None and request["state"] != QUEUED_ACTIVE:
            # no node yet (or no more): the request is the state
            found["state"] = f"REQUEST {request['state']}"
            found["meaning"] = _request_meaning(request)
        return {**found, "request": request}

    def capacity_kind(self, machine_type: str | None, generation: str) -> str:
        """The TPU generation (the TPU API counts a node's hosts by it, `twin.node_kind`)."""
        return generation


def _node_meaning(state: str, cell: capacity_table.Cell | None) -> str:
    """A TPU node's state (tpu v2 Node.state) in a user's words, with what the controller does."""
    if state == "READY":
        return "running"
    if state == "MISSING":
        return "missing: the recovery controller creates it again"
    if state == "PREEMPTED":
        return "preempted: Google took the Spot TPUs back; the recovery controller recreates the slice"
    if state == TPU_UNKNOWN:
        return "unknown after a failed repair: the recovery controller recreates the slice"
    if state in (TPU_TERMINATED, "REPAIRING") and cell is not None and cell.repair_grace_s is not None:
        return (
            f"being repaired by Google ({state}); the recovery controller recreates it if not back within "
            f"{cell.repair_grace_s // 60} min"
        )
    if state in ("CREATING", "STARTING", "RESTARTING"):
        return "being created"
    return state.lower()


def _request_meaning(request: Mapping[str, Any]) -> str:
    """A queued slice's request in a user's words, while it, not its node, is the slice's state."""
    state = request["state"]
    if state == QUEUED_WAITING:
        reason = f": {request['reason']}" if request["reason"] else ""
        return f"waiting for capacity for the whole slice{reason}"
    if state == QUEUED_SUSPENDED:
        return str(request["reason"] or "suspended: its node was deleted")
    return str(state).lower().replace("_", " ")


def _node_spec(node: Mapping[str, Any]) -> dict[str, Any]:
    """A node's writable fields (TPU_CREATE_FIELDS), one of each pair the API refuses together
    (TPU_EXCLUSIVE_FIELDS): what a recreated node, direct or queued, is created from."""
    spec = {key: node[key] for key in TPU_CREATE_FIELDS if key in node}
    for kept, dropped in TPU_EXCLUSIVE_FIELDS:
        if spec.get(kept):
            spec.pop(dropped, None)
    return spec


def _queued_spec(queued: Mapping[str, Any]) -> dict[str, Any]:
    """A queued resource's writable fields (QUEUED_CREATE_FIELDS), its node's as `_node_spec`."""
    spec = {key: queued[key] for key in QUEUED_CREATE_FIELDS if key in queued}
    node_specs = (spec.get("tpu") or {}).get("nodeSpec") or []
    spec["tpu"] = {
        "nodeSpec": [
            {
                **{key: s[key] for key in ("parent", "nodeId", "multiNodeParams") if key in s},
                "node": _node_spec(s.get("node") or {}),
            }
            for s in node_specs
        ]
    }
    return spec


# ---- status rows ------------------------------------------------------------------------------


def boot_state(entries: list[dict[str, str]]) -> str:
    """The boot state a host published (guest attribute ``rayslice/state``), or `UNKNOWN`."""
    for entry in entries:
        if entry.get("namespace") == names.GUEST_ATTRIBUTE_NAMESPACE and entry.get("key") == names.STATE_KEY:
            return str(entry.get("value", ""))
    return UNKNOWN


def queued_resource_status(queued: dict[str, Any], hosts: int, joined: int) -> dict[str, Any]:
    """A queued slice's request as status shows it (the same keys as `bulk_wait_status`): its
    state (tpu v2 QueuedResourceState: WAITING_FOR_RESOURCES, PROVISIONING, ACTIVE, FAILED with
    ``failedData.error``, SUSPENDED ...), since when (createTime), the deadline its
    ``queueingPolicy.validUntilDuration`` sets, the flex-start run duration, the hosts of its node
    and how many joined Ray."""
    state = queued.get("state") or {}
    error = (state.get("failedData") or {}).get("error") or {}
    since = str(queued.get("createTime", ""))
    valid = (queued.get("queueingPolicy") or {}).get("validUntilDuration")
    run = (queued.get("runDuration") or {}).get("maxRunDuration")
    reason = f"{error.get('code', '')}: {error.get('message', '')}" if error else None
    if state.get("state") == QUEUED_SUSPENDED:
        reason = _suspended(queued)
    return {
        "kind": "queued resource",
        "name": str(queued.get("name", "")).rsplit("/", 1)[-1],
        "state": str(state.get("state", "STATE_UNSPECIFIED")),
        "since": since,
        "deadline": _after(since, _seconds(valid)) if valid and since else None,
        "run_hours": hours(run) if run else None,
        "hosts_asked": hosts,
        "hosts_joined": joined,
        "reason": reason,
    }


def _suspended(queued: dict[str, Any]) -> str:
    """What a SUSPENDED request means for its capacity (`capacity_table`), and what happens next:
    a flex-start run or a calendar-mode reservation that ended is not requested again."""
    try:
        reaction = capacity_table.queued_cell(queued).events[capacity_table.SUSPENDED]
    except (capacity_table.NoSuchCell, KeyError):
        return "suspended: its node was deleted"
    if reaction.action == capacity_table.END:
        return f"{reaction.meaning}; not requested again"
    return f"{reaction.meaning}; the recovery controller requests it again"


def _seconds(duration: str) -> float:
    """A google-duration (``"3600s"``) in seconds."""
    return float(str(duration).removesuffix("s"))


def hours(duration: str) -> float:
    """A google-duration in hours."""
    return _seconds(duration) / HOUR_S


def _after(timestamp: str, seconds: float) -> str:
    """An RFC 3339 time `seconds` after `timestamp`, in the same UTC form."""
    start = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    return (start + datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def bulk_wait_status(mig: dict[str, Any], made: int, joined: int) -> dict[str, Any]:
    """A bulk MIG as status shows its wait (the same keys as `queued_resource_status`):
    WAITING_FOR_RESOURCES while its bulk instance operation is in progress (`bulk_waits`; bulk
    mode creates every host at once when the zone has them, Compute Engine "About bulk mode"),
    with Google's reason (`bulk_reason`), ACTIVE once the hosts exist; since the MIG was made;
    no deadline (it waits until resized to 0 or deleted). The run duration is its template's,
    which status does not read. `made`: the hosts that exist."""
    waits = bulk_waits(mig, made)
    return {
        "kind": "bulk MIG",
        "name": str(mig.get("name", "")),
        "state": QUEUED_WAITING if waits else QUEUED_ACTIVE,
        "since": str(mig.get("creationTimestamp", "")),
        "deadline": None,
        "run_hours": None,
        "hosts_asked": int(mig.get("targetSize", 0)),
        "hosts_joined": joined,
        "reason": (bulk_reason(mig) or None) if waits else None,
    }


def managed_status(instance: dict[str, Any]) -> tuple[str, str]:
    """A MIG's managed instance: its name, and its status (or, while it is made, its action)."""
    return managed_instance_name(instance), str(
        instance.get("instanceStatus") or instance.get("currentAction") or "UNKNOWN"
    )


def _by_worker(slice_name: str) -> Callable[[tuple[str, str]], tuple[int, str]]:
    """The order a slice's hosts are listed in: by the worker number their names give them (which
    the boot script reads from the metadata's host list), not by the names as text ("-w10" comes
    after "-w9"); names the MIG made itself (flex-start) after, by name."""

    def key(managed: tuple[str, str]) -> tuple[int, str]:
        worker = names.host_worker(slice_name, managed[0])
        return (worker, "") if worker is not None else (sys.maxsize, managed[0])

    return key


# ---- which kind -------------------------------------------------------------------------------

KINDS: dict[str, SliceKind] = {kind.resource: kind for kind in (MigSlices(), TpuNodeSlices())}


def of(platform: str) -> SliceKind | None:
    """The kind of `platform`'s slices (`platforms.VM_PLATFORMS`); None where no VM platform
    (gke: node pools, no recovery controller)."""
    found = VM_PLATFORMS.get(platform)
    return KINDS[found.slice_resource] if found is not None else None


def role_parts(platform: str, elastic: bool = False) -> tuple[RolePart, ...]:
    """The controller's custom roles on `platform`; none where no controller runs (gke). An
    elastic cluster's controller also reads the head's demand."""
    kind = of(platform)
    if kind is None:
        return ()
    return (*kind.role_parts, permissions.ELASTIC_PART) if elastic else kind.role_parts


def permissions_of(platform: str, elastic: bool = False) -> tuple[str, ...]:
    """Every permission the controller's custom roles hold on `platform`, each once."""
    return tuple(p for part in role_parts(platform, elastic) for p in part.permissions)


def held(platform: str, elastic: bool = False) -> tuple[str, ...]:
    """Everything the controller's account may do on `platform`: its custom roles' permissions
    and acting as the hosts' account (what the simulator's emulated IAM binds to it)."""
    custom = permissions_of(platform, elastic)
    return (*custom, permissions.ACT_AS_PERMISSION) if custom else ()
