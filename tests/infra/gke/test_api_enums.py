"""Every API enum value the GKE program sends, checked against Google's discovery documents
(container v1, compute v1) that google-api-python-client ships: a typo or a renamed value fails
here instead of in `pulumi up`. The values are read from what the program registered under
Pulumi's mocks, not from the module's constants.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import googleapiclient
import pytest

from tests.infra.gke.mocked import CLUSTER, NODE_POOL, POLICY, deploy, gke_spec

DOCUMENTS = Path(googleapiclient.__file__).parent / "discovery_cache" / "documents"


def enum(api: str, schema: str, field: str) -> list[str]:
    document = json.loads((DOCUMENTS / f"{api}.json").read_text())
    values = document["schemas"][schema]["properties"][field]["enum"]
    assert values, f"{api} {schema}.{field} has no enum"
    return values


def dig(value: Any, *path: str) -> Any:
    for key in path:
        if value is None:
            return None
        value = value.get(key)
    return value


# (where the value sits in the registered Pulumi inputs, the API schema and field that types it)
CHECKS = {
    CLUSTER: [
        (("releaseChannel", "channel"), ("container.v1", "ReleaseChannel", "channel")),
        (("datapathProvider",), ("container.v1", "NetworkConfig", "datapathProvider")),
    ],
    NODE_POOL: [
        (
            ("nodeConfig", "workloadMetadataConfig", "mode"),
            ("container.v1", "WorkloadMetadataConfig", "mode"),
        ),
        (("placementPolicy", "type"), ("container.v1", "PlacementPolicy", "type")),
        (
            ("nodeConfig", "reservationAffinity", "consumeReservationType"),
            ("container.v1", "ReservationAffinity", "consumeReservationType"),
        ),
        (("autoscaling", "locationPolicy"), ("container.v1", "NodePoolAutoscaling", "locationPolicy")),
    ],
    POLICY: [(("workloadPolicy", "type"), ("compute.v1", "ResourcePolicyWorkloadPolicy", "type"))],
}
# Specs that between them make the program send every value above: COMPACT placement and a
# reservation, a tpu7x workload policy, a single-host pool with no placement, a flex-start pool
# (NO_RESERVATION, autoscaling's location policy).
SPECS = [
    {"accelerator": "v6e-16", "capacity": "reserved", "reservation": "my-res"},
    {"accelerator": "v6e-16", "capacity": "flex-start"},
    {"accelerator": "tpu7x-16"},
    {"accelerator": "v6e-4", "capacity": "spot"},
]


@pytest.fixture(scope="module")
def sent() -> dict[tuple[str, ...], set[str]]:
    """Every enum-typed value the program registered, by (type token, input path)."""
    values: dict[tuple[str, ...], set[str]] = {}
    for extra in SPECS:
        extra = dict(extra)
        recorder = deploy(gke_spec(extra.pop("accelerator"), **extra))
        for token, checks in CHECKS.items():
            for resource in recorder.resources[token]:
                for path, _ in checks:
                    value = dig(resource.inputs, *path)
                    if value is not None:
                        values.setdefault((token, *path), set()).add(value)
    return values


@pytest.mark.parametrize(
    "token,path,api",
    [(token, path, api) for token, checks in CHECKS.items() for path, api in checks],
    ids=lambda v: v if isinstance(v, str) else ".".join(v) if isinstance(v, tuple) else None,
)
def test_every_enum_value_sent_is_in_the_discovery_document(sent, token, path, api):
    values = sent.get((token, *path))
    assert values, f"no spec made the program send {token} {'.'.join(path)}: extend SPECS"
    allowed = enum(*api)
    assert values <= set(allowed), f"{sorted(values - set(allowed))} not in {api}: {allowed}"


def test_taint_effect_is_in_the_discovery_document():
    recorder = deploy(gke_spec("v6e-16"))
    effects = {
        taint["effect"]
        for pool in recorder.resources[NODE_POOL]
        for taint in pool.inputs["nodeConfig"].get("taints", [])
    }
    assert effects == {"NO_SCHEDULE"}
    assert effects <= set(enum("container.v1", "NodeTaint", "effect"))


def test_gke_metadata_needs_workload_identity_per_the_api():
    """The source for refusing an existing cluster without Workload Identity."""
    document = json.loads((DOCUMENTS / "container.v1.json").read_text())
    field = document["schemas"]["WorkloadMetadataConfig"]["properties"]["mode"]
    description = dict(zip(field["enum"], field["enumDescriptions"], strict=True))["GKE_METADATA"]
    assert "only be enabled if Workload Identity is enabled at the cluster level" in description
