"""The rayslice policy pack: `rayslice.cloud.rules` run by Pulumi CrossGuard.

``pulumi preview --policy-pack policy/`` (from a checkout of this repository) refuses, on a real
project, what `rayslice preview` refuses offline: both runners hand Pulumi's properties of each
Compute Engine and TPU resource to `rayslice.cloud.rules.resource` (the REST body the provider
sends, from `rayslice.cloud.bodies`) and report `rayslice.cloud.rules.check`'s violations.

Two policies, both mandatory:

- `RESOURCE_POLICY` runs the rules that read one resource, on its inputs (``args.props`` of a
  resource validation): the fields the program sets, not the ones the API fills in later (a TPU
  node read back from the API carries both ``acceleratorType`` and ``acceleratorConfig``).
- `STACK_POLICY` runs the rules across resources (a MIG, its template, its workload policy, its
  per-instance configs) on the stack's resources, linked by Pulumi's property dependencies, which
  are known in a preview even where a self link is not.

Values Pulumi does not know yet during a preview are left out, so a rule that needs one says
nothing about it rather than guess.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# rayslice.cloud and what it imports (rayslice.catalog, rayslice.errors) need only the standard
# library, so the pack reads them from the checkout it lives in instead of installing rayslice.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pulumi_policy import (
    EnforcementLevel,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import _DictProxy, _is_unknown, _ListProxy

from rayslice.cloud import rules

PACK_NAME = "rayslice-google-rules"
RESOURCE_RULES = tuple(r for r in rules.RULES if not r.cross_resource)
STACK_RULES = tuple(r for r in rules.RULES if r.cross_resource)


def plain(value: Any) -> Any:
    """pulumi-policy's unknown-checking proxies as plain dicts and lists; values not known yet
    (during a preview) are left out instead of raising. A proxy hands its wrapped value out under
    the key ``__target`` (pulumi_policy/proxy.py), which is the only way to read past an unknown."""
    if isinstance(value, _DictProxy | _ListProxy):
        value = value["__target"]
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items() if not _is_unknown(v)}
    if isinstance(value, list):
        return [plain(v) for v in value if not _is_unknown(v)]
    return value


def _report(violations: list[rules.Violation], report_violation: ReportViolation) -> None:
    for violation in violations:
        report_violation(str(violation), violation.urn)


def validate_resource(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    resource = rules.resource(args.resource_type, args.urn, args.name, plain(args.props), {})
    if resource is not None:
        _report(rules.check(rules.Stack([resource]), RESOURCE_RULES), report_violation)


def validate_stack(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    resources = []
    for r in args.resources:
        refs = {key: [dep.urn for dep in deps] for key, deps in r.property_dependencies.items()}
        resource = rules.resource(r.resource_type, r.urn, r.name, plain(r.props), refs)
        if resource is not None:
            resources.append(resource)
    _report(rules.check(rules.Stack(resources), STACK_RULES), report_violation)


def _summary(selected: Sequence[rules.Rule]) -> str:
    return "Google's documented rules (rayslice/cloud/rules.py): " + ", ".join(r.id for r in selected)


RESOURCE_POLICY = ResourceValidationPolicy(
    name="google-rules-per-resource",
    description=_summary(RESOURCE_RULES),
    validate=validate_resource,
    enforcement_level=EnforcementLevel.MANDATORY,
)
STACK_POLICY = StackValidationPolicy(
    name="google-rules-across-resources",
    description=_summary(STACK_RULES),
    validate=validate_stack,
    enforcement_level=EnforcementLevel.MANDATORY,
)
POLICIES = [RESOURCE_POLICY, STACK_POLICY]
