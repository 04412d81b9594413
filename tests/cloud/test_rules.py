"""Each of Google's rules in rayslice.cloud.rules on a good and a bad hand-written stack."""

from __future__ import annotations

import pytest

from rayslice.cloud import bodies, rules
from rayslice.cloud.twin.state import CloudRuleError
from tests.cloud.stacks import make, rule_ids, slice_entries, slice_stack, urn

SPECIFIC = {
    "type": "SPECIFIC_RESERVATION",
    "specificReservation": {"key": "compute.googleapis.com/reservation-name", "values": ["r1"]},
}


def test_the_shape_rayslice_ships_breaks_no_rule():
    assert rule_ids(slice_stack()) == []
    assert rule_ids(slice_stack(model="SPOT", termination="STOP", lifecycle="DO_NOTHING")) == []
    assert rule_ids(slice_stack(model="RESERVATION_BOUND", termination="DELETE", affinity=SPECIFIC)) == []


@pytest.mark.parametrize("model", ["SPOT", "STANDARD"])
def test_bulk_mode_only_with_flex_start_or_reservation_bound(model):
    found = rules.check(slice_stack(bulk=True, target=4, configs=0, model=model, termination="STOP"))
    [violation] = [v for v in found if v.rule == "bulk-provisioning-model"]
    assert violation.resource == "s-0-mig" and model in violation.message
    assert "bulk-create-instances-in-mig" in violation.source
    assert "rule bulk-provisioning-model" in str(violation) and violation.source in str(violation)
    for good in ("FLEX_START", "RESERVATION_BOUND"):
        stack = slice_stack(
            bulk=True, target=4, configs=0, model=good, termination="DELETE", affinity=SPECIFIC
        )
        assert "bulk-provisioning-model" not in rule_ids(stack)


def test_a_bulk_spot_stack_with_n_plus_n_hosts_breaks_both_rules():
    """Issue 19's hand-written bad stack, over the whole stack as the policy pack sees it (the
    cloud twin refuses its MIG insert first, tests/infra/test_preview.py)."""
    stack = slice_stack(target=4, bulk=True, model="SPOT", termination="STOP", lifecycle="DO_NOTHING")
    assert rule_ids(stack) == ["bulk-grows-from-zero", "bulk-provisioning-model", "instances-match-topology"]


def test_reservation_bound_needs_a_specific_reservation():
    stack = slice_stack(model="RESERVATION_BOUND", termination="DELETE", affinity={"type": "ANY_RESERVATION"})
    assert rule_ids(stack) == ["reservation-bound-specific"]
    assert rule_ids(slice_stack(model="RESERVATION_BOUND", termination="DELETE")) == [
        "reservation-bound-specific"
    ]


def test_bulk_reservation_bound_needs_delete():
    bad = slice_stack(
        bulk=True, target=4, configs=0, model="RESERVATION_BOUND", termination="STOP", affinity=SPECIFIC
    )
    assert rule_ids(bad) == ["bulk-reservation-bound-delete"]
    # Without bulk mode the bulk page's requirement does not apply.
    assert rule_ids(slice_stack(model="RESERVATION_BOUND", termination="STOP", affinity=SPECIFIC)) == []


def test_topology_must_be_whole_hosts_of_a_tpu_machine_type():
    assert rule_ids(slice_stack(machine="n2-standard-16", disk="pd-balanced")) == ["topology-machine-type"]
    assert rule_ids(slice_stack(topology="2x3", configs=1)) == ["topology-machine-type"]


@pytest.mark.parametrize("target, configs", [(4, 4), (0, 2), (4, 0 + 1), (3, 0)])
def test_instances_are_target_size_plus_per_instance_configs(target, configs):
    """createInstances raises the target size: N plus N configs is 2N hosts (issue 19, defect 1)."""
    [violation] = rules.check(slice_stack(target=target, configs=configs))
    assert violation.rule == "instances-match-topology"
    assert f"ends with {target + configs} instances" in violation.message and "4 hosts" in violation.message
    assert "PerInstanceConfig.yaml" in violation.source
    assert rule_ids(slice_stack(target=4, configs=0)) == []
    assert (
        rule_ids(slice_stack(target=0, configs=0)) == []
    )  # empty: an elastic slice, hosts added whole later


