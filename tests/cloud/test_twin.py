"""The cloud twin: Google's documented behaviour and rules, applied to what the program declares."""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
import json
from pathlib import Path
from typing import Any

import pulumi_gcp as gcp
import pytest

from rayslice import capacity_table
from rayslice.cloud import bodies, rules
from rayslice.cloud.states import INSTANCE_RUNNING, INSTANCE_TERMINATED
from rayslice.cloud.twin import CloudTwin
from rayslice.cloud.twin.compute import BulkModeError, DuplicateInstanceError
from rayslice.cloud.twin.state import DELETED, MIG_HOST, CloudRuleError, TwinHost
from rayslice.errors import SpecError
from rayslice.infra import preview
from rayslice.infra.compute import slice as compute_slice
from rayslice.infra.compute import template as compute_template
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from tests.cloud.stacks import slice_entries

STACKS = Path(__file__).resolve().parents[2] / "infra"
EXAMPLES = sorted(STACKS.glob("Pulumi.example-*.yaml"))
P, Z = "p", "us-east5-b"


def _apply(twin: CloudTwin, entries: list[Any]) -> None:
    """Hand-written resources (tests.cloud.stacks) applied in order, as the mocks apply them: the
    MIG refers to its template and workload policy by the self links the twin gave them."""
    links: dict[str, str] = {}
    for type_token, name, props, _ in entries:
        if type_token == bodies.MIG:
            props = {
                **props,
                "versions": [{"instanceTemplate": links["s-0-template"]}],
                "resourcePolicies": {"workloadPolicy": links["s-0-policy"]},
            }
        request = bodies.request(type_token, props)
        assert request is not None
        outputs = twin.apply(
            type_token, name, request, project=P, zone=Z, target=props.get("instanceGroupManager")
        )
        links[name] = outputs.get("selfLinkUnique", "")


def _deploy(stack: str, *overrides: str) -> CloudTwin:
    twin = CloudTwin()
    preview.deploy(preview.stack_config(str(STACKS / stack), list(overrides)), twin)
    return twin


@pytest.mark.parametrize("stack", EXAMPLES, ids=lambda p: p.name)
def test_every_example_applies_to_the_twin_without_a_violation(stack):
    twin = CloudTwin()
    preview.deploy(preview.stack_config(str(stack), []), twin)
    assert twin.refused == [] and twin.audit() == []


def test_a_mig_creates_its_target_size_and_create_instances_adds_named_hosts():
    twin = CloudTwin()
    _apply(twin, slice_entries(target=2, configs=0))
    [mig] = twin.migs.values()
    auto = [h.name for h in twin.hosts()]
    assert len(auto) == 2 and all(name.startswith("s-0-") and len(name) == 8 for name in auto)
    twin.create_instances(P, Z, mig, [{"name": "s-0-w0"}, {"name": "s-0-w1"}])
    assert mig["targetSize"] == 4 and {"s-0-w0", "s-0-w1"} <= {h.name for h in twin.hosts()}


def test_target_size_n_plus_n_configs_doubles_the_hosts(monkeypatch):
    """Defect 1 reverted (target size = hosts): the twin holds 2N hosts and deploy says why."""
    original = gcp.compute.InstanceGroupManager

    def old_shape(*args: Any, **kwargs: Any) -> Any:
        kwargs["target_size"] = kwargs["update_policy"].max_unavailable_fixed  # the slice's hosts
        return original(*args, **kwargs)

    monkeypatch.setattr(compute_slice.gcp.compute, "InstanceGroupManager", old_shape)
    twin = CloudTwin()
    with pytest.raises(CloudRuleError) as caught:
        preview.deploy(preview.stack_config(str(STACKS / "Pulumi.example-compute-v6e-16.yaml"), []), twin)
    assert len([h for h in twin.hosts() if h.kind == MIG_HOST]) == 8  # v6e-16: 4 hosts, twice
    assert "ends with 8 instances" in str(caught.value) and "rule instances-match-topology" in str(
        caught.value
    )


