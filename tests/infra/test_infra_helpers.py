"""Pure helpers of rayslice.infra: firewall rules, names, labels, scheduling, gcloud commands."""

from __future__ import annotations

import ipaddress
import shlex

import pytest

from rayslice import spec
from rayslice.catalog import region_of
from rayslice.infra import access
from rayslice.infra.compute import template as compute_template
from rayslice.infra.firewall import IAP_SOURCE_RANGE, cluster_tag, firewall_rules, head_tag, slice_tags
from rayslice.infra.identity import account_id
from rayslice.infra.labels import resource_labels
from rayslice.infra.tpu_vm.slice import accelerator_config, scheduling


def _spec(**raw):
    return spec.load({"acceleratorType": "v6e-16", "zone": "us-east5-b", **raw})


def test_firewall_rules_without_dashboard_ranges():
    rules = {r.suffix: r for r in firewall_rules(_spec())}
    assert set(rules) == {"internal", "iap-ssh"}
    assert rules["internal"].source_tags == rules["internal"].target_tags == ("rayslice-host",)
    assert rules["internal"].source_ranges == ()
    assert rules["iap-ssh"].source_ranges == (IAP_SOURCE_RANGE,)
    assert rules["iap-ssh"].protocols == (("tcp", ("22",)),)


def test_dashboard_rule_targets_only_the_head():
    rules = {
        r.suffix: r for r in firewall_rules(_spec(dashboardSourceRanges=["10.0.0.0/8", "192.168.1.0/24"]))
    }
    assert rules["dashboard"].source_ranges == ("10.0.0.0/8", "192.168.1.0/24")
    assert rules["dashboard"].target_tags == ("rayslice-head",)
    assert rules["dashboard"].protocols == (("tcp", ("8265",)),)


def test_a_rule_holds_one_ip_version_and_its_name_fits_even_for_the_longest_cluster_name():
    """Compute Engine takes IPv4 or IPv6 ranges in a rule, not both (Google's "Use VPC firewall
    rules"): mixed dashboard ranges become two rules, and so does the controller's deny."""
    name = "c" * 40  # the longest name the spec takes
    rules = firewall_rules(
        _spec(
            name=name,
            slices=2,
            capacity="spot",
            dashboardSourceRanges=["10.0.0.0/8", "fd00::/8", "192.168.1.0/24"],
        )
    )
    by_suffix = {r.suffix: r.source_ranges for r in rules}
    assert by_suffix["dashboard"] == ("10.0.0.0/8", "192.168.1.0/24")
    assert by_suffix["dashboard-v6"] == ("fd00::/8",)
    assert by_suffix["controller-deny"] == ("0.0.0.0/0",) and by_suffix["controller-deny-v6"] == ("::/0",)
    for rule in rules:
        assert len({ipaddress.ip_network(r).version for r in rule.source_ranges}) <= 1, rule.suffix
        assert len(f"{name}-fw-{rule.suffix}") <= 63  # RFC 1035, Firewall.name
    only_v6 = {r.suffix: r.source_ranges for r in firewall_rules(_spec(dashboardSourceRanges=["fd00::/8"]))}
    assert only_v6["dashboard"] == ("fd00::/8",) and "dashboard-v6" not in only_v6


def test_head_tag_goes_to_slice_zero_only_with_head_on_the_slice():
    on_slice = _spec()
    assert slice_tags(on_slice, 0) == [cluster_tag(on_slice), head_tag(on_slice)]
    with_vm = _spec(slices=2, head="vm")
    assert [slice_tags(with_vm, i) for i in range(2)] == [[cluster_tag(with_vm)]] * 2


def test_account_id_fits_gcp_rules_and_stays_unique():
    assert account_id("rayslice") == "rayslice-hosts"
    long_a, long_b = "a" * 35 + "-one", "a" * 35 + "-two"
    ids = {account_id(long_a), account_id(long_b)}
    assert len(ids) == 2
    assert all(6 <= len(i) <= 30 and not i.endswith("-") and i[0].isalpha() for i in ids)


def test_labels_keep_the_users_and_add_rayslice_ones():
    labels = resource_labels(_spec(labels={"team": "ml", "rayslice-cluster": "spoofed"}), "tpu-slice", 1)
    assert labels == {
        "team": "ml",
        "rayslice-cluster": "rayslice",
        "rayslice-role": "tpu-slice",
        "rayslice-slice": "1",
        "managed-by": "rayslice",
    }


