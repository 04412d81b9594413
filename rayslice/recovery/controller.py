"""The recovery controller: watches this cluster's slices and recreates a broken one whole.

It runs on its own VM (a slice cannot heal its own host, and no Ray process or user code may
run beside its project-wide rights: `rayslice.infra.controller_vm`) as a supervised service. Every
`interval_s` it reconciles each slice:

- desired: every slice of the spec whole (`Target.slice_names`), unless its capacity ended; who
  repairs a broken one, and how long Google may take, from the stack's capacity cell
  (`rayslice.capacity_table`);
- observed: the slice through the cloud API, as its kind reads it (`rayslice.recovery.kinds`:
  a MIG and its managed instances, or a TPU node or its queued request): broken or not, whole or
  not, gone or still there for Google to recover, ended, and the spec to recreate it from;
- actions, from their difference (`reconcile`): nothing; record that the capacity ended; leave a
  slice that Google repairs to Google (on-demand, reserved, flex-start: Cloud TPU "Failure
  recovery of TPU instances"), recording it once, until it is gone or the cell's grace has run
  out; recreate it whole from its recorded spec (the kind deletes what is left and makes it
  again as the program did: Google's "Request TPU Spot VMs" page says a Spot MIG must be deleted
  and recreated); or finish a recreation under way.

A slice whose hosts are still being created is not broken: a MIG slice is watched once it has
been seen whole, and one the controller has just recreated is left alone until it is whole
again. A queued slice that waits, provisions or has FAILED (its deadline passed: the user's
limit) is left alone.

A recreation is several calls (delete, insert, createInstances); each step is written to the
controller's state directory before its call is sent, with the spec the slice is recreated from
(`rayslice.recovery.journal`), so a controller killed between two calls is succeeded by one that
finishes the recreation from that step, and says so in its event.

On an elastic cluster (`rayslice.recovery.scaling`) it then adds and removes whole slices through
their kind: with one ``createInstances`` of the names infra gave the hosts and ``deleteInstances``
of them (on reservation-bound capacity, whose MIG is in bulk mode as its cell says, removed by a
resize to 0 instead), or, on flex-start, by resizing the slice's bulk MIG from 0 to its hosts (it
waits for capacity) and back to 0, which deletes the hosts or withdraws the wait if the demand
goes before capacity comes (docs/elastic.md).

After a failed recreation the next try waits `base_backoff_s * 2**(failures-1)`, capped at
`max_backoff_s`; a healthy observation resets it.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayslice import capacity_table, names
from rayslice.cloud.rest import default_session
from rayslice.errors import CloudError, NoCredentials, RaysliceError
from rayslice.platforms import VM_PLATFORMS
from rayslice.recovery import kinds
from rayslice.recovery.cloud import CloudClient, Location, RefusedResource
from rayslice.recovery.demand import Demand, parse
from rayslice.recovery.events import Event, FileSink, GuestAttributeSink, Recorder, Sink, StreamSink
from rayslice.recovery.journal import DELETE, INSERT, Entry, Journal, Recreation
from rayslice.recovery.kinds import Observation, Operation, SliceKind
from rayslice.recovery.scaling import Decision, ScalingPolicy, decide, instances_of

# The outcome recorded for a slice whose capacity ended (a flex-start run duration reached, a
# calendar-mode reservation over): `rayslice status` shows it.
ENDED_OUTCOME = "ended: not requested again (`pulumi destroy` removes what is left)"
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
        """The stack's capacity cell: who repairs its slices and how long that may take. None
        also where the capacity has a cell only as a queued request (tpu-vm flex-start and named
        reservations): each slice's request names its own (`kinds.Observation.cell`)."""
        if self.capacity and capacity_table.has_cell(self.platform, self.capacity):
            return capacity_table.cell(self.platform, self.capacity)
        return None

    @property
    def slice_names(self) -> tuple[str, ...]:
        return tuple(names.slice_name(self.cluster, index) for index in range(self.slices))

    @property
    def kind(self) -> SliceKind:
        """What each slice is (`rayslice.recovery.kinds`): how it is read, recreated and scaled."""
        found = kinds.of(self.platform)
        if found is None:
            raise RefusedResource(f"platform {self.platform!r} has no recovery controller")
        return found


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
    # When the controller first saw the slice partly created (`Observation.partly`), and how many
    # times in a row it gave a partly created slice up (its back-off grows with each).
    partly_since: float | None = None
    partials: int = 0
    # Its capacity ended: nothing is asked again, by recovery or by elastic scaling.
    ended: bool = False


