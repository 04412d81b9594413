"""Hand-written Pulumi resources (camelCase inputs, as mocks and policy packs see them) of one
Compute Engine TPU slice, for the rules' tests; every argument is one thing a test breaks."""

from __future__ import annotations

from typing import Any

from rayslice.cloud import bodies, rules

URN = "urn:pulumi:dev::rayslice::{type}::{name}"


def urn(type_token: str, name: str) -> str:
    return URN.format(type=type_token, name=name)


def make(type_token: str, name: str, props: dict[str, Any], refs: dict[str, list[str]] | None = None):
    resource = rules.resource(type_token, urn(type_token, name), name, props, refs or {})
    assert resource is not None
    return resource


def template_props(
    *,
    model: str = "STANDARD",
    termination: str | None = None,
    machine: str = "ct6e-standard-4t",
    disk: str = "hyperdisk-balanced",
    affinity: dict[str, Any] | None = None,
    metadata: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    scheduling = {"provisioningModel": model, "onHostMaintenance": "TERMINATE"}
    if termination:
        scheduling["instanceTerminationAction"] = termination
    props: dict[str, Any] = {
        "namePrefix": "s-0-",
        "machineType": machine,
        "disks": [{"boot": True, "autoDelete": True, "diskType": disk, "diskSizeGb": 100.0}],
        "networkInterfaces": [{"network": "net", "subnetwork": "subnet"}],
        "scheduling": scheduling,
        "metadata": metadata or {"startup-script": "#!/bin/bash"},
        "labels": labels or {"managed-by": "rayslice"},
    }
    if affinity:
        props["reservationAffinity"] = affinity
    return props


Entry = tuple[str, str, dict[str, Any], dict[str, list[str]]]  # type, name, inputs, refs (URNs)


def slice_entries(
    *,
    target: int = 0,
    configs: int = 4,
    topology: str = "4x4",
    bulk: bool = False,
    lifecycle: str | None = "DO_NOTHING",
    **template: Any,
) -> list[Entry]:
    """A v6e-16 slice: workload policy, template, MIG and `configs` per-instance configs. The
    MIG does nothing on a failed host, as rayslice ships it (None: the default, REPAIR)."""
    policy = (
        bodies.RESOURCE_POLICY,
        "s-0-policy",
        {
            "name": "s-0-policy",
            "workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": topology},
        },
        {},
    )
    tmpl: Entry = (bodies.TEMPLATE, "s-0-template", template_props(**template), {})
    mig_props: dict[str, Any] = {
        "name": "s-0",
        "baseInstanceName": "s-0",
        "targetSize": float(target),
        "versions": [{"instanceTemplate": "projects/p/global/instanceTemplates/s-0-x"}],
        "resourcePolicies": {"workloadPolicy": "projects/p/regions/r/resourcePolicies/s-0-policy"},
    }
    if bulk:
        mig_props["targetSizePolicies"] = [{"mode": "BULK"}]
    if lifecycle:
        mig_props["instanceLifecyclePolicy"] = {"defaultActionOnFailure": lifecycle}
    refs = {
        "versions": [urn(bodies.TEMPLATE, tmpl[1])],
        "resourcePolicies": [urn(bodies.RESOURCE_POLICY, policy[1])],
    }
    mig: Entry = (bodies.MIG, "s-0-mig", mig_props, refs)
    pics: list[Entry] = [
        (
            bodies.PER_INSTANCE_CONFIG,
            f"s-0-w{i}",
            {"name": f"s-0-w{i}", "instanceGroupManager": "s-0", "zone": "us-east5-b"},
            {"instanceGroupManager": [urn(bodies.MIG, mig[1])]},
        )
        for i in range(configs)
    ]
    return [policy, tmpl, mig, *pics]


def slice_stack(**kwargs: Any) -> rules.Stack:
    return rules.Stack([make(*entry) for entry in slice_entries(**kwargs)])


def rule_ids(stack: rules.Stack) -> list[str]:
    return sorted({v.rule for v in rules.check(stack)})