def test_tpu_node_mutually_exclusive_pairs():
    base = {
        "name": "n",
        "runtimeVersion": "v2-alpha-tpuv6e",
        "acceleratorConfig": {"type": "V6E", "topology": "4x4"},
    }
    good = make(bodies.TPU_NODE, "n", {**base, "networkConfig": {"network": "net"}})
    assert rule_ids(rules.Stack([good])) == []
    for extra in (
        {"acceleratorType": "v6e-16"},
        {"networkConfig": {"network": "a"}, "networkConfigs": [{"network": "b"}]},
    ):
        bad = make(bodies.TPU_NODE, "n", {**base, **extra})
        [violation] = rules.check(rules.Stack([bad]))
        assert violation.rule == "tpu-node-exclusive-fields" and "mutually exclusive" in violation.message


def test_metadata_limits():
    at_limit = {"startup-script": "x" * rules.METADATA_VALUE_MAX}
    assert rule_ids(slice_stack(metadata=at_limit)) == []
    assert rule_ids(slice_stack(metadata={"big": "x" * (rules.METADATA_VALUE_MAX + 1)})) == [
        "metadata-limits"
    ]
    half = rules.METADATA_TOTAL_LIMIT // 2
    assert rule_ids(slice_stack(metadata={"a": "x" * (half - 1), "b": "x" * (half - 1)})) == [
        "metadata-limits"
    ]
    assert rule_ids(slice_stack(metadata={"bad key": "v"})) == ["metadata-limits"]
    node = make(bodies.TPU_NODE, "n", {"name": "n", "metadata": {"s": "x" * (rules.METADATA_VALUE_MAX + 1)}})
    assert rule_ids(rules.Stack([node])) == ["metadata-limits"]


@pytest.mark.parametrize("name", ["Upper", "1st", "ends-", "a" * 64, "under_score"])
def test_resource_names_follow_rfc1035(name):
    address = make(bodies.ADDRESS, "ip", {"name": name, "addressType": "INTERNAL"})
    assert rule_ids(rules.Stack([address])) == ["resource-name"]
    assert rule_ids(rules.Stack([make(bodies.ADDRESS, "ip", {"name": "a" * 63})])) == []


@pytest.mark.parametrize(
    "labels",
    [{"Key": "v"}, {"1key": "v"}, {"k": "V"}, {"k": "x" * 64}, {f"k{i}": "v" for i in range(65)}],
)
def test_label_rules(labels):
    assert rule_ids(slice_stack(labels=labels)) == ["labels"]
    assert rule_ids(slice_stack(labels={"ключ": "значение", "k_1-2": ""})) == []


@pytest.mark.parametrize(
    "machine, disk, good",
    [
        ("ct5p-hightpu-4t", "pd-balanced", True),
        ("ct5p-hightpu-4t", "hyperdisk-balanced", False),
        ("ct6e-standard-4t", "hyperdisk-balanced", True),
        ("ct6e-standard-4t", "pd-balanced", False),
        ("tpu7x-standard-4t", "hyperdisk-balanced", True),
        ("tpu7x-standard-4t", "hyperdisk-ml", False),
    ],
)
def test_boot_disk_per_generation(machine, disk, good):
    topology = "2x2x4" if machine.startswith("ct5p") or machine.startswith("tpu7x") else "4x4"
    found = rule_ids(slice_stack(machine=machine, disk=disk, topology=topology))
    assert found == ([] if good else ["tpu-boot-disk"])


def test_spot_tpu_slices_stop():
    assert rule_ids(slice_stack(model="SPOT", termination="DELETE", lifecycle="DO_NOTHING")) == [
        "spot-tpu-stop"
    ]


