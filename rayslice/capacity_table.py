"""Capacity x platform: one cell per way of getting TPUs, with what Google's documents say about it.

A cell (`Cell`) holds, for one platform (``compute``, ``tpu-vm``, ``gke``) and one capacity
(``on-demand``, ``spot``, ``reserved``, ``reserved-any``, ``reserved-calendar``, ``flex-start``;
on tpu-vm each also ``queued``), everything that differs between capacities:

- ``calls``: the API calls that create one slice, in order, each with the fields that carry the
  capacity (`Call`); and those fields again as attributes, for the code that builds them:
  ``provisioning_model``, ``termination_action``, ``reservation_affinity``, ``mig_mode``
  (``BULK``, ``INDIVIDUAL`` or None where a slice is no MIG), ``target_size`` (how the MIG gets
  its hosts), ``failure_action`` (the MIG's ``defaultActionOnFailure``, GKE's auto-repair) and
  ``run_duration`` (whether ``maxRunHours`` bounds the slice);
- ``repaired_by``: who brings a failed slice back (`COMPUTE_ENGINE`, `CLOUD_TPU`, `GKE` or
  `RAYSLICE`), and ``repair_grace_s``: how long the recovery controller leaves a broken slice to
  Google before it acts (None where Google does not repair);
- ``events``: per event (`EVENTS`: a Spot preemption, host maintenance, a host error, the run
  duration reached, no capacity, a SUSPENDED queued resource, the slice gone), what it means in
  the user's words and what the controller does (`ACTIONS`); an event a cell does not list
  cannot happen there;
- ``elastic_allowed`` (whether ``minSlices`` may be set) and ``price_key`` (the capacity's key in
  the catalog's price table);
- ``sources``: each a Google page, discovery document or peer's code, its URL and what it says
  (`Source`), and ``unsettled``: where sources disagree or are silent, the choice that is safe
  under every reading (`Unsettled`).

`cell(platform, capacity, queued=...)` reads one cell, `cell_for(spec)` the cell of a stack
(`capacity_of` says which capacity key a stack's keys give), `CELLS` is every cell in the order
the docs page (`docs/capacity-table.md`, written by ``scripts/write_capacity_table.py``) lists
them, and `Cell.describe` is the few lines ``rayslice validate`` and ``rayslice preview`` print.
Infra, the cloud rules, the spec's rules, the cost and the recovery controller read a cell and
do not compare capacity names themselves.

The recovery controller imports this module, so it ships in the controller's bundle
(`rayslice.recovery.bundle`): standard library only, Python 3.10.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

# ---- the axes ---------------------------------------------------------------------------------

COMPUTE, TPU_VM, GKE = "compute", "tpu-vm", "gke"
PLATFORMS = (COMPUTE, TPU_VM, GKE)

ON_DEMAND = "on-demand"
SPOT = "spot"
RESERVED = "reserved"  # a named (specific) reservation
RESERVED_ANY = "reserved-any"  # any matching reservation, none named
RESERVED_CALENDAR = "reserved-calendar"  # a named future reservation created in calendar mode
# A named reservation in All Capacity mode: Google repairs hosts in place and never relocates a
# slice; the user (rayslice) moves it to the reservation's spare hosts.
RESERVED_ALL_CAPACITY = "reserved-all-capacity"
FLEX_START = "flex-start"
CAPACITIES = (ON_DEMAND, SPOT, RESERVED, RESERVED_ANY, RESERVED_CALENDAR, RESERVED_ALL_CAPACITY, FLEX_START)
# The spec's ``capacityMode`` values (a reservation's operational mode, Cloud TPU "TPU capacity
# modes"): Google's managed mode, or All Capacity mode.
MANAGED_MODE, ALL_CAPACITY_MODE = "managed", "all-capacity"
CAPACITY_MODES = (MANAGED_MODE, ALL_CAPACITY_MODE)

# Who brings a failed slice back.
COMPUTE_ENGINE = "compute-engine"  # Compute Engine restarts the slice whole on healthy hosts
CLOUD_TPU = "cloud-tpu"  # the Cloud TPU service takes the node through maintenance
GKE_REPAIR = "gke"  # GKE's node auto-repair or its cluster autoscaler
RAYSLICE = "rayslice"  # nobody at Google: rayslice's recovery controller recreates the slice

# Events the controller sees on a slice.
PREEMPTION = "spot-preemption"
MAINTENANCE = "host-maintenance"
HOST_ERROR = "host-error"
RUN_DURATION = "run-duration-reached"
NO_CAPACITY = "capacity-unavailable"
SUSPENDED = "suspended"
GONE = "slice-gone"
EVENTS = (PREEMPTION, MAINTENANCE, HOST_ERROR, RUN_DURATION, NO_CAPACITY, SUSPENDED, GONE)

# What the controller does about an event.
RECREATE = "recreate"  # delete what is left of the slice and create it whole again
WAIT_FOR_REPAIR = "wait-for-repair"  # leave it to Google; recreate only once gone or after the grace
END = "end"  # the slice ended as its capacity says: record it and request nothing again
KEEP_WAITING = "keep-waiting"  # a request that waits for capacity: record it, change nothing
RETRY = "retry"  # a create refused for lack of capacity: try again on the next round
LEFT_TO_GKE = "left-to-gke"  # no rayslice controller on GKE: GKE and KubeRay act
ACTIONS = (RECREATE, WAIT_FOR_REPAIR, END, KEEP_WAITING, RETRY, LEFT_TO_GKE)

# Field values (compute v1, tpu v2alpha1 and container v1 enums; tests/infra/test_api_enums.py
# checks them against the discovery documents).
STANDARD_MODEL, SPOT_MODEL = "STANDARD", "SPOT"
RESERVATION_BOUND_MODEL, FLEX_START_MODEL = "RESERVATION_BOUND", "FLEX_START"
STOP, DELETE = "STOP", "DELETE"
SPECIFIC_RESERVATION, ANY_RESERVATION, NO_RESERVATION = (
    "SPECIFIC_RESERVATION",
    "ANY_RESERVATION",
    "NO_RESERVATION",
)
BULK, INDIVIDUAL = "BULK", "INDIVIDUAL"


def in_bulk_mode(mig: Mapping[str, Any]) -> bool:
    """Whether a MIG (an InstanceGroupManager body, as sent or as Google returns it) runs in bulk
    mode (compute v1 discovery, InstanceGroupManagerTargetSizePolicy.mode)."""
    return (mig.get("targetSizePolicy") or {}).get("mode") == BULK


DO_NOTHING, REPAIR = "DO_NOTHING", "REPAIR"
AUTO_REPAIR_ON, AUTO_REPAIR_OFF = "auto-repair on", "auto-repair off"
# How a MIG gets its hosts.
TARGET_FROM_ZERO = (
    "inserted with target size 0; createInstances names every host (in one call in bulk mode, one "
    "call per host in individual mode)"
)
TARGET_AT_INSERT = "inserted with target size = hosts; the MIG creates them all when it can"

# Placeholders in a call's body for what the stack decides (`fill`).
PROJECT = "{project}"
ZONE = "{zone}"
RESERVATION_NAME = "{reservation}"
HOSTS = "{hosts}"  # the slice's host count
MAX_RUN_SECONDS = "{maxRunSeconds}"  # maxRunHours in seconds, a number
MAX_RUN_DURATION = "{maxRunSeconds}s"  # the same as a google-duration string
PLACEHOLDERS = (PROJECT, ZONE, RESERVATION_NAME, HOSTS, MAX_RUN_SECONDS)
# A TPU API reservation path; gcloud names "any matching reservation" with ``-`` in place of a
# name (google-cloud-sdk, googlecloudsdk/command_lib/compute/tpus/queued_resources/util.py,
# CreateReservationName: with --reserved on the v2 API, "{}/{}/locations/{}/reservations/-").
TPU_RESERVATION_PATH = f"projects/{PROJECT}/locations/{ZONE}/reservations/{RESERVATION_NAME}"
TPU_ANY_RESERVATION_PATH = f"projects/{PROJECT}/locations/{ZONE}/reservations/-"


def fill(body: Any, values: Mapping[str, Any]) -> Any:
    """`body` with each placeholder replaced by its value in `values` (keyed by placeholder). A
    string that is exactly one placeholder becomes the value itself (a number stays a number);
    placeholders inside a longer string are replaced as text."""
    if isinstance(body, Mapping):
        return {key: fill(value, values) for key, value in body.items()}
    if isinstance(body, (list, tuple)):
        return [fill(value, values) for value in body]
    if isinstance(body, str):
        if body in values:
            return values[body]
        for placeholder, value in values.items():
            body = body.replace(placeholder, str(value))
    return body


# How long the controller leaves a broken slice to Google. Google gives no bound for a recovery;
# "Manually start a host maintenance event" says starting maintenance on a large slice "might
# result in slice unavailability of up to a few hours". Four hours covers "a few"; a slice still
# down then is recreated (a recovery that never came back costs at most this long).
GOOGLE_REPAIR_GRACE_S = 4 * 3600
# How long a host under repair in an All Capacity reservation is left to Google: it repairs the
# host in place and never moves the slice ("Deploy TPUs in All Capacity mode in GKE": the
# responsibility for node failures and planned maintenance is the user's), so rayslice recreates
# a slice still broken after this onto the reservation's spare hosts. A quarter of an hour lets a
# host restart in place; anything longer is a repair that only the user can route around.
ALL_CAPACITY_GRACE_S = 15 * 60
# How long an individual-mode slice may stay partly created before the controller deletes it,
# backs off and asks again. Compute Engine ("About bulk mode"): without bulk mode a MIG "creates
# as many instances as possible with the available capacity and attempts to create the remaining
# instances as capacity becomes available", with no bound; the hosts it made bill while the
# slice, whole or nothing to JAX, runs no job. A TPU VM the zone has is RUNNING within minutes,
# so a quarter of an hour is the most one attempt bills for nothing.
WHOLE_WITHIN_S = 15 * 60


# ---- the record types -------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """One document a cell rests on: its title, URL and what it says, in our words."""

    title: str
    url: str
    says: str


@dataclass(frozen=True)
class Call:
    """One API call that creates (part of) a slice, with the part of its REST body that carries
    the capacity. Values the stack decides are placeholders (`PLACEHOLDERS`), which `fill`
    replaces; the rest is sent as written."""

    method: str  # e.g. "instanceGroupManagers.insert"
    body: Mapping[str, Any] = field(default_factory=dict)

    def fields(self) -> dict[str, str]:
        """The body as ``path.to.field`` -> value, as the docs page lists it."""
        flat: dict[str, str] = {}

        def walk(prefix: str, value: Any) -> None:
            if isinstance(value, Mapping) and value:
                for key, inner in value.items():
                    walk(f"{prefix}.{key}" if prefix else key, inner)
            else:
                flat[prefix] = json.dumps(value) if not isinstance(value, str) else value

        for key, value in self.body.items():
            walk(key, value)
        return flat


@dataclass(frozen=True)
class Reaction:
    """What an event means on a cell, in the user's words, and what the controller does."""

    meaning: str
    action: str


