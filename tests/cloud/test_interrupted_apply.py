"""Issue 40 item 5: `pulumi up` and `pulumi destroy` interrupted at each step, against the twin.
There is no Pulumi CLI here: the program runs under the mocks that apply it to the twin, and
Pulumi's state is modelled as what a failed run leaves in it: each resource whose create returned
(a resource whose create failed is not in it; its dependents are not created). Running the
program again creates only what the state lacks, as `pulumi up` does; destroying again deletes
only what the state still holds. After either, the twin must hold what a clean apply leaves (or
nothing): no MIG, template, policy, address, queued resource, node or instance left behind."""

from __future__ import annotations

import copy
import functools
import threading
from pathlib import Path
from typing import Any

import pytest
from pulumi.runtime.mocks import MockResourceArgs

from rayslice.cloud import bodies
from rayslice.cloud.twin import CloudTwin
from rayslice.infra import preview
from rayslice.infra.mocks import FakeGcp, OfflineEngine, Registration
from rayslice.infra.program import main

INFRA = Path(__file__).resolve().parents[2] / "infra"
# Two compute stacks (Spot: one per-instance config per host; reserved: a bulk MIG whose hosts
# come from one SliceHosts), one tpu-vm stack (queued: its request and node are two resources);
# each a stack file and its overrides.
STACKS = {
    "compute": (INFRA / "Pulumi.example-compute-v6e-16.yaml", []),
    "compute-reserved": (
        INFRA / "Pulumi.example-compute-v6e-16.yaml",
        ["capacity=reserved", "reservation=team-v6e"],
    ),
    "tpu-vm": (INFRA / "Pulumi.example-tpu-vm-queued-v6e-16.yaml", []),
}


def _config(stack: str) -> dict[str, str]:
    path, overrides = STACKS[stack]
    return preview.stack_config(str(path), overrides)


class Interrupted(Exception):
    """The injected failure: the create call fails before Google acts on it."""


