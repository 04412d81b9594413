"""Google's documented rules for Compute Engine, TPU and GKE node pool resources, over REST
request bodies.

One definition of each rule, two runners: `rayslice preview` (no cloud API, over what the program
registered under Pulumi's mocks) and the Pulumi policy pack in ``policy/`` (over a real
project's resources in ``pulumi preview --policy-pack``). Both turn a resource's Pulumi
properties into the REST body the provider sends (`rayslice.cloud.bodies`) and hand a `Stack`
of `Resource` to `check`.

Each `Rule` carries its source (a Google page's title and URL, discovery-document text or a
magic-modules file), and each `Violation` names the resource, the rule and that source. Where
sources are silent or disagree, a rule takes the stricter reading and its comment says so.

A rule that reads one resource (`Rule.cross_resource` False) runs on a resource's inputs in the
policy pack; a rule across resources runs on the whole stack. Links between resources (a MIG's
template and workload policy, a per-instance config's MIG) come from Pulumi's property
dependencies (`Resource.refs`: input property -> URNs it was computed from), which both runners
know even where the value itself (a self link) is not yet known.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from rayslice import capacity_table, catalog
from rayslice.cloud import bodies
from rayslice.cloud.bodies import (
    MIG,
    PER_INSTANCE_CONFIG,
    QUEUED_RESOURCE,
    RESIZE_REQUEST,
    RESOURCE_POLICY,
    SLICE_HOSTS,
    TEMPLATE,
    TPU_NODE,
    Request,
    queued_node,
)

# Provisioning models, instance termination actions and MIG settings (compute v1 enums).
FLEX_START = "FLEX_START"
RESERVATION_BOUND = "RESERVATION_BOUND"
SPOT = "SPOT"
SPECIFIC_RESERVATION = "SPECIFIC_RESERVATION"
DELETE = "DELETE"
STOP = "STOP"
DO_NOTHING = "DO_NOTHING"

METADATA_VALUE_MAX = 262_144  # bytes, at most
METADATA_TOTAL_LIMIT = 512 * 1024  # bytes, all keys and values together, less than
_METADATA_KEY = re.compile(r"[a-zA-Z0-9_-]{1,128}")
_RFC1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
NAME_MAX = 63
LABELS_MAX = 64
LABEL_MAX = 63


@dataclass(frozen=True)
class Resource:
    """One resource as the rules see it: its Pulumi identity, the REST call the provider makes
    for it, and the resources each of its input properties was computed from."""

    type: str
    urn: str
    name: str  # the Pulumi resource name, which a violation names
    request: Request
    refs: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @property
    def body(self) -> dict[str, Any]:
        return self.request.body


@dataclass(frozen=True)
class Violation:
    urn: str
    resource: str
    rule: str
    message: str
    source: str
    ours: bool = False  # a rule of rayslice's design (`Rule.ours`), not one Google enforces

    def __str__(self) -> str:
        if self.ours:
            return (
                f"{self.resource}: {self.message} [rayslice's rule {self.rule}, not Google's: Google "
                f"would accept this, but the slice would not work; grounds: {self.source}]"
            )
        return f"{self.resource}: {self.message} [rule {self.rule}; source: {self.source}]"

    def as_json(self) -> dict[str, str]:
        return {
            "resource": self.resource,
            "urn": self.urn,
            "rule": self.rule,
            "message": self.message,
            "source": self.source,
        }


class Stack:
    """The resources of one deployment, with lookups along their references."""

    def __init__(self, resources: Iterable[Resource]):
        self.resources = list(resources)
        self._by_urn = {r.urn: r for r in self.resources}

    def of_type(self, type_token: str) -> list[Resource]:
        return [r for r in self.resources if r.type == type_token]

    def referenced(self, resource: Resource, prop: str, type_token: str) -> list[Resource]:
        """The resources of `type_token` that `resource`'s input `prop` was computed from."""
        found = (self._by_urn.get(urn) for urn in sorted(resource.refs.get(prop, ())))
        return [r for r in found if r is not None and r.type == type_token]

    def referencing(self, target: Resource, prop: str, type_token: str) -> list[Resource]:
        """The resources of `type_token` whose input `prop` was computed from `target`."""
        return [r for r in self.of_type(type_token) if target.urn in r.refs.get(prop, ())]


Finding = tuple[Resource, str]