@dataclass(frozen=True)
class Wait:
    """One state a cell's slice can stay in for a while: how long before the controller acts
    (`limit_s`; None: the controller never acts on it), what it then does, and what the state
    bills meanwhile, in the user's words."""

    state: str
    limit_s: int | None
    then: str
    cost: str

    def words(self) -> str:
        """One line: the state, its limit, what follows and its cost."""
        if self.limit_s is None:
            what = f"no limit: {self.then}"
        elif self.limit_s == 0:
            what = self.then
        else:
            what = f"up to {self.limit_s // 60} min, then {self.then}"
        return f"{self.state}: {what}; costs meanwhile: {self.cost}"


@dataclass(frozen=True)
class Unsettled:
    """A point sources disagree on or are silent about, and the choice safe under each reading."""

    point: str
    choice: str


@dataclass(frozen=True)
class Cell:
    """One (platform, capacity) of the table; the module docstring says what each field means."""

    platform: str
    capacity: str
    queued: bool
    summary: str
    calls: tuple[Call, ...]
    provisioning_model: str | None
    termination_action: str | None
    reservation_affinity: str | None
    mig_mode: str | None
    target_size: str | None
    failure_action: str | None
    run_duration: bool
    repaired_by: str
    repair_grace_s: int | None
    events: Mapping[str, Reaction]
    elastic_allowed: bool
    price_key: str
    sources: tuple[Source, ...]
    unsettled: tuple[Unsettled, ...] = ()
    # How long a slice may stay partly created (some hosts made, the rest not) before the
    # controller deletes it and asks again after a back-off (`WHOLE_WITHIN_S`); None where a slice
    # is made whole or not at all (bulk MIGs, TPU nodes, queued requests).
    whole_within_s: int | None = None

    @property
    def key(self) -> str:
        """``compute/spot``, ``tpu-vm/queued/reserved``: how the docs and messages name a cell."""
        return "/".join((self.platform, *(("queued",) if self.queued else ()), self.capacity))

    @property
    def waits_for_capacity(self) -> bool:
        """Whether a slice is a request that waits for capacity and whose hosts the cloud names
        (a flex-start bulk MIG inserted with its target size, a queued resource, a flex-start node
        pool), not hosts rayslice names and asks for itself (a reserved MIG's createInstances
        waits too, in bulk mode, for the hosts rayslice named)."""
        return self.action(NO_CAPACITY) == KEEP_WAITING and self.target_size != TARGET_FROM_ZERO

    def action(self, event: str) -> str | None:
        """The controller's action on `event`, None where the event cannot happen here."""
        reaction = self.events.get(event)
        return reaction.action if reaction else None

    @property
    def waits(self) -> tuple[Wait, ...]:
        """Each state a slice of this cell can stay in for a while, how long before the controller
        acts, and its cost (`Wait`): read from the cell's events, grace and bound, so the table,
        its page and `validate` say one thing."""
        if self.platform == GKE:
            return (Wait("any state", None, "GKE and KubeRay act (no rayslice controller)", "as GKE bills"),)
        reservation = "the reservation's hours, used or not"
        idle = reservation if self.price_key == RESERVED else "nothing: no host exists yet"
        found: list[Wait] = []
        no_capacity = self.action(NO_CAPACITY)
        if no_capacity == KEEP_WAITING:
            then = (
                "the request fails at queueDeadlineHours if set; the controller does not act"
                if self.queued
                else "the controller keeps waiting (resize to 0 or `pulumi destroy` withdraws it)"
            )
            found.append(Wait("waiting for capacity", None, then, idle))
        elif self.whole_within_s is None:
            found.append(Wait("refused for lack of capacity", 0, "asked again on the next round", idle))
        if self.whole_within_s is not None:
            hosts = (
                f"the hosts made so far at the {self.price_key} price, buying nothing "
                "(no job runs on part of a slice)"
            )
            found.append(
                Wait(
                    "partly created",
                    self.whole_within_s,
                    "deleted, and asked again after a back-off",
                    f"{reservation}" if self.price_key == RESERVED else hosts,
                )
            )
        if self.repair_grace_s is not None:
            down = "hosts still running at the price; a stopped host only its disks"
            in_place = self.repaired_by == RAYSLICE
            state = "repaired in place by Google" if in_place else "being repaired by Google"
            found.append(
                Wait(
                    state,
                    self.repair_grace_s,
                    "recreated whole",
                    reservation if self.price_key == RESERVED else down,
                )
            )
        if self.action(PREEMPTION) == RECREATE:
            found.append(Wait("preempted", 0, "recreated whole at once", "the stopped hosts' disks only"))
        if self.action(RUN_DURATION) == END or self.action(SUSPENDED) == END:
            then = (
                "its MIG is resized to 0 at once and nothing is asked again"
                if self.mig_mode
                else "nothing is asked again"
            )
            found.append(Wait("ended", 0, then, "nothing after the end"))
        return tuple(found)

    def describe(self) -> list[str]:
        """The few lines `validate` and `preview` print: how slices are made, who repairs them,
        what the controller does on each event (events grouped by action), and how long each
        state may last and what it costs (`waits`)."""
        repaired = {
            COMPUTE_ENGINE: "Compute Engine recovers a failed slice whole",
            CLOUD_TPU: "the Cloud TPU service takes a slice through host maintenance",
            GKE_REPAIR: "GKE brings the nodes back (auto-repair or the autoscaler)",
            RAYSLICE: "not by Google: rayslice's recovery controller recreates the slice whole",
        }[self.repaired_by]
        if self.repaired_by == RAYSLICE and self.repair_grace_s is not None:
            repaired = "Google repairs hosts in place only; rayslice's recovery controller moves the slice"
        lines = [
            f"capacity {self.key}: {self.summary}",
            f"  slices made by: {' -> '.join(c.method for c in self.calls)}",
            f"  repaired: {repaired}",
        ]
        by_action: dict[str, list[str]] = {}
        for event, reaction in self.events.items():
            by_action.setdefault(reaction.action, []).append(event)
        for action, events in by_action.items():
            lines.append(f"  on {', '.join(events)}: {self._action_words(action)}")
        lines += [f"  {wait.words()}" for wait in self.waits]
        return lines

    def _action_words(self, action: str) -> str:
        grace = f"{(self.repair_grace_s or 0) // 60} min"
        return {
            RECREATE: "the controller recreates the slice whole",
            WAIT_FOR_REPAIR: f"the controller leaves it to Google, and recreates it only once it is gone or "
            f"still broken after {grace}",
            END: "the slice has ended: the controller records it and requests nothing again",
            KEEP_WAITING: "the request keeps waiting; the controller changes nothing",
            RETRY: "the create is tried again on the controller's next round"
            + (
                f" (a slice partly created is deleted and asked again if not whole within "
                f"{self.whole_within_s // 60} min)"
                if self.whole_within_s
                else ""
            ),
            LEFT_TO_GKE: "no rayslice controller on gke: GKE and KubeRay act",
        }[action]