class _Engine(FakeGcp):
    """Pulumi's engine over the twin: `state` holds each created resource's outputs by URN; a
    resource already in it is not created again; the `fail_at`-th create that reaches the twin
    fails before the twin sees it, or, with `lose`, after: Google made the resource, but its
    answer never reached Pulumi (kept in `lost`, by URN, for a `pulumi import`)."""

    def __init__(
        self,
        twin: CloudTwin,
        state: dict[str, tuple[str, dict[str, Any]]],
        fail_at: int = 0,
        *,
        lose: bool = False,
    ):
        super().__init__(twin)
        self.state = state
        self.fail_at = fail_at
        self.lose = lose
        self.lost: dict[str, tuple[str, dict[str, Any]]] = {}
        self.creates = 0
        self.in_flight = 0
        self._count = threading.Lock()

    def new_resource(self, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
        urn = str(self._registering.urn)
        if urn in self.state:
            return self.state[urn]
        with self._count:
            self.in_flight += 1
            creates = self.creates = self.creates + (bodies.request(args.typ, dict(args.inputs)) is not None)
        try:
            if creates == self.fail_at and bodies.request(args.typ, dict(args.inputs)) is not None:
                if self.lose:
                    self.lost[urn] = super().new_resource(args)
                raise Interrupted(urn)
            self.state[urn] = super().new_resource(args)
            return self.state[urn]
        finally:
            with self._count:
                self.in_flight -= 1


def _up(config: dict[str, str], engine: _Engine) -> list[Registration]:
    """One `pulumi up`; the registrations it reached (all of them unless interrupted)."""
    offline = OfflineEngine(fake=engine)
    try:
        offline.run(functools.partial(main, preview._no_stack_lock), config)
    except Exception as exc:  # the engine's wrapping of the injected failure
        if engine.creates < engine.fail_at or engine.fail_at == 0:
            raise
        assert "Interrupted" in repr(exc) or isinstance(exc, Interrupted), exc
        # Pulumi lets the creates already under way finish before it exits (their resources are
        # in its state): the run has waited for the mocks' worker threads.
        assert not engine.in_flight
        assert set(engine.state) <= {r.urn for r in offline.registrations}
    return offline.registrations


def _holdings(twin: CloudTwin) -> dict[str, list[str]]:
    """What the twin holds, by name (addresses and ids differ between runs, names do not)."""
    return {
        "resources": sorted(twin.resources),  # templates, policies, firewalls, ... by self link
        "migs": sorted(k[2] for k in twin.migs),
        "configs": sorted(c["name"] for held in twin.configs.values() for c in held),
        "instances": sorted(k[2] for k in twin.vms),
        "addresses": sorted(twin.addresses),
        "nodes": sorted(k[2] for k in twin.nodes),
        "queued": sorted(k[2] for k in twin.queued),
        "resize requests": sorted(k[2] for k, held in twin.resize_requests.items() if held),
    }


def _delete(twin: CloudTwin, registration: Registration) -> None:
    """The provider's delete call for one resource the twin holds (the resource's own API)."""
    inputs = registration.inputs
    project, zone = str(inputs.get("project", "fake-project")), str(inputs.get("zone"))
    kind = registration.type
    if kind == bodies.ADDRESS:
        twin.delete_address(inputs["name"])
    elif kind == bodies.MIG:
        twin.delete_mig(project, zone, inputs["name"])
    elif kind == bodies.PER_INSTANCE_CONFIG:
        twin.delete_per_instance_configs(project, zone, inputs["instanceGroupManager"], [inputs["name"]])
    elif kind == bodies.SLICE_HOSTS:  # rayslice's provider (compute/bulk_hosts.py): a resize to 0, then
        mig = str(inputs["instanceGroupManager"])  # what is left of the hosts' configs
        if (project, zone, mig) in twin.migs:
            twin.resize_mig(project, zone, mig, 0)
            names = {i["name"] for i in inputs["instances"]}
            left = [c["name"] for c in twin.configs[(project, zone, mig)] if c["name"] in names]
            if left:
                twin.delete_per_instance_configs(project, zone, mig, left)
    elif kind == bodies.INSTANCE:
        twin.delete_instance(project, zone, inputs["name"])
    elif kind == bodies.TPU_NODE:
        twin.delete_node(project, zone, inputs["name"])
    elif kind == bodies.QUEUED_RESOURCE:  # rayslice's provider deletes with force (tpu_vm/queued.py)
        twin.delete_queued_resource(project, zone, inputs["name"], force=True)
    for link in [link for link, held in twin.resources.items() if held.urn == registration.urn]:
        del twin.resources[link]


def _destroy(
    registrations: list[Registration], state: dict[str, Any], twin: CloudTwin, fail_at: int = 0
) -> int:
    """`pulumi destroy` of what `state` holds, dependents first; the `fail_at`-th delete fails
    before Google acts on it and stops the run (the resource stays in the state). Returns the
    number of deletes tried."""
    left = {r.urn: r for r in registrations if r.urn in state}
    needed_by: dict[str, set[str]] = {urn: set() for urn in left}
    for r in left.values():
        for dependency in {*r.dependencies, r.parent} & left.keys():
            needed_by[dependency].add(r.urn)
    tried = 0
    while left:
        free = [r for urn, r in left.items() if not (needed_by[urn] & left.keys())]
        resource = min(free, key=lambda r: (r.type != bodies.ADDRESS, r.urn))
        if bodies.request(resource.type, resource.inputs) is not None:
            tried += 1
            if tried == fail_at:
                return tried
            _delete(twin, resource)
        del left[resource.urn]
        del state[resource.urn]
    return tried


def _clean(config: dict[str, str]) -> tuple[dict[str, list[str]], int, list[Registration]]:
    twin = CloudTwin()
    engine = _Engine(twin, {})
    registrations = _up(config, engine)
    assert not twin.violations()
    return _holdings(twin), engine.creates, registrations


@functools.cache
def _reference(stack: str) -> tuple[dict[str, list[str]], int]:
    holdings, creates, _ = _clean(_config(stack))
    return holdings, creates


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_an_up_interrupted_at_each_create_then_run_again_or_destroyed_leaves_nothing(
    stack: str,
) -> None:
    config = _config(stack)
    clean, creates = _reference(stack)
    assert creates > 5 and clean["instances"]  # the stack creates cloud resources
    for step in range(1, creates + 1):
        twin = CloudTwin()
        state: dict[str, Any] = {}
        interrupted = _Engine(twin, state, fail_at=step)
        reached = _up(config, interrupted)
        assert interrupted.creates >= step, f"create {step} never happened"
        # `pulumi destroy` straight away deletes all the interrupted run made.
        gone, gone_state = copy.deepcopy((twin, state))
        _destroy(reached, gone_state, gone)
        assert not any(_holdings(gone).values()), (step, _holdings(gone))
        # `pulumi up` again makes the rest, and a destroy then leaves nothing.
        registrations = _up(config, _Engine(twin, state))
        assert _holdings(twin) == clean, f"after create {step} failed and `pulumi up` ran again"
        assert not twin.violations(), step
        _destroy(registrations, state, twin)
        assert not any(_holdings(twin).values()), (step, _holdings(twin))


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_a_destroy_interrupted_at_each_delete_then_run_again_leaves_nothing(stack: str) -> None:
    config = _config(stack)
    deployed = CloudTwin()
    deployed_state: dict[str, Any] = {}
    registrations = _up(config, _Engine(deployed, deployed_state))
    step = 0
    while True:
        step += 1
        twin, state = copy.deepcopy((deployed, deployed_state))
        tried = _destroy(registrations, state, twin, fail_at=step)
        if tried < step:  # every delete went through: each one has been interrupted once
            break
        assert any(_holdings(twin).values())  # stopped part-way
        _destroy(registrations, state, twin)
        assert not any(_holdings(twin).values()), (step, _holdings(twin))
    assert step > _reference(stack)[1] // 2


# What sending a lost create again meets, by resource type: Google refuses a second resource of
# one name (rule already-exists, 409), and createInstances refuses hosts that exist
# (DuplicateInstanceError). Not refused: an instance template, whose name the provider makes
# unique per create (a lost one stays behind on Google as an orphan; the twin's stand-in suffix is
# fixed, so it cannot show one).
NOT_REFUSED = {bodies.TEMPLATE}


def _refused_again(config: dict[str, str], twin: CloudTwin, state: dict[str, Any], urn: str) -> str:
    """`pulumi up` again without importing the lost resource `urn`: why Google refused it ('' if
    it did not), on copies of `twin` and `state`."""
    twin, state = copy.deepcopy((twin, state))
    try:
        _up(config, _Engine(twin, state))
    except Exception as exc:  # a refused createInstances, or what depends on a refused resource
        if "already exist" in str(exc):
            return str(exc)
    return "; ".join(str(v) for v in twin.refused if v.rule == "already-exists" and v.urn == urn)


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_a_create_whose_answer_was_lost_is_refused_when_sent_again_and_imported_leaves_nothing(
    stack: str,
) -> None:
    """Issue 40 item 5, the other interruption: Google carried out a create, but its answer never
    reached Pulumi, so the resource is outside the state. `pulumi up` again sends the create
    again, and Google refuses it (409): nothing is made twice. `pulumi import` of the resource (its
    outputs into the state) and `pulumi up` make the rest; `pulumi destroy` then leaves nothing."""
    config = _config(stack)
    clean, creates = _reference(stack)
    for step in range(1, creates + 1):
        twin = CloudTwin()
        state: dict[str, Any] = {}
        losing = _Engine(twin, state, fail_at=step, lose=True)
        _up(config, losing)
        [(urn, outputs)] = losing.lost.items()
        kind = urn.split("::")[-2].split("$")[-1]
        why = _refused_again(config, twin, state, urn)
        if kind in NOT_REFUSED:
            assert not why, (step, urn, why)
        elif kind != bodies.SLICE_HOSTS:  # SliceHosts adopts its own hosts (test_slice_hosts_provider)
            assert why, f"create {step} ({urn}) was sent again and not refused"
        state[urn] = outputs  # `pulumi import`
        registrations = _up(config, _Engine(twin, state))
        assert _holdings(twin) == clean, f"after create {step} was lost, imported and `pulumi up` ran again"
        assert not twin.violations(), step
        _destroy(registrations, state, twin)
        assert not any(_holdings(twin).values()), (step, _holdings(twin))