@pytest.mark.parametrize("model", ["SPOT", "STANDARD"])
def test_bulk_mode_is_refused_with_spot_and_on_demand_templates(model):
    """Defect 2: the MIG insert is refused, naming resource, rule and source."""
    twin = CloudTwin()
    with pytest.raises(CloudRuleError) as caught:
        _apply(
            twin,
            slice_entries(
                target=4, configs=0, bulk=True, model=model, termination="STOP", lifecycle="DO_NOTHING"
            ),
        )
    text = str(caught.value)
    assert (
        "s-0-mig:" in text
        and "rule bulk-provisioning-model" in text
        and "bulk-create-instances-in-mig" in text
    )
    assert twin.migs == {} and [v.rule for v in twin.refused] == ["bulk-provisioning-model"]


def test_reservation_bound_needs_a_specific_reservation_and_delete_in_bulk_mode():
    """Defect 3."""
    with pytest.raises(CloudRuleError, match="rule reservation-bound-specific"):
        _apply(CloudTwin(), slice_entries(model="RESERVATION_BOUND", termination="DELETE"))
    specific = {
        "type": "SPECIFIC_RESERVATION",
        "specificReservation": {"key": "compute.googleapis.com/reservation-name", "values": ["r"]},
    }
    with pytest.raises(CloudRuleError, match="rule bulk-reservation-bound-delete"):
        _apply(
            CloudTwin(),
            slice_entries(
                target=4,
                configs=0,
                bulk=True,
                model="RESERVATION_BOUND",
                termination="STOP",
                affinity=specific,
            ),
        )


def test_reserved_stack_without_a_reservation_is_refused_through_the_program():
    """Defect 3 through the program: ``capacity: reserved`` without a name is refused, by the
    spec now, before any request (the twin's own refusal is tested above with the bodies)."""
    with pytest.raises(SpecError, match="capacity=reserved on compute needs reservation=<name"):
        _deploy("Pulumi.example-compute-v6e-16.yaml", "capacity=reserved")
    twin = _deploy("Pulumi.example-compute-v6e-16.yaml", "capacity=reserved", "reservation=my-res")
    assert len([h for h in twin.hosts() if h.kind == MIG_HOST]) == 4


def test_a_workload_policy_topology_must_fit_the_machine_type():
    with pytest.raises(CloudRuleError, match="rule topology-machine-type"):
        _apply(CloudTwin(), slice_entries(topology="2x3", configs=1))


def test_tpu7x_hosts_serve_what_a_real_compute_engine_tpu_host_serves():
    """Defects 4 and 5: v7x-16 as the host reports it; worker-id, endpoints and tpu-env agree."""
    twin = _deploy("Pulumi.example-compute-tpu7x-16.yaml")
    hosts = [h for h in twin.hosts() if h.kind == MIG_HOST]  # worker 0 first
    # Worker ids follow creation order, which Pulumi leaves open between per-instance configs
    # (no source ties Google's worker-id to the configs' names): any order must be consistent.
    assert sorted(h.name for h in hosts) == ["jax-ironwood-slice-0-w0", "jax-ironwood-slice-0-w1"]
    endpoints = ",".join(f"unknown:unknown:{h.ip}" for h in hosts)
    for worker, host in enumerate(hosts):
        assert host.ip.startswith("10.128.") and host.machine_type == "tpu7x-standard-4t"
        assert host.metadata["accelerator-type"] == "v7x-16"
        assert host.metadata["worker-id"] == str(worker)
        assert host.metadata["worker-network-endpoints"] == endpoints
        assert (
            f"WORKER_ID: '{worker}'" in host.metadata["tpu-env"]
            and "TOPOLOGY: '2x2x2'" in host.metadata["tpu-env"]
        )
        assert "startup-script" in host.metadata


