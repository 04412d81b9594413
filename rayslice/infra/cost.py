"""What a stack costs per hour at list prices, before `pulumi up` (`rayslice preview`).

The slices come from the spec (its shape, zone and its capacity cell's price key:
`catalog.slice_hour_price`, `capacity_table.Cell.price_key`); the CPU VMs from what the program
registered, so every VM it declares is priced, the head VM and any other (a separate controller
VM, GKE's CPU node pools), each with the machine type and zone it was declared with; and a GKE
cluster the program creates, with GKE's cluster management fee (GKE pricing: $0.10 per cluster
per hour, whatever the cluster's size; `catalog.gke_cluster_hour_price`). The fee of an existing
cluster (``gkeCluster``) is already being paid and is not the stack's.
A price the catalog's source does not publish is shown as such and left out of the total,
which then says how many items it lacks, never a guessed number.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rayslice import catalog
from rayslice.capacity_table import cell_for
from rayslice.cloud import bodies, rules
from rayslice.infra.mocks import Registration
from rayslice.spec import ClusterSpec

NODE_POOL = "gcp:container/nodePool:NodePool"
GKE_CLUSTER = "gcp:container/cluster:Cluster"
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
    price_key = cell_for(spec).price_key
    costs = [
        Cost(
            f"slice {spec.slice_name(i)}: {spec.accelerator_type} ({spec.tpu.chips} chips), "
            f"{spec.capacity}{' (queued)' if spec.queued else ''}{', elastic' if elastic else ''}, {region}",
            catalog.slice_hour_price(spec.tpu, region, price_key),
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
        elif r.type == GKE_CLUSTER:
            costs.append(_cluster_fee(r))
    return costs


def _cluster_fee(registration: Registration) -> Cost:
    """GKE's management fee of a cluster the program creates. A zonal cluster (its location a
    zone) may be covered by the free tier's monthly credit, one cluster's worth per billing
    account: the line says so, and the total still counts the list fee."""
    fee, credit = catalog.gke_cluster_hour_price()
    location = str(registration.inputs.get("location") or "")
    zonal = location.count("-") == 2  # us-east5-a, not the region us-east5
    name = registration.inputs.get("name") or registration.name
    note = f"; zonal: the ${credit:.2f}/month free-tier credit may cover it" if zonal else ""
    return Cost(f"GKE cluster {name}: management fee (GKE pricing), {location}{note}", fee)


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
