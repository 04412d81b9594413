"""Every API enum value rayslice sends is one the API defines (issue 12 item 11).

google-api-python-client ships Google's discovery documents (compute v1, tpu v2): the
machine-readable contract of each API. Each row below names where a value sits in a
registered resource's inputs and the schema property that defines its enum; the test runs
the real program under Pulumi's mocks for a set of configurations and checks every value it
finds there. A typo or a renamed value fails here instead of in `pulumi up`.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

import pytest

from rayslice import catalog
from rayslice.infra.mocks import run_offline
from rayslice.infra.program import main
from rayslice.infra.tpu_vm.slice import API_ACCELERATOR_TYPES

# Type tokens of the resources that carry enum values, by short name.
TYPES = {
    "InstanceTemplate": "gcp:compute/instanceTemplate:InstanceTemplate",
    "ResourcePolicy": "gcp:compute/resourcePolicy:ResourcePolicy",
    "InstanceGroupManager": "gcp:compute/instanceGroupManager:InstanceGroupManager",
    "PerInstanceConfig": "gcp:compute/perInstanceConfig:PerInstanceConfig",
    "Address": "gcp:compute/address:Address",
    "Firewall": "gcp:compute/firewall:Firewall",
    "Network": "gcp:compute/network:Network",
    "RouterNat": "gcp:compute/routerNat:RouterNat",
    "V2Vm": "gcp:tpu/v2Vm:V2Vm",
}
# (resource, path into its inputs ("[]" walks a list), "document:Schema.property" of the enum)
ENUM_INPUTS = [
    ("InstanceTemplate", "scheduling.provisioningModel", "compute.v1:Scheduling.provisioningModel"),
    (
        "InstanceTemplate",
        "scheduling.instanceTerminationAction",
        "compute.v1:Scheduling.instanceTerminationAction",
    ),
    ("InstanceTemplate", "scheduling.onHostMaintenance", "compute.v1:Scheduling.onHostMaintenance"),
    ("InstanceTemplate", "reservationAffinity.type", "compute.v1:ReservationAffinity.consumeReservationType"),
    ("ResourcePolicy", "workloadPolicy.type", "compute.v1:ResourcePolicyWorkloadPolicy.type"),
    # (No target-size policy is sent since issue 19: bulk mode refuses STANDARD and SPOT templates.)
    (
        "InstanceGroupManager",
        "instanceLifecyclePolicy.defaultActionOnFailure",
        "compute.v1:InstanceGroupManagerInstanceLifecyclePolicy.defaultActionOnFailure",
    ),
    ("InstanceGroupManager", "updatePolicy.type", "compute.v1:InstanceGroupManagerUpdatePolicy.type"),
    (
        "InstanceGroupManager",
        "updatePolicy.minimalAction",
        "compute.v1:InstanceGroupManagerUpdatePolicy.minimalAction",
    ),
    (
        "InstanceGroupManager",
        "updatePolicy.replacementMethod",
        "compute.v1:InstanceGroupManagerUpdatePolicy.replacementMethod",
    ),
    (
        "PerInstanceConfig",
        "preservedState.internalIps.[].autoDelete",
        "compute.v1:PreservedStatePreservedNetworkIp.autoDelete",
    ),
    ("Address", "addressType", "compute.v1:Address.addressType"),
    ("Firewall", "direction", "compute.v1:Firewall.direction"),
    ("Network", "routingMode", "compute.v1:NetworkRoutingConfig.routingMode"),
    ("RouterNat", "natIpAllocateOption", "compute.v1:RouterNat.natIpAllocateOption"),
    ("RouterNat", "sourceSubnetworkIpRangesToNat", "compute.v1:RouterNat.sourceSubnetworkIpRangesToNat"),
    ("RouterNat", "logConfig.filter", "compute.v1:RouterNatLogConfig.filter"),
    ("V2Vm", "acceleratorConfig.type", "tpu.v2:AcceleratorConfig.type"),
]

BASE = {"rayslice:zone": "us-east5-b", "gcp:project": "my-gcp-project"}
# Configurations that between them reach every branch that picks an enum value.
CONFIGS = {
    "compute-on-demand": {"rayslice:acceleratorType": "v6e-16"},
    "compute-spot": {"rayslice:acceleratorType": "v6e-16", "rayslice:capacity": "spot"},
    # A compute reservation is always named now (the spec refuses reserved without one there).
    "tpu-vm-reserved": {
        "rayslice:acceleratorType": "v6e-16",
        "rayslice:platform": "tpu-vm",
        "rayslice:capacity": "reserved",
    },
    "compute-named-reservation": {
        "rayslice:acceleratorType": "v6e-16",
        "rayslice:capacity": "reserved",
        "rayslice:reservation": "team-v6e",
    },
    "tpu-vm": {"rayslice:acceleratorType": "v6e-16", "rayslice:platform": "tpu-vm"},
}


@cache
def _schemas(document: str) -> dict[str, Any]:
    text = (
        resources.files("googleapiclient.discovery_cache.documents").joinpath(f"{document}.json").read_text()
    )
    return json.loads(text)["schemas"]


def _enum(where: str) -> list[str]:
    document, _, field = where.partition(":")
    schema, _, prop = field.partition(".")
    values = _schemas(document)[schema]["properties"][prop]["enum"]
    assert values, where
    return values


def _values(inputs: Any, path: list[str]) -> list[Any]:
    if not path:
        return [inputs]
    head, rest = path[0], path[1:]
    if head == "[]":
        return [v for item in inputs or [] for v in _values(item, rest)]
    if not isinstance(inputs, dict) or head not in inputs:
        return []
    return _values(inputs[head], rest)


@cache
def _registrations(config: str) -> tuple[Any, ...]:
    return tuple(run_offline(lambda: main().exports, {**BASE, **CONFIGS[config]}).registrations)


@pytest.mark.parametrize("resource, path, where", ENUM_INPUTS, ids=lambda v: str(v))
def test_every_enum_value_sent_is_in_the_discovery_document(resource, path, where):
    type_token = TYPES[resource]
    allowed = _enum(where)
    found = [
        value
        for config in CONFIGS
        for r in _registrations(config)
        if r.type == type_token
        for value in _values(r.inputs, path.split("."))
    ]
    assert found, f"no configuration sends {type_token} {path}: the row checks nothing"
    assert set(found) <= set(allowed), (sorted(set(found) - set(allowed)), allowed)


def test_every_tpu_vm_generation_has_an_api_accelerator_type():
    allowed = _enum("tpu.v2:AcceleratorConfig.type")
    assert set(API_ACCELERATOR_TYPES.values()) <= set(allowed)
    assert sorted(API_ACCELERATOR_TYPES) == sorted(g.name for g in catalog.generations("tpu-vm"))


def test_spot_termination_value_is_documented():
    """The enum the test above uses for termination actions, spelled out: DELETE is one of them."""
    assert "DELETE" in _enum("compute.v1:Scheduling.instanceTerminationAction")
