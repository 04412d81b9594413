"""Every REST body rayslice.cloud.bodies makes from what the program declares conforms to Google's
discovery documents (compute v1, tpu v2): each field exists in the request schema, with the
declared type and a listed enum value, and no output-only field is sent."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from rayslice.cloud import bodies, rules
from rayslice.infra.mocks import Registration, run_offline
from rayslice.infra.preview import stack_config
from rayslice.infra.program import main
from tests.recovery.discovery import method, problems

STACKS = Path(__file__).resolve().parents[2] / "infra"  # the example stacks, beside the program
EXAMPLES = sorted(p.name for p in STACKS.glob("Pulumi.example-*.yaml"))
_QUEUED = ["platform=tpu-vm", "acceleratorType=v6e-4", "zone=us-east5-a", "queued=true", "head=vm"]
# Beyond the examples: the branches that pick other fields (reservations, v5p, tpu7x on a head VM).
OVERRIDES = {
    "reserved": ["acceleratorType=v6e-16", "zone=us-east5-b", "capacity=reserved", "reservation=r1"],
    "v5p-compute": ["acceleratorType=v5p-16", "zone=us-east5-a", "platform=compute"],
    "external-ips": ["acceleratorType=v6e-4", "zone=us-east5-b", "externalIps=true", "head=vm"],
    "queued-flex": [*_QUEUED, "capacity=flex-start", "queueDeadlineHours=6"],
    "queued-reserved": [*_QUEUED, "capacity=reserved", "reservation=r1"],
    "queued-reserved-any": [*_QUEUED, "capacity=reserved"],
    "queued-calendar": [*_QUEUED, "capacity=reserved", "reservation=r1", "calendarMode=true"],
}


@cache
def _registrations(name: str) -> tuple[Registration, ...]:
    config = stack_config(str(STACKS / name), []) if name in EXAMPLES else stack_config(None, OVERRIDES[name])
    return tuple(run_offline(lambda: main().exports, config).registrations)


def _cloud(name: str) -> list[tuple[Registration, bodies.Request]]:
    return [(r, req) for r in _registrations(name) if (req := bodies.request(r.type, r.inputs)) is not None]


@pytest.mark.parametrize("name", [*EXAMPLES, *OVERRIDES])
def test_every_body_conforms_to_the_discovery_document(name):
    pairs = _cloud(name)
    assert pairs
    for registration, request in pairs:
        assert method(request.api, request.method)["request"]["$ref"] == request.schema
        where = f"{registration.name} ({request.method})"
        assert problems(request.api, {"$ref": request.schema}, request.body, where, request=True) == []


@pytest.mark.parametrize("name", [*EXAMPLES, *OVERRIDES])
def test_every_input_is_sent_or_kept_by_the_provider(name):
    """A new input the converter does not know would silently escape the rules."""
    for registration, _ in _cloud(name):
        unknown = set(registration.inputs) - bodies.consumed(registration.type) - bodies.PROVIDER_ONLY
        assert not unknown, (registration.type, unknown)


def test_every_compute_and_tpu_type_the_program_declares_has_a_converter():
    declared = {
        r.type
        for name in [*EXAMPLES, *OVERRIDES]
        for r in _registrations(name)
        if r.type.startswith(("gcp:compute/", "gcp:tpu/"))
    }
    assert declared and declared <= set(bodies.types())


def test_per_instance_config_is_a_create_instances_request():
    """magic-modules PerInstanceConfig.yaml: create_url createInstances, encoder wraps `instances`."""
    (config, request) = next(
        p for p in _cloud("Pulumi.example-compute-v6e-16.yaml") if p[0].type == bodies.PER_INSTANCE_CONFIG
    )
    assert request.method == "compute.instanceGroupManagers.createInstances"
    [instance] = request.body["instances"]
    assert instance["name"] == config.inputs["name"]
    assert set(instance["preservedState"]["internalIPs"]) == {"nic0"}


def test_template_fields_as_the_provider_sends_them():
    (_, request) = next(p for p in _cloud("reserved") if p[0].type == bodies.TEMPLATE)
    properties = request.body["properties"]
    assert properties["reservationAffinity"] == {
        "consumeReservationType": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": ["r1"],
    }
    assert properties["disks"][0]["initializeParams"]["diskSizeGb"] == "100"  # int64 as a string
    (template, _) = next(p for p in _cloud("reserved") if p[0].type == bodies.TEMPLATE)
    items = properties["metadata"]["items"]
    assert {i["key"]: i["value"] for i in items} == template.inputs["metadata"]
    assert len(properties["serviceAccounts"]) == 1
    # name_prefix plus the provider's suffix: a name the RFC1035 rule can check.
    assert (
        request.name and request.name.startswith("rayslice-slice-0-") and len(request.name) <= rules.NAME_MAX
    )


@pytest.mark.parametrize("prefix, suffix", [("p" * 37, 24), ("p" * 38, 9)])
def test_template_name_from_a_prefix(prefix, suffix):
    """pulumi-gcp's InstanceTemplate doc: 24 characters after a prefix of up to 37, else 9."""
    request = bodies.request(bodies.TEMPLATE, {"namePrefix": prefix})
    assert request is not None and request.name is not None and len(request.name) == len(prefix) + suffix


def test_mig_fields_as_the_provider_sends_them():
    props = {
        "name": "m",
        "targetSize": 0.0,
        "targetSizePolicies": [{"mode": "BULK"}],
        "instanceLifecyclePolicy": {"defaultActionOnFailure": "DO_NOTHING"},
        "updatePolicy": {"type": "PROACTIVE", "maxSurgeFixed": 0.0, "maxUnavailableFixed": 4.0},
    }
    request = bodies.request(bodies.MIG, props)
    assert request is not None
    assert request.body["targetSize"] == 0 and request.body["targetSizePolicy"] == {"mode": "BULK"}
    assert request.body["updatePolicy"]["maxUnavailable"] == {"fixed": 4}
    assert problems("compute", {"$ref": request.schema}, request.body, "mig", request=True) == []


def test_other_types_have_no_request():
    assert bodies.request("gcp:serviceaccount/account:Account", {"accountId": "a"}) is None
