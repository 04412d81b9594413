"""ClusterSpec: defaults, coercion, and one table row per validation error.

Every row of `ERRORS` is one invalid config; the test asserts that it yields exactly one problem
and that the message names the key and says what to do (the fragments listed in the row).
"""

from __future__ import annotations

import dataclasses
import typing

import pytest

from rayslice import catalog, spec
from rayslice.spec import draft, model

BASE = {"acceleratorType": "v6e-16", "zone": "us-east5-b"}


def load(**overrides):
    return spec.load({**BASE, **overrides})


def problems(**overrides) -> list[str]:
    with pytest.raises(spec.SpecError) as err:
        load(**overrides)
    return err.value.problems


# ---- defaults and coercion ---------------------------------------------------------------------


def test_defaults():
    s = load()
    assert s.accelerator_type == "v6e-16" and s.tpu.hosts == 4
    assert (s.platform, s.slices, s.head, s.preset, s.ray_auth, s.capacity, s.recovery) == (
        "compute",
        1,
        "slice",
        "jax",
        "token",
        "on-demand",
        True,
    )
    assert s.tpu.machine_type == "ct6e-standard-4t" and s.runtime_version is None
    assert s.external_ips is False and s.allow_insecure_package_index is False
    assert s.package_index_credentials_secret is None and s.gke_authorized_networks == ()
    assert s.ray_version == spec.DEFAULT_RAY_VERSION
    assert s.head_machine_type == "n2-standard-16"


@pytest.mark.parametrize(
    "accelerator, zone, platform",
    [
        ("v6e-16", "us-east5-b", "compute"),
        ("v5p-16", "us-east5-a", "compute"),
        ("tpu7x-16", "us-central1-c", "compute"),
        ("v5litepod-16", "us-south1-a", "tpu-vm"),
        ("v4-16", "us-central2-b", "tpu-vm"),
        ("v2-8", "us-central1-b", "tpu-vm"),
        ("tpu7-8", "us-central1-c", "gke"),
    ],
)
def test_default_platform_per_generation(accelerator, zone, platform):
    assert spec.load({"acceleratorType": accelerator, "zone": zone}).platform == platform


def test_tpu_vm_fills_the_runtime_version():
    s = load(platform="tpu-vm")
    assert (s.platform, s.runtime_version, s.tpu.machine_type) == ("tpu-vm", "v2-alpha-tpuv6e", None)


@pytest.mark.parametrize(
    "overrides, head",
    [
        ({}, "slice"),
        ({"slices": "2"}, "vm"),
        ({"capacity": "spot"}, "vm"),
        ({"capacity": "spot", "recovery": "false"}, "vm"),
        ({"capacity": "spot", "recovery": "false", "head": "slice"}, "slice"),
        ({"capacity": "reserved", "reservation": "team-v6e"}, "slice"),
        ({"minSlices": "0"}, "vm"),  # elastic: the head outlives every slice
    ],
)
def test_head_default(overrides, head):
    assert load(**overrides).head == head


def test_strings_are_coerced_like_pulumi_config():
    s = load(
        slices="2",
        externalIps="true",
        recovery="false",
        labels='{"team": "ml"}',
        requirements='["optax>=0.2"]',
        dashboardSourceRanges="10.0.0.0/8\n192.168.0.0/16",
    )
    assert (s.slices, s.external_ips, s.recovery, dict(s.labels), s.requirements) == (
        2,
        True,
        False,
        {"team": "ml"},
        ("optax>=0.2",),
    )
    assert s.dashboard_source_ranges == ("10.0.0.0/8", "192.168.0.0/16")


def test_zone_is_optional_for_the_simulator():
    assert spec.load({"acceleratorType": "v6e-16"}, require_zone=False).zone == "us-central1-b"


def test_spec_is_frozen():
    s = load()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.slices = 3  # type: ignore[misc]  # the point of the test


@pytest.mark.parametrize(
    "overrides",
    [
        {"slices": "2", "labels": {"team": "ml"}, "requirements": ["optax"], "platform": "tpu-vm"},
        {"capacity": "spot", "recovery": "false", "dashboardSourceRanges": ["10.0.0.0/8"]},
        {"platform": "gke", "gkeAuthorizedNetworks": ["10.1.0.0/16"], "kuberay": "addon"},
        {
            "packageIndex": "https://pypi.internal/simple",
            "packageIndexCredentialsSecret": "pip-cred",
            "allowForeignPackageIndexSecret": "true",
        },
    ],
)
def test_as_config_round_trips(overrides):
    s = load(**overrides)
    config = s.as_config()
    assert set(config) == spec.KEY_NAMES
    assert spec.load(config) == s


def test_every_key_is_a_field_with_a_description():
    fields = {f.name for f in dataclasses.fields(spec.ClusterSpec)} - {"tpu"}
    assert {k.field for k in spec.KEYS} == fields
    for key in spec.KEYS:
        assert key.description.endswith((".", ")")), key.name
        assert key.type in ("string", "integer", "boolean", "array", "object"), key.name