class SpecLike(Protocol):
    """The stack keys a cell depends on (`rayslice.spec.ClusterSpec` has them; the controller's
    configuration may too)."""

    @property
    def platform(self) -> str: ...
    @property
    def capacity(self) -> str: ...
    @property
    def queued(self) -> bool: ...
    @property
    def reservation(self) -> str | None: ...
    @property
    def calendar_mode(self) -> bool: ...
    @property
    def capacity_mode(self) -> str: ...


# ---- the sources ------------------------------------------------------------------------------

BULK_MODE = Source(
    "Compute Engine, About bulk mode",
    "https://cloud.google.com/compute/docs/instance-groups/about-bulk-mode",
    "A MIG in bulk mode creates all instances at once or none; only with reservation-bound or "
    "flex-start templates; no resize requests, autoscaling or standby pools; hosts are added "
    "(target size or createInstances) only while the target size is 0, and removed by resizing to "
    "0, or to a smaller size once no bulk creation is in progress.",
)
BULK_CREATE = Source(
    "Compute Engine, Create a MIG that uses the bulk mode",
    "https://cloud.google.com/compute/docs/instance-groups/bulk-create-instances-in-mig",
    "Bulk mode is only supported with templates whose provisioning model is reservation-bound or "
    "flex-start; the reservation-bound template deletes its VMs on termination and chooses a reservation.",
)
TPU_MIG = Source(
    "Cloud TPU, Create Cloud TPU VMs with MIGs",
    "https://docs.cloud.google.com/tpu/docs/tpus-and-migs",
    "MIGs create TPU VMs of v5p and later: single-host MIGs of independent VMs, and multi-host "
    "slices of VMs joined by ICI links, bound to a workload policy with the slice's topology.",
)
FAILURE_RECOVERY = Source(
    "Cloud TPU, Failure recovery of TPU instances",
    "https://docs.cloud.google.com/tpu/docs/failure-recovery",
    "In managed capacity (on-demand, flex-start and standard reservations) Compute Engine recovers "
    "TPU instances and slices by restarting them on healthy hardware; a multi-host slice is "
    "recovered or rescheduled together, never one instance of it. Planned terminations are not "
    "recovered: deletion, a reservation's deletion or expiry, a Spot preemption (that list read in "
    "the page's zh-CN copy; the English page was read up to its multi-host section).",
)
SPOT_TPU = Source(
    "Cloud TPU, Request TPU Spot VMs",
    "https://cloud.google.com/tpu/docs/spot-compute",
    "A Spot TPU MIG's template sets provisioning model SPOT and termination action STOP; to "
    "restart a Spot instance or MIG it must be deleted and recreated.",
)
MAINTENANCE_START = Source(
    "Cloud TPU, Manually start a host maintenance event",
    "https://cloud.google.com/tpu/docs/manually-start-maintenance",
    "Maintenance of a large slice may leave it unavailable for up to a few hours; the slice is "
    "rescheduled to other hosts as soon as there is capacity.",
)
MAINTENANCE_TPU_API = Source(
    "Cloud TPU, Manage maintenance events with Cloud TPU Pods",
    "https://cloud.google.com/tpu/docs/maintenance-events",
    "Most maintenance events are recovered automatically; in the edge cases where a job does not "
    "restart, delete and recreate the TPU resources.",
)
FLEX_TPU = Source(
    "Cloud TPU, Request Cloud TPUs using flex-start",
    "https://cloud.google.com/tpu/docs/request-using-flex-start",
    "Flex-start TPUs come through queued resources with a run duration of at most 7 days; when it "
    "ends the VMs are deleted and the queued resource moves to SUSPENDED; zones per generation.",
)
CONSUME_RESERVATION = Source(
    "Cloud TPU, Consume a reservation",
    "https://cloud.google.com/tpu/docs/consume-reservation",
    "A queued resource names a reservation with --reservation; for a future reservation created in "
    "calendar mode the name is required and --provisioning-model must be reservation-bound; "
    "--reserved (no name) lets the service pick a matching reservation.",
)
CALENDAR_MODE = Source(
    "Cloud TPU, Request a future reservation in calendar mode",
    "https://cloud.google.com/tpu/docs/calendar-mode-reservation",
    "A calendar-mode reservation lasts 1 to 90 days; it is consumed through the Create Node or "
    "Queued Resources API; at its end Compute Engine deletes the reservation and every TPU using it.",
)
COMPUTE_CONSUME = Source(
    "Compute Engine, About instances that use the reservation-bound model",
    "https://docs.cloud.google.com/compute/docs/instances/about-reservation-bound-vms",
    "A reservation-bound instance consumes one specific reservation (reservation affinity "
    "SPECIFIC_RESERVATION with the reservation's name) and is deleted when the reservation ends.",
)
FLEX_VMS = Source(
    "Compute Engine, About Flex-start VMs",
    "https://cloud.google.com/compute/docs/instances/about-flex-start-vms",
    "Flex-start VMs start when resources are available and run for up to seven days; then Compute "
    "Engine stops or deletes them as their termination action says.",
)
BULK_WAIT = Source(
    "Compute Engine, Overview of adding instances all at once in a MIG; compute v1 "
    "InstanceGroupManagerStatusBulkInstanceOperation",
    "https://docs.cloud.google.com/compute/docs/instance-groups/overview-add-vms-all-at-once-in-mig",
    "By default a MIG creates each instance on its own, which 'can lead to partial provisioning'; "
    "bulk mode creates them only when all are available, avoiding 'charges for partial capacity'. "
    "While a bulk MIG waits, status.bulkInstanceOperation.inProgress is true and its "
    "lastProgressCheck holds the time of the last check and the errors that keep it waiting.",
)
SCHEDULING_RESTART = Source(
    "compute v1 Scheduling.automaticRestart",
    "https://cloud.google.com/compute/docs/reference/rest/v1/instances",
    "Whether Compute Engine restarts an instance it terminated (not one a user terminated); "
    "true by default; only preemptible instances cannot be restarted automatically. SkyPilot's "
    "flex-start TPU template leaves it at that default.",
)
ALL_CAPACITY = Source(
    "Cloud TPU, Request TPU capacity in All Capacity mode",
    "https://docs.cloud.google.com/tpu/docs/request-all-capacity-mode-reservation",
    "An All Capacity mode reservation is asked for through the account team and delivered as a "
    "named Compute Engine reservation.",
)
ALL_CAPACITY_GKE = Source(
    "GKE, Deploy TPUs in All Capacity mode in GKE",
    "https://docs.cloud.google.com/kubernetes-engine/docs/how-to/tpu-all-capacity-mode",
    "Unlike managed mode, where Google keeps part of the capacity to handle hardware failures, All "
    "Capacity mode gives the whole reservation and shifts managing node failures and planned "
    "maintenance to the user.",
)
GKE_FLEX = Source(
    "GKE, About flex-start provisioning mode",
    "https://cloud.google.com/kubernetes-engine/docs/concepts/dws",
    "Flex-start node pools get VMs when capacity becomes available, for at most 7 days; TPU v3 "
    "and v4 are not supported; TPUs in v6e asia-northeast1-b, us-east5-a, us-east5-b, v5e "
    "us-west4-a, v5p us-east5-a (no TPU7x), on GKE 1.33.0-gke.1712000 or later.",
)
GKE_PRICING = Source(
    "GKE pricing",
    "https://cloud.google.com/kubernetes-engine/pricing",
    "A flat cluster management fee of $0.10 per cluster per hour, whatever the cluster's size; a "
    "$74.40 monthly free-tier credit per billing account for zonal and Autopilot clusters.",
)
GCLOUD_QUEUED = Source(
    "Google Cloud SDK, googlecloudsdk/command_lib/compute/tpus/queued_resources/util.py "
    "(google-cloud-sdk-unofficial/google-cloud-sdk at 01f043c2289d)",
    "https://github.com/google-cloud-sdk-unofficial/google-cloud-sdk/blob/master/lib/googlecloudsdk/"
    "command_lib/compute/tpus/queued_resources/util.py",
    "CreateReservationName: with --reserved on the v2 API the request's reservationName is "
    "projects/PROJECT/locations/ZONE/reservations/- (any matching reservation); a bare --reservation "
    "NAME becomes projects/PROJECT/locations/ZONE/reservations/NAME. CreateNodeSpec sets no "
    "scheduling on the node.",
)
GKE_AUTO_REPAIR = Source(
    "Cloud TPU, Introduction to TPUs in GKE",
    "https://cloud.google.com/tpu/docs/tpus-in-gke",
    "A multi-host TPU slice node pool is one atomic unit: if GKE cannot create one of its nodes it "
    "creates none, and when one node needs repair GKE shuts down every TPU VM of the slice and "
    "schedules the pods again once the whole slice is back (read in the page's id copy).",
)
TPU_V2_DISCOVERY = Source(
    "tpu v2 / v2alpha1 discovery documents (revision 20261001)",
    "https://tpu.googleapis.com/$discovery/rest?version=v2alpha1",
    "Node.schedulingConfig has spot and reserved; v2alpha1 QueuedResource adds provisioningModel "
    "(STANDARD, SPOT, RESERVATION_BOUND, FLEX_START) and runDuration; QueuedResourceState SUSPENDED: "
    "the resources of the request have been deleted.",
)
COMPUTE_DISCOVERY = Source(
    "compute v1 discovery document",
    "https://compute.googleapis.com/discovery/v1/apis/compute/v1/rest",
    "Scheduling.provisioningModel, instanceTerminationAction, maxRunDuration; "
    "InstanceGroupManagerTargetSizePolicy.mode BULK/INDIVIDUAL; "
    "InstanceGroupManagerInstanceLifecyclePolicy.defaultActionOnFailure REPAIR/DO_NOTHING.",
)
SKYPILOT_MIG = Source(
    "SkyPilot, sky/provision/gcp/mig_utils.py",
    "https://github.com/skypilot-org/skypilot/blob/master/sky/provision/gcp/mig_utils.py",
    "TPU flex-start on Compute Engine: a FLEX_START template with maxRunDuration, a BULK MIG of "
    "target size = hosts, defaultActionOnFailure DO_NOTHING, no resize request.",
)
XPK_CAPACITY = Source(
    "xpk, src/xpk/core/capacity.py",
    "https://github.com/AI-Hypercomputer/xpk/blob/main/src/xpk/core/capacity.py",
    "GKE node pools per capacity: --spot, --reservation-affinity=specific --reservation=NAME, and "
    "flex-start with --flex-start --enable-autoscaling --no-enable-autorepair --reservation-affinity=none.",
)
PULUMI_BULK_CONFIG = Source(
    "pulumi-gcp 10.2, compute.BulkPerInstanceConfig (magic-modules BulkPerInstanceConfig)",
    "https://www.pulumi.com/registry/packages/gcp/api-docs/compute/bulkperinstanceconfig/",
    "'A config defined for multiple managed instances that belong to an instance group manager "
    "with target_size_policy.mode=BULK': a bulk MIG's hosts named by per-instance configs, in one "
    "createInstances. It takes names only; rayslice sends the same call with each host's reserved "
    "internal address (its own provider, rayslice/infra/compute/bulk_hosts.py).",
)
TPU7X_RUN = Source(
    "Qwen3.5-397B-A17B-FP8 Inference on TPU v7x, TPU VM Edition (practitioner log)",
    "",
    "A reservation-bound TPU7x MIG needs the workload policy, DO_NOTHING and BULK together, "
    "'otherwise only independent VMs are created, not an ICI slice' (a host then shows HOST_BOUNDS 1,1,1).",
)


