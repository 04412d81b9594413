"""The recovery controller: watches this cluster's slices and recreates a broken one whole.

It runs on its own VM (a slice cannot heal its own host, and no Ray process or user code may
run beside its project-wide rights: `rayslice.infra.controller_vm`) as a supervised service. Every
`interval_s` it looks at each slice through the cloud API, as the platform's slice resource
(`rayslice.platforms.VmPlatform.slice_resource`) says:

- a TPU node (``tpu-vm``): the Cloud TPU node. PREEMPTED, TERMINATED or missing is broken; the node is deleted
  and created again with the same id from its own recorded spec (the writable fields of the last
  answer seen while it existed, one of each pair of fields the API refuses together). A queued
  slice (its queued resource, `names.request_name`, exists) is read through its request: while
  it waits, provisions or has FAILED (its deadline passed: the user's limit, not retried) the
  slice is left alone; SUSPENDED or SUSPENDING (its node deleted, by a preemption or by hand), or
  ACTIVE with its node broken or missing, breaks it. It is recreated the way it was made: the
  request is deleted with ``force`` (its node first) and made again under the same name from its
  recorded writable fields, so it waits for capacity as the first did.
- a MIG (``compute``): the slice's MIG and its managed instances. Once the slice has been seen
  whole (every instance RUNNING, as many as the target size), any host that is not RUNNING
  breaks it: stopped or stopping (a Spot preemption with termination action STOP leaves such
  hosts behind), terminated, suspended, or being created again (a single new host does not make
  a multi-host slice whole). So do a missing MIG, fewer instances than the target size, and an
  instance the MIG is recreating by itself. Google's "Request TPU Spot VMs" page says a Spot
  MIG must be deleted and recreated; so the controller deletes the MIG, inserts it again from
  its recorded spec in the program's shape (target size 0, no bulk target-size policy, default
  action on failure DO_NOTHING: the controller, not the MIG, repairs a slice, and whole), and
  creates the hosts with their recorded per-instance configs (names and preserved addresses) in
  one ``createInstances`` call, which raises the target size to the slice's host count. A
  flex-start slice's MIG (bulk mode, no per-instance configs) gets its hosts the way it first
  did: the controller inserts it again as recorded, in bulk mode with its target size, and the MIG
  waits until the zone has every host (Compute Engine, "About bulk mode": no resize request; hosts
  are added only while the target size is 0). A bulk MIG that waits (target size set, no instance
  yet) is left alone, and watched again once its hosts exist.

On an elastic cluster (`rayslice.recovery.scaling`) it then adds and removes whole slices: with
``createInstances`` and ``deleteInstances`` of the names infra gave the hosts, or, on flex-start,
by resizing the slice's bulk MIG from 0 to its hosts (it waits for capacity) and back to 0, which
deletes the hosts or withdraws the wait if the demand goes before capacity comes (docs/elastic.md).

A recreation is several calls (delete, insert, createInstances); each step is written to the
controller's state directory before its call is sent, with the spec the slice is recreated from
(`rayslice.recovery.journal`), so a controller killed between two calls is succeeded by one that
finishes the recreation from that step, and says so in its event.

A slice not yet seen whole (a node CREATING, instances being created) is left alone, and so is
one the controller has just recreated, until it is whole again. After a failed recreation the
next try waits `base_backoff_s * 2**(failures-1)`, capped at `max_backoff_s`; a healthy
observation resets it.

The bodies it sends are checked against Google's rules (`rayslice.cloud.rules`) in the tests
(tests/recovery), not here: the rules that decide a MIG's shape read its instance template and
workload policy, which the controller never reads, and the bundle stays small.

It never touches anything but this cluster's slices: the names it may act on are computed from
the spec (`rayslice.names.slice_name`), `act_on` refuses any other name before a request is
built, and the client refuses again at each mutating call.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayslice import capacity_table, names
from rayslice.errors import NoCredentials, RaysliceError
from rayslice.platforms import TPU_NODE, VM_PLATFORMS
from rayslice.recovery.cloud import (
    CloudClient,
    CloudError,
    Location,
    RefusedResource,
    default_session,
    managed_instance_name,
    operation_error,
)
from rayslice.recovery.demand import Demand, parse
from rayslice.recovery.events import Event, FileSink, GuestAttributeSink, Recorder, Sink, StreamSink
from rayslice.recovery.journal import CREATE_HOSTS, DELETE, INSERT, STEPS, Entry, Journal, Recreation
from rayslice.recovery.scaling import Decision, ScalingPolicy, decide, instances_of

# Cloud TPU v2 Node.state values (tpu.v2.json) that mean the node will not come back by itself.
TPU_TERMINATED = "TERMINATED"
TPU_BROKEN_STATES = frozenset({"PREEMPTED", TPU_TERMINATED})
# compute v1 InstanceGroupManagerTargetSizePolicy.mode of a flex-start slice's MIG.
BULK_MODE = "BULK"
# Compute v1 ManagedInstance.instanceStatus of a serving host; any other status breaks a slice
# that was once whole.
COMPUTE_SERVING_STATUS = "RUNNING"
# ManagedInstance.instanceStatus values of a host that is not serving and will not by itself.
COMPUTE_BROKEN_STATUSES = frozenset({"STOPPED", "STOPPING", "TERMINATED", "SUSPENDED", "SUSPENDING"})
# ManagedInstance.currentAction values of a MIG replacing a host on its own.
COMPUTE_REPLACING_ACTIONS = frozenset({"RECREATING"})
# What a recreated MIG does with a failed host (compute v1,
# InstanceGroupManagerInstanceLifecyclePolicy.defaultActionOnFailure): nothing; the controller
# recreates the slice whole (rule spot-tpu-do-nothing in rayslice.cloud.rules).
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
# queued resources with: `cloud.QUEUED_VERSION`) carried to the new request of a recreated queued
# slice, flex-start's included; its node keeps TPU_CREATE_FIELDS only.
QUEUED_CREATE_FIELDS = (
    "bestEffort",
    "guaranteed",
    "provisioningModel",
    "queueingPolicy",
    "reservationName",
    "runDuration",
    "spot",
    "tpu",
)
# QueuedResourceState.state values whose node is gone or going (tpu.v2.json).
QUEUED_BROKEN_STATES = frozenset({"SUSPENDED", "SUSPENDING"})
QUEUED_ACTIVE = "ACTIVE"
# The outcome recorded for a slice whose capacity ended (a flex-start run duration reached, a
# calendar-mode reservation over): `rayslice status` shows it.
ENDED_OUTCOME = "ended: not requested again (`pulumi destroy` removes what is left)"
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
# Called with a recreation's step before its call is sent (`Controller.recreate`).
Begin = Callable[[str], None]
DEFAULT_INTERVAL_S = 30.0
DEFAULT_BASE_BACKOFF_S = 30.0
DEFAULT_MAX_BACKOFF_S = 900.0
OPERATION_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Target:
    """The cluster to watch: every name derives from these, as in infra."""

    cluster: str
    platform: str
    slices: int
    location: Location
    # The table's capacity key (`capacity_table.capacity_of`); None: an older controller's
    # configuration, which recreates every broken slice as Spot's cell says.
    capacity: str | None = None

    @property
    def cell(self) -> capacity_table.Cell | None:
        """The stack's capacity cell: who repairs its slices and how long that may take."""
        return capacity_table.cell(self.platform, self.capacity) if self.capacity else None

    @property
    def slice_names(self) -> tuple[str, ...]:
        return tuple(names.slice_name(self.cluster, index) for index in range(self.slices))

    @property
    def slice_resource(self) -> str:
        """What each slice is in the cloud API (`platforms.TPU_NODE` or `platforms.MIG`)."""
        platform = VM_PLATFORMS.get(self.platform)
        if platform is None:
            raise RefusedResource(f"platform {self.platform!r} has no recovery controller")
        return platform.slice_resource