def test_the_draft_has_every_spec_field_as_optional():
    """The rules read a `Draft`; each of its fields is the spec's field, typed the same or None."""
    spec_types = typing.get_type_hints(model.ClusterSpec, include_extras=True)
    draft_types = typing.get_type_hints(draft.Draft, include_extras=True)
    del spec_types["tpu"]  # from the catalog, not a key
    assert set(draft_types) == {*spec_types, "refused"}
    for field, annotation in spec_types.items():
        assert draft_types[field] == annotation | None, field


@pytest.mark.parametrize(
    "overrides, secure",
    [
        ({"dashboardSourceRanges": ["10.0.0.0/8", "34.1.2.0/24"]}, "token auth"),
        ({"dashboardSourceRanges": ["10.0.0.0/8"], "rayAuth": "none"}, "private range, no auth"),
        (
            {
                "packageIndex": "https://pypi.internal/simple",
                "packageIndexCredentialsSecret": "pip-cred",
                "allowForeignPackageIndexSecret": "true",
            },
            "",
        ),
        ({"packageIndex": "http://mirror.lan/simple", "allowInsecurePackageIndex": "true"}, "opt-in"),
        ({"packageIndex": "file:///opt/wheels"}, "local"),
        ({"platform": "gke", "gkeAuthorizedNetworks": ["203.0.113.0/24"]}, "gke"),
        ({"platform": "gke", "headMachineType": "e2-standard-8"}, "gke head pool"),
        ({"slices": "2", "headMachineType": "c3-standard-22"}, "c3 in us-east5"),
        ({"acceleratorType": "v4-16", "zone": "us-central2-b", "head": "vm", "headMachineType": "m1-x"}, ""),
    ],
)
def test_valid_configs(overrides, secure):
    """Configs next to the refused ones below that must stay valid (`secure` says why)."""
    assert load(**overrides).name == "rayslice", secure


def test_an_elastic_cluster_keeps_slices_as_its_most_and_a_ceiling_it_can_pay():
    s = load(acceleratorType="v6e-4", slices="3", minSlices="0", idleTimeoutSeconds="90", maxUsdPerHour="25")
    assert (s.elastic, s.min_slices, s.slices, s.idle_timeout_seconds, s.max_usd_per_hour) == (
        True,
        0,
        3,
        90,
        25,
    )
    assert not load().elastic and load().idle_timeout_seconds == 600


def test_an_elastic_cluster_on_flex_start_asks_for_its_slices_for_max_run_hours():
    s = load(slices="2", minSlices="0", capacity="flex-start", maxRunHours="24", zone="us-east5-a")
    assert (s.elastic, s.waits_for_capacity, s.max_run_seconds) == (True, True, 86400)
    assert load().max_run_seconds is None


def test_head_machine_type_is_checked_only_where_a_head_machine_runs():
    # head=slice on one slice: no head VM, so the (unused) type is not refused.
    assert load(headMachineType="n1-standard-16").head == "slice"


# ---- one row per validation error ---------------------------------------------------------------