# ---- building the cells -----------------------------------------------------------------------

_GONE_RECREATE = Reaction("the slice's MIG, node or queued resource is gone (deleted by hand)", RECREATE)
_NO_CAPACITY_RETRY = Reaction(
    "the zone has no capacity for the slice now (ZONE_RESOURCE_POOL_EXHAUSTED)", RETRY
)
_PARTLY_CREATED = Reaction(
    "the zone has not every host now: the MIG creates what it can and the rest when capacity comes "
    "(partly created, each missing host's last attempt says why); the controller deletes a slice "
    "not whole in time and asks again after a back-off",
    RETRY,
)
_WAITS = Reaction("waiting for capacity: the request waits until the zone has the whole slice", KEEP_WAITING)
_PREEMPTED = Reaction("preempted: Google took the Spot hosts back for other work", RECREATE)


def _google_repairs(who: str) -> dict[str, Reaction]:
    """Events on capacity Google repairs: the controller waits, and acts only on what is gone."""
    by = "Compute Engine" if who == COMPUTE_ENGINE else "the Cloud TPU service"
    return {
        MAINTENANCE: Reaction(f"host maintenance: {by} is restarting the slice, whole", WAIT_FOR_REPAIR),
        HOST_ERROR: Reaction(f"a host failed: {by} is recovering the slice, whole", WAIT_FOR_REPAIR),
    }


def _spot_events() -> dict[str, Reaction]:
    return {
        PREEMPTION: _PREEMPTED,
        MAINTENANCE: Reaction(
            "host maintenance stopped the Spot hosts; Google does not restart them", RECREATE
        ),
        HOST_ERROR: Reaction("a Spot host failed; Google does not recover Spot slices", RECREATE),
    }


