"""The recovery controller over generated timelines of a cloud twin whose time passes.

For each compute and tpu-vm cell of the capacity table, a Hypothesis rule-based state machine
drives the twin's clock (the controller passes every `INTERVAL_S` while time passes), the cell's
events (Spot preemption, host errors and maintenance, a slice deleted behind rayslice's back,
capacity that comes, goes or arrives late, the end of a flex-start run) and controller restarts
at any point, mid-recreation included, against the real controller (reconcile, act_on, the
journal) over the emulated APIs on loopback. After every step it checks the invariants of
docs/recovery.md ("Invariants over time"):

- `google_repairs_undisturbed`: no slice is deleted or recreated while Google is within its
  documented repair of it (the cell's ``repair_grace_s``);
- `ended_runs_stay_ended`: an ended flex-start run is never requested again;
- `spot_slices_come_back`: every Spot slice that is gone or broken is requested again within
  `MAX_PASSES` passes once its back-off has run out;
- `waste_is_bounded`: the host-hours billed for slices that cannot run a job stay under a bound
  per event (a half-created slice, a broken slice waiting past its grace, a stray host);
- `each_call_once`: no mutating call is refused as a duplicate across restarts, and nothing is
  left that the stack does not own;
- `status_tells_the_truth`: what `rayslice status` reports for each slice matches the twin.

`test_each_invariant_catches_a_broken_controller` runs the same machine against controllers
broken on purpose (today's N1 and N2 behaviour among them) and expects each invariant to fail.
The default profile checks a few dozen timelines in seconds (a fixed seed derivation, so a run
is reproducible); ``--hypothesis-profile timelines-long`` checks many more (docs/testing.md).
"""

from __future__ import annotations

import dataclasses
import io
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from rayslice import capacity_table as table
from rayslice import names
from rayslice.cloud import bodies
from rayslice.cloud.twin import CloudTwin
from rayslice.cloud.twin.clock import TwinClock
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.local.google.cloud_api.routes import Call
from rayslice.local.google.metadata_server import MetadataServer
from rayslice.recovery import controller as controller_module
from rayslice.recovery import kinds
from rayslice.recovery.cloud import CloudClient
from rayslice.recovery.controller import Controller, Plan, Target
from rayslice.recovery.events import Recorder, StreamSink
from rayslice.recovery.journal import Journal
from rayslice.recovery.kinds import Observation
from tests.recovery.conftest import CLUSTER, LOCATION, NODE_FIELDS, PROJECT, ZONE

START = 1_800_000_000.0
INTERVAL_S = 900.0  # the controller's pass interval in these timelines (30 s in production: coarser here)
MACHINE = "ct6e-standard-4t"  # a v6e-16 slice: four hosts of 4 chips
HOSTS = 4
SLICES = 2
GENERATION = "v6e"
BASE_BACKOFF_S, MAX_BACKOFF_S = 600.0, 1800.0
MAX_PASSES = 2  # passes after a Spot slice's back-off ran out by which it must be asked for again
SLICE_NAMES = tuple(names.slice_name(CLUSTER, i) for i in range(SLICES))
CELLS = ("compute/spot", "compute/on-demand", "compute/flex-start", "tpu-vm/spot", "tpu-vm/on-demand")
# Timelines a broken controller's test may try before its invariant fails, and their steps.
BROKEN_EXAMPLES, BROKEN_STEPS = 60, 15
EXAMPLES, STEPS = 8, 10  # timelines per cell in the suite's run, and steps per timeline at most
MAX_RUN_S = 4 * 3600  # a flex-start slice's run duration in these timelines
# The POST calls that change nothing (`CloudApiEmulator.mutations`).
READS = ("listManagedInstances", "listPerInstanceConfigs", "getGuestAttributes")


class Killed(BaseException):
    """The controller's process dies (a restart mid-pass): nothing after it runs."""


@dataclass
class Sent:
    """One mutating call the controller made: when (the twin's time), what, on which slice, and
    how the API answered."""

    at: float
    method_id: str
    slice_name: str | None
    status: int
    path: str