# (id, overrides on BASE, fragments the single problem must contain: the key, and the fix)
ERRORS = [
    ("unknown-key", {"acceleratortype": "v6e-16"}, ["did you mean 'acceleratorType'"]),
    (
        "host-image-name",
        {"hostImage": "My_Image"},
        ["hostImage='My_Image' is not a Compute Engine image", "projects/PROJECT/global/images/NAME"],
    ),
    ("host-image-family", {"hostImage": "global/images/family/x"}, ["is not a Compute Engine image"]),
    (
        "host-image-other-project",
        {"project": "my-project", "hostImage": "projects/their-project/global/images/img"},
        ["in project their-project, not the stack's project my-project"],
    ),
    (
        "host-image-not-compute",
        {"platform": "tpu-vm", "acceleratorType": "v6e-16", "hostImage": "img"},
        ["hostImage applies to platform=compute only", "runtime version picks the image"],
    ),
    (
        "host-image-gke",
        {"platform": "gke", "hostImage": "img"},
        ["hostImage applies to platform=compute only", "container image instead (docs/deploy-gke.md)"],
    ),
    ("unknown-key-far", {"colour": "red"}, ["unknown config key 'colour'", "known keys:"]),
    ("accelerator-unknown", {"acceleratorType": "v5p-7", "zone": "us-east5-a"}, ["v5p-8, v5p-16, v5p-32"]),
    (
        "generation-not-on-platform",
        {"platform": "compute", "acceleratorType": "v5litepod-16", "zone": "us-south1-a"},
        ["v5litepod is not available on compute", "offered on: tpu-vm, gke", "set platform"],
    ),
    (
        "tpu7x-not-on-tpu-vm",
        {"platform": "tpu-vm", "acceleratorType": "tpu7x-16", "zone": "us-central1-c"},
        ["offered on: compute, gke", "--set platform=compute"],
    ),
    ("v2-16-does-not-exist", {"platform": "tpu-vm", "acceleratorType": "v2-16"}, ["v2-8, v2-32"]),
    ("zone-without-generation", {"zone": "us-central2-b"}, ["does not offer TPU v6e", "us-east5-b"]),
    ("zone-malformed", {"zone": "moon-1"}, ["not a GCP zone name", "us-central1-b"]),
    (
        "runtime-other-generation",
        {"platform": "tpu-vm", "runtimeVersion": "v2-alpha-tpuv5"},
        ["built for v5p, not v6e", "use v2-alpha-tpuv6e"],
    ),
    ("runtime-malformed", {"platform": "tpu-vm", "runtimeVersion": "a b"}, ["not a runtime version name"]),
    (
        "runtime-on-gke",
        {"platform": "gke", "runtimeVersion": "v2-alpha-tpuv6e"},
        ["TPU VM API only", "remove"],
    ),
    ("runtime-on-compute", {"runtimeVersion": "v2-alpha-tpuv6e"}, ["TPU VM API only", "platform=compute"]),
    (
        "multislice-unsupported",
        {"platform": "tpu-vm", "acceleratorType": "v3-32", "zone": "us-central1-a", "slices": "2"},
        ["v3 does not support multislice", "use slices=1"],
    ),
    ("slices-out-of-range", {"slices": "0"}, ["out of range", "use 1 to 64"]),
    ("head-slice-multislice", {"slices": "2", "head": "slice"}, ["use head=vm for multislice"]),
    (
        "head-slice-spot",
        {"capacity": "spot", "head": "slice"},
        ["head=slice with capacity=spot", "use head=vm", "recovery=false"],
    ),
    (
        "head-machine-family-missing-in-zone",
        {"slices": "2", "headMachineType": "n1-standard-16"},
        ["'n1'", "not offered in zone us-east5-b", "a family it offers: c3, c4, e2, n2, n2d"],
    ),
    (
        "head-machine-family-unknown",
        {"head": "vm", "headMachineType": "zz9-standard-4"},
        ["'zz9'", "is unknown", "us-east5-b offers: c3, c4, e2, n2, n2d"],
    ),
    (
        "head-machine-family-gke-us-south1",
        {
            "platform": "gke",
            "acceleratorType": "v5litepod-16",
            "zone": "us-south1-a",
            "headMachineType": "n1-standard-8",
        },
        ["not offered in zone us-south1-a"],
    ),
    ("head-machine-malformed", {"headMachineType": "N2 big"}, ["not a machine type name", "n2-standard-16"]),
    ("name-uppercase", {"name": "Rayslice"}, ["name='Rayslice'", "GCP naming rules"]),
    ("name-underscore", {"name": "ray_slice"}, ["GCP naming rules", "lowercase"]),
    ("name-too-long", {"name": "a" * 41}, ["use 1-40 characters"]),
    ("name-trailing-hyphen", {"name": "x-"}, ["not ending in a hyphen"]),
    ("network-name", {"network": "my net"}, ["network='my net'", "valid GCP resource name"]),
    (
        "subnetwork-name",
        {"network": "vpc", "subnetwork": "$(touch /tmp/x)"},
        ["subnetwork='$(touch /tmp/x)'", "valid GCP resource name"],
    ),
    ("subnetwork-without-network", {"subnetwork": "tpu-subnet"}, ["set network to the VPC"]),
    ("project-id", {"project": "p"}, ["project='p'", "6-30 lowercase"]),
    ("label-key-uppercase", {"labels": {"Team": "ml"}}, ["GCP label rules", "start with a lowercase"]),
    ("label-value-uppercase", {"labels": {"team": "ML"}}, ["GCP label rules", "lowercase"]),
    ("label-value-space", {"labels": {"team": "a b"}}, ["GCP label rules"]),
    ("label-value-shell", {"labels": {"team": "$(id)"}}, ["GCP label rules"]),
    ("label-key-digit", {"labels": {"1team": "x"}}, ["GCP label rules"]),
    ("label-value-long", {"labels": {"t": "x" * 64}}, ["up to 63"]),
    ("labels-too-many", {"labels": {f"k{i}": "v" for i in range(61)}}, ["use at most 60"]),
    ("requirement-shell", {"requirements": ["$(touch /tmp/x)"]}, ["PEP 508", "e.g. 'optax>=0.2'"]),
    ("requirement-space", {"requirements": ["foo bar"]}, ["PEP 508"]),
    ("requirement-operator", {"requirements": ["numpy>>1"]}, ["PEP 508"]),
    ("requirement-backtick", {"requirements": ["`id`"]}, ["PEP 508"]),
    ("requirement-url", {"requirements": ["pkg @ https://x.invalid/p.whl"]}, ["use packageIndex"]),
    ("ray-version-short", {"rayVersion": "2.60"}, ["rayVersion", "malformed", "2.60.0"]),
    ("ray-version-word", {"rayVersion": "latest"}, ["malformed"]),
    ("ray-version-shell", {"rayVersion": "2.60.0; rm -rf /"}, ["malformed"]),
    ("ray-version-prefix", {"rayVersion": "v2.60.0"}, ["malformed"]),
    ("package-index-quote", {"packageIndex": "https://x.invalid/simple'; id"}, ["packageIndex", "https://"]),
    (
        "package-index-credentials",
        {"packageIndex": "https://user:pw@example.com/simple"},
        ["credentials in its URL", "packageIndexCredentialsSecret=<secret name>"],
    ),
    (
        "package-index-plain-http",
        {"packageIndex": "http://example.com/simple"},
        ["plain http", "use https://", "allowInsecurePackageIndex=true"],
    ),
    (
        "credentials-secret-without-index",
        {"packageIndexCredentialsSecret": "pip-cred", "allowForeignPackageIndexSecret": "true"},
        ["without packageIndex", "set packageIndex"],
    ),
    (
        "credentials-secret-path",
        {"packageIndex": "https://x.example/simple", "packageIndexCredentialsSecret": "projects/p/secrets/s"},
        ["not a Secret Manager secret name", "the secret's ID"],
    ),
    ("dashboard-not-cidr", {"dashboardSourceRanges": ["office"]}, ["not a CIDR range", "10.0.0.0/8"]),
    ("dashboard-everything", {"dashboardSourceRanges": ["0.0.0.0/0"]}, ["whole address space", "your own"]),
    (
        "dashboard-halves",
        {"dashboardSourceRanges": ["0.0.0.0/1", "128.0.0.0/1"]},
        ["0.0.0.0/1, 128.0.0.0/1 together cover the whole address space"],
    ),
    (
        "dashboard-pieces",
        {"dashboardSourceRanges": ["0.0.0.0/2", "64.0.0.0/2", "128.0.0.0/1"], "rayAuth": "none"},
        ["whole address space"],
    ),
    ("dashboard-ipv6-everything", {"dashboardSourceRanges": ["::/1", "8000::/1"]}, ["whole address space"]),
    (
        "dashboard-public-without-auth",
        {"dashboardSourceRanges": ["34.1.2.0/24"], "rayAuth": "none"},
        ["public range", "remote code execution", "set rayAuth=token"],
    ),
    ("gke-cluster-on-compute", {"gkeCluster": "prod"}, ["gkeCluster applies to platform=gke only"]),
    (
        "gke-authorized-networks-on-compute",
        {"gkeAuthorizedNetworks": ["10.0.0.0/8"]},
        ["gkeAuthorizedNetworks applies to platform=gke only"],
    ),
    (
        "gke-authorized-networks-everything",
        {"platform": "gke", "gkeAuthorizedNetworks": ["0.0.0.0/0"]},
        ["whole address space", "GKE control-plane endpoint"],
    ),
    (
        "gke-authorized-networks-not-cidr",
        {"platform": "gke", "gkeAuthorizedNetworks": ["office"]},
        ["gkeAuthorizedNetworks: 'office' is not a CIDR range"],
    ),
    ("gke-reserved-needs-reservation", {"platform": "gke", "capacity": "reserved"}, ["reservation=<name"]),
    (
        "gke-cluster-with-network",
        {"platform": "gke", "gkeCluster": "team", "network": "x-net"},
        ["network is not used with gkeCluster", "remove network"],
    ),
    ("choice-platform", {"platform": "tpu-pod"}, ["platform='tpu-pod' is not valid", "compute, tpu-vm, gke"]),
    (
        "choice-capacity",
        {"capacity": "cheap"},
        ["capacity='cheap' is not valid", "on-demand, spot, reserved, flex-start"],
    ),
    (
        "gke-flex-start-leaves-out-v4",
        {"platform": "gke", "acceleratorType": "v4-16", "zone": "us-central2-b", "capacity": "flex-start"},
        ["capacity=flex-start on gke does not offer v4"],
    ),
    (  # D7: flex-start only where Google takes it (catalog.FLEX_START_ZONES)
        "flex-start-zone-compute",
        {"platform": "compute", "capacity": "flex-start", "zone": "us-east5-b"},
        ["capacity=flex-start on compute is not offered for v6e in zone us-east5-b", "use zone=us-east5-a"],
    ),
    (
        "flex-start-zone-tpu-vm",
        {"platform": "tpu-vm", "capacity": "flex-start", "queued": "true", "zone": "us-east5-b"},
        ["capacity=flex-start on tpu-vm is not offered for v6e in zone us-east5-b", "use zone=us-east5-a"],
    ),
    (
        "flex-start-generation-compute",
        {"platform": "compute", "acceleratorType": "v5p-16", "zone": "us-east5-a", "capacity": "flex-start"},
        ["capacity=flex-start on compute does not offer v5p", "takes tpu7x, v6e"],
    ),
    (  # N5 (issue 51): GKE's flex-start zones and generations
        "flex-start-zone-gke",
        {"platform": "gke", "capacity": "flex-start", "zone": "us-central1-b"},
        ["capacity=flex-start on gke is not offered for v6e in zone us-central1-b", "use zone=us-east5-a"],
    ),
    (
        "flex-start-generation-gke",
        {
            "platform": "gke",
            "acceleratorType": "tpu7x-128",
            "zone": "us-central1-c",
            "capacity": "flex-start",
        },
        ["capacity=flex-start on gke does not offer tpu7x", "takes v5litepod, v5p, v6e"],
    ),
    (  # N4 (issue 51): All Capacity reservations
        "choice-capacity-mode",
        {"capacity": "reserved", "reservation": "r1", "capacityMode": "self-managed"},
        ["capacityMode='self-managed' is not valid", "managed, all-capacity"],
    ),
    (
        "all-capacity-needs-a-reservation",
        {"platform": "compute", "capacity": "reserved", "capacityMode": "all-capacity"},
        ["capacityMode=all-capacity applies to capacity=reserved with a named reservation"],
    ),
    (
        "all-capacity-on-compute-only",
        {
            "platform": "tpu-vm",
            "capacity": "reserved",
            "reservation": "r1",
            "queued": "true",
            "capacityMode": "all-capacity",
        },
        ["capacityMode=all-capacity is offered on platform=compute only"],
    ),
    (
        "all-capacity-not-calendar",
        {
            "platform": "compute",
            "capacity": "reserved",
            "reservation": "r1",
            "calendarMode": "true",
            "capacityMode": "all-capacity",
        },
        ["capacityMode=all-capacity and calendarMode name two kinds of reservation"],
    ),
    (  # D6: a calendar-mode reservation is named, and consumed through a queued resource on tpu-vm
        "calendar-needs-a-reservation",
        {"platform": "tpu-vm", "capacity": "reserved", "queued": "true", "calendarMode": "true"},
        ["calendarMode applies to capacity=reserved with a named reservation"],
    ),
    (
        "calendar-tpu-vm-is-queued",
        {"platform": "tpu-vm", "capacity": "reserved", "reservation": "r1", "calendarMode": "true"},
        ["calendarMode on platform=tpu-vm is consumed through a queued resource", "set queued=true"],
    ),
    (
        "calendar-not-on-gke",
        {"platform": "gke", "capacity": "reserved", "reservation": "r1", "calendarMode": "true"},
        ["calendarMode is not offered on platform=gke"],
    ),
    (
        "compute-reserved-needs-reservation",
        {"platform": "compute", "capacity": "reserved"},
        ["capacity=reserved on compute needs reservation=<name", "RESERVATION_BOUND"],
    ),
    (
        "tpu-vm-flex-start-is-queued",
        {"platform": "tpu-vm", "capacity": "flex-start", "zone": "us-east5-a"},
        ["capacity=flex-start on platform=tpu-vm is a queued request: set queued=true"],
    ),
    (
        "queued-is-tpu-vm-only",
        {"platform": "compute", "queued": "true"},
        ["queued=true applies to platform=tpu-vm only", "capacity=flex-start"],
    ),
    (
        "tpu-vm-reservation-name-needs-queued",
        {"platform": "tpu-vm", "capacity": "reserved", "reservation": "r1"},
        ["reservation on platform=tpu-vm is named through a queued resource: set queued=true"],
    ),
    (
        "reservation-without-reserved",
        {"capacity": "spot", "reservation": "r1"},
        ["reservation is used with capacity=reserved only"],
    ),
    (
        "max-run-hours-out-of-range",
        {"platform": "compute", "capacity": "flex-start", "maxRunHours": "169", "zone": "us-east5-a"},
        ["maxRunHours=169 is out of range; use 1 to 168"],
    ),
    (
        "max-run-hours-needs-flex-start",
        {"capacity": "spot", "maxRunHours": "5"},
        ["maxRunHours applies to capacity=flex-start only"],
    ),
    (
        "queue-deadline-needs-queued",
        {"platform": "tpu-vm", "queueDeadlineHours": "5"},
        ["queueDeadlineHours applies to queued=true"],
    ),
    ("choice-head", {"head": "laptop"}, ["head='laptop' is not valid", "slice, vm"]),
    ("choice-preset", {"preset": "tf"}, ["preset='tf' is not valid", "jax, xla"]),
    ("choice-ray-auth", {"rayAuth": "disabled"}, ["rayAuth='disabled' is not valid", "token, none"]),
    ("choice-kuberay", {"kuberay": "manual"}, ["kuberay='manual' is not valid", "helm, addon"]),
    ("type-integer", {"slices": "two"}, ["slices must be a whole number"]),
    ("type-integer-bool", {"slices": True}, ["slices must be a whole number"]),
    ("type-boolean", {"externalIps": "yes"}, ["externalIps must be true or false"]),
    ("type-boolean-recovery", {"recovery": "off"}, ["recovery must be true or false"]),
    ("type-mapping", {"labels": "[1]"}, ["labels must be a mapping of strings"]),
    ("type-list", {"requirements": '{"a": 1}'}, ["requirements must be a list of strings"]),
    ("type-string", {"zone": ["us-east5-b"]}, ["zone must be a string"]),
    # Control and format characters are refused while the value is read, before any rule.
    ("name-trailing-newline", {"name": "ray\n"}, ["name must be printable text", "U+000A"]),
    ("project-trailing-newline", {"project": "my-project\n"}, ["project must be printable", "U+000A"]),
    ("network-trailing-newline", {"network": "vpc\n"}, ["network must be printable", "U+000A"]),
    ("machine-trailing-newline", {"headMachineType": "n2-standard-8\n"}, ["headMachineType must be"]),
    ("label-value-trailing-newline", {"labels": {"team": "ml\n"}}, ["labels must be printable"]),
    ("label-key-escape", {"labels": {"te\x1bam": "ml"}}, ["labels must be printable", "U+001B"]),
    ("zone-carriage-return", {"zone": "us-east5-b\r"}, ["zone must be printable", "U+000D"]),
    ("name-bidi-override", {"name": "ray\u202e"}, ["name must be printable", "U+202E"]),
    ("marker-newline", {"requirements": ['optax; python_version < "3.1\n2"']}, ["requirements must be"]),
    ("marker-vertical-tab", {"requirements": ['optax; os_name == "posix\x0b"']}, ["U+000B"]),
    ("marker-line-separator", {"requirements": ['optax; os_name == "a\u2028b"']}, ["U+2028"]),
    ("label-value-nested", {"labels": {"team": {"a": "b"}}}, ["labels must be a string or a number"]),
    ("label-value-list", {"labels": {"team": ["a"]}}, ["labels must be a string or a number"]),
    ("integer-non-ascii-digits", {"slices": "\u0662"}, ["slices must be a whole number written in ASCII"]),
    ("integer-underscore", {"slices": "1_0"}, ["ASCII digits"]),
    ("integer-trailing-newline", {"slices": "2\n"}, ["slices must be printable"]),
    ("ray-version-non-ascii-digits", {"rayVersion": "\u0662.60.0"}, ["rayVersion", "malformed"]),
    (
        "package-index-query-token",
        {"packageIndex": "https://idx.example/simple?token=abc"},
        ["query or fragment", "packageIndexCredentialsSecret=<secret name>"],
    ),
    ("package-index-fragment", {"packageIndex": "https://idx.example/simple#t"}, ["query or fragment"]),
    ("package-index-non-ascii", {"packageIndex": "https://idx.example/\u0455imple"}, ["packageIndex="]),
    (
        "dashboard-wide-public",
        {"dashboardSourceRanges": ["34.0.0.0/7"]},
        ["cover 33,554,432 addresses", "more than a /8", "allowWideDashboardRanges=true"],
    ),
    (
        "dashboard-all-nines-but-one",
        {"dashboardSourceRanges": [f"{n >> 1}.{(n & 1) * 128}.0.0/9" for n in range(1, 512)]},
        ["more than a /8", "allowWideDashboardRanges"],
    ),
    (
        "elastic-min-not-below-max",
        {"slices": "2", "minSlices": "2"},
        ["minSlices=2 with slices=2", "use 0 to 1"],
    ),
    ("elastic-negative-min", {"slices": "2", "minSlices": "-1"}, ["minSlices=-1"]),
    (
        "elastic-on-gke",
        {"slices": "2", "minSlices": "0", "platform": "gke"},
        ["needs platform=compute", "autoscaler"],
    ),
    (
        "elastic-on-tpu-vm",
        {"slices": "2", "minSlices": "0", "platform": "tpu-vm"},
        ["needs platform=compute", "Pulumi does not know about"],
    ),
    (
        "elastic-queued-on-tpu-vm",
        {"slices": "2", "minSlices": "0", "platform": "tpu-vm", "queued": "true"},
        ["needs platform=compute", "queued resource", "capacity=flex-start gives slices that wait"],
    ),
    ("elastic-head-on-a-slice", {"slices": "1", "minSlices": "0", "head": "slice"}, ["use head=vm"]),
    (
        "elastic-without-controller",
        {"slices": "2", "minSlices": "0", "recovery": "false"},
        ["recovery=false"],
    ),
    (
        "elastic-flex-start-ceiling-without-a-price",
        {
            "slices": "2",
            "minSlices": "0",
            "capacity": "flex-start",
            "maxUsdPerHour": "100",
            "zone": "us-east5-a",
        },
        ["no list price of v6e-16 on flex-start", "remove maxUsdPerHour"],
    ),
    (
        "elastic-idle-zero",
        {"slices": "2", "minSlices": "0", "idleTimeoutSeconds": "0"},
        ["idleTimeoutSeconds=0 is out of range; use 1 to 604,800"],
    ),
    ("idle-without-elastic", {"idleTimeoutSeconds": "60"}, ["elastic clusters only", "set minSlices"]),
    ("ceiling-without-elastic", {"maxUsdPerHour": "60"}, ["maxUsdPerHour applies to elastic"]),
    (
        "ceiling-below-the-minimum",
        {"acceleratorType": "v6e-4", "slices": "3", "minSlices": "2", "maxUsdPerHour": "20"},
        ["maxUsdPerHour=20 is below the 2 slice(s)", "$21.60/h"],
    ),
    (
        "dashboard-wide-ipv6",
        {"dashboardSourceRanges": ["2600::/31"]},
        ["public IPv6 ranges together cover", "more than a /32"],
    ),
]