def test_scheduling_per_capacity():
    def tpu_vm(**keys: str):
        return scheduling(_spec(platform="tpu-vm", **keys))

    assert tpu_vm() is None
    assert tpu_vm(capacity="spot").spot is True
    assert tpu_vm(capacity="reserved").reserved is True


def test_region_of_zone():
    assert region_of("us-east5-b") == "us-east5"
    assert region_of("europe-west4-a") == "europe-west4"


def test_commands_are_shell_safe_and_go_through_iap():
    tunnel = access.tpu_dashboard_tunnel("s-0", "us-east5-b", "p-1", "10.0.0.5")
    # GA `gcloud compute tpus tpu-vm ssh` lists only --internal-ip (its reference's synopsis);
    # the alpha command has --tunnel-through-iap
    # (cloud.google.com/sdk/gcloud/reference/alpha/compute/tpus/tpu-vm/ssh).
    assert shlex.split(tunnel) == [
        "gcloud",
        "alpha",
        "compute",
        "tpus",
        "tpu-vm",
        "ssh",
        "s-0",
        "--zone=us-east5-b",
        "--project=p-1",
        "--worker=0",
        "--tunnel-through-iap",
        "--",
        "-N",
        "-L",
        "8265:10.0.0.5:8265",
    ]
    assert shlex.split(access.vm_ssh("head", "us-east5-b", None)) == [
        "gcloud",
        "compute",
        "ssh",
        "head",
        "--zone=us-east5-b",
        "--tunnel-through-iap",
    ]
    assert access.tpu_ssh("s", "z-a1-b", None, worker="all").endswith("--worker=all --tunnel-through-iap")
    assert (
        access.token_command("t", "p-1") == "gcloud secrets versions access latest --secret=t --project=p-1"
    )
    assert access.jobs_api_address("10.0.0.5") == "http://10.0.0.5:8265"


# Flags of each command, from the synopses of gcloud's reference pages (read 2026-12):
# - GA tpu-vm ssh: cloud.google.com/sdk/gcloud/reference/compute/tpus/tpu-vm/ssh (copied whole);
# - alpha tpu-vm ssh: the GA flags plus the alpha track's `--batch-size` and
#   `[--internal-ip|--tunnel-through-iap]` group, as on the alpha `tpu-vm scp` page and the
#   `queued-resources ssh` pages (.../alpha/compute/tpus/tpu-vm/ssh itself was not in the store);
# - compute ssh: .../reference/beta/compute/ssh's synopsis; the GA page has the same IAP flag
#   (cloud.google.com/sdk/gcloud/reference/compute/ssh). --project is a gcloud-wide flag.
GA_TPU_VM_SSH_FLAGS = {
    "--dry-run", "--force-key-file-overwrite", "--internal-ip", "--plain", "--ssh-flag",
    "--ssh-key-file", "--strict-host-key-checking", "--worker", "--zone", "--command",
    "--output-directory", "--ssh-key-expiration", "--ssh-key-expire-after",
}  # fmt: skip
ALPHA_TPU_VM_SSH_FLAGS = GA_TPU_VM_SSH_FLAGS | {"--tunnel-through-iap", "--batch-size"}
COMPUTE_SSH_FLAGS = {
    "--command", "--container", "--dry-run", "--force-key-file-overwrite", "--plain", "--ssh-flag",
    "--ssh-key-file", "--strict-host-key-checking", "--troubleshoot", "--zone", "--internal-ip",
    "--tunnel-through-iap", "--ssh-key-expiration", "--ssh-key-expire-after", "--network", "--region",
    "--dest-group",
}  # fmt: skip
GCLOUD_WIDE = {"--project"}


def _flags(command: str) -> tuple[list[str], set[str]]:
    words = shlex.split(command)
    gcloud_part = words[: words.index("--")] if "--" in words else words
    positional = [w for w in gcloud_part if not w.startswith("--")]
    return positional, {w.split("=", 1)[0] for w in gcloud_part if w.startswith("--")}