@pytest.mark.parametrize(
    "model, termination, lifecycle, left",
    [
        ("SPOT", "STOP", "DO_NOTHING", INSTANCE_TERMINATED),
        ("STANDARD", "DELETE", "DO_NOTHING", None),
        # REPAIR, the default, brings the host back alone: only a one-host slice may keep it
        # (rule tpu-mig-do-nothing).
        ("STANDARD", "STOP", None, INSTANCE_RUNNING),
    ],
)
def test_preemption_follows_the_termination_action_and_the_lifecycle_policy(
    model, termination, lifecycle, left
):
    """Defect 6: STOP plus DO_NOTHING leaves stopped hosts; REPAIR brings single hosts back."""
    twin = CloudTwin()
    events: list[tuple[str, str]] = []
    shape = {"topology": "2x2", "configs": 1} if lifecycle is None else {}
    _apply(twin, slice_entries(model=model, termination=termination, lifecycle=lifecycle, **shape))
    hosts = 1 if shape else 4
    twin.on_host_down = lambda h: events.append((h.name, h.status))
    twin.on_host_up = lambda h: events.append((h.name, h.status))
    hit = twin.preempt(P, Z, "s-0")
    assert [h.name for h in hit] == [f"s-0-w{i}" for i in range(hosts)]
    statuses = {h.name: h.status for h in twin.hosts()}
    if left is None:
        assert statuses == {} and {s for _, s in events} == {DELETED}
    else:
        assert set(statuses.values()) == {left}
        assert len(events) == (
            hosts if left == INSTANCE_TERMINATED else 2 * hosts
        )  # down, and up again when repaired


def test_tpu_nodes_refuse_exclusive_pairs_big_metadata_bad_names_and_labels():
    """Defect 8 and the TPU API's limits."""
    base = {"acceleratorConfig": {"type": "V6E", "topology": "4x4"}, "runtimeVersion": "v2-alpha-tpuv6e"}
    cases = {
        "tpu-node-exclusive-fields": {
            "networkConfig": {"network": "a"},
            "networkConfigs": [{"network": "b"}],
        },
        "metadata-limits": {"metadata": {"big": "x" * (rules.METADATA_VALUE_MAX + 1)}},
        "labels": {"labels": {"Bad": "x"}},
    }
    for rule, extra in cases.items():
        request = bodies.request(bodies.TPU_NODE, {"name": "n", **base, **extra})
        assert request is not None
        with pytest.raises(CloudRuleError, match=f"rule {rule}"):
            CloudTwin().apply(bodies.TPU_NODE, "n", request, project=P, zone=Z)
    request = bodies.request(bodies.TPU_NODE, {"name": "Bad_Name", **base})
    assert request is not None
    with pytest.raises(CloudRuleError, match="rule resource-name"):
        CloudTwin().apply(bodies.TPU_NODE, "n", request, project=P, zone=Z)


def test_v5p_boot_disk_reverted_is_refused(monkeypatch):
    """Defect 7 reverted (Hyperdisk Balanced on v5p)."""
    monkeypatch.setattr(compute_slice, "boot_disk_type", lambda spec: "hyperdisk-balanced")
    with pytest.raises(CloudRuleError, match="rule tpu-boot-disk"):
        _deploy("Pulumi.example-compute-v6e-16.yaml", "acceleratorType=v5p-16", "zone=us-east5-a")


def test_spot_without_stop_or_do_nothing_reverted_is_refused(monkeypatch):
    """Defect 6 reverted: DELETE termination, and the default lifecycle policy."""
    spot = capacity_table.cell("compute", "spot")
    template, *rest = spot.calls
    body = copy.deepcopy(dict(template.body))
    body["properties"]["scheduling"]["instanceTerminationAction"] = "DELETE"
    deleting = dataclasses.replace(spot, calls=(capacity_table.Call(template.method, body), *rest))
    monkeypatch.setattr(compute_template, "cell_for", lambda spec: deleting)
    with pytest.raises(CloudRuleError, match="rule spot-tpu-stop"):
        _deploy("Pulumi.example-compute-v6e-16.yaml", "capacity=spot")
    monkeypatch.undo()
    monkeypatch.setattr(compute_slice, "lifecycle_policy", lambda spec: None)
    for capacity in ("spot", "on-demand"):  # D3 (issue 40): every capacity, not Spot only
        with pytest.raises(CloudRuleError, match="rule tpu-mig-do-nothing"):
            _deploy("Pulumi.example-compute-v6e-16.yaml", f"capacity={capacity}")