@pytest.mark.parametrize("overrides, fragments", [row[1:] for row in ERRORS], ids=[row[0] for row in ERRORS])
def test_validation_error(overrides, fragments):
    [message] = problems(**overrides)
    for fragment in fragments:
        assert fragment in message, message


def test_error_ids_are_unique():
    assert len({row[0] for row in ERRORS}) == len(ERRORS)


def test_missing_zone_names_where_the_generation_is():
    with pytest.raises(spec.SpecError) as err:
        spec.load({"acceleratorType": "v5p-16"})
    assert err.value.problems == [
        "zone is not set: set rayslice:zone or gcp:zone (v5p is offered in us-central1-a, us-east5-a)"
    ]


@pytest.mark.parametrize("slices, longest_ok", [(1, 32), (10, 32), (11, 31)])
def test_gke_name_leaves_room_for_the_longest_node_pool(slices, longest_ok):
    """GKE allows 40 characters per node pool; "<name>-slice-<last index>" is the longest."""
    gke = {"platform": "gke", "slices": slices, "head": "vm"}
    assert len(load(**gke, name="a" * longest_ok).slice_name(slices - 1)) <= spec.GKE_NODE_POOL_NAME_MAX
    [problem] = problems(**gke, name="a" * (longest_ok + 1))
    assert f"shorten name to at most {longest_ok} characters" in problem
    assert load(name="a" * (longest_ok + 1), slices=slices, head="vm").name  # TPU VM names may be longer


