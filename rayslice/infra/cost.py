"""What a stack costs per hour at list prices, before `pulumi up` (`rayslice preview`).

The slices come from the spec (its shape, zone and capacity: `catalog.slice_hour_price`); the CPU
VMs from what the program registered, so every VM it declares is priced, the head VM and any
other (a separate controller VM, GKE's CPU node pools), each with the machine type and zone it
was declared with. A price the catalog's source does not publish is shown as such and left out
of the total, which then says how many items it lacks, never a guessed number.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rayslice import catalog
from rayslice.cloud import bodies, rules
from rayslice.infra.mocks import Registration
from rayslice.spec import ClusterSpec

NODE_POOL = "gcp:container/nodePool:NodePool"
_TPU_FAMILIES = frozenset(
    family
    for g in catalog.GENERATIONS
    for family in (g.gke_machine_family, g.compute_machine_family)
    if family
)


@dataclass(frozen=True)
class Cost:
    """One priced item: what it is and its USD per hour (None: no published price)."""

    item: str
    per_hour: float | None
    # An elastic cluster's slice above minSlices: billed only while the controller keeps its
    # hosts (docs/elastic.md).
    elastic: bool = False


def stack_costs(spec: ClusterSpec, registrations: Iterable[Registration]) -> list[Cost]:
    """Every slice, then every CPU VM the program declares, with its price per hour."""
    region = catalog.region_of(spec.zone)
    costs = [
        Cost(
            f"slice {spec.slice_name(i)}: {spec.accelerator_type} ({spec.tpu.chips} chips), "
            f"{spec.capacity}{' (queued)' if spec.queued else ''}{', elastic' if elastic else ''}, {region}",
            catalog.slice_hour_price(spec.tpu, region, spec.capacity),
            elastic,
        )
        for i in range(spec.slices)
        for elastic in [spec.elastic and i >= (spec.min_slices or 0)]
    ]
    for r in registrations:
        if r.type == bodies.INSTANCE:
            costs.append(_vm_cost(r, str(r.inputs.get("zone") or spec.zone), 1))
        elif r.type == NODE_POOL and not _is_tpu(_machine(r.inputs.get("nodeConfig"))):
            zone = str((r.inputs.get("nodeLocations") or [spec.zone])[0])
            costs.append(_vm_cost(r, zone, int(r.inputs.get("nodeCount") or 1)))
    return costs


def _machine(holder: Any) -> str:
    return str((holder or {}).get("machineType") or "")


def _is_tpu(machine: str) -> bool:
    return machine.rsplit("-", 1)[0] in _TPU_FAMILIES


def _vm_cost(registration: Registration, zone: str, count: int) -> Cost:
    inputs = registration.inputs
    machine = _machine(inputs) or _machine(inputs.get("nodeConfig"))
    scheduling = inputs.get("scheduling") or {}
    spot = scheduling.get("provisioningModel") == rules.SPOT or bool(
        (inputs.get("nodeConfig") or {}).get("spot")
    )
    capacity = "spot" if spot else "on-demand"
    region = catalog.region_of(zone)
    price = catalog.machine_hour_price(machine, region, capacity)
    name = inputs.get("name") or registration.name
    shown = f"{count} x {machine}" if count > 1 else machine
    return Cost(f"VM {name}: {shown}, {capacity}, {region}", None if price is None else price * count)


def render_costs(costs: list[Cost]) -> str:
    """The cost lines and the whole stack's, with the prices' date and source. With elastic
    slices the stack costs between two totals: without them, and with every one."""
    totals = [("whole stack", costs)]
    if any(c.elastic for c in costs):
        totals = [
            ("whole stack, no elastic slice", [c for c in costs if not c.elastic]),
            ("whole stack, every slice", costs),
        ]
    width = max(len(c.item) for c in costs)
    lines = ["cost per hour at list prices:"]
    lines += [f"  {c.item:<{width}}  {catalog.format_price(c.per_hour)}" for c in costs]
    lines += [f"  {label:<{width}}  {_total(items)}" for label, items in totals]
    lines.append(f"  ({catalog.price_source()})")
    return "\n".join(lines)


def _total(costs: list[Cost]) -> str:
    known = sum(c.per_hour for c in costs if c.per_hour is not None)
    missing = sum(c.per_hour is None for c in costs)
    total = f"${known:,.2f}/h"
    return f"at least {total} ({missing} item(s) without a published price)" if missing else total