@pytest.mark.parametrize("stack", ["Pulumi.example-compute-tpu7x-16.yaml", "Pulumi.example-multislice.yaml"])
def test_an_address_range_gives_every_subnetwork_its_addresses(stack):
    """The simulator's range: declared (10.128.0.0/20) and existing subnetworks alike hand out
    addresses from it, the first being the gateway; each host its own."""
    pool = ipaddress.IPv4Network("100.64.7.0/26")
    twin = CloudTwin(address_range=str(pool))
    preview.deploy(preview.stack_config(str(STACKS / stack), []), twin)
    ips = [h.ip for h in twin.hosts()]
    assert len(ips) >= 2 and len(set(ips)) == len(ips)
    assert all(ipaddress.IPv4Address(ip) in pool for ip in ips)
    assert str(pool[1]) not in ips and str(pool[2]) in ips
    mig_hosts = [h for h in twin.hosts() if h.group and h.kind == MIG_HOST]
    for host in mig_hosts:
        assert host.metadata["worker-network-endpoints"] == ",".join(
            f"unknown:unknown:{h.ip}" for h in mig_hosts if h.group == host.group
        )


def test_a_twin_host_round_trips_through_json():
    """The emulation process writes the twin's hosts for `local up` as JSON."""
    twin = _deploy("Pulumi.example-compute-tpu7x-16.yaml")
    for host in twin.hosts():
        assert TwinHost(**json.loads(json.dumps(dataclasses.asdict(host)))) == host


def test_the_emulators_spot_preemption_returns_the_hosts_it_hit_each_reported_down():
    """What `rayslice local preempt` calls: each host stopped (STOP) and left (DO_NOTHING), and
    ``on_host_down`` called once per host hit."""
    emulator = CloudApiEmulator(address_range="100.64.8.0/24")
    try:
        config = preview.stack_config(str(STACKS / "Pulumi.example-compute-tpu7x-16.yaml"), ["capacity=spot"])
        preview.deploy(config, emulator.twin)
        down: list[TwinHost] = []
        emulator.twin.on_host_down = down.append
        [host, *_] = [h for h in emulator.twin.hosts() if h.kind == MIG_HOST]  # not the head VM
        hit = emulator.preempt(host.project, host.zone, str(host.group), mode="spot")
    finally:
        emulator.server_close()
    assert sorted(h.name for h in hit) == ["jax-ironwood-slice-0-w0", "jax-ironwood-slice-0-w1"]
    assert all(h.status == INSTANCE_RUNNING for h in hit)  # as they were when hit
    assert [(h.name, h.status) for h in down] == [(h.name, INSTANCE_TERMINATED) for h in hit]
    assert {h.status for h in emulator.twin.hosts() if h.group == host.group} == {INSTANCE_TERMINATED}


def _bulk_mig(twin: CloudTwin, target: int) -> dict[str, Any]:
    _apply(twin, slice_entries(bulk=True, target=target, configs=0, model="FLEX_START", termination="DELETE"))
    return twin.migs[(P, Z, "s-0")]