@pytest.mark.parametrize(
    "overrides, refused",
    [
        # Derived as compute, the platform would refuse runtimeVersion too.
        ({"platform": "tpu-pod", "runtimeVersion": "v2-alpha-tpuv6e"}, "platform='tpu-pod'"),
        # Derived as vm (spot), the head's n1 machine type would be refused in us-east5-b.
        ({"head": "laptop", "capacity": "spot", "headMachineType": "n1-standard-16"}, "head='laptop'"),
        # Absent, the zone would be reported as not set.
        ({"zone": ["us-east5-b"]}, "zone must be a string"),
    ],
)
def test_a_refused_derived_key_is_not_derived(overrides, refused):
    """Only the user's wrong value is reported, nothing that would follow from a default guessed for it."""
    [problem] = problems(**overrides)
    assert refused in problem


def test_every_problem_is_reported_at_once():
    found = problems(acceleratorType="v5p-7", slices="x", preset="tf", labels={"A": "b"})
    assert len(found) == 4


def test_field_and_cross_field_problems_are_reported_together():
    found = problems(
        rayAuth="none", dashboardSourceRanges=["8.8.8.0/24"], recovery="maybe", packageIndex="http://x.lan/s"
    )
    assert len(found) == 3, found
    assert any("remote code execution" in p for p in found)
    assert any("recovery must be true or false" in p for p in found)
    assert any("plain http" in p for p in found)


