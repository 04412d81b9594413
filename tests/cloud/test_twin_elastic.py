"""Pulumi and the controller on an elastic cluster's slices (issue 24, docs/elastic.md): the program
declares every slice's MIG empty and the controller adds and removes hosts, so a ``pulumi up``
after it did, and a ``pulumi destroy``, find nothing to fight over."""

from __future__ import annotations

from pathlib import Path

from rayslice import names
from rayslice.cloud import bodies
from rayslice.cloud.twin import CloudTwin
from rayslice.infra import preview
from rayslice.infra.mocks import run_offline
from rayslice.infra.program import main
from rayslice.recovery.scaling import instances_of, resize_request_of
from rayslice.spec import load, load_cli, read_stack_file
from rayslice.startup_scripts.controller import scaling_policy

EXAMPLE = str(Path(__file__).resolve().parents[2] / "infra" / "Pulumi.example-compute-elastic-v6e-16.yaml")


def _registrations():
    return run_offline(lambda: main().exports, preview.stack_config(EXAMPLE, [])).registrations


def test_a_pulumi_up_after_the_controller_added_a_slice_finds_nothing_to_change():
    spec = load_cli(EXAMPLE, [])
    twin = CloudTwin()
    first = preview.deploy(preview.stack_config(EXAMPLE, []), twin)
    assert {h.group for h in twin.hosts()} == {None}  # the head and controller VMs: no slice host

    # What the controller sends to add slice 1: its hosts, named and addressed as infra reserved.
    name = spec.slice_name(1)
    mig = twin.migs[(spec.project, spec.zone, name)]
    hosts = names.slice_host_names(name, spec.tpu.hosts)
    twin.create_instances(
        spec.project, spec.zone, mig, instances_of(scaling_policy(spec), spec.project, hosts)
    )
    assert sorted(h.name for h in twin.hosts() if h.group == name) == hosts
    assert not twin.violations()  # a whole slice, its addresses the reserved ones
    reserved = {twin.addresses[names.address_name(h)] for h in hosts}
    assert {h.ip for h in twin.hosts() if h.group == name} == reserved

    # `pulumi up --refresh`: each MIG, as the cloud now has it, differs from the inputs Pulumi's
    # state holds for it (the first deployment's) only in what the program ignores after creation:
    # the target size the controller raised.
    for declared in (r for r in first if r.type == bodies.MIG):
        live = twin.migs[(spec.project, spec.zone, declared.inputs["name"])]
        differs = {
            key
            for key, value in bodies.request(bodies.MIG, declared.inputs).body.items()
            if live.get(key) != value
        }
        assert differs <= {"targetSize"} and set(declared.ignore_changes) == {"targetSize"}
    # The program run again declares nothing the controller made (no per-instance config it would
    # delete or recreate): the same resources as before.
    again = _registrations()
    assert not [r for r in again if r.type == bodies.PER_INSTANCE_CONFIG]
    assert sorted(r.urn for r in again) == sorted(r.urn for r in first)

    # `pulumi destroy` deletes the MIGs it declared, and with them the controller's hosts.
    for declared in (r for r in again if r.type == bodies.MIG):
        twin.delete_mig(spec.project, spec.zone, declared.inputs["name"])
    assert not [h for h in twin.hosts() if h.group is not None]


def _flex_config() -> dict[str, str]:
    """The elastic example on flex-start, slice 0 kept (minSlices 1): Pulumi's resize request asks
    for slice 0, the controller's for slice 1. No ceiling: no flex-start list price is published."""
    raw = {k: v for k, v in read_stack_file(EXAMPLE).items() if k != "maxUsdPerHour"}
    flex = {"capacity": "flex-start", "maxRunHours": 24, "minSlices": 1, "zone": "us-east5-a"}
    return preview.pulumi_config({**raw, **flex})


def test_an_elastic_flex_start_slice_is_the_controllers_request_and_a_pulumi_up_after_it_changes_nothing():
    config = _flex_config()
    spec = load({k.split(":", 1)[1]: v for k, v in config.items() if k.startswith("rayslice:")})
    twin = CloudTwin()
    first = preview.deploy(config, twin)
    declared = [r for r in first if r.type == bodies.RESIZE_REQUEST]
    assert [r.inputs["name"] for r in declared] == [names.request_name(spec.slice_name(0))]
    elastic = spec.slice_name(1)
    assert not twin.resize_requests_of(spec.project, spec.zone, elastic)  # the controller's to make
    assert {h.group for h in twin.hosts()} == {None, spec.slice_name(0)}

    # What the controller sends to add slice 1: the same request as Pulumi's for slice 0, but for
    # slice 1 (`resize_request_of`); the zone has room, so its hosts come at once.
    policy = scaling_policy(spec)
    request = resize_request_of(policy, elastic)
    pulumi_request = bodies.request(bodies.RESIZE_REQUEST, declared[0].inputs).body
    assert set(request) == set(pulumi_request) and request["resizeBy"] == pulumi_request["resizeBy"]
    assert request["requestedRunDuration"] == pulumi_request["requestedRunDuration"]
    twin.insert_resize_request(spec.project, spec.zone, elastic, request)
    assert len([h for h in twin.hosts() if h.group == elastic]) == spec.tpu.hosts
    assert not twin.violations()

    # `pulumi up --refresh`: the live MIGs differ from Pulumi's inputs only in the ignored target
    # size, and the program declares the same resources again (no request for slice 1).
    for mig in (r for r in first if r.type == bodies.MIG):
        live = twin.migs[(spec.project, spec.zone, mig.inputs["name"])]
        body = bodies.request(bodies.MIG, mig.inputs).body
        assert {key for key, value in body.items() if live.get(key) != value} <= {"targetSize"}
    again = run_offline(lambda: main().exports, config).registrations
    assert sorted(r.urn for r in again) == sorted(r.urn for r in first)

    # `pulumi destroy` deletes the MIGs, and with them the controller's hosts and request.
    for mig in (r for r in again if r.type == bodies.MIG):
        twin.delete_mig(spec.project, spec.zone, mig.inputs["name"])
    assert not [h for h in twin.hosts() if h.group is not None]
    assert not twin.resize_requests