@dataclass
class Observation:
    """One look at one slice: `broken` says whether to act, `seen` says what was seen."""

    broken: bool
    seen: str
    recorded: dict[str, Any] | None = None  # the spec to recreate from, when the slice exists
    whole: bool = False  # every host serving
    # The slice or its hosts are gone (nothing is left for Google to recover); False: its hosts
    # exist but do not serve, which Google may be recovering.
    gone: bool = True
    # The capacity cell the slice itself names (a queued slice's request, `capacity_table.queued_cell`);
    # None: the stack's (`Target.cell`).
    cell: capacity_table.Cell | None = None


@dataclass
class SliceState:
    failures: int = 0
    next_try: float = 0.0
    recorded: dict[str, Any] | None = None
    last_seen: str = ""
    # Seen whole since the controller started or last recreated it: from then on a host that is
    # not serving breaks the slice (before, the slice is still being created).
    was_whole: bool = False
    # When the controller first saw the slice broken while Google recovers it (`Controller.clock`).
    broken_since: float | None = None
    # The recreation under way (`rayslice.recovery.journal`), and whether an earlier controller
    # process began it.
    recreation: Recreation | None = None
    inherited: bool = False


@dataclass
class Controller:
    client: CloudClient
    target: Target
    recorder: Recorder
    base_backoff_s: float = DEFAULT_BASE_BACKOFF_S
    max_backoff_s: float = DEFAULT_MAX_BACKOFF_S
    operation_timeout_s: float = OPERATION_TIMEOUT_S
    clock: Callable[[], float] = time.monotonic
    slices: dict[str, SliceState] = field(default_factory=dict)
    scaling: ScalingPolicy | None = None  # an elastic cluster's (`rayslice.recovery.scaling`)
    wall_clock: Callable[[], float] = time.time  # what the head's demand readings are stamped with
    # Slices whose hosts the controller is removing: recovery leaves them alone until they are gone.
    removing: set[str] = field(default_factory=set)
    missing_before: bool = False  # the last reading found slices missing (`scaling.decide`)
    last_wait: str = ""  # what unmet demand waited on, recorded once per change
    # Each slice's spec and the recreation under way, where a restarted controller finds them.
    journal: Journal = field(default_factory=Journal)

    def backoff(self, failures: int) -> float:
        """Seconds to wait after `failures` failed recreations in a row (exponential, capped)."""
        if failures <= 0:
            return 0.0
        return float(min(self.base_backoff_s * 2 ** (failures - 1), self.max_backoff_s))

    # ---- one pass -----------------------------------------------------------------------------

    def step(self) -> None:
        """Looks at every slice once and acts on the broken ones whose backoff has passed; on an
        elastic cluster, then adds or removes slices as Ray's demand says."""
        for name in self.target.slice_names:
            if name in self.removing:
                self._removal_done(name)
            else:
                self.act_on(name)
        if self.scaling is not None:
            self.scale(self.scaling)

    def act_on(self, name: str) -> None:
        if name not in self.target.slice_names:
            raise RefusedResource(
                f"refusing to act on {name!r}: not one of cluster {self.target.cluster!r}'s slices "
                f"({', '.join(self.target.slice_names)})"
            )
        state = self.slices.get(name)
        if state is None:  # first look since the controller started: what an earlier one kept
            entry = self.journal.load(name)
            state = SliceState(recorded=entry.spec, recreation=entry.recreation)
            state.inherited = entry.recreation is not None
            self.slices[name] = state
        try:
            observation = self.observe(name, state.was_whole)
        except (CloudError, OSError) as exc:
            # A transient API or network failure: nothing was seen, so nothing is recorded.
            print(f"rayslice-recovery: could not read {name}: {exc}", file=sys.stderr)
            return
        if state.recreation is not None:
            # Finished before anything else: what is seen now is the half-made slice, not its spec.
            if self.clock() >= state.next_try:
                attempt = max(state.failures + 1, state.recreation.attempt)
                self._recreate(name, state, observation.seen, attempt)
            return
        if observation.recorded is not None and not observation.broken:
            self._remember(name, state, observation.recorded)
        state.was_whole = state.was_whole or observation.whole
        if not observation.broken:
            if state.broken_since is not None:  # Google's recovery brought it back
                minutes = (self.clock() - state.broken_since) / 60
                self.recorder.record(
                    Event.now(name, observation.seen, "none", f"recovered after {minutes:.0f} min")
                )
                state.broken_since = None
            state.failures, state.next_try, state.last_seen = 0, 0.0, observation.seen
            return
        if observation.recorded is not None and state.recorded is None:
            self._remember(name, state, observation.recorded)  # e.g. a MIG whose hosts were preempted
        waited = self._google_recovers(name, state, observation)
        if waited is None:
            return  # left to Google for now
        if self.clock() < state.next_try:
            return  # backing off; the failure that set it was recorded
        attempt = state.failures + 1
        if state.recorded is None:
            self._failed(state, attempt)
            self.recorder.record(
                Event.now(
                    name,
                    observation.seen,
                    "none",
                    "cannot recreate: no recorded spec of this "
                    "slice (it was never seen whole since the controller started)",
                    attempt,
                )
            )
            return
        self._recreate(name, state, observation.seen, attempt, waited)

    def _remember(
        self, name: str, state: SliceState, recorded: dict[str, Any], *, force: bool = False
    ) -> None:
        """Keeps `recorded` as the slice's spec, in the journal too when it changed (or `force`:
        a recreation just ended). A journal that cannot be written is said on stderr; the
        controller goes on with its memory."""
        if recorded == state.recorded and not force:
            return
        state.recorded = recorded
        try:
            self.journal.save(name, Entry(recorded))
        except OSError as exc:
            print(f"rayslice-recovery: could not keep {name}'s spec: {exc}", file=sys.stderr)

    def _recreate(self, name: str, state: SliceState, seen: str, attempt: int, waited: str = "") -> None:
        """Recreates the slice from its recorded spec, or finishes the recreation under way from
        the step it reached; each step is journaled before its call is sent."""
        spec = state.recorded
        assert spec is not None  # a recreation begins only from a recorded spec
        recreation = state.recreation or Recreation(DELETE, seen, attempt)
        recreation.attempt = attempt
        state.recreation = recreation
        inherited, start = state.inherited, recreation.step

        def begin(step: str) -> None:
            recreation.step = step
            self.journal.save(name, Entry(spec, recreation))

        try:
            outcome = self.recreate(name, spec, start, begin)
        except (CloudError, OSError) as exc:
            outcome = f"failed: {exc}"
        if not outcome.startswith("failed"):
            state.recreation, state.inherited = None, False
            self._remember(name, state, spec, force=True)
        if outcome.startswith("failed"):
            self._failed(state, attempt)
            outcome += f"; next try in {self.backoff(state.failures):.0f}s"
        else:
            # New hosts are being created: the slice is not broken again until it was whole.
            state.failures, state.next_try, state.was_whole = 0, 0.0, False
            state.broken_since = None
        if inherited:
            waited = (
                f"finished the recreation an earlier controller began (it saw {recreation.seen}) "
                f"from its step {start}: " + waited
            )
        self.recorder.record(Event.now(name, seen, "recreate", waited + outcome, attempt))

    def _google_recovers(self, name: str, state: SliceState, observation: Observation) -> str | None:
        """Whether a broken slice is left to Google (None) or acted on now (what to say first).

        The stack's capacity cell (`capacity_table`) says who repairs its slices: where Google does
        (``repaired_by`` not rayslice: on-demand, reserved and flex-start on compute, Cloud TPU
        "Failure recovery of TPU instances"), a slice whose hosts still exist is never deleted
        while Google may be recovering it: the first sighting is recorded with the cell's words,
        and the slice is recreated only once it is gone or still broken after the cell's
        ``repair_grace_s``. Spot slices, and a slice that is gone, are recreated at once."""
        if observation.gone:
            return ""
        # A queued slice's cell comes from its request: the stack's capacity key alone names no
        # cell for a queued reservation or flex-start request (`capacity_table.cell`).
        cell = observation.cell or self.target.cell
        if cell is None or cell.repaired_by == capacity_table.RAYSLICE:
            return ""
        grace = float(cell.repair_grace_s or 0)
        now = self.clock()
        if state.broken_since is None:
            state.broken_since = now
            reaction = cell.events[capacity_table.HOST_ERROR]
            outcome = f"{reaction.meaning}; recreated only if not recovered within {grace / 60:.0f} min"
            self.recorder.record(Event.now(name, observation.seen, reaction.action, outcome))
        if now - state.broken_since < grace:
            return None
        return f"not recovered after {(now - state.broken_since) / 60:.0f} min; "

    def _failed(self, state: SliceState, attempt: int) -> None:
        state.failures = attempt
        state.next_try = self.clock() + self.backoff(attempt)

    # ---- elastic slices (rayslice.recovery.scaling) -------------------------------------------

    def scale(self, policy: ScalingPolicy) -> None:
        try:
            sizes = {name: self._sizes(name) for name in self.target.slice_names}
            # A bulk MIG (flex-start) with a target size and no instance waits for capacity.
            waiting = {n for n, (target, held) in sizes.items() if target > 0 and held == 0}
            if policy.run_duration_s is None:
                waiting = set()
            with_hosts = {n for n, (target, _) in sizes.items() if target > 0 and n not in waiting}
            demand = self.read_demand(policy)
        except (CloudError, NoCredentials, OSError) as exc:  # recovery goes on; the next pass tries again
            print(f"rayslice-recovery: could not read the cluster's slices or demand: {exc}", file=sys.stderr)
            return
        try:
            decision = decide(
                policy,
                self.target.slice_names,
                with_hosts,
                demand,
                self.wall_clock(),
                self.missing_before,
                waiting,
            )
        except Exception as exc:  # a reading no rule foresaw: recorded (once), and recovery goes on
            decision = Decision(waiting=f"no scaling decision: {type(exc).__name__}: {exc!s:.200}")
        self.missing_before = decision.missing > 0
        seen = f"demand {decision.wanted} slice(s)"
        if decision.asked:
            seen += f", {decision.asked} asked for in all"
        seen += f"; with hosts: {', '.join(sorted(with_hosts)) or 'none'}"
        if waiting:
            seen += f"; waiting for capacity: {', '.join(sorted(waiting))}"
        if decision.waiting != self.last_wait:
            self.last_wait = decision.waiting
            if decision.waiting:
                self.recorder.record(Event.now(self.target.cluster, seen, "wait", decision.waiting))
        for name in decision.add:
            self.recorder.record(Event.now(name, seen, "add slice", self._add(policy, name)))
        for name in decision.remove:
            self.recorder.record(Event.now(name, seen, "remove slice", self._remove(policy, name)))
        for name in decision.cancel:
            self.recorder.record(Event.now(name, seen, "cancel slice", self._cancel(name)))

    def read_demand(self, policy: ScalingPolicy) -> Demand | None:
        """The head's last reading of Ray's demand; None when there is none or it is unreadable."""
        path = f"{names.GUEST_ATTRIBUTE_NAMESPACE}/{names.DEMAND_KEY}"
        entries = self.client.instance_guest_attributes(policy.head_instance, path)
        value = next((e.get("value", "") for e in entries if e.get("key") == names.DEMAND_KEY), "")
        if not value:
            return None
        try:
            return parse(value)
        except ValueError as exc:
            print(f"rayslice-recovery: the head's demand is unreadable: {exc}", file=sys.stderr)
            return None

    def _sizes(self, name: str) -> tuple[int, int]:
        """Slice `name`'s MIG's target size and the instances it holds ((0, 0) when missing)."""
        mig = self.client.get_mig(name)
        if mig is None:
            return 0, 0
        target = int(mig.get("targetSize", 0))
        return target, len(self.client.list_managed_instances(name)) if target else 0

    def _add(self, policy: ScalingPolicy, name: str) -> str:
        if policy.run_duration_s is not None:
            return self._resize(name, policy.hosts_per_slice, "waits for capacity")
        hosts = names.slice_host_names(name, policy.hosts_per_slice)
        instances = instances_of(policy, self.target.location.project, hosts)
        try:
            done = self.client.wait_zone_operation(
                self.client.create_instances(name, instances, self.target.slice_names),
                self.operation_timeout_s,
            )
        except (CloudError, OSError) as exc:
            return f"failed: {exc}"
        if operation_error(done):
            return f"failed: createInstances: {operation_error(done)}"
        # A new slice: recovery watches it once it has been whole.
        self.slices[name] = SliceState()
        return f"{len(hosts)} host(s) requested"

    def _resize(self, name: str, size: int, outcome: str) -> str:
        """Slice `name`'s bulk MIG (flex-start) resized to `size`: from 0 to its hosts, which the
        MIG creates all at once when the zone has them, or to 0, which deletes them or withdraws
        the wait (Compute Engine, "About bulk mode")."""
        try:
            done = self.client.wait_zone_operation(
                self.client.resize_mig(name, size, self.target.slice_names), self.operation_timeout_s
            )
        except (CloudError, OSError) as exc:
            return f"failed: {exc}"
        if operation_error(done):
            return f"failed: resize to {size}: {operation_error(done)}"
        if size:
            self.slices[name] = SliceState()  # recovery watches it once it has been whole
        return f"MIG resized to {size} host(s): {outcome}"

    def _cancel(self, name: str) -> str:
        """A flex-start slice that still waits for capacity and is no longer needed: resized to 0,
        so no hosts come later for nothing."""
        return self._resize(name, 0, "no demand for it before capacity came")

    def _remove(self, policy: ScalingPolicy, name: str) -> str:
        if policy.run_duration_s is not None:
            outcome = self._resize(name, 0, f"idle for {policy.idle_timeout_s:.0f}s or more")
            if not outcome.startswith("failed"):
                self.removing.add(name)
            return outcome
        hosts = names.slice_host_names(name, policy.hosts_per_slice)
        allowed = self.target.slice_names
        wait = self.client.wait_zone_operation
        try:
            done = wait(self.client.delete_instances(name, hosts, allowed), self.operation_timeout_s)
            if operation_error(done):
                return f"failed: deleteInstances: {operation_error(done)}"
            # Whether deleteInstances also deletes the hosts' per-instance configs is not said
            # for every case (rayslice/recovery/cloud.py); what is left is deleted, so the next
            # createInstances of the same names starts clean.
            left = [c["name"] for c in self.client.list_per_instance_configs(name) if c.get("name") in hosts]
            if left:
                done = wait(
                    self.client.delete_per_instance_configs(name, left, allowed), self.operation_timeout_s
                )
                if operation_error(done):
                    return f"failed: deletePerInstanceConfigs: {operation_error(done)}"
        except (CloudError, OSError) as exc:
            return f"failed: {exc}"
        self.removing.add(name)
        return f"{len(hosts)} host(s) deleted (idle for {policy.idle_timeout_s:.0f}s or more)"

    def _removal_done(self, name: str) -> None:
        """Ends a removal once the slice's MIG holds no instance: recovery watches it again."""
        try:
            if self.client.list_managed_instances(name):
                return
        except (CloudError, OSError):
            return
        self.removing.discard(name)
        self.slices[name] = SliceState()

    # ---- per platform -------------------------------------------------------------------------

    def observe(self, name: str, was_whole: bool = False) -> Observation:
        """One look at slice `name`; `was_whole`: it has been seen whole since it was (re)created."""
        if self.target.slice_resource == TPU_NODE:
            return self._observe_node(name)
        return self._observe_mig(name, was_whole)

    def recreate(
        self, name: str, recorded: Mapping[str, Any], step: str = DELETE, begin: Begin = lambda _: None
    ) -> str:
        """Recreates slice `name` from `recorded`, from `step` on (`rayslice.recovery.journal`);
        `begin(step)` is called before each step's call is sent. Every step looks first, so one
        a killed controller already sent is not sent again."""
        if self.target.slice_resource == TPU_NODE:
            return self._recreate_node(name, recorded, STEPS.index(step), begin)
        return self._recreate_mig(name, recorded, STEPS.index(step), begin)

    def _observe_node(self, name: str) -> Observation:
        queued = self.client.get_queued_resource(names.request_name(name))
        if queued is not None:
            return self._observe_queued(name, queued)
        node = self.client.get_node(name)
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

    def _observe_queued(self, name: str, queued: Mapping[str, Any]) -> Observation:
        """A queued slice, through its request (see the module docstring)."""
        recorded: dict[str, Any] = {"queued": _queued_spec(queued)}
        cell = capacity_table.queued_cell(queued)
        state = str((queued.get("state") or {}).get("state", "STATE_UNSPECIFIED"))
        seen = f"queued resource {state}"
        if state in QUEUED_BROKEN_STATES:
            # What SUSPENDED means depends on the capacity (`capacity_table`): a flex-start run or
            # a calendar-mode reservation that ended is over, and nothing is requested again.
            reaction = cell.events.get(capacity_table.SUSPENDED)
            if reaction is not None and reaction.action == capacity_table.END:
                return self._ended(name, f"{seen}: {reaction.meaning}", recorded)
            return Observation(True, seen, recorded)
        if state != QUEUED_ACTIVE:
            return Observation(False, seen, recorded)  # waiting, provisioning, or failed: left alone
        node = self.client.get_node(name)
        if node is None:
            return Observation(True, f"{seen}, node missing", recorded)
        node_state = str(node.get("state", "STATE_UNSPECIFIED"))
        broken = node_state in TPU_BROKEN_STATES
        # A TERMINATED node is left to the Cloud TPU service's repair where the cell says so, as a
        # direct node is (`_observe_node`); deleting its request would give the capacity up.
        seen = f"{seen}, node state {node_state}"
        gone = node_state != TPU_TERMINATED
        return Observation(broken, seen, recorded, node_state == "READY", gone, cell)

    def _ended(self, name: str, seen: str, recorded: dict[str, Any]) -> Observation:
        """A slice whose capacity ended: recorded once as an event, left alone (not broken)."""
        state = self.slices.get(name)
        if state is None or state.last_seen != seen:
            self.recorder.record(Event.now(name, seen, "none", ENDED_OUTCOME, 1))
        return Observation(False, seen, recorded)

    def _recreate_queued(self, name: str, recorded: Mapping[str, Any], start: int, begin: Begin) -> str:
        request = names.request_name(name)
        allowed = {names.request_name(s) for s in self.target.slice_names}
        wait = self.client.wait_tpu_operation
        if start <= STEPS.index(DELETE):
            begin(DELETE)
            if self.client.get_queued_resource(request) is not None:
                done = wait(
                    self.client.delete_queued_resource(request, allowed, force=True), self.operation_timeout_s
                )
                if not done.get("done") or operation_error(done):
                    return f"failed: delete request: {operation_error(done) or 'did not finish'}"
        begin(INSERT)
        if self.client.get_queued_resource(request) is None:  # else a killed controller made it
            done = wait(
                self.client.create_queued_resource(request, recorded, allowed), self.operation_timeout_s
            )
            if not done.get("done") or operation_error(done):
                return f"failed: queued resource: {operation_error(done) or 'did not finish'}"
        return f"recreated; queued resource {request} waits for capacity"

    def _recreate_node(self, name: str, recorded: Mapping[str, Any], start: int, begin: Begin) -> str:
        if "queued" in recorded:
            return self._recreate_queued(name, recorded["queued"], start, begin)
        allowed = self.target.slice_names
        if start <= STEPS.index(DELETE):
            begin(DELETE)
            if self.client.get_node(name) is not None:
                done = self.client.wait_tpu_operation(
                    self.client.delete_node(name, allowed), self.operation_timeout_s
                )
                if not done.get("done") or operation_error(done):
                    return f"failed: delete: {operation_error(done) or 'did not finish'}"
        begin(INSERT)
        if self.client.get_node(name) is not None:
            return "recreated"  # a killed controller's create was accepted: the node is there
        done = self.client.wait_tpu_operation(
            self.client.create_node(name, recorded, allowed), self.operation_timeout_s
        )
        if not done.get("done"):
            return "create requested, still in progress"
        error = operation_error(done)
        return f"failed: create: {error}" if error else "recreated"

    def _observe_mig(self, name: str, was_whole: bool) -> Observation:
        mig = self.client.get_mig(name)
        if mig is None:
            return Observation(True, "MIG missing")
        instances = self.client.list_managed_instances(name)
        configs = self.client.list_per_instance_configs(name)
        recorded: dict[str, Any] = {
            "mig": {key: mig[key] for key in MIG_INSERT_FIELDS if key in mig},
            "instances": [
                {key: config[key] for key in ("name", "preservedState") if key in config}
                for config in configs
            ],
        }
        target = int(mig.get("targetSize", 0))
        bulk = mig.get("targetSizePolicy", {}).get("mode") == BULK_MODE
        if bulk and target and not instances and not was_whole:
            # Bulk mode creates every host at once when the zone has them, none before: a bulk MIG
            # not yet whole with no instance waits (one that was whole has lost its hosts).
            return Observation(False, f"MIG waits for capacity for {target} host(s)", recorded)
        cell = self.target.cell
        ended = cell.events.get(capacity_table.RUN_DURATION) if cell is not None else None
        if target and not instances and was_whole and ended and ended.action == capacity_table.END:
            # Every host deleted by Compute Engine while the MIG stays: the run duration (or the
            # reservation's period) is over, as the capacity cell says; nothing is asked again.
            return self._ended(name, f"MIG 0 of {target} instances: {ended.meaning}", recorded)
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
            preempted = self._preempted({host for host, _ in down})
            problems += [
                f"host {_short(name, host)} {'preempted' if host in preempted else what}"
                for host, what in down
            ]
        if problems:
            gone = len(instances) < target
            return Observation(True, "MIG " + ", ".join(problems), recorded, gone=gone)
        return Observation(False, f"MIG {serving} of {target} instances running", recorded, whole)

    def _preempted(self, hosts: set[str]) -> set[str]:
        """Which of `hosts` Compute Engine preempted: those named by a zone operation of type
        ``compute.instances.preempted`` (`CloudClient.list_preemptions`), so that an event says
        "preempted" rather than only the state a preemption leaves (TERMINATED, STOPPING). An
        unreadable list says nothing (the hosts keep their state's name)."""
        try:
            operations = self.client.list_preemptions()
        except (CloudError, OSError):
            return set()
        return {str(o.get("targetLink", "")).rsplit("/", 1)[-1] for o in operations} & hosts

    def _recreate_mig(self, name: str, recorded: Mapping[str, Any], start: int, begin: Begin) -> str:
        allowed = self.target.slice_names
        wait = self.client.wait_zone_operation
        if start <= STEPS.index(DELETE):
            begin(DELETE)
            if self.client.get_mig(name) is not None:
                done = wait(self.client.delete_mig(name, allowed), self.operation_timeout_s)
                if done.get("status") != "DONE" or operation_error(done):
                    return f"failed: delete: {operation_error(done) or 'did not finish'}"
        body = dict(recorded["mig"])
        instances = list(recorded["instances"])
        if instances:
            # createInstances below adds the named hosts, one call in individual mode (an earlier
            # rayslice's bulk Spot MIG loses its bulk policy: bulk mode refuses Spot templates).
            body["targetSize"] = 0
            body.pop("targetSizePolicy", None)
        # else a bulk MIG (flex-start): inserted with its target size, it waits for every host.
        policy = dict(body.get("instanceLifecyclePolicy") or {})
        body["instanceLifecyclePolicy"] = {**policy, "defaultActionOnFailure": MIG_ACTION_ON_FAILURE}
        if start <= STEPS.index(INSERT):
            begin(INSERT)
            if self.client.get_mig(name) is None:  # else a killed controller's insert was accepted
                done = wait(self.client.insert_mig(body, allowed), self.operation_timeout_s)
                if done.get("status") != "DONE" or operation_error(done):
                    return f"failed: insert: {operation_error(done) or 'did not finish'}"
        if instances:
            begin(CREATE_HOSTS)
            # Only the hosts not there yet: a name that exists is refused (an instance name is
            # unique in its zone), and a killed controller may have asked for them already.
            there = {managed_instance_name(i) for i in self.client.list_managed_instances(name)}
            missing = [i for i in instances if i.get("name") not in there]
            if not missing:
                return "recreated"
            done = wait(self.client.create_instances(name, missing, allowed), self.operation_timeout_s)
            if done.get("status") != "DONE":
                return "hosts requested, still in progress"
            if operation_error(done):
                return f"failed: createInstances: {operation_error(done)}"
        elif body.get("targetSizePolicy", {}).get("mode") == BULK_MODE:
            return f"recreated; the MIG waits for capacity for {body.get('targetSize')} host(s)"
        return "recreated"

    # ---- the service --------------------------------------------------------------------------

    def run(self, interval_s: float, stop: threading.Event) -> None:
        while not stop.is_set():
            self.step()
            stop.wait(interval_s)


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


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m rayslice.recovery", description="Recreate this cluster's broken slices whole."
    )
    parser.add_argument("--project", required=True)
    parser.add_argument("--zone", required=True)
    parser.add_argument("--cluster", required=True, help="the spec's name (prefix of every resource)")
    parser.add_argument("--platform", required=True, choices=tuple(VM_PLATFORMS))
    parser.add_argument("--slices", required=True, type=int)
    parser.add_argument(
        "--capacity",
        choices=capacity_table.CAPACITIES,
        help="the stack's capacity cell (rayslice.capacity_table): who repairs a broken slice",
    )
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S)
    parser.add_argument("--base-backoff", type=float, default=DEFAULT_BASE_BACKOFF_S)
    parser.add_argument("--max-backoff", type=float, default=DEFAULT_MAX_BACKOFF_S)
    parser.add_argument("--event-log", type=Path, help="also append events to this JSON-lines file")
    parser.add_argument(
        "--state-dir",
        type=Path,
        required=True,
        help="where each slice's spec and the recreation under way are kept for a restarted "
        "controller (rayslice.recovery.journal)",
    )
    parser.add_argument(
        "--no-guest-attributes", action="store_true", help="do not publish events as guest attributes"
    )
    parser.add_argument(
        "--elastic",
        help="an elastic cluster's scaling policy (JSON, rayslice.recovery.scaling.ScalingPolicy)",
    )
    parser.add_argument("--once", action="store_true", help="one pass, then exit")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.slices < 1:
        print("--slices must be at least 1", file=sys.stderr)
        return 2
    try:
        scaling = ScalingPolicy.from_json(args.elastic) if args.elastic else None
    except ValueError as exc:
        print(f"--elastic: {exc}", file=sys.stderr)
        return 2
    try:
        target = Target(
            args.cluster, args.platform, args.slices, Location(args.project, args.zone), args.capacity
        )
        client = CloudClient(default_session(), target.location)
        sinks: list[Sink] = [StreamSink()]
        if args.event_log:
            sinks.append(FileSink(args.event_log))
        if not args.no_guest_attributes:
            sinks.append(GuestAttributeSink())
        controller = Controller(
            client,
            target,
            Recorder(sinks),
            base_backoff_s=args.base_backoff,
            max_backoff_s=args.max_backoff,
            scaling=scaling,
            journal=Journal(args.state_dir),
        )
        if args.once:
            controller.step()
        else:
            controller.run(args.interval, threading.Event())
    except RaysliceError as exc:
        print(f"rayslice-recovery: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


def _short(slice_name: str, host: str) -> str:
    """A host as events name it: ``w2`` for rayslice's ``<slice>-w2``, else its whole name."""
    worker = names.host_worker(slice_name, host)
    return host if worker is None else f"w{worker}"