def test_every_emitted_flag_exists_on_the_command_it_is_passed_to():
    tpu = access.tpu_dashboard_tunnel("s-0", "us-east5-b", "team-p1", "10.0.0.5")
    words, flags = _flags(tpu)
    assert words[:6] == ["gcloud", "alpha", "compute", "tpus", "tpu-vm", "ssh"]
    assert flags <= ALPHA_TPU_VM_SSH_FLAGS | GCLOUD_WIDE
    assert not flags <= GA_TPU_VM_SSH_FLAGS | GCLOUD_WIDE  # why GA would not do: --tunnel-through-iap
    for command in (
        access.vm_ssh("h", "us-east5-b", "team-p1"),
        access.vm_dashboard_tunnel("h", "z-a1-b", None, "10.0.0.5"),
    ):
        words, flags = _flags(command)
        assert words[:3] == ["gcloud", "compute", "ssh"]
        assert "--tunnel-through-iap" in flags and flags <= COMPUTE_SSH_FLAGS | GCLOUD_WIDE


def test_topology_names_reach_the_tpu_api_as_type_and_topology():
    """`v4-4x4x8` used to go out as accelerator_type alone, and the API picked its own topology."""
    config = accelerator_config(spec.load({"acceleratorType": "v4-4x4x8", "zone": "us-central2-b"}))
    assert (config.type, config.topology) == ("V4", "4x4x8")
    config = accelerator_config(spec.load({"acceleratorType": "v5litepod-16", "zone": "us-west4-a"}))
    assert (config.type, config.topology) == ("V5LITE_POD", "4x4")


def test_compute_scheduling_per_capacity():
    """The template's scheduling is the stack's capacity cell, field for field."""
    spot = compute_template.scheduling(_spec(capacity="spot"))
    assert (spot.provisioning_model, spot.instance_termination_action, spot.preemptible) == (
        "SPOT",
        "STOP",
        True,
    )
    assert spot.automatic_restart is False and spot.on_host_maintenance == "TERMINATE"
    standard = compute_template.scheduling(_spec())
    assert (standard.provisioning_model, standard.on_host_maintenance) == ("STANDARD", "TERMINATE")
    assert standard.instance_termination_action is None and standard.automatic_restart is True
    reserved = compute_template.scheduling(_spec(capacity="reserved", reservation="r"))
    assert (reserved.provisioning_model, reserved.instance_termination_action) == (
        "RESERVATION_BOUND",
        "DELETE",
    )
    assert reserved.on_host_maintenance == "TERMINATE" and reserved.automatic_restart is True
    flex = compute_template.scheduling(_spec(capacity="flex-start", maxRunHours=2, zone="us-east5-a"))
    assert (flex.provisioning_model, flex.instance_termination_action) == ("FLEX_START", "DELETE")
    assert (
        flex.max_run_duration.seconds == 7200 and flex.automatic_restart is True
    )  # Compute Engine restarts it after a host error


def test_every_compute_mig_does_nothing_on_a_failed_host():
    """D3: a MIG's REPAIR recreates one host, which cannot rejoin the slice's ICI domain."""
    for keys in ({}, {"capacity": "spot"}, {"capacity": "reserved", "reservation": "r"}):
        policy = compute_template.lifecycle_policy(_spec(**keys))
        assert policy.default_action_on_failure == "DO_NOTHING"


def test_compute_reservation_affinity_and_image():
    named = compute_template.reservation_affinity(_spec(capacity="reserved", reservation="team-v6e"))
    assert named.type == "SPECIFIC_RESERVATION"
    assert (named.specific_reservation.key, named.specific_reservation.values) == (
        "compute.googleapis.com/reservation-name",
        ["team-v6e"],
    )
    with pytest.raises(spec.SpecError, match="capacity=reserved on compute needs reservation"):
        _spec(capacity="reserved")  # no ANY_RESERVATION template can be declared any more
    assert compute_template.reservation_affinity(_spec()) is None
    assert compute_template.source_image(_spec()) == (
        "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"
    )
    # A host image: a bare name in the template's own project, or the link as given.
    assert compute_template.source_image(_spec(hostImage="img")) == "global/images/img"
    linked = "projects/my-project/global/images/img"
    assert compute_template.source_image(_spec(hostImage=linked, project="my-project")) == linked