# What the controller does about one slice on one pass (`reconcile`).
HEALTHY = "healthy"  # nothing to do; a recovery by Google, if it was waited for, is recorded
ENDED = "ended"  # its capacity ended: recorded once, nothing requested again
LEAVE_TO_GOOGLE = "leave-to-google"  # broken where Google repairs: recorded once, then waited on
WAITING = "waiting"  # still within Google's grace, or backing off after a failure: nothing now
CREATING = "creating"  # partly created, first seen: its bound starts counting
GIVE_UP = "give-up"  # partly created past the cell's bound: deleted, asked again after a back-off
NO_SPEC = "no-spec"  # broken, and nothing recorded to recreate it from
RECREATE = "recreate"  # recreate it whole from its recorded spec
FINISH = "finish"  # finish the recreation under way from the step it reached


@dataclass(frozen=True)
class Plan:
    """`reconcile`'s answer: the action, and the words its event starts with."""

    action: str
    note: str = ""


def reconcile(
    observation: Observation, state: SliceState, cell: capacity_table.Cell | None, now: float
) -> Plan:
    """What to do about one slice, from what is wanted (the slice whole, as the stack's capacity
    `cell` says who repairs it) and what was seen (`observation`, and what the controller knows
    of the slice: `state`). Decides only; `Controller.act_on` acts.

    Where the cell gives Google a repair grace (``repair_grace_s``: Google recovers the slice,
    or, in an All Capacity reservation, repairs its hosts in place), a slice whose hosts still
    exist is never deleted while Google may be repairing it: it is left to Google (recorded once,
    with the cell's words) and recreated only once it is gone or still broken after the grace.
    Spot slices, and a slice that is gone, are recreated at once. A slice partly created (some
    hosts made, the rest not) is given up once it is not whole within the cell's
    ``whole_within_s``: deleted, and asked again after a back-off. A slice whose capacity ended
    is recorded once and its MIG resized to 0. A queued slice's cell is its request's
    (`Observation.cell`): the stack's capacity key alone names no cell for a queued reservation
    or flex-start request."""
    if state.recreation is not None:
        return Plan(FINISH) if now >= state.next_try else Plan(WAITING)
    if observation.ended:
        return Plan(ENDED)
    cell = observation.cell or cell
    if observation.partly:
        # Some hosts billing, the slice not whole: bounded by the cell (`Cell.whole_within_s`).
        bound = cell.whole_within_s if cell is not None else None
        if bound is None or state.partly_since is None:
            return Plan(CREATING)
        if now - state.partly_since < bound:
            return Plan(WAITING)
        if state.recorded is None:
            return Plan(NO_SPEC)
        minutes = (now - state.partly_since) / 60
        return Plan(GIVE_UP, f"not whole {minutes:.0f} min after its creation began; ")
    if not observation.broken:
        return Plan(HEALTHY)
    note = ""
    if not observation.gone and cell is not None and cell.repair_grace_s is not None:
        if state.broken_since is None:
            return Plan(LEAVE_TO_GOOGLE)
        if now - state.broken_since < float(cell.repair_grace_s or 0):
            return Plan(WAITING)
        note = f"not recovered after {(now - state.broken_since) / 60:.0f} min; "
    if now < state.next_try:
        return Plan(WAITING)  # backing off; the failure that set it was recorded
    return Plan(RECREATE if state.recorded is not None else NO_SPEC, note)


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

    @property
    def operation(self) -> Operation:
        """How the slices' kind sends its calls: this cluster's slices only."""
        return Operation(self.client, self.target.slice_names, self.operation_timeout_s)

    # ---- one pass -----------------------------------------------------------------------------

    def step(self) -> None:
        """Reconciles every slice once; on an elastic cluster, then adds or removes slices as
        Ray's demand says."""
        for name in self.target.slice_names:
            if name in self.removing:
                self._removal_done(name)
            else:
                self.act_on(name)
        if self.scaling is not None:
            self.scale(self.scaling)

    def act_on(self, name: str) -> None:
        """Observes slice `name`, asks `reconcile` what to do, and does it."""
        if name not in self.target.slice_names:
            raise RefusedResource(
                f"refusing to act on {name!r}: not one of cluster {self.target.cluster!r}'s slices "
                f"({', '.join(self.target.slice_names)})"
            )
        state = self.slices.get(name)
        if state is None:  # first look since the controller started: what an earlier one kept
            entry = self.journal.load(name)
            state = SliceState(
                recorded=entry.spec,
                recreation=entry.recreation,
                was_whole=entry.was_whole,
                ended=entry.ended,
            )
            state.inherited = entry.recreation is not None
            self.slices[name] = state
        try:
            observation = self.target.kind.observe(
                self.client, name, was_whole=state.was_whole, cell=self.target.cell
            )
        except (CloudError, OSError) as exc:
            # A transient API or network failure: nothing was seen, so nothing is recorded.
            print(f"rayslice-recovery: could not read {name}: {exc}", file=sys.stderr)
            return
        # While a recreation is under way, what is seen is the half-made slice, not its spec.
        # A broken slice's spec is kept only if none was (e.g. a MIG whose hosts were preempted).
        keep = not observation.broken or state.recorded is None
        if observation.recorded is not None and state.recreation is None and keep:
            self._remember(name, state, observation.recorded)
        if observation.whole and not state.was_whole:
            state.was_whole = True
            if state.recreation is None:  # else the journal holds the recreation, kept whole
                self._keep(name, state)
        now = self.clock()
        plan = reconcile(observation, state, self.target.cell, now)
        if plan.action == ENDED:
            self._end(name, state, observation.seen)
        elif plan.action == CREATING:
            self._creating(name, state, observation, now)
        elif plan.action == GIVE_UP:
            self._give_up(name, state, observation.seen, plan.note)
        elif plan.action == HEALTHY:
            if observation.whole:
                state.partly_since, state.partials = None, 0
            if state.broken_since is not None:  # Google's recovery brought it back
                minutes = (now - state.broken_since) / 60
                self.recorder.record(
                    Event.now(name, observation.seen, "none", f"recovered after {minutes:.0f} min")
                )
                state.broken_since = None
            state.failures, state.next_try, state.last_seen = 0, 0.0, observation.seen
        elif plan.action == LEAVE_TO_GOOGLE:
            state.broken_since = now
            cell = observation.cell or self.target.cell
            assert cell is not None and cell.repair_grace_s is not None  # `reconcile` read both
            reaction = cell.events[capacity_table.HOST_ERROR]
            grace = f"{cell.repair_grace_s / 60:.0f} min"
            outcome = f"{reaction.meaning}; recreated only if not recovered within {grace}"
            self.recorder.record(Event.now(name, observation.seen, reaction.action, outcome))
        elif plan.action == NO_SPEC:
            attempt = state.failures + 1
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
        elif plan.action == RECREATE:
            self._recreate(name, state, observation.seen, state.failures + 1, plan.note)
        elif plan.action == FINISH:
            assert state.recreation is not None
            attempt = max(state.failures + 1, state.recreation.attempt)
            self._recreate(name, state, observation.seen, attempt)

    def _remember(
        self, name: str, state: SliceState, recorded: dict[str, Any], *, force: bool = False
    ) -> None:
        """Keeps `recorded` as the slice's spec, in the journal too when it changed (or `force`:
        a recreation just ended)."""
        if recorded == state.recorded and not force:
            return
        state.recorded = recorded
        self._keep(name, state)

    def _keep(self, name: str, state: SliceState) -> None:
        """Writes what a successor needs of a slice at rest (its spec, whether it was whole,
        whether its capacity ended) to the journal. A journal that cannot be written is said on
        stderr; the controller goes on with its memory."""
        try:
            self.journal.save(name, Entry(state.recorded, None, state.was_whole, state.ended))
        except OSError as exc:
            print(f"rayslice-recovery: could not keep {name}'s spec: {exc}", file=sys.stderr)

    def _end(self, name: str, state: SliceState, seen: str) -> None:
        """A slice whose capacity ended: its MIG resized to 0, so that whatever Google does with
        the target size no new run is bought and nothing bills (`SliceKind.end`), recorded once
        (and again for each resize it sends); nothing is asked again."""
        outcome = self.target.kind.end(self.operation, name)
        if not state.ended or outcome:
            words = ENDED_OUTCOME + (f"; {outcome}" if outcome else "")
            self.recorder.record(Event.now(name, seen, "none", words, 1))
        if not state.ended:
            state.ended = True
            self._keep(name, state)
        state.failures, state.next_try, state.last_seen = 0, 0.0, seen

    def _creating(self, name: str, state: SliceState, observation: Observation, now: float) -> None:
        """A slice first seen partly created, whose creation this controller did not begin: its
        cell's bound counts from now. Nothing is recorded: every slice is partly created for a
        while as its hosts come up; the event comes if it is given up (`_give_up`), and
        `rayslice status` says it meanwhile."""
        if state.partly_since is None:
            state.partly_since = now

    def _give_up(self, name: str, state: SliceState, seen: str, note: str) -> None:
        """A slice still partly created past its cell's bound: deleted now (its hosts stop
        billing), its recreation journaled at the insert step and finished after a back-off that
        grows with each slice given up in a row (`reconcile` then says FINISH)."""
        spec = state.recorded
        assert spec is not None  # `reconcile` gives up only a slice with a recorded spec
        state.partials += 1
        attempt = state.partials
        recreation = Recreation(DELETE, seen, attempt)
        state.recreation = recreation

        def begin(step: str) -> None:
            recreation.step = step
            self.journal.save(name, Entry(spec, recreation))

        try:
            outcome = self.target.kind.recreate(
                self.operation, name, spec, DELETE, begin, cell=self.target.cell, pause_before=INSERT
            )
        except (CloudError, OSError) as exc:
            outcome = f"failed: {exc}"
        if outcome.startswith("failed"):
            self._failed(state, attempt)
            outcome += f"; next try in {self.backoff(state.failures):.0f}s"
        else:
            begin(INSERT)  # the successor (or the next pass) asks again from the insert
            state.next_try = self.clock() + self.backoff(attempt)
            state.partly_since, state.was_whole = None, False
            outcome = f"{outcome}; asked again in {self.backoff(attempt):.0f}s"
        self.recorder.record(Event.now(name, seen, "recreate", note + outcome, attempt))

    def _recreate(self, name: str, state: SliceState, seen: str, attempt: int, note: str = "") -> None:
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
            outcome = self.target.kind.recreate(
                self.operation, name, spec, start, begin, cell=self.target.cell
            )
        except (CloudError, OSError) as exc:
            outcome = f"failed: {exc}"
        if not outcome.startswith("failed"):
            state.recreation, state.inherited = None, False
            self._remember(name, state, spec, force=True)
        if outcome.startswith("failed"):
            self._failed(state, attempt)
            outcome += f"; next try in {self.backoff(state.failures):.0f}s"
        else:
            # New hosts are being created: the slice is not broken again until it was whole, and
            # a partly created one is bounded from now, when its creation began.
            state.failures, state.next_try, state.was_whole = 0, 0.0, False
            state.broken_since, state.partly_since = None, self.clock()
        if inherited:
            note = (
                f"finished the recreation an earlier controller began (it saw {recreation.seen}) "
                f"from its step {start}: " + note
            )
        self.recorder.record(Event.now(name, seen, "recreate", note + outcome, attempt))

    def _failed(self, state: SliceState, attempt: int) -> None:
        state.failures = attempt
        state.next_try = self.clock() + self.backoff(attempt)

    # ---- elastic slices (rayslice.recovery.scaling) -------------------------------------------

    def scale(self, policy: ScalingPolicy) -> None:
        kind = self.target.kind
        # flex-start: the MIG names its hosts, and gets them by a resize from 0.
        by_size = policy.run_duration_s is not None
        # A bulk MIG (the cell's mode; flex-start's in an older configuration) sheds its hosts by
        # a resize to 0 (Compute Engine, "About bulk mode").
        cell = self.target.cell
        bulk = by_size or (cell is not None and cell.mig_mode == capacity_table.BULK)
        # A slice whose capacity ended is never asked again, by demand either.
        slice_names = tuple(n for n in self.target.slice_names if not self.slices.get(n, SliceState()).ended)
        try:
            sizes = {name: kind.hosts_held(self.client, name) for name in slice_names}
            # A bulk MIG (flex-start, reservation-bound) with a target size and no instance waits
            # for capacity.
            waiting = {n for n, (target, held) in sizes.items() if target > 0 and held == 0}
            if not bulk:
                waiting = set()
            with_hosts = {n for n, (target, _) in sizes.items() if target > 0 and n not in waiting}
            demand = self.read_demand(policy)
        except (CloudError, NoCredentials, OSError) as exc:  # recovery goes on; the next pass tries again
            print(f"rayslice-recovery: could not read the cluster's slices or demand: {exc}", file=sys.stderr)
            return
        try:
            decision = decide(
                policy,
                slice_names,
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
        idle = f"idle for {policy.idle_timeout_s:.0f}s or more"
        for name in decision.add:
            hosts = names.slice_host_names(name, policy.hosts_per_slice)
            instances = [] if by_size else instances_of(policy, self.target.location.project, hosts)
            outcome = kind.add_hosts(
                self.operation, name, instances, bulk=policy.hosts_per_slice if by_size else None
            )
            if not outcome.startswith("failed"):
                self.slices[name] = SliceState()  # a new slice: recovery watches it once it is whole
            self.recorder.record(Event.now(name, seen, "add slice", outcome))
        for name in decision.remove:
            # Named hosts (not flex-start's): their per-instance configs go too.
            named = [] if by_size else names.slice_host_names(name, policy.hosts_per_slice)
            outcome = kind.remove_hosts(self.operation, name, named, bulk=bulk, why=idle)
            if not outcome.startswith("failed"):
                self.removing.add(name)
            self.recorder.record(Event.now(name, seen, "remove slice", outcome))
        for name in decision.cancel:
            # A bulk slice that still waits for capacity and is no longer needed: resized to 0, so
            # no hosts come later for nothing.
            why = "no demand for it before capacity came"
            named = [] if by_size else names.slice_host_names(name, policy.hosts_per_slice)
            outcome = kind.remove_hosts(self.operation, name, named, bulk=True, why=why)
            self.recorder.record(Event.now(name, seen, "cancel slice", outcome))

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

    def _removal_done(self, name: str) -> None:
        """Ends a removal once the slice holds no host: recovery watches it again."""
        try:
            if self.target.kind.hosts_held(self.client, name)[1]:
                return
        except (CloudError, OSError):
            return
        self.removing.discard(name)
        self.slices[name] = SliceState()

    # ---- the service --------------------------------------------------------------------------

    def run(self, interval_s: float, stop: threading.Event) -> None:
        while not stop.is_set():
            self.step()
            stop.wait(interval_s)


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