# ---- the machine-family table ---------------------------------------------------------------------


def test_default_head_machine_type_exists_in_every_settled_catalog_zone():
    zones = {z for g in catalog.GENERATIONS for z in g.zones}
    assert zones <= set(catalog.MACHINE_FAMILIES_BY_ZONE), zones - set(catalog.MACHINE_FAMILIES_BY_ZONE)
    [default] = [k.default for k in spec.KEYS if k.name == "headMachineType"]
    assert default == "n2-standard-16"
    family = catalog.machine_family(default)
    for zone in sorted(zones):
        families = catalog.zone_machine_families(zone)
        assert families is None or family in families, zone


@pytest.mark.parametrize("zone", ["us-east5-a", "us-east5-b", "us-south1-a"])
def test_n1_is_refused_where_compute_engine_lacks_it(zone):
    assert "n1" in str(catalog.head_machine_problem("n1-standard-16", zone))
    assert catalog.head_machine_problem("n2d-standard-16", zone) is None


def test_c3_is_refused_in_asia_east1():
    assert "not offered in zone asia-east1-c" in str(
        catalog.head_machine_problem("c3-standard-8", "asia-east1-c")
    )
    v2 = spec.load({"platform": "tpu-vm", "acceleratorType": "v2-8", "zone": "asia-east1-c", "head": "vm"})
    assert v2.head_machine_type == "n2-standard-16"  # the default exists there