_COMPUTE_TEMPLATE = "instanceTemplates.insert"
_POLICY = Call("resourcePolicies.insert", {"workloadPolicy": {"type": "HIGH_THROUGHPUT"}})
# TPU hosts cannot live-migrate: Compute Engine's TPU pages require TERMINATE on host maintenance.
ON_HOST_MAINTENANCE = "TERMINATE"
# A specific reservation's key (compute v1 ReservationAffinity.key: "use
# compute.googleapis.com/reservation-name as the key and specify the name of your reservation as
# its value").
RESERVATION_NAME_KEY = "compute.googleapis.com/reservation-name"


def _compute(
    capacity: str,
    summary: str,
    *,
    model: str,
    termination: str | None,
    affinity: str | None,
    mode: str,
    target: str,
    run_duration: bool,
    repaired_by: str,
    events: dict[str, Reaction],
    price_key: str,
    sources: tuple[Source, ...],
    unsettled: tuple[Unsettled, ...] = (),
    grace: int | None = GOOGLE_REPAIR_GRACE_S,
) -> Cell:
    """A compute cell: a template, a workload policy and a MIG (plus its hosts' createInstances
    where the MIG starts empty); `grace`: how long a broken slice whose hosts exist is left to
    Google (None where nobody at Google repairs it)."""
    # pulumi-gcp refuses SPOT without preemptible and without automatic restart off (and
    # Scheduling.automaticRestart, compute v1: "Preemptible instances cannot be automatically
    # restarted"). Every other model keeps Compute Engine's default, true: failure recovery
    # "is controlled by the automatic restart setting", and with it off a failed host stays
    # TERMINATED while the cell waits for Google's recovery (FLEX_AUTO_RESTART).
    restarts = model != SPOT_MODEL
    scheduling: dict[str, Any] = {
        "provisioningModel": model,
        "onHostMaintenance": ON_HOST_MAINTENANCE,
        "automaticRestart": restarts,
    }
    if model == SPOT_MODEL:
        scheduling["preemptible"] = True
    if termination:
        scheduling["instanceTerminationAction"] = termination
    if run_duration:
        scheduling["maxRunDuration"] = {"seconds": MAX_RUN_SECONDS}
    properties: dict[str, Any] = {"scheduling": scheduling}
    if affinity:
        properties["reservationAffinity"] = {"consumeReservationType": affinity}
        if affinity == SPECIFIC_RESERVATION:
            properties["reservationAffinity"].update(key=RESERVATION_NAME_KEY, values=[RESERVATION_NAME])
    mig = {
        "targetSizePolicy": {"mode": mode},
        "targetSize": HOSTS if target == TARGET_AT_INSERT else 0,
        "instanceLifecyclePolicy": {"defaultActionOnFailure": DO_NOTHING},
    }
    calls = [
        Call(_COMPUTE_TEMPLATE, {"properties": properties}),
        _POLICY,
        Call("instanceGroupManagers.insert", mig),
    ]
    if target == TARGET_FROM_ZERO:
        # Bulk mode takes hosts only while the target size is 0: all in one call. Individual mode
        # takes them one per-instance config, so one call, per host.
        calls_per = "one call" if mode == BULK else "one call per host"
        calls.append(
            Call("instanceGroupManagers.createInstances", {"instances": f"{HOSTS} hosts, {calls_per}"})
        )
    return Cell(
        platform=COMPUTE,
        capacity=capacity,
        queued=False,
        summary=summary,
        calls=tuple(calls),
        provisioning_model=model,
        termination_action=termination,
        reservation_affinity=affinity,
        mig_mode=mode,
        target_size=target,
        failure_action=DO_NOTHING,
        run_duration=run_duration,
        repaired_by=repaired_by,
        repair_grace_s=grace,
        events={
            **events,
            # A bulk MIG waits for every host (Compute Engine, "About bulk mode"), whether its
            # target size was set at insert or by one createInstances; an individual one makes
            # what the zone has and the rest later.
            NO_CAPACITY: _WAITS if mode == BULK else _PARTLY_CREATED,
            GONE: _GONE_RECREATE,
        },
        elastic_allowed=True,
        price_key=price_key,
        sources=(TPU_MIG, COMPUTE_DISCOVERY, *sources),
        unsettled=(_DO_NOTHING_EVERYWHERE, *unsettled),
        whole_within_s=None if mode == BULK else WHOLE_WITHIN_S,
    )


_DO_NOTHING_EVERYWHERE = Unsettled(
    "Whether a multi-host MIG of on-demand or reserved hosts should keep the default REPAIR. "
    "Failure recovery says Compute Engine recovers such slices whole and single hosts cannot be "
    "rescheduled; a MIG's REPAIR recreates one host.",
    "DO_NOTHING on every TPU MIG (SkyPilot and the TPU7x log do so): a repaired single host "
    "could not rejoin the ICI domain, and Compute Engine's own slice recovery does not need the MIG.",
)
_INDIVIDUAL_FORM = Unsettled(
    "How a Spot or on-demand multi-host slice must be created. Bulk mode refuses these "
    "provisioning models; the TPU7x log says without BULK only independent VMs are made; "
    "Google's MIG page could not be read past its prerequisites.",
    "INDIVIDUAL mode (the only one Compute Engine accepts here), each host added from target size 0 "
    "by its own createInstances (a per-instance config with its name and reserved address); each "
    "host checks the topology its TPU runtime reports and stops its boot, naming the cause, if it "
    "is smaller than the slice's.",
)
_GRACE = Unsettled(
    "How long Google's recovery of a slice takes. No page gives a bound; maintenance of a large "
    "slice may take 'up to a few hours'.",
    f"The controller waits {GOOGLE_REPAIR_GRACE_S // 3600} h after it first sees a broken host before "
    "it recreates a slice whose MIG and instances still exist; a slice that is gone is recreated at once.",
)

_FLEX_ZONES_COMPUTE = Unsettled(
    "Where Compute Engine takes flex-start TPUs. No Compute Engine page read lists the zones; "
    "SkyPilot's provisioner lists v6e in asia-northeast1-b, us-east5-a and us-south1-ai1b and TPU7x in "
    "us-central1-c; the Cloud TPU flex-start page lists v6e in asia-northeast1-b and us-east5-a.",
    "validate takes the v6e zones both list and SkyPilot's TPU7x zone, refuses the others naming these "
    "(catalog.FLEX_START_ZONES), and offers no v5p flex-start on compute.",
)
_FLEX_AUTO_RESTART = Unsettled(
    "Whether Compute Engine takes automatic restart on a flex-start TPU template: no page read "
    "refuses it (the ResizeRequest example turns it off for A3 GPUs), and failure recovery needs it.",
    "Keep the default, on (SkyPilot does so): a failed host is recovered by Compute Engine within "
    "the cell's grace; if Google refused the template, `pulumi up` would fail with its message "
    "before any slice is made.",
)
_ALL_CAPACITY_SPARES = Unsettled(
    "Where a slice recreated out of an All Capacity reservation lands: Google says the user "
    "reschedules onto spare hardware set aside in the reservation; rayslice cannot pick hosts.",
    f"The controller waits {ALL_CAPACITY_GRACE_S // 60} min for the in-place repair, then deletes the "
    "slice and asks the same reservation again (one createInstances in bulk mode), which places it "
    "on healthy hosts if the reservation has spares, or waits for them.",
)
_FLEX_ZONES_GKE = Unsettled(
    "Which zones GKE's flex-start takes for TPUs: the list is taken from a review's quote of GKE's "
    "page, not re-read from the page itself; the page also asks for GKE 1.33.0-gke.1712000 or later.",
    "validate takes the listed zones per generation and refuses the others, and TPU7x, naming them "
    "(catalog.FLEX_START_ZONES); the GKE version is the release channel's, which rayslice does not "
    "pin, so an older cluster fails when the node pool is created, with GKE's message.",
)
_CALENDAR_COMPUTE = Unsettled(
    "Whether a calendar-mode reservation asks more of a Compute Engine instance than a named "
    "reservation does; the pages read show reservation-bound and the reservation's name for both.",
    "The same template as a named reservation; the cell differs in its end: when the reservation's "
    "period is over its hosts are deleted and the controller does not ask again.",
)

