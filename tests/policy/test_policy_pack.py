"""The policy pack in policy/: pulumi-policy's own argument objects through its callbacks.

No Pulumi CLI runs here, so the tests build what pulumi-policy's analyzer builds from the engine's
request (`ResourceValidationArgs` with the unknown-checking proxy over the inputs,
`StackValidationArgs` of `PolicyResource`s with property dependencies) and call the policies'
`validate` as the analyzer does. pulumi-policy is a dev extra, which scripts/setup.sh installs.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pulumi_policy
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, unknown_checking_proxy

from rayslice.cloud import bodies
from tests.cloud.stacks import Entry, slice_entries, template_props, urn

ROOT = Path(__file__).resolve().parents[2]


def _pack() -> Any:
    spec = importlib.util.spec_from_file_location("rayslice_rules", ROOT / "policy" / "rayslice_rules.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PACK = _pack()


def _options() -> Any:
    return pulumi_policy.PolicyResourceOptions(
        False, [], None, [], pulumi_policy.PolicyCustomTimeouts(0, 0, 0), []
    )


def _validate(policy: Any, args: Any) -> list[tuple[str, str | None]]:
    reported: list[tuple[str, str | None]] = []
    policy.validate(args, lambda message, urn=None: reported.append((message, urn)))
    return reported


def test_both_policies_are_mandatory_and_cover_every_rule():
    assert [p.enforcement_level for p in PACK.POLICIES] == [pulumi_policy.EnforcementLevel.MANDATORY] * 2
    assert {r.id for r in PACK.RESOURCE_RULES} | {r.id for r in PACK.STACK_RULES} == {
        r.id for r in PACK.rules.RULES
    }
    assert (ROOT / "policy" / "PulumiPolicy.yaml").is_file()
    assert "pulumi-policy" in (ROOT / "policy" / "requirements.txt").read_text()


def test_resource_policy_reports_a_spot_template_that_deletes():
    props = template_props(model="SPOT", termination="DELETE")
    name = "s-0-template"
    args = pulumi_policy.ResourceValidationArgs(
        bodies.TEMPLATE, unknown_checking_proxy(props), urn(bodies.TEMPLATE, name), name, _options(), None
    )
    [(message, reported_urn)] = _validate(PACK.RESOURCE_POLICY, args)
    assert reported_urn == urn(bodies.TEMPLATE, name)
    assert "rule spot-tpu-stop" in message and "spot-compute" in message and name in message
    fixed = template_props(model="SPOT", termination="STOP")
    good = pulumi_policy.ResourceValidationArgs(
        bodies.TEMPLATE, unknown_checking_proxy(fixed), urn(bodies.TEMPLATE, name), name, _options(), None
    )
    assert _validate(PACK.RESOURCE_POLICY, good) == []


def test_values_unknown_in_a_preview_are_left_out_not_raised():
    props = {**template_props(), "namePrefix": UNKNOWN_STRING_VALUE, "labels": {"k": UNKNOWN_STRING_VALUE}}
    args = pulumi_policy.ResourceValidationArgs(
        bodies.TEMPLATE, unknown_checking_proxy(props), urn(bodies.TEMPLATE, "t"), "t", _options(), None
    )
    assert _validate(PACK.RESOURCE_POLICY, args) == []
    assert PACK.plain(unknown_checking_proxy(props))["labels"] == {}


def _policy_resources(entries: list[Entry]) -> list[Any]:
    """pulumi-policy's view of a stack: one PolicyResource per resource, linked by property."""
    by_urn = {
        urn(kind, name): pulumi_policy.PolicyResource(
            kind, unknown_checking_proxy(props), urn(kind, name), name, _options(), None, None, [], {}
        )
        for kind, name, props, _ in entries
    }
    for kind, name, _, refs in entries:
        by_urn[urn(kind, name)].property_dependencies = {
            k: [by_urn[u] for u in urns] for k, urns in refs.items()
        }
    return list(by_urn.values())


def test_stack_policy_reports_bulk_with_spot_and_twice_the_hosts():
    """The shape before issue 19: target size N, N per-instance configs, BULK with a Spot template."""
    old = slice_entries(
        target=4, configs=4, bulk=True, model="SPOT", termination="STOP", lifecycle="DO_NOTHING"
    )
    reported = _validate(PACK.STACK_POLICY, pulumi_policy.StackValidationArgs(_policy_resources(old)))
    # Google's rules read "[rule ID; ...", rayslice's own "[rayslice's rule ID, not Google's: ...".
    rules_reported = sorted(re.search(r"rule ([a-z0-9-]+)[;,]", m).group(1) for m, _ in reported)
    assert rules_reported == ["bulk-provisioning-model", "instances-match-topology"]
    assert {u for _, u in reported} == {urn(bodies.MIG, "s-0-mig")}
    good = slice_entries(model="SPOT", termination="STOP", lifecycle="DO_NOTHING")
    assert _validate(PACK.STACK_POLICY, pulumi_policy.StackValidationArgs(_policy_resources(good))) == []