@dataclass(frozen=True)
class Rule:
    id: str
    source: str
    check: Callable[[Stack], Iterator[Finding]]
    cross_resource: bool
    # True: the rule reads the finished deployment (a count over resources created one by one),
    # so the cloud twin checks it once everything is applied, not on each request.
    at_end: bool = False
    # True: rayslice's own rule, drawn from its sources but not enforced by Google (no source
    # says Google refuses the request); its violations say so instead of "Google would refuse".
    ours: bool = False


def _provisioning(template: Resource) -> str | None:
    return template.body.get("properties", {}).get("scheduling", {}).get("provisioningModel")


def _termination(template: Resource) -> str | None:
    return template.body.get("properties", {}).get("scheduling", {}).get("instanceTerminationAction")


def _bulk(mig: Resource) -> bool:
    return capacity_table.in_bulk_mode(mig.body)


def _templates(stack: Stack, mig: Resource) -> list[Resource]:
    return stack.referenced(mig, "versions", TEMPLATE)


def _create_calls(stack: Stack, mig: Resource) -> list[Resource]:
    """The createInstances calls made on a MIG: one per per-instance config (the provider's
    create_url), one per SliceHosts (every host of a slice in one call)."""
    return [
        r
        for kind in (PER_INSTANCE_CONFIG, SLICE_HOSTS)
        for r in stack.referencing(mig, "instanceGroupManager", kind)
    ]


def _created(calls: list[Resource]) -> int:
    """The instances those createInstances calls name."""
    return sum(len(c.body.get("instances", [])) for c in calls)


def tpu_machine(machine_type: str | None) -> tuple[str, int] | None:
    """(generation, chips per host) of a Compute Engine TPU machine type, from the catalog;
    None for any other machine type."""
    if not machine_type:
        return None
    short = machine_type.rsplit("/", 1)[-1]
    for gen in catalog.generations("compute"):
        for chips in gen.compute_chips_per_host:
            if short == f"{gen.compute_machine_family}-{chips}t":
                return gen.name, chips
    return None


# (a) "Create a MIG that uses the bulk mode"
# (https://docs.cloud.google.com/compute/docs/instance-groups/bulk-create-instances-in-mig):
# "Bulk mode in MIGs is only supported with instance templates that specify either a
# reservation-bound or flex-start provisioning model."
_BULK_PAGE = (
    "Compute Engine, 'Create a MIG that uses the bulk mode', "
    "https://docs.cloud.google.com/compute/docs/instance-groups/bulk-create-instances-in-mig"
)


def _bulk_needs_flex_or_reservation(stack: Stack) -> Iterator[Finding]:
    for mig in stack.of_type(MIG):
        if not _bulk(mig):
            continue
        for template in _templates(stack, mig):
            model = _provisioning(template) or "STANDARD"
            if model not in (FLEX_START, RESERVATION_BOUND):
                yield (
                    mig,
                    f"target-size policy BULK with template {template.name} of provisioning model "
                    f"{model}: bulk mode takes only FLEX_START or RESERVATION_BOUND templates",
                )


# (a') "About bulk mode" (https://cloud.google.com/compute/docs/instance-groups/about-bulk-mode):
# a MIG in bulk mode "does not support" resize requests, and hosts are added, by its target size
# or by createInstances, only while its target size is 0. So a bulk MIG's hosts come from its
# target size at insert or from one createInstances (in Pulumi, one per-instance config, each its
# own createInstances call, or one SliceHosts), never from both, never from a resize request.
_BULK_MODE_PAGE = (
    "Compute Engine, 'About bulk mode', https://cloud.google.com/compute/docs/instance-groups/about-bulk-mode"
)


def _bulk_no_resize_request(stack: Stack) -> Iterator[Finding]:
    for mig in stack.of_type(MIG):
        if _bulk(mig):
            for request in stack.referencing(mig, "instanceGroupManager", RESIZE_REQUEST):
                yield (
                    request,
                    f"resize request on MIG {mig.name}, which is in bulk mode: bulk mode does not "
                    "support resize requests; set the MIG's target size instead",
                )


def _bulk_grows_from_zero(stack: Stack) -> Iterator[Finding]:
    for mig in stack.of_type(MIG):
        if not _bulk(mig):
            continue
        calls = _create_calls(stack, mig)
        target = int(mig.body.get("targetSize", 0))
        if calls and (target > 0 or len(calls) > 1):
            yield (
                mig,
                f"bulk mode with target size {target} and {len(calls)} createInstances call(s) (one per "
                "per-instance config or SliceHosts): a bulk MIG takes hosts only while its target size "
                "is 0, so from its target size or from one createInstances, not more",
            )