_COMPUTE_CELLS = (
    _compute(
        ON_DEMAND,
        "standard VMs at list price, each host created when the zone has it",
        model=STANDARD_MODEL,
        termination=None,
        affinity=None,
        mode=INDIVIDUAL,
        target=TARGET_FROM_ZERO,
        run_duration=False,
        repaired_by=COMPUTE_ENGINE,
        events=_google_repairs(COMPUTE_ENGINE),
        price_key=ON_DEMAND,
        sources=(FAILURE_RECOVERY, MAINTENANCE_START),
        unsettled=(_INDIVIDUAL_FORM, _GRACE),
    ),
    _compute(
        SPOT,
        "Spot VMs at the Spot price; Google may take them back at any time",
        model=SPOT_MODEL,
        termination=STOP,
        affinity=None,
        mode=INDIVIDUAL,
        target=TARGET_FROM_ZERO,
        run_duration=False,
        repaired_by=RAYSLICE,
        events=_spot_events(),
        price_key=SPOT,
        sources=(SPOT_TPU, FAILURE_RECOVERY),
        unsettled=(_INDIVIDUAL_FORM,),
        grace=None,
    ),
    _compute(
        RESERVED,
        "hosts of a named reservation (reservation-bound)",
        model=RESERVATION_BOUND_MODEL,
        termination=DELETE,
        affinity=SPECIFIC_RESERVATION,
        mode=BULK,
        target=TARGET_FROM_ZERO,
        run_duration=False,
        repaired_by=COMPUTE_ENGINE,
        events=_google_repairs(COMPUTE_ENGINE),
        price_key=RESERVED,
        sources=(COMPUTE_CONSUME, BULK_MODE, BULK_CREATE, PULUMI_BULK_CONFIG, FAILURE_RECOVERY, TPU7X_RUN),
        unsettled=(_GRACE,),
    ),
    _compute(
        RESERVED_CALENDAR,
        "hosts of a named future reservation in calendar mode (1-90 days; ends with the reservation)",
        model=RESERVATION_BOUND_MODEL,
        termination=DELETE,
        affinity=SPECIFIC_RESERVATION,
        mode=BULK,
        target=TARGET_FROM_ZERO,
        run_duration=False,
        repaired_by=COMPUTE_ENGINE,
        events={
            **_google_repairs(COMPUTE_ENGINE),
            RUN_DURATION: Reaction(
                "ended: the reservation's period is over and Compute Engine deleted its hosts", END
            ),
        },
        price_key=RESERVED,
        sources=(COMPUTE_CONSUME, CALENDAR_MODE, BULK_MODE, PULUMI_BULK_CONFIG, FAILURE_RECOVERY),
        unsettled=(_CALENDAR_COMPUTE, _GRACE),
    ),
    _compute(
        RESERVED_ALL_CAPACITY,
        "hosts of a named reservation in All Capacity mode (reservation-bound; you route around failures)",
        model=RESERVATION_BOUND_MODEL,
        termination=DELETE,
        affinity=SPECIFIC_RESERVATION,
        mode=BULK,
        target=TARGET_FROM_ZERO,
        run_duration=False,
        repaired_by=RAYSLICE,
        events={
            MAINTENANCE: Reaction(
                "host maintenance: Google works on the hosts in place and does not move the slice",
                WAIT_FOR_REPAIR,
            ),
            HOST_ERROR: Reaction(
                "a host failed: Google repairs it in place and never moves the slice to other hosts",
                WAIT_FOR_REPAIR,
            ),
        },
        price_key=RESERVED,
        sources=(COMPUTE_CONSUME, ALL_CAPACITY, ALL_CAPACITY_GKE, BULK_MODE, PULUMI_BULK_CONFIG),
        unsettled=(_ALL_CAPACITY_SPARES,),
        grace=ALL_CAPACITY_GRACE_S,
    ),
    _compute(
        FLEX_START,
        "waits for the whole slice, then runs at most maxRunHours (flex-start)",
        model=FLEX_START_MODEL,
        termination=DELETE,
        affinity=NO_RESERVATION,
        mode=BULK,
        target=TARGET_AT_INSERT,
        run_duration=True,
        repaired_by=COMPUTE_ENGINE,
        events={
            **_google_repairs(COMPUTE_ENGINE),
            RUN_DURATION: Reaction("ended: run duration reached; Compute Engine deleted the hosts", END),
        },
        price_key=FLEX_START,
        sources=(
            BULK_MODE,
            BULK_WAIT,
            SKYPILOT_MIG,
            FLEX_VMS,
            FAILURE_RECOVERY,
            SCHEDULING_RESTART,
            FLEX_TPU,
        ),
        unsettled=(_FLEX_ZONES_COMPUTE, _FLEX_AUTO_RESTART, _GRACE),
    ),
)


def _tpu_vm(
    capacity: str,
    summary: str,
    *,
    queued: bool,
    body: dict[str, Any],
    model: str | None,
    affinity: str | None,
    run_duration: bool,
    repaired_by: str,
    events: dict[str, Reaction],
    price_key: str,
    sources: tuple[Source, ...],
    unsettled: tuple[Unsettled, ...] = (),
) -> Cell:
    """A tpu-vm cell: one TPU node, created directly or through a queued resource."""
    calls = (Call("queuedResources.create" if queued else "nodes.create", body),)
    return Cell(
        platform=TPU_VM,
        capacity=capacity,
        queued=queued,
        summary=summary,
        calls=calls,
        provisioning_model=model,
        termination_action=None,
        reservation_affinity=affinity,
        mig_mode=None,
        target_size=None,
        failure_action=None,
        run_duration=run_duration,
        repaired_by=repaired_by,
        repair_grace_s=None if repaired_by == RAYSLICE else GOOGLE_REPAIR_GRACE_S,
        events={**events, NO_CAPACITY: _WAITS if queued else _NO_CAPACITY_RETRY, GONE: _GONE_RECREATE},
        elastic_allowed=False,
        price_key=price_key,
        sources=(TPU_V2_DISCOVERY, *sources),
        unsettled=unsettled,
    )


_TPU_HOST_ERROR = Unsettled(
    "Whether the Cloud TPU service brings back a TPU node a host error left TERMINATED; its "
    "maintenance page says most maintenance events recover by themselves (the node REPAIRING) and "
    "says nothing of host errors.",
    "A node REPAIRING is left to the service; one TERMINATED is left to it for the grace period, "
    "then recreated; one PREEMPTED or gone is recreated at once.",
)
_FLEX_SUSPENDED = Unsettled(
    "Whether a flex-start request can be SUSPENDED before its run duration ends; the flex-start page "
    "names only the end of the run.",
    "Any SUSPENDED flex-start request has ended: nothing is requested again, so maxRunHours always "
    "bounds the cost; `pulumi destroy` and `pulumi up` ask anew.",
)
_QUEUED_SUSPENDED = Reaction(
    "suspended: Google deleted the slice's node (SUSPENDED); a new request waits for capacity", RECREATE
)
_ENDED_SUSPENDED = Reaction(
    "ended: run duration reached; Google deleted the hosts and suspended the request", END
)


