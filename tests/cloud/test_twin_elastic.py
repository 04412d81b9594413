"""Pulumi and the controller on an elastic cluster's slices (issue 24, docs/elastic.md): the program
declares every slice's MIG empty and the controller adds and removes hosts, so a ``pulumi up``
after it did, and a ``pulumi destroy``, find nothing to fight over."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayslice import names
from rayslice.cloud import bodies
from rayslice.cloud.twin import CloudTwin
from rayslice.cloud.twin.compute import AddressInUseError, BulkModeError
from rayslice.infra import preview
from rayslice.infra.mocks import run_offline
from rayslice.infra.program import main
from rayslice.recovery.scaling import instances_of
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

    # `pulumi destroy` deletes the MIGs it declared, and with them the controller's hosts; then
    # the addresses those hosts used, which Google refuses to delete while they are in use.
    _destroy(again, twin)
    assert not [h for h in twin.hosts() if h.group is not None]
    assert not twin.addresses


def _destroy(registrations, twin: CloudTwin) -> None:
    """`pulumi destroy`'s order on the twin: a resource goes only once every resource that depends
    on it (or is its child) is gone; among those free to go, addresses first, the order most likely
    to find an address still in use (D11, issue 40)."""
    left = {r.urn: r for r in registrations}
    needed_by = {urn: set() for urn in left}
    for r in registrations:
        for dependency in {*r.dependencies, r.parent} & left.keys():
            needed_by[dependency].add(r.urn)
    while left:
        free = [r for urn, r in left.items() if not (needed_by[urn] & left.keys())]
        resource = min(free, key=lambda r: (r.type != bodies.ADDRESS, r.urn))
        if resource.type == bodies.ADDRESS:
            twin.delete_address(resource.inputs["name"])  # AddressInUseError while a host uses it
        elif resource.type == bodies.MIG:
            twin.delete_mig(resource.inputs["project"], resource.inputs["zone"], resource.inputs["name"])
        del left[resource.urn]


def test_an_address_in_use_cannot_be_deleted():
    """Item 4 of issue 40 (Compute Engine: an address in use is released only once unused)."""
    spec = load_cli(EXAMPLE, [])
    twin = CloudTwin()
    preview.deploy(preview.stack_config(EXAMPLE, []), twin)
    name = spec.slice_name(1)
    hosts = names.slice_host_names(name, spec.tpu.hosts)
    mig = twin.migs[(spec.project, spec.zone, name)]
    configs = instances_of(scaling_policy(spec), spec.project, hosts)
    twin.create_instances(spec.project, spec.zone, mig, configs)
    with pytest.raises(AddressInUseError, match=hosts[0]):
        twin.delete_address(names.address_name(hosts[0]))
    assert names.address_name(hosts[0]) in twin.addresses
    twin.delete_mig(spec.project, spec.zone, name)
    twin.delete_address(names.address_name(hosts[0]))
    assert names.address_name(hosts[0]) not in twin.addresses


def _flex_config() -> dict[str, str]:
    """The elastic example on flex-start, slice 0 kept (minSlices 1). No ceiling: no flex-start
    list price is published."""
    raw = {k: v for k, v in read_stack_file(EXAMPLE).items() if k != "maxUsdPerHour"}
    flex = {"capacity": "flex-start", "maxRunHours": 24, "minSlices": 1, "zone": "us-east5-a"}
    return preview.pulumi_config({**raw, **flex})


def test_an_elastic_flex_start_slice_is_resized_from_zero_by_the_controller():
    """D1 (issue 40): every flex-start slice is a bulk MIG with no resize request; slice 0's
    target size is its hosts, slice 1's is 0 until the controller resizes it (bulk mode adds
    hosts only while the target size is 0), and a `pulumi up` after it changes nothing."""
    config = _flex_config()
    spec = load({k.split(":", 1)[1]: v for k, v in config.items() if k.startswith("rayslice:")})
    twin = CloudTwin()
    first = preview.deploy(config, twin)
    assert not [r for r in first if r.type == bodies.RESIZE_REQUEST]
    sizes = {r.inputs["name"]: r.inputs["targetSize"] for r in first if r.type == bodies.MIG}
    elastic = spec.slice_name(1)
    assert sizes == {spec.slice_name(0): spec.tpu.hosts, elastic: 0}
    assert {h.group for h in twin.hosts()} == {None, spec.slice_name(0)}

    # What the controller sends to add slice 1: a resize from 0; the zone has room, so its hosts
    # come at once. A second growth while the target size is above 0 is refused.
    twin.resize_mig(spec.project, spec.zone, elastic, spec.tpu.hosts)
    assert len([h for h in twin.hosts() if h.group == elastic]) == spec.tpu.hosts
    with pytest.raises(BulkModeError):
        twin.resize_mig(spec.project, spec.zone, elastic, spec.tpu.hosts + 1)
    assert not twin.violations()

    # `pulumi up --refresh`: the live MIGs differ from Pulumi's inputs only in the ignored target
    # size, and the program declares the same resources again.
    for mig in (r for r in first if r.type == bodies.MIG):
        live = twin.migs[(spec.project, spec.zone, mig.inputs["name"])]
        body = bodies.request(bodies.MIG, mig.inputs).body
        assert {key for key, value in body.items() if live.get(key) != value} <= {"targetSize"}
    again = run_offline(lambda: main().exports, config).registrations
    assert sorted(r.urn for r in again) == sorted(r.urn for r in first)

    # Removed: resized to 0, which deletes the hosts; `pulumi destroy` then deletes the MIGs.
    twin.resize_mig(spec.project, spec.zone, elastic, 0)
    assert not [h for h in twin.hosts() if h.group == elastic]
    _destroy(again, twin)
    assert not [h for h in twin.hosts() if h.group is not None]