# (b) "About instances that use the reservation-bound model"
# (https://docs.cloud.google.com/compute/docs/instances/about-reservation-bound-vms): such
# instances consume reserved capacity, and the bulk page's template has "Choose a reservation",
# i.e. a specific reservation (gcloud: --reservation-affinity=specific). ANY_RESERVATION is not
# offered for it on either page; the stricter reading refuses it.
_RESERVATION_BOUND_PAGE = (
    "Compute Engine, 'About instances that use the reservation-bound model', "
    "https://docs.cloud.google.com/compute/docs/instances/about-reservation-bound-vms"
)


def _reservation_bound_needs_specific(stack: Stack) -> Iterator[Finding]:
    for template in stack.of_type(TEMPLATE):
        if _provisioning(template) != RESERVATION_BOUND:
            continue
        affinity = template.body.get("properties", {}).get("reservationAffinity", {})
        if affinity.get("consumeReservationType") != SPECIFIC_RESERVATION or not affinity.get("values"):
            yield (
                template,
                "provisioning model RESERVATION_BOUND without a specific reservation: set "
                "reservationAffinity SPECIFIC_RESERVATION with the reservation's name",
            )


# (b) The bulk page's reservation-bound template: "In the On VM termination list, select Delete"
# (gcloud: --instance-termination-action=DELETE).
def _bulk_reservation_bound_deletes(stack: Stack) -> Iterator[Finding]:
    for mig in stack.of_type(MIG):
        if not _bulk(mig):
            continue
        for template in _templates(stack, mig):
            if _provisioning(template) == RESERVATION_BOUND and _termination(template) != DELETE:
                yield (
                    mig,
                    f"bulk mode with RESERVATION_BOUND template {template.name} needs instance "
                    f"termination action DELETE, not {_termination(template)}",
                )


# (c, d) "Create a MIG with multi-host TPU slice"
# (https://docs.cloud.google.com/compute/docs/tpus/create-tpu-mig-multi-host-slice): the MIG's
# workload policy names the slice's accelerator topology, and the MIG holds one TPU VM per host
# of it (chips of the topology / chips per VM of the machine type). A per-instance config is
# created with instanceGroupManagers.createInstances (magic-modules
# mmv1/products/compute/PerInstanceConfig.yaml, create_url), which adds an instance and raises
# the target size by one (compute v1 discovery, instanceGroupManagers.createInstances: "Creates
# instances with per-instance configurations in this managed instance group"; targetSize: "The
# target number of running instances"). A resize request raises it by its resizeBy once it is
# fulfilled (compute v1 discovery, InstanceGroupManagerResizeRequest.resizeBy: "The group's target
# size will be increased by this number"). So the MIG ends with targetSize + per-instance configs
# + the resize requests' resizeBy. An empty MIG is not a broken slice: the resize-request flow
# creates the MIG before any of its hosts exists (Compute Engine, "Create resize requests in a MIG",
# https://docs.cloud.google.com/compute/docs/instance-groups/create-resize-requests-mig), and an
# elastic cluster's slices above minSlices are declared so, their hosts added whole by the
# controller (docs/elastic.md); only a count between none and the topology's is refused.
_TPU_MIG_PAGE = (
    "Compute Engine, 'Create a MIG with multi-host TPU slice', "
    "https://docs.cloud.google.com/compute/docs/tpus/create-tpu-mig-multi-host-slice; magic-modules "
    "mmv1/products/compute/PerInstanceConfig.yaml (create_url .../createInstances)"
)