@dataclass
class Timeline:
    """What the machine knows of one timeline beside the twin: the controller's calls with their
    times, and what it made happen."""

    sent: list[Sent] = field(default_factory=list)
    # Slices down (not whole) since an injected event, with the time the controller last had
    # something to do about each (the event, its last call on it, or its restart).
    down: dict[str, float] = field(default_factory=dict)
    repairing: dict[str, float] = field(default_factory=dict)  # Google's repair under way, since
    ended: dict[str, float] = field(default_factory=dict)  # flex-start runs the twin ended, when seen
    events: int = 0  # injected events that may leave hosts billed that cannot run a job
    attempts: int = 0  # the controller's calls that ask for hosts
    downtime_s: float = 0.0  # time no controller ran
    passes: int = 0


def _slice_of(path: str) -> str | None:
    return next((name for name in SLICE_NAMES if f"/{name}" in path), None)


# ---- the cells' stacks, as the program makes them ------------------------------------------------


def _template_properties(cell: table.Cell) -> dict[str, Any]:
    body = table.fill(cell.calls[0].body, {table.MAX_RUN_SECONDS: MAX_RUN_S})
    return {"machineType": MACHINE, **body["properties"]}


def seed_compute(twin: CloudTwin, cell: table.Cell) -> None:
    """Each slice as the program makes it for `cell`: an instance template of the cell's
    scheduling, a MIG of the cell's mode, and its hosts (one createInstances of the names infra
    gives, or the bulk MIG's own at its target size)."""
    mig_call = next(c for c in cell.calls if c.method == "instanceGroupManagers.insert")
    mig_fields = table.fill(mig_call.body, {table.HOSTS: HOSTS})
    for name in SLICE_NAMES:
        template_name = f"{name}-template"
        body = {"name": template_name, "properties": _template_properties(cell)}
        request = bodies.Request(
            "compute", "compute.instanceTemplates.insert", "InstanceTemplate", template_name, body
        )
        link = str(twin.apply(bodies.TEMPLATE, template_name, request, project=PROJECT)["selfLink"])
        mig = twin.insert_mig(
            PROJECT,
            ZONE,
            {
                "name": name,
                "baseInstanceName": name,
                "versions": [{"instanceTemplate": link}],
                **mig_fields,
            },
        )
        if int(mig.get("targetSize", 0)) == 0:
            configs = [{"name": names.host_name(name, w)} for w in range(HOSTS)]
            twin.create_instances(PROJECT, ZONE, mig, configs)


def seed_tpu(cloud: CloudApiEmulator, cell: table.Cell) -> None:
    fields = table.fill(cell.calls[0].body, {})
    for name in SLICE_NAMES:
        cloud.add_node(PROJECT, ZONE, name, **{**NODE_FIELDS, "schedulingConfig": {}, **fields})


# ---- the twin's truth ----------------------------------------------------------------------------


def whole(twin: CloudTwin, cell: table.Cell, name: str) -> bool:
    """Whether slice `name` can run a job now: every host of it up."""
    if cell.platform == table.TPU_VM:
        node = twin.nodes.get((PROJECT, ZONE, name))
        return node is not None and node.get("state") == "READY"
    key = (PROJECT, ZONE, name)
    if key not in twin.migs:
        return False
    records = twin.instances.get(key, [])
    return len(records) == HOSTS and all(r.get("instanceStatus") == "RUNNING" for r in records)


def exists(twin: CloudTwin, cell: table.Cell, name: str) -> bool:
    key = (PROJECT, ZONE, name)
    return key in (twin.nodes if cell.platform == table.TPU_VM else twin.migs)


# ---- the machine ---------------------------------------------------------------------------------

INVARIANTS = frozenset(
    {
        "google_repairs_undisturbed",
        "ended_runs_stay_ended",
        "spot_slices_come_back",
        "waste_is_bounded",
        "each_call_once",
        "status_tells_the_truth",
    }
)
# Calls that make a slice or ask for its hosts.
CREATES = ("instanceGroupManagers.insert", "createInstances", "nodes.create", "queuedResources.create")


def asks_for_hosts(call: Call) -> bool:
    """Whether `call` asks Google for hosts: a MIG inserted with a target size, createInstances,
    a node or a queued resource (a MIG inserted empty asks for none)."""
    if not str(call.method_id).endswith(CREATES):
        return False
    return not str(call.method_id).endswith("insert") or int((call.request or {}).get("targetSize", 0)) > 0