def test_unsettled_zone_accepts_any_family():
    assert catalog.zone_machine_families("us-central2-b") is None
    assert catalog.head_machine_problem("n1-standard-16", "us-central2-b") is None


@pytest.mark.parametrize("machine_type", ["c4a-standard-8", "t2a-standard-8", "n4a-standard-8"])
@pytest.mark.parametrize("zone", ["us-central1-a", "us-central2-b"])
def test_an_arm_head_is_refused_in_every_zone(machine_type, zone):
    """The hosts' locks are x86_64 (`locks.PLATFORM`): a stack cannot ask for an aarch64 head,
    not even in a zone whose machine families no source settled."""
    raw = {"acceleratorType": "v4-8" if zone == "us-central2-b" else "v5litepod-8", "zone": zone}
    with pytest.raises(spec.SpecError, match=r"is Arm \(aarch64\).*x86_64 lock") as refused:
        spec.load({**raw, "platform": "tpu-vm", "head": "vm", "headMachineType": machine_type})
    assert refused.value.exit_code == 2


# ---- where raw values come from -----------------------------------------------------------------


def test_stack_file_with_gcp_fallbacks(tmp_path):
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(
        "config:\n  gcp:project: my-project-1\n  gcp:zone: us-east5-a\n"
        "  rayslice:acceleratorType: v5p-16\n  rayslice:labels:\n    team: ml\n"
        "  rayslice:requirements:\n    - optax>=0.2\n"
    )
    s = spec.load_cli(str(path), ["slices=2"])
    assert (s.project, s.zone, s.accelerator_type, s.slices, dict(s.labels), s.requirements) == (
        "my-project-1",
        "us-east5-a",
        "v5p-16",
        2,
        {"team": "ml"},
        ("optax>=0.2",),
    )


