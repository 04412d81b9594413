"""Issue 40's fault matrix: for every compute and tpu-vm cell of the capacity table and every
event it lists whose action is the controller's (recreate, wait for Google's repair, end), inject
the event in the cloud twin and check that the controller does what the cell says; for every gke
cell and every event it lists (all left to GKE and KubeRay), inject it in the twin's container API
and check that GKE does what the cell says and rayslice sends nothing. The tables of outcomes are
published in docs/recovery.md ("Fault matrix"), which `test_the_docs_list_every_row` keeps in step
with the capacity table.

Then the controller is killed mid-recreation, after each call of it, on every cell where it
recreates, and a fresh controller on the same state directory must finish the slice with nothing
orphaned or duplicated (docs/recovery.md, "A controller stopped mid-operation")."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rayslice import capacity_table as table
from rayslice import cli, names
from rayslice import spec as spec_module
from rayslice.cloud.capacity import CapacityExhausted
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.local.google.metadata_server import MetadataServer
from rayslice.recovery.cloud import CloudClient
from tests.recovery.conftest import (
    CLUSTER,
    GKE_MACHINE,
    NODE_FIELDS,
    PROJECT,
    ZONE,
    Clock,
    bulk_mig_fields,
    gke_pool,
    make_controller,
    mig_fields,
    queued_body,
    seed,
    seed_flex,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "recovery.md"
CONTROLLER_ACTIONS = (table.RECREATE, table.WAIT_FOR_REPAIR, table.END)
SLICE1 = names.slice_name(CLUSTER, 1)


def _inject(event: str) -> Callable[[CloudApiEmulator], None]:
    """How the twin makes `event` happen to slice 1."""
    return {
        table.PREEMPTION: lambda cloud: cloud.preempt(PROJECT, ZONE, SLICE1, mode="terminated"),
        table.MAINTENANCE: lambda cloud: cloud.state.host_error(PROJECT, ZONE, SLICE1),
        table.HOST_ERROR: lambda cloud: cloud.state.host_error(PROJECT, ZONE, SLICE1),
        table.GONE: lambda cloud: cloud.state.delete_mig(PROJECT, ZONE, SLICE1),
        table.RUN_DURATION: _end_run,
    }[event]


def _end_run(cloud: CloudApiEmulator) -> None:
    """The run (or the reservation's period) ends: Compute Engine deletes every host; the MIG stays."""
    for record in list(cloud.state.instances[(PROJECT, ZONE, SLICE1)]):
        cloud.state.lose(cloud.state.vms[(PROJECT, ZONE, record["name"])], deleted=True)


def _mig_fields(cell: table.Cell) -> Callable[[str], dict[str, object]]:
    """The MIG the program makes for a compute cell whose hosts it names: in bulk mode where the
    cell says so (reserved: every host from one createInstances), else individual."""
    return bulk_mig_fields if cell.mig_mode == table.BULK else mig_fields


def _cases(platform: str = table.COMPUTE) -> list[tuple[table.Cell, str, str]]:
    return [
        (cell, event, reaction.action)
        for cell in table.CELLS
        if cell.platform == platform
        for event, reaction in cell.events.items()
        if reaction.action in CONTROLLER_ACTIONS
    ]


def _row(cell: table.Cell, event: str, action: str) -> str:
    return f"| {cell.key} | {event} | {action} |"


@pytest.mark.parametrize("cell, event, action", _cases(), ids=lambda v: getattr(v, "key", v))
def test_the_controller_does_what_the_cell_says(
    cloud: CloudApiEmulator,
    client: CloudClient,
    controller_metadata: MetadataServer,
    cell: table.Cell,
    event: str,
    action: str,
) -> None:
    if cell.run_duration:  # flex-start: a bulk MIG whose hosts the MIG named
        seed_flex(cloud)
    else:
        seed(cloud, "compute", fields=_mig_fields(cell))
    controller, stream = make_controller(client, "compute", controller_metadata, capacity=cell.capacity)
    controller.step()  # seen whole
    assert cloud.mutations() == []
    _inject(event)(cloud)
    controller.step()
    methods = [c.method_id for c in cloud.mutations()]
    [seen] = [json.loads(line) for line in stream.getvalue().splitlines()]
    if action == table.WAIT_FOR_REPAIR:
        assert methods == [] and seen["action"] == table.WAIT_FOR_REPAIR
    elif action == table.END:  # recorded once, its MIG resized to 0 so no new run starts
        assert methods == ["compute.instanceGroupManagers.resize"], methods
        assert seen["outcome"].startswith("ended") and "resized to 0" in seen["outcome"], seen
        assert cloud.state.migs[(PROJECT, ZONE, SLICE1)]["targetSize"] == 0
        controller.step()  # nothing asked again
        assert [c.method_id for c in cloud.mutations()] == methods
    else:  # recreated whole, at once
        assert "compute.instanceGroupManagers.insert" in methods and seen["action"] == "recreate"
        assert not seen["outcome"].startswith("failed"), seen


def _terminate(cloud: CloudApiEmulator) -> None:
    """A host error or maintenance event on a TPU VM: the node is TERMINATED and still exists, for
    the Cloud TPU service to repair ("Failure recovery of TPU instances")."""
    cloud.state.nodes[(PROJECT, ZONE, SLICE1)]["state"] = "TERMINATED"


def _inject_tpu(event: str, queued: bool) -> Callable[[CloudApiEmulator], None]:
    """How the twin makes `event` happen to slice 1 of a tpu-vm stack (direct or queued)."""
    request = names.request_name(SLICE1)
    ends = {  # the run (or the calendar reservation) ends: the node deleted, the request SUSPENDED
        table.RUN_DURATION: lambda cloud: cloud.state.end_run(PROJECT, ZONE, request),
        table.SUSPENDED: lambda cloud: cloud.state.end_run(PROJECT, ZONE, request),
    }
    gone = (
        (lambda cloud: cloud.state.delete_queued_resource(PROJECT, ZONE, request, force=True))
        if queued
        else (lambda cloud: cloud.state.delete_node(PROJECT, ZONE, SLICE1))
    )
    return {
        table.PREEMPTION: lambda cloud: cloud.preempt(PROJECT, ZONE, SLICE1),
        table.MAINTENANCE: _terminate,
        table.HOST_ERROR: _terminate,
        table.GONE: gone,
        **ends,
    }[event]


def _seed_tpu(cloud: CloudApiEmulator, cell: table.Cell) -> None:
    """Two slices as the program makes them for `cell`: nodes, or queued resources fulfilled at
    once, with the request fields the cell's call sends."""
    values = {
        table.PROJECT: PROJECT,
        table.ZONE: ZONE,
        table.RESERVATION_NAME: "r1",
        table.MAX_RUN_SECONDS: 86400,
    }
    fields = {k: v for k, v in table.fill(cell.calls[0].body, values).items() if k not in ("tpu", "node")}
    for index in range(2):
        name = names.slice_name(CLUSTER, index)
        if cell.queued:
            body = {**queued_body(name), **fields}
            if "spot" not in fields:
                body.pop("spot", None)
            cloud.state.create_queued_resource(PROJECT, ZONE, names.request_name(name), body)
        else:
            cloud.add_node(PROJECT, ZONE, name, **{**NODE_FIELDS, "schedulingConfig": {}, **fields})


@pytest.mark.parametrize("cell, event, action", _cases(table.TPU_VM), ids=lambda v: getattr(v, "key", v))
def test_the_controller_does_what_the_tpu_vm_cell_says(
    cloud: CloudApiEmulator,
    client: CloudClient,
    controller_metadata: MetadataServer,
    cell: table.Cell,
    event: str,
    action: str,
) -> None:
    _seed_tpu(cloud, cell)
    # The stack's capacity key, as the controller VM passes it (`capacity_table.capacity_of`).
    controller, stream = make_controller(client, "tpu-vm", controller_metadata, capacity=cell.capacity)
    controller.step()  # seen whole
    assert cloud.mutations() == []
    _inject_tpu(event, cell.queued)(cloud)
    controller.step()
    methods = [c.method_id for c in cloud.mutations()]
    [seen] = [json.loads(line) for line in stream.getvalue().splitlines()]
    if action == table.WAIT_FOR_REPAIR:
        assert methods == [] and seen["action"] == table.WAIT_FOR_REPAIR, seen
        # The Cloud TPU service repairs the node: the controller records the recovery, sends nothing.
        cloud.state.nodes[(PROJECT, ZONE, SLICE1)]["state"] = "READY"
        controller.step()
        events = [json.loads(line) for line in stream.getvalue().splitlines()]
        assert cloud.mutations() == [] and events[-1]["outcome"].startswith("recovered"), events
    elif action == table.END:  # recorded once, nothing asked again
        assert methods == [] and seen["outcome"].startswith("ended"), seen
    else:  # asked again whole, at once
        created = "queuedResources.create" if cell.queued else "nodes.create"
        assert any(str(m).endswith(created) for m in methods) and seen["action"] == "recreate", (
            methods,
            seen,
        )
        assert not seen["outcome"].startswith("failed"), seen


# ---- gke: GKE and KubeRay act, rayslice sends nothing -----------------------------------------

GKE_HOSTS = 4  # the default v6e-16: four nodes per slice (`GKE_MACHINE`)
# What GKE does, in the twin, after each event: the phase and running nodes `rayslice status`
# then shows for the slice it hit, and the docs' words for it (by event; host errors and
# maintenance by whether the cell's pool has auto-repair on).
REPAIRED = "every node stops; auto-repair brings the slice back whole"
LEFT_DOWN = "every node stops and stays down (auto-repair off)"
GKE_OUTCOMES: dict[tuple[str, bool | None], tuple[str, int, str]] = {
    (table.PREEMPTION, None): ("running", GKE_HOSTS, "recorded; the pool's MIG recreates the nodes"),
    (table.HOST_ERROR, True): ("running", GKE_HOSTS, REPAIRED),
    (table.MAINTENANCE, True): ("running", GKE_HOSTS, REPAIRED),
    (table.HOST_ERROR, False): ("down", 0, LEFT_DOWN),
    (table.MAINTENANCE, False): ("down", 0, LEFT_DOWN),
    (table.RUN_DURATION, None): ("waiting", 0, "the nodes are deleted; the pool stays"),
    (table.GONE, None): ("missing", 0, "the pool is gone; `pulumi up` makes it again"),
}
NO_CAPACITY_OUTCOMES = {  # by whether the pool is flex-start
    False: ("failed", 0, "the pool's create fails; the pool is kept in ERROR (GCE_STOCKOUT)"),
    True: ("running", GKE_HOSTS, "the pool waits with no node; its nodes come whole with the capacity"),
}


def _gke_cases() -> list[tuple[table.Cell, str, str]]:
    return [
        (cell, event, reaction.action)
        for cell in table.CELLS
        if cell.platform == table.GKE
        for event, reaction in cell.events.items()
    ]


def _auto_repair(cell: table.Cell) -> bool:
    return bool(cell.calls[0].body["management"]["autoRepair"])


def _gke_outcome(cell: table.Cell, event: str) -> tuple[str, int, str]:
    if event == table.NO_CAPACITY:
        return NO_CAPACITY_OUTCOMES[cell.run_duration]
    repairs = event in (table.HOST_ERROR, table.MAINTENANCE)
    return GKE_OUTCOMES[(event, _auto_repair(cell) if repairs else None)]


def _gke_row(cell: table.Cell, event: str, action: str) -> str:
    return f"{_row(cell, event, action)} {_gke_outcome(cell, event)[2]} |"


def _gke_pool(cell: table.Cell, name: str) -> dict[str, Any]:
    """Slice `name`'s node pool as the program makes it for `cell`: the cell's nodePools.create
    fields over the shape's (`gke_pool`)."""
    values = {table.RESERVATION_NAME: "r1", table.MAX_RUN_SECONDS: 86400}
    fields = table.fill(cell.calls[0].body, values)
    pool = gke_pool(name, flex=cell.run_duration, hosts=GKE_HOSTS)
    for key, value in fields.items():
        pool[key] = {**pool.get(key, {}), **value} if isinstance(value, dict) else value
    return pool


def _gke_status(cell: table.Cell, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """Each slice as `rayslice status` shows it for the cell's stack (the one rayslice client
    that calls the cloud on gke)."""
    args = ["status", "--set", f"project={PROJECT}", "--set", f"zone={ZONE}", "--set", "platform=gke"]
    for key, value in _gke_config(cell).items():
        args += ["--set", f"{key}={value}"]
    assert cli.main([*args, "--json"]) == 0
    return list(json.loads(capsys.readouterr().out)["slices"])


def _gke_config(cell: table.Cell) -> dict[str, str]:
    config = {"slices": "2", "capacity": table.SPEC_CAPACITY.get(cell.capacity, cell.capacity)}
    if cell.capacity == table.RESERVED:
        config["reservation"] = "r1"
    if cell.run_duration:
        config["maxRunHours"] = "24"
    return config


def _seen(item: dict[str, Any]) -> tuple[str, int]:
    return str(item["phase"]), int(item.get("nodes_running", 0))


@pytest.mark.parametrize("cell, event, action", _gke_cases(), ids=lambda v: getattr(v, "key", v))
def test_gke_repairs_what_the_gke_cell_says_and_rayslice_sends_nothing(
    cloud: CloudApiEmulator,
    adc: Path,
    capsys: pytest.CaptureFixture[str],
    cell: table.Cell,
    event: str,
    action: str,
) -> None:
    """No recovery controller runs on gke (the stack deploys none); each event is GKE's to
    handle, the twin's container API does what the cell's pool makes GKE do, and `rayslice
    status`, which reads the pools, sends no mutating call."""
    assert action == table.LEFT_TO_GKE
    spec = spec_module.load({"project": PROJECT, "zone": ZONE, "platform": "gke", **_gke_config(cell)})
    assert not spec.runs_recovery and table.cell_for(spec) == cell
    twin = cloud.state
    twin.set_capacity(ZONE, GKE_MACHINE, 2 * GKE_HOSTS)
    slice0, slice1 = (names.slice_name(CLUSTER, i) for i in range(2))
    twin.create_node_pool(PROJECT, ZONE, CLUSTER, _gke_pool(cell, slice0))
    if event == table.NO_CAPACITY:  # the program creates slice 1's pool in a zone with no room
        twin.set_capacity(ZONE, GKE_MACHINE, 0)
        if cell.run_duration:
            twin.create_node_pool(PROJECT, ZONE, CLUSTER, _gke_pool(cell, slice1))
            assert [_seen(s) for s in _gke_status(cell, capsys)][1] == ("waiting", 0)
            twin.set_capacity(ZONE, GKE_MACHINE, GKE_HOSTS)  # the capacity comes
        else:
            with pytest.raises(CapacityExhausted):
                twin.create_node_pool(PROJECT, ZONE, CLUSTER, _gke_pool(cell, slice1))
    else:
        twin.create_node_pool(PROJECT, ZONE, CLUSTER, _gke_pool(cell, slice1))
        assert [_seen(s) for s in _gke_status(cell, capsys)] == [("running", GKE_HOSTS)] * 2
        if event == table.PREEMPTION:
            assert len(twin.preempt_node_pool(PROJECT, ZONE, CLUSTER, slice1)) == GKE_HOSTS
            assert len(twin.preemptions(PROJECT, ZONE)) == GKE_HOSTS
        elif event in (table.HOST_ERROR, table.MAINTENANCE):
            assert len(twin.fail_node_pool(PROJECT, ZONE, CLUSTER, slice1)) == GKE_HOSTS
            assert _gke_status(cell, capsys)[1]["nodes_running"] == 0  # the whole slice is down
            assert twin.repair_node_pool(PROJECT, ZONE, CLUSTER, slice1) == _auto_repair(cell)
        elif event == table.RUN_DURATION:
            twin.end_node_pool_run(PROJECT, ZONE, CLUSTER, slice1)
        else:
            assert event == table.GONE
            twin.delete_node_pool(PROJECT, ZONE, CLUSTER, slice1)
    phase, running, _ = _gke_outcome(cell, event)
    first, second = _gke_status(cell, capsys)
    assert _seen(first) == ("running", GKE_HOSTS), first  # the other slice is untouched
    assert _seen(second) == (phase, running), second
    assert cloud.mutations() == []  # nothing deleted, created or resized by rayslice


def test_the_docs_list_every_row() -> None:
    text = DOCS.read_text()
    cases = [*_cases(), *_cases(table.TPU_VM)]
    missing = [_row(*case) for case in cases if _row(*case) not in text]
    missing += [_gke_row(*case) for case in _gke_cases() if _gke_row(*case) not in text]
    assert not missing, "docs/recovery.md's fault matrix lacks:\n" + "\n".join(missing)


class Killed(BaseException):
    """The controller's process ends here (not an error it handles)."""


# The client calls a recreation makes, in order, for each kind of slice (`Controller.recreate`):
# what is left deleted, the MIG, node or request again, then a MIG's named hosts. A flex-start
# MIG (bulk, its hosts named by the MIG) gets them from its target size at insert.
_STEPS = {
    "mig": ("delete_mig", "insert_mig", "create_instances"),
    "bulk": ("delete_mig", "insert_mig"),
    "node": ("delete_node", "create_node"),
    "queued": ("delete_queued_resource", "create_queued_resource"),
}


def _kind(cell: table.Cell) -> str:
    if cell.platform == table.COMPUTE:
        return "bulk" if cell.run_duration else "mig"
    return "queued" if cell.queued else "node"


def _kill_cases() -> list[tuple[table.Cell, str]]:
    """Every step of a recreation on every cell whose controller recreates a slice it can still
    see (each compute and tpu-vm cell: Spot at once, the others once Google's grace has run out)."""
    return [
        (cell, step)
        for cell in table.CELLS
        if cell.platform in (table.COMPUTE, table.TPU_VM)
        and any(r.action == table.RECREATE for r in cell.events.values())
        for step in _STEPS[_kind(cell)]
    ]


def _break(cloud: CloudApiEmulator, cell: table.Cell) -> None:
    """Slice 1 broken so that the controller recreates it: a preemption of Spot, a host error
    (a TERMINATED node) of capacity that Google repairs."""
    spot = cell.repaired_by == table.RAYSLICE
    if cell.platform == table.COMPUTE:
        if spot:
            cloud.preempt(PROJECT, ZONE, SLICE1, mode="terminated")
        else:
            cloud.state.host_error(PROJECT, ZONE, SLICE1)
    elif spot:
        cloud.preempt(PROJECT, ZONE, SLICE1)
    else:
        _terminate(cloud)


def _resources(cloud: CloudApiEmulator) -> tuple[list[str], list[str], list[str], list[str]]:
    """What the project holds: MIGs, the group of each instance (a flex-start MIG names its hosts
    anew), nodes and queued requests."""
    return (
        sorted(k[2] for k in cloud.state.migs),
        sorted(str(v.group) for v in cloud.state.vms.values()),
        sorted(k[2] for k in cloud.state.nodes),
        sorted(k[2] for k in cloud.state.queued),
    )


@pytest.mark.parametrize("cell, after", _kill_cases(), ids=lambda v: getattr(v, "key", v))
def test_a_controller_killed_after_a_step_of_a_recreation_is_finished_by_the_next(
    cloud: CloudApiEmulator,
    client: CloudClient,
    controller_metadata: MetadataServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    cell: table.Cell,
    after: str,
) -> None:
    """Slice 1 broken; the controller recreating it is killed once the call `after` has
    completed; a fresh controller on the same state directory (the controller VM's disk) finishes
    the slice: the same resources as before the fault (no orphan, nothing missing), each call of
    the recreation made once, and an event that says the recreation was finished."""
    kind = _kind(cell)
    if kind == "bulk":
        seed_flex(cloud)
    elif kind == "mig":
        seed(cloud, "compute", fields=_mig_fields(cell))
    else:
        _seed_tpu(cloud, cell)
    before = _resources(cloud)
    state = tmp_path / "state"
    clock = Clock()
    controller, _ = make_controller(
        client, cell.platform, controller_metadata, capacity=cell.capacity, clock=clock, state_dir=state
    )
    controller.step()  # seen whole: its spec is kept
    _break(cloud, cell)
    if cell.repair_grace_s:  # left to Google first, and recreated once the grace has run out
        controller.step()
        clock.now += cell.repair_grace_s
    sent = getattr(client, after)
    wait_name = "wait_zone_operation" if cell.platform == table.COMPUTE else "wait_tpu_operation"
    wait = getattr(client, wait_name)
    calls: list[str] = []

    def send(*args: object, **kwargs: object) -> object:
        calls.append(after)
        return sent(*args, **kwargs)

    def wait_then_die(*args: object, **kwargs: object) -> object:
        done = wait(*args, **kwargs)
        if calls:
            raise Killed
        return done

    monkeypatch.setattr(client, after, send)
    monkeypatch.setattr(client, wait_name, wait_then_die)
    with pytest.raises(Killed):
        controller.step()
    monkeypatch.undo()
    fresh, stream = make_controller(
        client, cell.platform, controller_metadata, capacity=cell.capacity, state_dir=state
    )
    for _ in range(3):
        fresh.step()
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert _resources(cloud) == before, events
    methods = [str(c.method_id).rsplit(".", 2)[-2:] for c in cloud.mutations()]
    for call in _STEPS[kind]:  # each call of the recreation made once, none twice
        assert sum(1 for m in methods if _client_call(m) == call) == 1, (call, methods, events)
    [event] = [e for e in events if e["slice"] == SLICE1]
    assert event["action"] == "recreate" and event["outcome"].startswith(
        "finished the recreation an earlier controller began"
    ), event
    if kind in ("mig", "bulk"):
        hosts = [h for h in cloud.state.hosts() if h.group == SLICE1]
        assert len(hosts) == 4 and {h.status for h in hosts} == {"RUNNING"}, events
        # The recreated MIG in the cell's mode (bulk on reserved capacity).
        mig = cloud.state.migs[(PROJECT, ZONE, SLICE1)]
        assert mig.get("targetSizePolicy", {}).get("mode", table.INDIVIDUAL) == cell.mig_mode
    else:
        assert cloud.state.nodes[(PROJECT, ZONE, SLICE1)]["state"] == "READY", events
    assert not cloud.state.violations()
    # Nothing left under way in the journal: a third controller would start clean.
    kept = json.loads((state / f"{SLICE1}.json").read_text())
    assert kept["recreation"] is None and kept["spec"] is not None, kept


def _client_call(method: list[str]) -> str:
    """The `CloudClient` method that sent an API method (``["instanceGroupManagers", "insert"]``)."""
    resource, verb = method
    return {
        ("instanceGroupManagers", "delete"): "delete_mig",
        ("instanceGroupManagers", "insert"): "insert_mig",
        ("instanceGroupManagers", "createInstances"): "create_instances",
        ("nodes", "delete"): "delete_node",
        ("nodes", "create"): "create_node",
        ("queuedResources", "delete"): "delete_queued_resource",
        ("queuedResources", "create"): "create_queued_resource",
    }.get((resource, verb), f"{resource}.{verb}")


@pytest.mark.parametrize("after", ["delete_mig", "insert_mig", "create_instances"])
def test_a_controller_killed_just_after_sending_a_call_is_finished_by_the_next(
    cloud: CloudApiEmulator,
    client: CloudClient,
    controller_metadata: MetadataServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    after: str,
) -> None:
    """As above, but killed as soon as the call was sent, before its operation ended (a Spot
    compute slice): the delete still runs when the fresh controller looks, so it sends it again;
    an insert or a createInstances already accepted is not sent again."""
    seed(cloud, "compute")
    state = tmp_path / "state"
    controller, _ = make_controller(
        client, "compute", controller_metadata, capacity=table.SPOT, state_dir=state
    )
    controller.step()
    cloud.preempt(PROJECT, ZONE, SLICE1, mode="terminated")
    sent = getattr(client, after)

    def send_then_die(*args: object, **kwargs: object) -> object:
        sent(*args, **kwargs)
        raise Killed

    monkeypatch.setattr(client, after, send_then_die)
    with pytest.raises(Killed):
        controller.step()
    monkeypatch.undo()
    fresh, stream = make_controller(
        client, "compute", controller_metadata, capacity=table.SPOT, state_dir=state
    )
    for _ in range(4):
        fresh.step()
    hosts = [h for h in cloud.state.hosts() if h.group == SLICE1]
    methods = [c.method_id for c in cloud.mutations()]
    assert len(hosts) == 4 and {h.status for h in hosts} == {"RUNNING"}, stream.getvalue()
    assert methods.count("compute.instanceGroupManagers.insert") == 1, methods
    assert methods.count("compute.instanceGroupManagers.createInstances") == 1, methods
    assert [k for k in cloud.state.migs if k[2] == SLICE1] == [(PROJECT, ZONE, SLICE1)]
    [event] = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert event["outcome"].startswith("finished the recreation an earlier controller began"), event
    assert not cloud.state.violations()