@dataclass
class Rig:
    """What every timeline of a test shares: the emulated APIs on loopback, a real client, the
    controller VM's metadata server, a folder for journals, and how the controller is broken (the
    identity for the real one)."""

    cloud: CloudApiEmulator
    client: CloudClient
    metadata: MetadataServer
    root: Path
    cell: table.Cell
    broken: Callable[[Controller], Controller] = lambda controller: controller
    examples: int = field(default_factory=lambda: timelines_per_test())
    # The invariants checked (all by default; a broken controller's test checks one).
    checks: frozenset[str] = INVARIANTS
    shrink: bool = True  # Hypothesis shrinks a failing timeline (off where a failure is expected)
    steps: int = field(default_factory=lambda: steps_per_timeline())
    restarts: bool = True  # timelines restart the controller (off: it runs throughout)
    counts: dict[str, int] = field(default_factory=lambda: {"timelines": 0, "steps": 0})


def machine(rig: Rig) -> type[RuleBasedStateMachine]:
    """The state machine for `rig.cell`'s timelines."""
    cell = rig.cell
    compute = cell.platform == table.COMPUTE
    spot = cell.capacity == "spot"
    google_repairs = cell.repaired_by != table.RAYSLICE
    grace = float(cell.repair_grace_s or 0)
    whole_within = float(cell.whole_within_s or 0)

    class Timelines(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            rig.counts["timelines"] += 1
            self.twin = CloudTwin()
            self.twin.clock = TwinClock.manual(START)
            rig.cloud.state = self.twin
            rig.cloud.calls.clear()
            self.state_dir = Path(tempfile.mkdtemp(dir=rig.root))
            self.seen = Timeline()
            self.stream = io.StringIO()
            if compute:
                seed_compute(self.twin, cell)
            else:
                seed_tpu(rig.cloud, cell)
            self.stopped_at: float | None = None  # when the controller process was killed
            self.controller = self._controller()
            self._pass()  # every slice seen whole: its spec is kept

        def teardown(self) -> None:
            shutil.rmtree(self.state_dir, ignore_errors=True)

        # ---- the controller ----------------------------------------------------------------

        def _controller(self) -> Controller:
            return rig.broken(
                Controller(
                    rig.client,
                    Target(CLUSTER, cell.platform, SLICES, LOCATION, cell.capacity),
                    Recorder([StreamSink(self.stream)]),
                    base_backoff_s=BASE_BACKOFF_S,
                    max_backoff_s=MAX_BACKOFF_S,
                    operation_timeout_s=30,
                    clock=lambda: self.twin.clock.now,
                    journal=Journal(self.state_dir),
                )
            )

        def _restart(self) -> None:
            """A fresh controller process on the same state directory. What it has to act on is
            timed from now: the slices were nobody's while no controller ran."""
            self.controller = self._controller()
            now = self.twin.clock.now
            if self.stopped_at is not None:
                self.seen.downtime_s += now - self.stopped_at
                self.stopped_at = None
            self.seen.down = {name: now for name in self.seen.down}

        def _pass(self) -> None:
            """One pass of the controller (a new process first, if the last one was killed)."""
            if self.stopped_at is not None:
                self._restart()
            before = len(rig.cloud.calls)
            try:
                self.controller.step()
            finally:
                self._note_calls(before)
                self.seen.passes += 1

        def _note_calls(self, before: int) -> None:
            now = self.twin.clock.now
            mutations = {id(call) for call in rig.cloud.mutations()}
            for call in rig.cloud.calls[before:]:
                if id(call) not in mutations:
                    continue
                # A node's id is a parameter, an inserted MIG's name is in its body.
                named = (call.request or {}).get("name", "") if isinstance(call.request, dict) else ""
                where = "/".join((call.path, *map(str, call.query.values()), str(named)))
                sent = Sent(now, str(call.method_id), _slice_of(where), call.status, call.path)
                self.seen.sent.append(sent)
                if sent.slice_name in self.seen.down:
                    self.seen.down[sent.slice_name] = now
                if asks_for_hosts(call):
                    self.seen.attempts += 1

        # ---- time ---------------------------------------------------------------------------

        @rule(passes=st.integers(1, 8))
        def time_passes(self, passes: int) -> None:
            """Time passes with the controller running every `INTERVAL_S`."""
            for _ in range(passes):
                self.twin.advance(INTERVAL_S)
                self._pass()

        @rule(hours=st.sampled_from([2, 5]))
        def hours_pass(self, hours: int) -> None:
            """Hours pass with the controller running every `INTERVAL_S`."""
            self.time_passes(int(hours * 3600 / INTERVAL_S))

        @precondition(lambda self: rig.restarts)
        @rule(hours=st.sampled_from([1, 5]))
        def controller_down(self, hours: int) -> None:
            """The controller's VM is down for `hours` (time passes, no pass), then a new process
            starts on the same state directory."""
            self.stopped_at = self.stopped_at or self.twin.clock.now
            self.twin.advance(hours * 3600.0)
            self._restart()
            self._pass()

        @precondition(lambda self: rig.restarts)
        @rule(after=st.integers(1, 4))
        def killed_mid_pass(self, after: int) -> None:
            """The controller is killed as soon as the `after`-th mutating call of a pass was
            answered (before it could note the answer); a fresh one on the same state directory
            takes over at the next pass, whatever happens in between."""
            sent = 0
            original = rig.client.request

            def request(method: str, url: str, **kwargs: Any) -> dict[str, Any]:
                nonlocal sent
                answer = original(method, url, **kwargs)
                if method != "GET" and not url.endswith(READS):
                    sent += 1
                    if sent >= after:
                        raise Killed
                return answer

            rig.client.request = request  # type: ignore[method-assign]
            try:
                self._pass()
            except Killed:
                pass
            finally:
                del rig.client.request
            self.stopped_at = self.twin.clock.now  # the next pass is a new process's

        # ---- the cell's events --------------------------------------------------------------

        @precondition(lambda self: spot)
        @rule(index=st.integers(0, SLICES - 1), left=st.sampled_from([HOSTS - 1, 1, 0, HOSTS, 100]))
        def preempted(self, index: int, left: int) -> None:
            """A Spot preemption of a whole slice (the template's termination action): Google
            takes its hosts back for other work, leaving the zone `left` free hosts."""
            name = SLICE_NAMES[index]
            if whole(self.twin, cell, name):
                rig.cloud.preempt(PROJECT, ZONE, name, mode="spot" if compute else "gone")
                self.twin.set_capacity(ZONE, MACHINE if compute else GENERATION, left)
                self._broke(name)

        @rule(index=st.integers(0, SLICES - 1), repaired=st.booleans())
        def host_error(self, index: int, repaired: bool) -> None:
            """A host error (or a maintenance event) on a whole slice: its hosts stop; Compute
            Engine restarts them where automatic restart is on, the Cloud TPU service repairs a
            node, READY again or (`repaired` False) UNKNOWN after a failed repair."""
            name = SLICE_NAMES[index]
            if not whole(self.twin, cell, name):
                return
            if compute:
                self.twin.host_error(PROJECT, ZONE, name)
            else:
                self.twin.node_host_error(PROJECT, ZONE, name, repaired=repaired)
            if google_repairs:
                self.seen.repairing[name] = self.twin.clock.now
            self._broke(name)

        @rule(index=st.integers(0, SLICES - 1))
        def slice_gone(self, index: int) -> None:
            """Someone deletes a slice behind rayslice's back."""
            name = SLICE_NAMES[index]
            if exists(self.twin, cell, name) and name not in self.seen.ended:
                if compute:
                    self.twin.delete_mig(PROJECT, ZONE, name)
                else:
                    self.twin.delete_node(PROJECT, ZONE, name)
                self.seen.repairing.pop(name, None)
                self._broke(name)

        @rule(hosts=st.sampled_from([0, 1, HOSTS - 1, HOSTS, 2 * HOSTS, 100]))
        def capacity(self, hosts: int) -> None:
            """The zone now has `hosts` free hosts of the slices' kind (capacity that goes, comes
            piecemeal, or comes back)."""
            self.twin.set_capacity(ZONE, MACHINE if compute else GENERATION, hosts)

        @rule(hosts=st.sampled_from([0, 2, HOSTS, 2 * HOSTS]), passes=st.integers(1, 12))
        def capacity_later(self, hosts: int, passes: int) -> None:
            """Capacity that arrives (or goes) later: the zone has `hosts` free hosts `passes`
            controller passes from now."""
            kind = MACHINE if compute else GENERATION
            self.twin.schedule_capacity(ZONE, kind, hosts, at=self.twin.clock.now + passes * INTERVAL_S)

        def _broke(self, name: str) -> None:
            self.seen.down.setdefault(name, self.twin.clock.now)
            self.seen.events += 1

        # ---- invariants ---------------------------------------------------------------------

        @invariant()
        def counted(self) -> None:
            rig.counts["steps"] += 1

        @invariant()
        def google_repairs_undisturbed(self) -> None:
            """No slice is deleted or recreated while Google is within its repair of it."""
            if "google_repairs_undisturbed" not in rig.checks:
                return
            for name, since in list(self.seen.repairing.items()):
                until = min(since + grace, repair_failed_at(self.twin, name, since))
                for sent in self.seen.sent:
                    if sent.slice_name == name and since <= sent.at < until:
                        raise AssertionError(
                            f"{sent.method_id} on {name} {sent.at - since:.0f} s after a host error, "
                            f"within Google's repair of {grace:.0f} s ({cell.key})"
                        )
                if whole(self.twin, cell, name) or self.twin.clock.now >= until:
                    del self.seen.repairing[name]

        @invariant()
        def ended_runs_stay_ended(self) -> None:
            """A slice whose flex-start run ended is never requested again."""
            if "ended_runs_stay_ended" not in rig.checks:
                return
            for name in SLICE_NAMES:
                if name not in self.seen.ended and run_ended(self.twin, name):
                    self.seen.ended[name] = self.twin.clock.now
            now = self.twin.clock.now
            for name, ended in self.seen.ended.items():
                if now >= ended + 2 * INTERVAL_S and running_hosts(self.twin, name):
                    raise AssertionError(f"{name}'s run ended, and hosts of it run again: a second paid run")
            for sent in self.seen.sent:
                ended = self.seen.ended.get(sent.slice_name or "")
                if ended is not None and sent.at >= ended and sent.method_id.endswith(CREATES):
                    raise AssertionError(
                        f"{sent.method_id} on {sent.slice_name}, whose run ended ({cell.key})"
                    )

        @invariant()
        def spot_slices_come_back(self) -> None:
            """A slice that is down (and not Google's to repair, nor ended) is acted on within
            `MAX_PASSES` passes once its back-off and the time a partial slice may take have run
            out."""
            if "spot_slices_come_back" not in rig.checks:
                return
            now = self.twin.clock.now
            bound = max(MAX_BACKOFF_S, whole_within) + MAX_PASSES * INTERVAL_S
            for name, since in list(self.seen.down.items()):
                if whole(self.twin, cell, name) or name in self.seen.ended:
                    del self.seen.down[name]
                    continue
                if name in self.seen.repairing or waiting_for_capacity(self.twin, name):
                    self.seen.down[name] = now  # Google's to act on: the controller waits with it
                    continue
                assert now - since <= bound, (
                    f"{name} down for {now - since:.0f} s with nothing asked of Google "
                    f"(bound {bound:.0f} s, {cell.key})"
                )

        @invariant()
        def waste_is_bounded(self) -> None:
            """Host-hours billed for slices that cannot run a job stay under a bound. The twin's
            events stop a slice whole (nothing of it bills), so waste comes from a request for
            hosts that the zone fills in part: at most a slice's hosts but one, until the pass
            after the cell's partly-created bound, per request; and, while no controller ran,
            every slice's hosts but one."""
            if "waste_is_bounded" not in rig.checks:
                return
            per_request = (HOSTS - 1) * (whole_within + INTERVAL_S) / 3600
            bound = per_request * self.seen.attempts + SLICES * (HOSTS - 1) * self.seen.downtime_s / 3600
            wasted = self.twin.bill.wasted()
            assert wasted <= bound + 1e-9, (
                f"{wasted:.2f} host-hours billed for slices that cannot run a job, over the bound "
                f"{bound:.2f} ({self.seen.attempts} requests for hosts, {cell.key})"
            )

        @invariant()
        def each_call_once(self) -> None:
            """No mutating call is refused as already done (across restarts), and the project
            holds nothing of the cluster's that the stack does not own."""
            if "each_call_once" not in rig.checks:
                return
            for sent in self.seen.sent:
                assert sent.status != 409, f"{sent.method_id} on {sent.path} sent twice (409, {cell.key})"
            held = {key[2] for key in (self.twin.migs if compute else self.twin.nodes)}
            assert held <= set(SLICE_NAMES), f"the project holds {sorted(held - set(SLICE_NAMES))}"

        @invariant()
        def status_tells_the_truth(self) -> None:
            """`rayslice status` reads each slice as the twin holds it: running only when whole,
            being repaired by Google while Google repairs it, ended once its run ended."""
            if "status_tells_the_truth" not in rig.checks:
                return
            kind = self.controller.target.kind
            for name in SLICE_NAMES:
                shown = kind.status(
                    rig.client, name, HOSTS, waits=cell.waits_for_capacity, cell=self.controller.target.cell
                )
                words = str(shown.get("meaning", shown["state"]))
                assert (words == "running") == whole(self.twin, cell, name), (name, shown, cell.key)
                if name in self.seen.repairing and not whole(self.twin, cell, name):
                    assert "repaired by Google" in words, (name, shown, cell.key)
                if name in self.seen.ended:
                    assert "ended" in words, (name, shown, cell.key)

    Timelines.TestCase.settings = settings(
        max_examples=rig.examples,
        stateful_step_count=rig.steps,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
        phases=list(Phase) if rig.shrink else [Phase.explicit, Phase.generate],
    )
    return Timelines


def timelines_per_test() -> int:
    """`EXAMPLES` in the suite; the profile's own count under a profile that asks for more than
    Hypothesis's default (``--hypothesis-profile timelines-long``, tests/conftest.py)."""
    asked = settings.default.max_examples
    return asked if asked > 100 else EXAMPLES


def waiting_for_capacity(twin: CloudTwin, name: str) -> bool:
    """Whether Google holds a request for slice `name` that waits for capacity: a bulk MIG's
    creation in progress (``status.bulkInstanceOperation.inProgress``) or a queued resource
    waiting for resources."""
    mig = twin.migs.get((PROJECT, ZONE, name)) or {}
    if ((mig.get("status") or {}).get("bulkInstanceOperation") or {}).get("inProgress"):
        return True
    queued = twin.queued_resource(PROJECT, ZONE, names.request_name(name)) or {}
    return bool((queued.get("state") or {}).get("state") == "WAITING_FOR_RESOURCES")


def running_hosts(twin: CloudTwin, name: str) -> int:
    """How many hosts of MIG slice `name` are RUNNING."""
    return sum(r.get("instanceStatus") == "RUNNING" for r in twin.instances.get((PROJECT, ZONE, name), []))


def repair_failed_at(twin: CloudTwin, name: str, since: float) -> float:
    """When Google's repair of slice `name`, begun at `since`, ended in failure (a TPU node left
    UNKNOWN: the twin's event for it), or infinity while it has not."""
    failed = [
        e.at for e in twin.schedule.done if e.at >= since and e.what == f"node {name}'s repair ends UNKNOWN"
    ]
    return min(failed, default=float("inf"))


def steps_per_timeline() -> int:
    """`STEPS`, or the profile's own under ``--hypothesis-profile timelines-long``."""
    return settings.default.stateful_step_count if settings.default.max_examples > 100 else STEPS


def run_ended(twin: CloudTwin, name: str) -> bool:
    """Whether the twin ended the run of a host of slice `name` (its flex-start run duration)."""
    return any(host.startswith(f"{name}-") for host in twin.ended)


@pytest.fixture
def rig_of(
    cloud: CloudApiEmulator, client: CloudClient, controller_metadata: MetadataServer, tmp_path: Path
) -> Callable[[str], Rig]:
    return lambda key: Rig(cloud, client, controller_metadata, tmp_path, table.by_key(key))


@pytest.mark.parametrize("key", CELLS)
def test_the_controller_keeps_its_invariants_over_generated_timelines(
    rig_of: Callable[[str], Rig], key: str
) -> None:
    rig = rig_of(key)
    run_state_machine_as_test(machine(rig))
    print(f"{key}: {rig.counts['timelines']} timelines, {rig.counts['steps']} steps checked")
    assert rig.counts["steps"] > rig.counts["timelines"] > 0


# ---- each invariant fails on a controller broken on purpose ----------------------------------


def _reconcile_without_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Google's repair is not waited for: every broken slice is recreated as a Spot one is."""
    original, spot = controller_module.reconcile, table.by_key("compute/spot")
    monkeypatch.setattr(
        controller_module,
        "reconcile",
        lambda seen, state, cell, now: original(dataclasses.replace(seen, cell=None), state, spot, now),
    )


def _reconcile_never_recreates(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken slice is read as healthy: nothing is asked again."""
    original = controller_module.reconcile

    def reconcile(seen: Observation, state: Any, cell: Any, now: float) -> Plan:
        plan = original(seen, state, cell, now)
        return Plan(controller_module.HEALTHY) if plan.action == controller_module.RECREATE else plan

    monkeypatch.setattr(controller_module, "reconcile", reconcile)


def _observe(monkeypatch: pytest.MonkeyPatch, change: Callable[[Observation], Observation]) -> None:
    """Every MIG observation passes through `change`."""
    original = kinds.MigSlices.observe

    def observe(self: kinds.MigSlices, *args: Any, **kwargs: Any) -> Observation:
        return change(original(self, *args, **kwargs))

    monkeypatch.setattr(kinds.MigSlices, "observe", observe)


def _partly_created_is_fine(monkeypatch: pytest.MonkeyPatch) -> None:
    """N1 as it was: a slice with some hosts made and the rest never created is not broken, for
    ever (only a slice once whole could break)."""
    _observe(monkeypatch, lambda seen: dataclasses.replace(seen, partly=False))


def _ended_is_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    """An ended flex-start run reads as broken hosts, so the slice is recreated: a second run."""
    _observe(
        monkeypatch,
        lambda seen: dataclasses.replace(seen, ended=False, broken=True, gone=True) if seen.ended else seen,
    )


def _creates_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller sends a MIG's insert again without looking first (as one that lost its
    journal, or retried blindly, would)."""
    original = CloudClient.insert_mig

    def insert_mig(self: CloudClient, *args: Any, **kwargs: Any) -> dict[str, Any]:
        answer = original(self, *args, **kwargs)
        original(self, *args, **kwargs)
        return answer

    monkeypatch.setattr(CloudClient, "insert_mig", insert_mig)


def _status_always_running(monkeypatch: pytest.MonkeyPatch) -> None:
    """`rayslice status` says every MIG slice runs."""
    original = kinds.MigSlices.status

    def status(self: kinds.MigSlices, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {**original(self, *args, **kwargs), "meaning": "running"}

    monkeypatch.setattr(kinds.MigSlices, "status", status)


BROKEN: list[tuple[str, str, Callable[[pytest.MonkeyPatch], None], str]] = [
    ("google_repairs_undisturbed", "compute/on-demand", _reconcile_without_grace, "within Google's repair"),
    ("ended_runs_stay_ended", "compute/flex-start", _ended_is_broken, "run ended"),
    ("spot_slices_come_back", "compute/spot", _reconcile_never_recreates, "with nothing asked of Google"),
    ("waste_is_bounded", "compute/spot", _partly_created_is_fine, "billed for slices that cannot run a job"),
    ("each_call_once", "compute/spot", _creates_twice, "sent twice"),
    ("status_tells_the_truth", "compute/spot", _status_always_running, "running"),
]


@pytest.mark.parametrize(("invariant", "key", "breaks", "words"), BROKEN, ids=[b[0] for b in BROKEN])
def test_each_invariant_catches_a_broken_controller(
    rig_of: Callable[[str], Rig],
    monkeypatch: pytest.MonkeyPatch,
    invariant: str,
    key: str,
    breaks: Callable[[pytest.MonkeyPatch], None],
    words: str,
) -> None:
    """The same timelines against a controller broken on purpose, checking one invariant: it
    fails, saying what went wrong."""
    breaks(monkeypatch)
    # Timelines without restarts: the hours a controller is down allow every host's waste, which
    # would hide a controller that wastes while it runs.
    rig = dataclasses.replace(
        rig_of(key),
        checks=frozenset({invariant}),
        examples=BROKEN_EXAMPLES,
        steps=BROKEN_STEPS,
        shrink=False,
        restarts=invariant != "waste_is_bounded",
    )
    with pytest.raises(AssertionError, match=words):
        run_state_machine_as_test(machine(rig))
    print(f"{invariant} on {key}: failed after {rig.counts['timelines']} timelines")