def test_a_bulk_mig_creates_nothing_before_it_has_every_host():
    """D8 (issue 40): bulk mode waits for full capacity instead of failing a partial create."""
    twin = CloudTwin()
    twin.set_capacity(Z, "ct6e-standard-4t", 3)
    mig = _bulk_mig(twin, 4)  # no ZONE_RESOURCE_POOL_EXHAUSTED: it waits
    # "During this waiting period, the MIG creates managed instances" (placeholders, no VM yet).
    waiting = twin.instances[(P, Z, "s-0")]
    assert mig["targetSize"] == 4 and len(waiting) == 4 and twin.hosts() == []
    assert all(r["currentAction"] == "CREATING" and "instanceStatus" not in r for r in waiting)
    twin.set_capacity(Z, "ct6e-standard-4t", 4)
    records = twin.instances[(P, Z, "s-0")]
    assert [r["name"] for r in records] == [r["name"] for r in waiting]  # the placeholders' names
    assert {r["instanceStatus"] for r in records} == {"RUNNING"} and len(twin.hosts()) == 4


def test_a_bulk_mig_grows_only_from_zero_and_shrinks_to_zero():
    """D8 (issue 40): growth (target size or createInstances) of a bulk MIG whose target size is
    above 0 is refused and changes nothing; a resize to 0 deletes every host."""
    twin = CloudTwin()
    mig = _bulk_mig(twin, 4)
    with pytest.raises(BulkModeError, match="bulk mode"):
        twin.resize_mig(P, Z, "s-0", 5)
    with pytest.raises(BulkModeError, match="bulk mode"):
        twin.create_instances(P, Z, mig, [{"name": "s-0-w9"}])
    assert mig["targetSize"] == 4 and len(twin.instances[(P, Z, "s-0")]) == 4
    twin.resize_mig(P, Z, "s-0", 0)
    assert mig["targetSize"] == 0 and twin.hosts() == []
    twin.create_instances(P, Z, mig, [{"name": f"s-0-w{i}"} for i in range(4)])  # from 0: one call
    assert sorted(h.name for h in twin.hosts()) == [f"s-0-w{i}" for i in range(4)]


def test_a_bulk_mig_shrinks_to_fewer_hosts_only_once_its_bulk_creation_is_done():
    """Compute Engine's "About bulk mode": a resize to a non-zero size needs no bulk instance
    operation in progress. While the MIG still waits for every host, only a resize to 0 removes
    hosts."""
    twin = CloudTwin()
    twin.set_capacity(Z, "ct6e-standard-4t", 3)
    mig = _bulk_mig(twin, 4)
    with pytest.raises(BulkModeError, match="in progress"):
        twin.resize_mig(P, Z, "s-0", 2)
    assert mig["targetSize"] == 4 and twin.hosts() == []
    twin.set_capacity(Z, "ct6e-standard-4t", 4)  # the wait ends: all four hosts exist
    twin.resize_mig(P, Z, "s-0", 2)
    assert mig["targetSize"] == 2 and len(twin.hosts()) == 2


def test_create_instances_naming_an_existing_instance_is_refused():
    """Item 4 of issue 40: an instance name is unique in its zone; nothing is created."""
    twin = CloudTwin()
    _apply(twin, slice_entries())
    mig = twin.migs[(P, Z, "s-0")]
    with pytest.raises(DuplicateInstanceError, match="s-0-w1"):
        twin.create_instances(P, Z, mig, [{"name": "s-0-w9"}, {"name": "s-0-w1"}])
    assert mig["targetSize"] == 4 and len(twin.hosts()) == 4


def test_a_spot_preemption_is_recorded_as_googles_preemption_operation():
    """D2 (issue 40): Compute Engine records compute.instances.preempted for each host."""
    twin = CloudTwin()
    _apply(twin, slice_entries(model="SPOT", termination="STOP"))
    twin.preempt(P, Z, "s-0")
    operations = twin.preemptions(P, Z)
    assert [o["targetLink"].rsplit("/", 1)[-1] for o in operations] == [f"s-0-w{i}" for i in range(4)]
    assert {(o["operationType"], o["status"], o["user"]) for o in operations} == {
        ("compute.instances.preempted", "DONE", "system")
    }
    assert twin.preemptions(P, "us-east5-a") == []