def test_stack_file_unknown_rayslice_key_is_reported(tmp_path):
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text("config:\n  rayslice:zones: us-east5-a\n")
    with pytest.raises(spec.SpecError, match="did you mean 'zone'"):
        spec.load_cli(str(path), [])


def test_stack_file_problems(tmp_path):
    with pytest.raises(spec.SpecError, match="cannot read stack file"):
        spec.read_stack_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("config: [\n")
    with pytest.raises(spec.SpecError, match="not valid YAML"):
        spec.read_stack_file(bad)


def test_override_syntax():
    with pytest.raises(spec.SpecError, match="KEY=VALUE"):
        spec.parse_overrides(["slices"])
    assert spec.parse_overrides(["rayslice:zone=us-east5-a"]) == {"zone": "us-east5-a"}


# A stack file whose labels hold nine levels of nine aliases: 387 million strings in 400 bytes.
ALIAS_BOMB = "\n".join(
    ["config:", "  rayslice:labels:", f"    l0: &l0 [{', '.join(['lol'] * 9)}]"]
    + [f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
)


def test_stack_file_alias_bomb_is_refused_before_it_expands(tmp_path):
    path = tmp_path / "Pulumi.bomb.yaml"
    path.write_text(ALIAS_BOMB + "\n")
    with pytest.raises(spec.SpecError, match=r"aliases \(\*name\) expand it to more than 100,000 values"):
        spec.read_stack_file(path)


def test_stack_file_aliases_within_the_limit_are_read(tmp_path):
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text("base: &r\n  - optax>=0.2\nconfig:\n  rayslice:requirements: *r\n")
    assert spec.read_stack_file(path) == {"requirements": ["optax>=0.2"]}


@pytest.mark.parametrize(
    "text, message",
    [
        ("config:\n  rayslice:labels: &a\n    x: *a\n", "refers to the node that contains it"),
        ("- config\n", "must be a mapping with a 'config' key"),
        ("config:\n  rayslice:labels: " + "[" * 3000 + "]" * 3000 + "\n", "nested too deeply"),
    ],
)
def test_stack_file_shapes_that_are_no_stack_file(tmp_path, text, message):
    path = tmp_path / "Pulumi.bad.yaml"
    path.write_text(text)
    with pytest.raises(spec.SpecError, match=message):
        spec.read_stack_file(path)


@pytest.mark.parametrize(
    "field, value",
    [
        ("name", "ray\n"),
        ("project", "my-project\n"),
        ("network", "vpc\n"),
        ("zone", "us-east5-b\n"),
        ("head_machine_type", "n2-standard-8\n"),
        ("runtime_version", "v2-alpha-tpuv6e\n"),
        ("ray_version", "2.60.0\n"),
        ("ray_version", "\u0662.60.0"),
        ("package_index", "https://idx.example/simple\n"),
        ("package_index_credentials_secret", "pip-cred\n"),
        ("labels", {"team": "ml\n"}),
        ("labels", {"team\n": "ml"}),
    ],
)
def test_the_rules_refuse_a_trailing_newline_and_foreign_digits_on_their_own(monkeypatch, field, value):
    """Reading refuses control characters first; the rules' patterns hold without that (whole
    value, ASCII classes), so neither check rests on the other."""
    monkeypatch.setattr(draft, "coerce", lambda key, raw: raw)  # values arrive typed, unchecked
    key = next(k.name for k in model.KEYS if k.field == field)
    raw = {**BASE, "platform": "tpu-vm", key: value}
    if field == "package_index_credentials_secret":
        raw["packageIndex"] = "https://idx.example/simple"
    with pytest.raises(spec.SpecError) as err:
        spec.load(raw)
    assert len(err.value.problems) == 1 and key in err.value.problems[0], err.value.problems


def test_requirements_with_markers_are_kept_literally():
    line = 'requests; python_version < "3.12"'
    assert load(requirements=[line]).requirements == (line,)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            {"platform": "compute", "capacity": "flex-start", "zone": "us-east5-a"},
            ("flex-start", 168, False, None),
        ),
        (
            {"platform": "compute", "capacity": "flex-start", "maxRunHours": "24", "zone": "us-east5-a"},
            ("flex-start", 24, False, None),
        ),
        (
            {
                "platform": "tpu-vm",
                "capacity": "flex-start",
                "queued": "true",
                "queueDeadlineHours": "6",
                "zone": "us-east5-a",
            },
            ("flex-start", 168, True, 6),
        ),
        ({"platform": "tpu-vm", "capacity": "spot", "queued": "true"}, ("spot", None, True, None)),
        (
            {"platform": "tpu-vm", "capacity": "reserved", "queued": "true", "reservation": "r1"},
            ("reserved", None, True, None),
        ),
        ({"platform": "tpu-vm", "capacity": "reserved"}, ("reserved", None, False, None)),
    ],
)
def test_capacity_per_platform_is_accepted(overrides, expected):
    s = load(**overrides)
    assert (s.capacity, s.max_run_hours, s.queued, s.queue_deadline_hours) == expected


@pytest.mark.parametrize(
    "image", ["rayslice-host-0123abcd", "global/images/img", "projects/my-project/global/images/img"]
)
def test_host_image_takes_a_name_or_a_link_in_the_stacks_project(image):
    assert load(project="my-project", hostImage=image).host_image == image