@pytest.mark.parametrize(
    "template",
    [
        {"model": "SPOT", "termination": "STOP"},
        {"model": "STANDARD"},
        {"model": "RESERVATION_BOUND", "termination": "DELETE", "affinity": SPECIFIC},
    ],
)
@pytest.mark.parametrize("lifecycle", [None, "REPAIR"])
def test_every_multi_host_tpu_mig_does_nothing_on_a_failed_host(template, lifecycle):
    """D3 (issue 40): on-demand and reserved slices too, not Spot only; a repaired host cannot
    rejoin its slice whatever the capacity."""
    [violation] = rules.check(slice_stack(lifecycle=lifecycle, **template))
    assert violation.rule == "tpu-mig-do-nothing" and "REPAIR" in violation.message
    assert "failure-recovery" in violation.source
    # A one-host slice is whole again after a repair: the rule leaves it alone.
    assert rule_ids(slice_stack(lifecycle=lifecycle, topology="2x2", configs=1, **template)) == []


def test_a_bulk_mig_takes_no_resize_request():
    """D8 (issue 40), "About bulk mode": bulk mode does not support resize requests."""
    entries = slice_entries(bulk=True, configs=0, model="FLEX_START", termination="DELETE")
    request = make(
        bodies.RESIZE_REQUEST,
        "s-0-request",
        {"name": "s-0-request", "zone": "z", "instanceGroupManager": "s-0", "resizeBy": 4.0},
        {"instanceGroupManager": [urn(bodies.MIG, "s-0-mig")]},
    )
    stack = rules.Stack([*(make(*e) for e in entries), request])
    [violation] = [v for v in rules.check(stack) if v.rule == "bulk-no-resize-request"]
    assert violation.resource == "s-0-request" and "about-bulk-mode" in violation.source


@pytest.mark.parametrize(
    "target, configs, broken", [(4, 0, False), (0, 1, False), (4, 1, True), (0, 2, True)]
)
def test_a_bulk_mig_grows_once_from_zero(target, configs, broken):
    """D8 (issue 40): hosts come to a bulk MIG only while its target size is 0, so from its target
    size or from one createInstances (one per-instance config), never more."""
    stack = slice_stack(bulk=True, target=target, configs=configs, model="FLEX_START", termination="DELETE")
    assert ("bulk-grows-from-zero" in rule_ids(stack)) is broken


def test_rayslices_own_rules_do_not_say_google_would_refuse():
    """D9: a MIG larger than its topology and a Spot MIG that repairs hosts are rayslice's rules:
    Google accepts both (no source says otherwise), so their message says whose rule it is."""
    [do_nothing] = rules.check(slice_stack(model="SPOT", termination="STOP", lifecycle=None))
    [bulk, grows, topology] = rules.check(slice_stack(target=4, configs=4, bulk=True))
    assert not bulk.ours and "[rule bulk-provisioning-model;" in str(bulk)
    assert not grows.ours and grows.rule == "bulk-grows-from-zero"
    for ours in (do_nothing, topology):
        assert ours.ours and f"rayslice's rule {ours.rule}, not Google's" in str(ours)
    only_ours = str(CloudRuleError([do_nothing]))
    assert "Google would refuse" not in only_ours and "rayslice's own" in only_ours
    assert "Google would refuse" in str(CloudRuleError([bulk]))


def test_every_rule_has_a_source_and_a_unique_id():
    ids = [r.id for r in rules.RULES]
    assert len(ids) == len(set(ids))
    assert all(r.source and ("http" in r.source or "discovery" in r.source) for r in rules.RULES)


def test_tpu_machine_comes_from_the_catalog():
    assert rules.tpu_machine("zones/z/machineTypes/ct6e-standard-8t") == ("v6e", 8)
    assert rules.tpu_machine("ct5p-hightpu-4t") == ("v5p", 4)
    assert rules.tpu_machine("n2-standard-16") is None and rules.tpu_machine(None) is None


@pytest.mark.parametrize(
    "seconds, broken", [("599", True), ("600", False), ("604800", False), ("604801", True)]
)
def test_a_resize_requests_run_duration_is_ten_minutes_to_seven_days(seconds, broken):
    request = make(
        bodies.RESIZE_REQUEST,
        "s-0-request",
        {
            "name": "s-0-request",
            "zone": "z",
            "instanceGroupManager": "s-0-mig",
            "resizeBy": 4,
            "requestedRunDuration": {"seconds": seconds},
        },
    )
    assert rule_ids(rules.Stack([request])) == (["resize-request-run-duration"] if broken else [])