def _tpu_vm_cells(queued: bool) -> tuple[Cell, ...]:
    """The tpu-vm cells, direct (`nodes.create`) or through a queued resource."""
    maybe_suspended = {SUSPENDED: _QUEUED_SUSPENDED} if queued else {}
    repaired = {**_google_repairs(CLOUD_TPU), **maybe_suspended}
    tier = "queued resource" if queued else "TPU node"
    cells = [
        _tpu_vm(
            ON_DEMAND,
            f"standard TPUs at list price, one {tier} per slice",
            queued=queued,
            body={},
            model=None,
            affinity=None,
            run_duration=False,
            repaired_by=CLOUD_TPU,
            events=repaired,
            price_key=ON_DEMAND,
            sources=(MAINTENANCE_TPU_API,),
            unsettled=(_TPU_HOST_ERROR, _GRACE),
        ),
        _tpu_vm(
            SPOT,
            f"Spot TPUs, one {tier} per slice; Google may take them back at any time",
            queued=queued,
            body={"spot": {}} if queued else {"schedulingConfig": {"spot": True}},
            model=None,
            affinity=None,
            run_duration=False,
            repaired_by=RAYSLICE,
            events={**_spot_events(), **maybe_suspended},
            price_key=SPOT,
            sources=(SPOT_TPU,),
        ),
        _tpu_vm(
            RESERVED_ANY,
            f"any reservation matching the slice, one {tier} per slice",
            queued=queued,
            body={"reservationName": TPU_ANY_RESERVATION_PATH}
            if queued
            else {"schedulingConfig": {"reserved": True}},
            model=None,
            affinity=ANY_RESERVATION,
            run_duration=False,
            repaired_by=CLOUD_TPU,
            events=repaired,
            price_key=RESERVED,
            sources=(CONSUME_RESERVATION, *((GCLOUD_QUEUED,) if queued else ()), MAINTENANCE_TPU_API),
            unsettled=(_TPU_HOST_ERROR, _GRACE),
        ),
    ]
    if queued:
        cells += [
            _tpu_vm(
                RESERVED,
                "a named reservation, through a queued resource",
                queued=True,
                body={"reservationName": TPU_RESERVATION_PATH},
                model=None,
                affinity=SPECIFIC_RESERVATION,
                run_duration=False,
                repaired_by=CLOUD_TPU,
                events=repaired,
                price_key=RESERVED,
                sources=(CONSUME_RESERVATION, GCLOUD_QUEUED, MAINTENANCE_TPU_API),
                unsettled=(_TPU_HOST_ERROR, _GRACE),
            ),
            _tpu_vm(
                RESERVED_CALENDAR,
                "a named calendar-mode reservation, through a queued resource (reservation-bound)",
                queued=True,
                body={"reservationName": TPU_RESERVATION_PATH, "provisioningModel": RESERVATION_BOUND_MODEL},
                model=RESERVATION_BOUND_MODEL,
                affinity=SPECIFIC_RESERVATION,
                run_duration=False,
                repaired_by=CLOUD_TPU,
                events={
                    **_google_repairs(CLOUD_TPU),
                    RUN_DURATION: Reaction(
                        "ended: the reservation's period is over and Google deleted its TPUs", END
                    ),
                    SUSPENDED: Reaction("ended: the reservation's period is over (SUSPENDED)", END),
                },
                price_key=RESERVED,
                sources=(CONSUME_RESERVATION, CALENDAR_MODE, MAINTENANCE_TPU_API),
                unsettled=(_TPU_HOST_ERROR, _GRACE),
            ),
            _tpu_vm(
                FLEX_START,
                "waits for the whole slice, then runs at most maxRunHours (flex-start queued resource)",
                queued=True,
                body={
                    "provisioningModel": FLEX_START_MODEL,
                    "runDuration": {"maxRunDuration": MAX_RUN_DURATION},
                },
                model=FLEX_START_MODEL,
                affinity=None,
                run_duration=True,
                repaired_by=CLOUD_TPU,
                events={
                    **_google_repairs(CLOUD_TPU),
                    RUN_DURATION: _ENDED_SUSPENDED,
                    SUSPENDED: _ENDED_SUSPENDED,
                },
                price_key=FLEX_START,
                sources=(FLEX_TPU, FAILURE_RECOVERY),
                unsettled=(_FLEX_SUSPENDED, _GRACE),
            ),
        ]
    return tuple(cells)


def _gke(
    capacity: str,
    summary: str,
    *,
    body: dict[str, Any],
    affinity: str | None,
    auto_repair: bool,
    run_duration: bool,
    events: dict[str, Reaction],
    price_key: str,
    sources: tuple[Source, ...],
    unsettled: tuple[Unsettled, ...] = (),
) -> Cell:
    left = {event: Reaction(r.meaning, LEFT_TO_GKE) for event, r in events.items()}
    gone = Reaction("the node pool is gone (deleted by hand): `pulumi up` makes it again", LEFT_TO_GKE)
    return Cell(
        platform=GKE,
        capacity=capacity,
        queued=False,
        summary=summary,
        calls=(Call("nodePools.create", {**body, "management": {"autoRepair": auto_repair}}),),
        provisioning_model=None,
        termination_action=None,
        reservation_affinity=affinity,
        mig_mode=None,
        target_size=None,
        failure_action=AUTO_REPAIR_ON if auto_repair else AUTO_REPAIR_OFF,
        run_duration=run_duration,
        repaired_by=GKE_REPAIR,
        repair_grace_s=None,
        events={**left, GONE: gone},
        elastic_allowed=False,
        price_key=price_key,
        sources=(GKE_AUTO_REPAIR, GKE_PRICING, *sources),
        unsettled=unsettled,
    )


_GKE_REPAIRS = {
    MAINTENANCE: Reaction("host maintenance: GKE drains and brings the slice's nodes back", LEFT_TO_GKE),
    HOST_ERROR: Reaction("a node failed: GKE auto-repair recreates the slice's nodes", LEFT_TO_GKE),
    NO_CAPACITY: Reaction("no capacity: the pool's nodes wait to be created", LEFT_TO_GKE),
}
# A flex-start pool has auto-repair off (xpk's --no-enable-autorepair): GKE does not recreate a
# failed node, and the slice, one atomic unit, stays down until its run ends.
_GKE_FLEX_UNREPAIRED = {
    **_GKE_REPAIRS,
    MAINTENANCE: Reaction(
        "host maintenance: GKE drains the slice's nodes; with auto-repair off no page says they come "
        "back before the run ends",
        LEFT_TO_GKE,
    ),
    HOST_ERROR: Reaction(
        "a node failed: auto-repair is off on a flex-start pool, so GKE does not recreate it and the "
        "slice stays down until its run ends (delete the pool and `pulumi up` to ask again)",
        LEFT_TO_GKE,
    ),
}
_GKE_CELLS = (
    _gke(
        ON_DEMAND,
        "a TPU node pool of standard VMs",
        body={},
        affinity=None,
        auto_repair=True,
        run_duration=False,
        events=_GKE_REPAIRS,
        price_key=ON_DEMAND,
        sources=(),
    ),
    _gke(
        SPOT,
        "a TPU node pool of Spot VMs; KubeRay recreates the pods on new nodes",
        body={"config": {"spot": True}},
        affinity=None,
        auto_repair=True,
        run_duration=False,
        events={PREEMPTION: _PREEMPTED, **_GKE_REPAIRS},
        price_key=SPOT,
        sources=(XPK_CAPACITY,),
    ),
    _gke(
        RESERVED,
        "a TPU node pool in a named reservation",
        body={
            "config": {
                "reservationAffinity": {
                    "consumeReservationType": SPECIFIC_RESERVATION,
                    "key": RESERVATION_NAME_KEY,
                    "values": [RESERVATION_NAME],
                }
            }
        },
        affinity=SPECIFIC_RESERVATION,
        auto_repair=True,
        run_duration=False,
        events=_GKE_REPAIRS,
        price_key=RESERVED,
        sources=(XPK_CAPACITY,),
    ),
    _gke(
        FLEX_START,
        "a flex-start TPU node pool the autoscaler grows when capacity comes, for at most maxRunHours",
        body={
            "config": {
                "flexStart": True,
                "maxRunDuration": MAX_RUN_DURATION,
                "reservationAffinity": {"consumeReservationType": NO_RESERVATION},
            },
            "autoscaling": {"enabled": True, "locationPolicy": "ANY"},
        },
        affinity=NO_RESERVATION,
        auto_repair=False,
        run_duration=True,
        events={
            **_GKE_FLEX_UNREPAIRED,
            RUN_DURATION: Reaction("ended: run duration reached; GKE removes the nodes", LEFT_TO_GKE),
        },
        price_key=FLEX_START,
        sources=(GKE_FLEX, XPK_CAPACITY),
        unsettled=(_FLEX_ZONES_GKE,),
    ),
)