def _slice_shape(stack: Stack, mig: Resource) -> Iterator[tuple[Resource, Resource, str, int, int]]:
    """(workload policy, template, topology, chips per host, hosts) of a MIG's TPU slice."""
    for policy in stack.referenced(mig, "resourcePolicies", RESOURCE_POLICY):
        topology = policy.body.get("workloadPolicy", {}).get("acceleratorTopology")
        if not topology:
            continue
        chips = math.prod(catalog.parse_topology(topology))
        for template in _templates(stack, mig):
            machine = tpu_machine(template.body.get("properties", {}).get("machineType"))
            per_host = machine[1] if machine else 0
            yield policy, template, topology, per_host, (chips // per_host if per_host else 0)


def _topology_fits_machine_type(stack: Stack) -> Iterator[Finding]:
    for mig in stack.of_type(MIG):
        for policy, template, topology, per_host, _ in _slice_shape(stack, mig):
            chips = math.prod(catalog.parse_topology(topology))
            machine = template.body.get("properties", {}).get("machineType")
            if not per_host:
                yield (
                    mig,
                    f"workload policy {policy.name} ({topology}) with {machine}, not a TPU machine type",
                )
            elif chips % per_host:
                yield (
                    mig,
                    f"accelerator topology {topology} ({chips} chips) is not a whole number of "
                    f"{machine} hosts ({per_host} chips each)",
                )


def _instances_match_topology(stack: Stack) -> Iterator[Finding]:
    for mig in stack.of_type(MIG):
        created = _created(_create_calls(stack, mig))
        requests = stack.referencing(mig, "instanceGroupManager", RESIZE_REQUEST)
        target = int(mig.body.get("targetSize", 0))
        resized = sum(int(r.body.get("resizeBy", 0)) for r in requests)
        ends = target + created + resized
        for _, _, topology, per_host, hosts in _slice_shape(stack, mig):
            if per_host and ends not in (0, hosts):
                yield (
                    mig,
                    f"ends with {ends} instances (target size {target} plus {created} named by "
                    "createInstances, which raises the target size by as many, plus "
                    f"{resized} from resize requests) for topology {topology} of {hosts} hosts",
                )


# (e) tpu v2 discovery document, Node.networkConfig / Node.networkConfigs: "network_config and
# network_configs are mutually exclusive, you can only specify one of them. If both are
# specified, an error will be returned." magic-modules mmv1/products/tpuv2/Vm.yaml:
# acceleratorConfig "cannot be used at the same time as accelerator_type" (conflicts).
_TPU_EXCLUSIVE_SOURCE = (
    "tpu v2 discovery document, Node.networkConfig/networkConfigs; magic-modules "
    "mmv1/products/tpuv2/Vm.yaml (acceleratorConfig conflicts with accelerator_type)"
)


def _node_body(request: Request) -> dict[str, Any] | None:
    """The Node a request creates: a node's own body, a queued resource's node; else None."""
    if request.schema == "Node":
        return request.body
    if request.schema == "QueuedResource":
        return queued_node(request.body)
    return None


def _tpu_node_exclusive_fields(stack: Stack) -> Iterator[Finding]:
    for resource in [*stack.of_type(TPU_NODE), *stack.of_type(QUEUED_RESOURCE)]:
        node = _node_body(resource.request) or {}
        for first, second in (("networkConfig", "networkConfigs"), ("acceleratorType", "acceleratorConfig")):
            if node.get(first) and node.get(second):
                yield resource, f"sets both {first} and {second}; they are mutually exclusive"


# (f) compute v1 discovery document, Metadata.items: keys match [a-zA-Z0-9-_]{1,128}; a value's
# "size must be less than or equal to 262144 bytes (256 KiB)"; "The total size of all keys and
# values must be less than 512 KB." The tpu v2 document gives no limit for Node.metadata; a TPU
# VM's metadata is served by the same metadata server, so the same limits apply (stricter).
_METADATA_SOURCE = "compute v1 discovery document, Metadata.items (key pattern, value and total size)"


def _metadata(request: Request) -> dict[str, str]:
    body = request.body
    node = _node_body(request)
    if node is not None:
        return dict(node.get("metadata") or {})
    holder = body.get("properties", body)
    return {i["key"]: i["value"] for i in holder.get("metadata", {}).get("items", [])}


def _metadata_limits(stack: Stack) -> Iterator[Finding]:
    for resource in stack.resources:
        metadata = _metadata(resource.request)
        for key, value in metadata.items():
            if not _METADATA_KEY.fullmatch(key):
                yield resource, f"metadata key {key!r} does not match [a-zA-Z0-9-_]{{1,128}}"
            size = len(value.encode())
            if size > METADATA_VALUE_MAX:
                yield resource, f"metadata value {key!r} is {size} bytes, more than {METADATA_VALUE_MAX}"
        total = sum(len(k.encode()) + len(v.encode()) for k, v in metadata.items())
        if total >= METADATA_TOTAL_LIMIT:
            yield resource, f"metadata keys and values total {total} bytes, not under {METADATA_TOTAL_LIMIT}"


# (g) compute v1 discovery document, e.g. Instance.name / Address.name: "the name must be 1-63
# characters long and match the regular expression `[a-z]([-a-z0-9]*[a-z0-9])?`". The tpu v2
# document does not spell out node IDs; the same RFC1035 rule is applied (stricter).
# Labels: "Organize resources using labels"
# (https://docs.cloud.google.com/compute/docs/labeling-resources): at most 64 labels; keys 1-63
# characters starting with a lowercase letter, values 0-63 characters, both only lowercase
# letters, digits, underscores and dashes (international characters allowed).
_NAME_SOURCE = "compute v1 discovery document, <Resource>.name (RFC1035, 1-63 characters)"
_LABELS_SOURCE = (
    "Compute Engine, 'Organize resources using labels', "
    "https://docs.cloud.google.com/compute/docs/labeling-resources"
)


def _names(stack: Stack) -> Iterator[Finding]:
    for resource in stack.resources:
        name = resource.request.name
        if name is not None and not (len(name) <= NAME_MAX and _RFC1035.fullmatch(name)):
            yield resource, f"name {name!r} is not 1-{NAME_MAX} characters of [a-z]([-a-z0-9]*[a-z0-9])?"


def _label_char(ch: str) -> bool:
    return ch.isdigit() or ch in "_-" or (ch.isalpha() and not ch.isupper())


def _labels_of(request: Request) -> dict[str, str]:
    body = _node_body(request) or request.body
    return dict(body.get("properties", body).get("labels") or {})


def _labels(stack: Stack) -> Iterator[Finding]:
    for resource in stack.resources:
        labels = _labels_of(resource.request)
        if len(labels) > LABELS_MAX:
            yield resource, f"{len(labels)} labels, more than {LABELS_MAX}"
        for key, value in labels.items():
            key_ok = 0 < len(key) <= LABEL_MAX and key[0].isalpha() and all(map(_label_char, key))
            if not key_ok:
                yield resource, f"label key {key!r} is not 1-{LABEL_MAX} lowercase letters, digits, _ or -"
            if not (len(value) <= LABEL_MAX and all(map(_label_char, value))):
                yield (
                    resource,
                    f"label {key}={value!r}: values are 0-{LABEL_MAX} lowercase letters, digits, _ or -",
                )


# (h) See catalog.BOOT_DISK_TYPES.
_DISK_SOURCE = (
    "Cloud TPU, 'Storage options for Cloud TPU data', "
    "https://docs.cloud.google.com/tpu/docs/storage-options-compute"
)


def _boot_disk_per_generation(stack: Stack) -> Iterator[Finding]:
    for resource in stack.resources:
        holder = resource.body.get("properties", resource.body)
        machine = tpu_machine(holder.get("machineType"))
        if machine is None:
            continue
        allowed = catalog.BOOT_DISK_TYPES.get(machine[0], ())
        for disk in holder.get("disks", []):
            if not disk.get("boot"):
                continue
            disk_type = disk.get("initializeParams", {}).get("diskType", "pd-standard").rsplit("/", 1)[-1]
            if disk_type not in allowed:
                yield resource, f"boot disk {disk_type} on {machine[0]}; Google lists {', '.join(allowed)}"


# (i) "Request TPU Spot VMs" (https://docs.cloud.google.com/tpu/docs/spot-compute): the MIG's
# template for Spot TPU VMs uses --provisioning-model=SPOT with
# --instance-termination-action=STOP, and "To restart a Spot VMs instance or MIG, you must delete
# and then recreate it". A MIG's default on failure is REPAIR, which "automatically repairs a
# failed VM by recreating it" (compute v1 discovery document,
# InstanceGroupManagerInstanceLifecyclePolicy.defaultActionOnFailure): one recreated host cannot
# rejoin a slice, so a Spot TPU MIG sets DO_NOTHING, as Google's tpu-operator does for its TPU
# MIGs (DefaultActionOnFailure DO_NOTHING).
_SPOT_SOURCE = (
    "Cloud TPU, 'Request TPU Spot VMs', https://docs.cloud.google.com/tpu/docs/spot-compute; compute v1 "
    "discovery document, InstanceGroupManagerInstanceLifecyclePolicy.defaultActionOnFailure"
)


def _unrepaired_tpu_cell(template: Resource) -> capacity_table.Cell | None:
    """The capacity cell of a TPU template whose slices Google does not recover (Spot: the
    cell's `repaired_by` is rayslice), None for any other template."""
    holder = template.body.get("properties", {})
    if tpu_machine(holder.get("machineType")) is None:
        return None
    cell = capacity_table.for_provisioning_model(_provisioning(template))
    return cell if cell is not None and cell.repaired_by == capacity_table.RAYSLICE else None


def _tpu_cell(template: Resource) -> capacity_table.Cell | None:
    """The capacity cell of a TPU template (by its provisioning model), None for any other."""
    holder = template.body.get("properties", {})
    if tpu_machine(holder.get("machineType")) is None:
        return None
    return capacity_table.for_provisioning_model(_provisioning(template))


def _spot_tpu_template_stops(stack: Stack) -> Iterator[Finding]:
    for template in stack.of_type(TEMPLATE):
        cell = _unrepaired_tpu_cell(template)
        if cell is not None and _termination(template) != cell.termination_action:
            yield (
                template,
                f"Spot TPU VMs with termination action {_termination(template)}; Google's page uses "
                f"{cell.termination_action}",
            )


# Every capacity, not Spot only: Cloud TPU, "Failure recovery of TPU instances"
# (https://cloud.google.com/tpu/docs/failure-recovery): individual hosts of a multi-host slice
# cannot be rescheduled, and Compute Engine recovers a slice of managed capacity whole, by
# itself; SkyPilot's TPU MIGs (sky/provision/gcp/mig_utils.py, create_region_managed_instance_group)
# set DO_NOTHING whatever the capacity. A one-host slice may keep REPAIR (it is whole again).
_TPU_MIG_SOURCE = (
    "Cloud TPU, 'Failure recovery of TPU instances', https://cloud.google.com/tpu/docs/failure-recovery; "
    + _SPOT_SOURCE
)


def _tpu_mig_does_nothing(stack: Stack) -> Iterator[Finding]:
    for mig in stack.of_type(MIG):
        hosts = max((shape[4] for shape in _slice_shape(stack, mig)), default=0)
        cells = [c for c in map(_tpu_cell, _templates(stack, mig)) if c is not None]
        if hosts <= 1 or not cells:
            continue
        action = mig.body.get("instanceLifecyclePolicy", {}).get("defaultActionOnFailure", "REPAIR")
        if action != cells[0].failure_action:
            yield (
                mig,
                f"multi-host TPU MIG ({hosts} hosts) with default action on failure {action}: a "
                f"repaired host cannot rejoin the slice; set {cells[0].failure_action}",
            )


# A resize request's run duration: "Must be from 600 to 604800 inclusive ... minimum and maximum
# allowed range for requestedRunDuration is 10 minutes (600 seconds) and 7 days (604800 seconds)"
# (pulumi-gcp ResizeRequestRequestedRunDuration.seconds, from magic-modules ResizeRequest.yaml).
_RUN_DURATION_SOURCE = (
    "pulumi-gcp compute.ResizeRequest requestedRunDuration.seconds (magic-modules "
    "mmv1/products/compute/ResizeRequest.yaml); Compute Engine, 'About resize requests in a MIG', "
    "https://cloud.google.com/compute/docs/instance-groups/about-resize-requests-mig"
)
RUN_DURATION_S = (600, 604_800)


def _resize_request_run_duration(stack: Stack) -> Iterator[Finding]:
    """A resize request's ``requestedRunDuration`` and a flex-start template's
    ``scheduling.maxRunDuration`` (the same 10 minutes to 7 days: "About bulk mode" and SkyPilot's
    flex-start template, sky/provision/gcp/mig_utils.py create_region_instance_template, carry the
    run duration in the template)."""
    low, high = RUN_DURATION_S
    timed = [(r, r.body.get("requestedRunDuration")) for r in stack.of_type(RESIZE_REQUEST)]
    timed += [
        (t, t.body.get("properties", {}).get("scheduling", {}).get("maxRunDuration"))
        for t in stack.of_type(TEMPLATE)
        if _provisioning(t) == FLEX_START
    ]
    for request, duration in timed:
        if duration is None:
            continue
        seconds = int(duration.get("seconds", 0))
        if not low <= seconds <= high:
            yield (
                request,
                f"requested run duration {seconds} s is outside {low} to {high} s (10 minutes to 7 days)",
            )


# (k) GKE flex-start node pools. GKE, "About flex-start provisioning mode"
# (https://cloud.google.com/kubernetes-engine/docs/concepts/dws): flex-start runs "for up to
# seven days", and with Standard clusters "you configure flex-start on specific node pools" whose
# VMs GKE provisions "when capacity becomes available", i.e. the cluster autoscaler grows the pool
# (xpk, src/xpk/core/capacity.py and nodepool.py, creates one with --enable-autoscaling
# --max-nodes=<hosts> and --num-nodes=0). Whether GKE refuses a flex-start pool with nodes from
# the start is not written anywhere: the rule takes the stricter reading (autoscaled, starting
# empty). The container v1 discovery document: NodePoolAutoscaling "The total_*_node_count
# fields are mutually exclusive with the *_node_count fields"; NodeConfig.maxRunDuration is a
# google-duration ("The runtime of each node in the node pool in seconds, terminated by 's'",
# pulumi-gcp NodePool node_config.max_run_duration).
_FLEX_POOL_SOURCE = (
    "GKE, 'About flex-start provisioning mode', https://cloud.google.com/kubernetes-engine/docs/"
    "concepts/dws; xpk src/xpk/core/capacity.py (CapacityType.FLEX_START); container v1 discovery "
    "document, NodePoolAutoscaling and NodeConfig.maxRunDuration"
)
MAX_RUN_DURATION_S = 7 * 24 * 3600
_DURATION = re.compile(r"(\d+)(\.\d+)?s")


def _pools(stack: Stack) -> Iterator[tuple[Resource, dict[str, Any]]]:
    for resource in stack.of_type(bodies.NODE_POOL):
        yield resource, resource.body.get("nodePool", {})


def _flex_pool_autoscaled(stack: Stack) -> Iterator[Finding]:
    for resource, pool in _pools(stack):
        if not (pool.get("config") or {}).get("flexStart"):
            continue
        scaling = pool.get("autoscaling") or {}
        if not scaling.get("enabled") or not (
            scaling.get("totalMaxNodeCount") or scaling.get("maxNodeCount")
        ):
            yield (
                resource,
                "flex-start pool without autoscaling to a maximum: no node would ever be provisioned",
            )
        if int(pool.get("initialNodeCount") or 0):
            yield (
                resource,
                f"flex-start pool with {pool['initialNodeCount']} initial node(s); it starts empty and "
                "the autoscaler grows it when capacity comes",
            )


def _autoscaling_limits(stack: Stack) -> Iterator[Finding]:
    for resource, pool in _pools(stack):
        scaling = pool.get("autoscaling") or {}
        total = [scaling.get(k) or 0 for k in ("totalMinNodeCount", "totalMaxNodeCount")]
        zonal = [scaling.get(k) or 0 for k in ("minNodeCount", "maxNodeCount")]
        if any(total) and any(zonal):
            yield resource, "autoscaling sets both total and per-zone node counts, which exclude each other"
        for low, high in (total, zonal):
            if high and low > high:
                yield resource, f"autoscaling minimum {low} is above its maximum {high}"


def _pool_run_duration(stack: Stack) -> Iterator[Finding]:
    for resource, pool in _pools(stack):
        config = pool.get("config") or {}
        duration = config.get("maxRunDuration")
        if duration is None:
            continue
        found = _DURATION.fullmatch(str(duration))
        if found is None:
            yield resource, f"maxRunDuration {duration!r} is not a number of seconds ending in 's'"
        elif config.get("flexStart") and not 0 < int(found[1]) <= MAX_RUN_DURATION_S:
            yield (
                resource,
                f"flex-start maxRunDuration {duration} is outside 1 s to {MAX_RUN_DURATION_S} s (7 days)",
            )


# A queued resource (tpu v2 and v2alpha1 discovery documents, QueuedResource; REST reference
# "projects.locations.queuedResources", https://cloud.google.com/tpu/docs/reference/rest/v2/
# projects.locations.queuedResources):
# - "Union field tier. Tier specifies the required tier. tier can be only one of the
#   following": spot, guaranteed (and bestEffort in v2alpha1);
# - the fields of the version it is sent to: provisioningModel, runDuration and bestEffort are
#   in v2alpha1's QueuedResource only, so a v2 request cannot carry them (flex-start is v2alpha1);
# - reservationName "Format: projects/{project}/locations/{zone}/reservations/{reservation}";
# - NodeSpec.parent and NodeSpec.node "Required"; nodeId "Should follow the
#   `^[A-Za-z0-9_.~+%-]+$` regex format";
# - QueueingPolicy.validUntilDuration is a google-duration ("<seconds>s").
_QUEUED_SOURCE = (
    "tpu v2/v2alpha1 discovery documents, QueuedResource, NodeSpec, QueueingPolicy; Cloud TPU REST "
    "reference, projects.locations.queuedResources (union field tier)"
)
QUEUED_TIERS = ("spot", "guaranteed", "bestEffort")
ALPHA_ONLY_QUEUED_FIELDS = ("provisioningModel", "runDuration", "bestEffort")
_RESERVATION_NAME = re.compile(r"projects/[^/]+/locations/[^/]+/reservations/[^/]+")
_NODE_ID = re.compile(r"[A-Za-z0-9_.~+%-]+")


def _queued_resource_shape(stack: Stack) -> Iterator[Finding]:
    for queued in stack.of_type(QUEUED_RESOURCE):
        body = queued.body
        tiers = [t for t in QUEUED_TIERS if t in body]
        if len(tiers) > 1:
            yield queued, f"sets tiers {', '.join(tiers)}; a queued resource takes one tier at most"
        if bodies.TPU_API_VERSIONS[queued.request.api] == "v2":
            for key in ALPHA_ONLY_QUEUED_FIELDS:
                if key in body:
                    yield queued, f"{key} is not a field of the v2 QueuedResource (only v2alpha1 has it)"
        reservation = body.get("reservationName")
        if reservation is not None and not _RESERVATION_NAME.fullmatch(str(reservation)):
            yield queued, f"reservationName {reservation!r} is not projects/P/locations/Z/reservations/R"
        for spec in (body.get("tpu") or {}).get("nodeSpec") or []:
            if not spec.get("parent") or not spec.get("node"):
                yield queued, "a node spec needs its parent and its node"
            node_id = spec.get("nodeId")
            if node_id is not None and not _NODE_ID.fullmatch(str(node_id)):
                yield queued, f"nodeId {node_id!r} does not match ^[A-Za-z0-9_.~+%-]+$"
        for key in ("validUntilDuration", "validAfterDuration"):
            duration = (body.get("queueingPolicy") or {}).get(key)
            if duration is not None and not _DURATION.fullmatch(str(duration)):
                yield queued, f"queueingPolicy.{key} {duration!r} is not a duration of seconds ('3600s')"


RULES: tuple[Rule, ...] = (
    Rule("bulk-provisioning-model", _BULK_PAGE, _bulk_needs_flex_or_reservation, True),
    Rule("reservation-bound-specific", _RESERVATION_BOUND_PAGE, _reservation_bound_needs_specific, False),
    Rule("bulk-reservation-bound-delete", _BULK_PAGE, _bulk_reservation_bound_deletes, True),
    Rule("bulk-no-resize-request", _BULK_MODE_PAGE, _bulk_no_resize_request, True),
    Rule("bulk-grows-from-zero", _BULK_MODE_PAGE, _bulk_grows_from_zero, True),
    Rule("topology-machine-type", _TPU_MIG_PAGE, _topology_fits_machine_type, True),
    # No source says Google refuses a MIG larger than its topology (rayslice.cloud.twin).
    Rule("instances-match-topology", _TPU_MIG_PAGE, _instances_match_topology, True, at_end=True, ours=True),
    Rule("tpu-node-exclusive-fields", _TPU_EXCLUSIVE_SOURCE, _tpu_node_exclusive_fields, False),
    Rule("metadata-limits", _METADATA_SOURCE, _metadata_limits, False),
    Rule("resource-name", _NAME_SOURCE, _names, False),
    Rule("labels", _LABELS_SOURCE, _labels, False),
    Rule("tpu-boot-disk", _DISK_SOURCE, _boot_disk_per_generation, False),
    # Google's page uses STOP and refuses nothing else: a Spot template that deletes on
    # preemption is accepted; rayslice keeps STOP so the preempted hosts stay listed (an event
    # can say "preempted") until the controller recreates the slice whole.
    Rule("spot-tpu-stop", _SPOT_SOURCE, _spot_tpu_template_stops, False, ours=True),
    # REPAIR is the MIG's default: Google accepts it; the repaired host could not rejoin the slice.
    Rule("tpu-mig-do-nothing", _TPU_MIG_SOURCE, _tpu_mig_does_nothing, True, ours=True),
    Rule("resize-request-run-duration", _RUN_DURATION_SOURCE, _resize_request_run_duration, False),
    Rule("flex-start-pool-autoscaled", _FLEX_POOL_SOURCE, _flex_pool_autoscaled, False),
    Rule("node-pool-autoscaling-limits", _FLEX_POOL_SOURCE, _autoscaling_limits, False),
    Rule("node-pool-run-duration", _FLEX_POOL_SOURCE, _pool_run_duration, False),
    Rule("queued-resource-shape", _QUEUED_SOURCE, _queued_resource_shape, False),
)


def check(stack: Stack, rules: Iterable[Rule] = RULES) -> list[Violation]:
    """Every violation of `rules` in `stack`, rule by rule."""
    return [
        Violation(resource.urn, resource.name, rule.id, message, rule.source, rule.ours)
        for rule in rules
        for resource, message in rule.check(stack)
    ]


def resource(
    type_token: str, urn: str, name: str, props: Mapping[str, Any], refs: Mapping[str, Iterable[str]]
) -> Resource | None:
    """A Pulumi resource as the rules see it, or None for a type the rules do not read."""
    request = bodies.request(type_token, props)
    if request is None:
        return None
    return Resource(type_token, urn, name, request, {k: frozenset(v) for k, v in refs.items()})