CELLS: tuple[Cell, ...] = (*_COMPUTE_CELLS, *_tpu_vm_cells(False), *_tpu_vm_cells(True), *_GKE_CELLS)
_BY_KEY = {(c.platform, c.capacity, c.queued): c for c in CELLS}


class NoSuchCell(LookupError):
    """A (platform, capacity, queued) the table has no cell for: rayslice does not offer it."""


def cell(platform: str, capacity: str, *, queued: bool = False) -> Cell:
    """The cell of `platform` and `capacity` (a key of `CAPACITIES`); `NoSuchCell` if none."""
    found = _BY_KEY.get((platform, capacity, queued))
    if found is None:
        raise NoSuchCell(f"no capacity cell {platform}/{'queued/' if queued else ''}{capacity}")
    return found


def by_key(key: str) -> Cell:
    """The cell named `key` (`Cell.key`, e.g. ``compute/reserved-calendar``): how a stack's cell
    can travel as one string, to the recovery controller's command line for instance."""
    for found in CELLS:
        if found.key == key:
            return found
    raise NoSuchCell(f"no capacity cell {key!r}; the cells are: {', '.join(c.key for c in CELLS)}")


def capacity_of(spec: SpecLike) -> str:
    """The table's capacity key for a stack's keys: ``reserved`` splits by whether a reservation
    is named, whether it was created in calendar mode and whether it is in All Capacity mode."""
    if spec.capacity != RESERVED:
        return spec.capacity
    if spec.calendar_mode:
        return RESERVED_CALENDAR
    if spec.capacity_mode == ALL_CAPACITY_MODE:
        return RESERVED_ALL_CAPACITY
    return RESERVED if spec.reservation else RESERVED_ANY


def cell_for(spec: SpecLike) -> Cell:
    """The stack's own cell."""
    return cell(spec.platform, capacity_of(spec), queued=bool(spec.queued))


# Why a (platform, capacity, queued) the spec can express has no cell, in the words `validate`
# prints; each says what to set instead.
_QUEUED_ELSEWHERE = {
    COMPUTE: "capacity=flex-start, whose slices wait for capacity",
    # GKE's queued provisioning hands nodes out only through ProvisioningRequest objects
    # (pulumi-gcp NodePool queued_provisioning.enabled: "Makes nodes obtainable through the
    # ProvisioningRequest API exclusively"), which Kueue or a job must create; rayslice installs
    # neither, so its RayCluster would never start.
    GKE: "capacity=flex-start, a node pool that waits for capacity (GKE's queued provisioning needs "
    "Kueue and ProvisioningRequest objects, which rayslice does not install: docs/capacity.md)",
}
_ALL_CAPACITY_ELSEWHERE = (
    "capacityMode=all-capacity is offered on platform=compute only (rayslice recreates the slice "
    "there; on tpu-vm and gke it has not read how such a reservation is consumed): use platform=compute"
)
_NOT_OFFERED = {
    (TPU_VM, RESERVED_ALL_CAPACITY, False): _ALL_CAPACITY_ELSEWHERE,
    (TPU_VM, RESERVED_ALL_CAPACITY, True): _ALL_CAPACITY_ELSEWHERE,
    (GKE, RESERVED_ALL_CAPACITY, False): _ALL_CAPACITY_ELSEWHERE,
    (TPU_VM, FLEX_START, False): "capacity=flex-start on platform=tpu-vm is a queued request: set "
    "queued=true (the TPU API takes flex-start only through a queued resource)",
    (TPU_VM, RESERVED, False): "reservation on platform=tpu-vm is named through a queued resource: set "
    "queued=true, or remove reservation (a direct create uses any matching reservation)",
    (TPU_VM, RESERVED_CALENDAR, False): "calendarMode on platform=tpu-vm is consumed through a queued "
    "resource (Cloud TPU, 'Consume a reservation'): set queued=true",
    (COMPUTE, RESERVED_ANY, False): "capacity=reserved on compute needs reservation=<name of your "
    "reservation> (a RESERVATION_BOUND MIG consumes one named reservation)",
    (GKE, RESERVED_ANY, False): "capacity=reserved on gke needs reservation=<name of your reservation>",
    (GKE, RESERVED_CALENDAR, False): "calendarMode is not offered on platform=gke (rayslice has not read "
    "how GKE consumes a calendar-mode reservation); use platform=compute or tpu-vm with queued=true",
}


def why_not(platform: str, capacity: str, *, queued: bool = False) -> str:
    """Why `platform` has no cell for `capacity` (queued or not), saying what to set instead."""
    if queued and not any(c.queued for c in CELLS if c.platform == platform):
        instead = _QUEUED_ELSEWHERE.get(platform, "another platform")
        return f"queued=true applies to platform=tpu-vm only (queued resources); on {platform} use {instead}"
    reason = _NOT_OFFERED.get((platform, capacity, queued))
    if reason:
        return reason
    spec_value = SPEC_CAPACITY.get(capacity, capacity)
    others = ", ".join(offered(platform))
    return f"capacity={spec_value} is not offered on platform={platform}; it offers: {others}"


def has_cell(platform: str, capacity: str, *, queued: bool = False) -> bool:
    return (platform, capacity, queued) in _BY_KEY


def _request_shape(request: Mapping[str, Any]) -> tuple[str | None, bool, str | None]:
    """What tells queued capacities apart in a request: its provisioning model (STANDARD and
    SPOT, which gcloud also sends, count as none: the tier says Spot), whether it has the Spot
    tier, and its reservation (``-``: any matching one, else a named one)."""
    model = request.get("provisioningModel")
    model = (
        None if model in (None, STANDARD_MODEL, SPOT_MODEL, "PROVISIONING_MODEL_UNSPECIFIED") else str(model)
    )
    reservation = request.get("reservationName")
    kind = None if not reservation else ("any" if str(reservation).endswith("/-") else "named")
    return model, "spot" in request or request.get("provisioningModel") == SPOT_MODEL, kind


def queued_cell(request: Mapping[str, Any]) -> Cell:
    """The tpu-vm queued cell a queued resource was made from, read from the resource itself (the
    recovery controller and `rayslice status` know the request, not the stack's keys)."""
    shape = _request_shape(request)
    for c in CELLS:
        if c.platform == TPU_VM and c.queued and _request_shape(c.calls[0].body) == shape:
            return c
    raise NoSuchCell(f"no queued capacity cell sends a request shaped {shape}")


# The spec's ``capacity`` value of each table capacity (the spec says ``reserved`` for all three).
SPEC_CAPACITY = {RESERVED_ANY: RESERVED, RESERVED_CALENDAR: RESERVED, RESERVED_ALL_CAPACITY: RESERVED}


def stack_lines(spec: SpecLike, *, controller_runs: bool) -> list[str]:
    """The stack's own cell as `validate` and `preview` print it; `controller_runs`: the stack
    runs the recovery controller (`ClusterSpec.runs_recovery`)."""
    found = cell_for(spec)
    lines = found.describe()
    if not controller_runs and any(r.action != LEFT_TO_GKE for r in found.events.values()):
        lines.append(
            "  this stack runs no recovery controller (recovery=false or head=slice): nothing is recreated"
        )
    return lines


def offered(platform: str) -> tuple[str, ...]:
    """The spec's capacity values `platform` has a cell for, in table order."""
    values = [SPEC_CAPACITY.get(c.capacity, c.capacity) for c in CELLS if c.platform == platform]
    return tuple(dict.fromkeys(values))


def for_provisioning_model(model: str | None) -> Cell | None:
    """The compute cell whose template has provisioning model `model` (the cloud rules read a
    template's cell this way); the first in table order where two share it."""
    for c in _COMPUTE_CELLS:
        if c.provisioning_model == (model or STANDARD_MODEL):
            return c
    return None
