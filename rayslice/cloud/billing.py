"""What a timeline of the cloud twin cost, and how much of it bought nothing.

Google bills a VM while it runs (Compute Engine, "VM instance pricing": "you are billed for
the time the instance is in the RUNNING state"; a stopped, TERMINATED instance is not billed
for its vCPUs or accelerators), a Cloud TPU node while it exists and is usable (READY), a GKE
node as the Compute Engine VM it is, and a GKE cluster its management fee per hour
(`catalog.gke_cluster_hour_price`). A request that waits (a queued resource, a resize request,
a bulk MIG's placeholders, an individual MIG's instances still being created) bills nothing.

The prices are the catalog's (`rayslice.catalog`, `prices.json`, the one copy `rayslice
preview`'s costs use): a TPU host costs its chips at the generation's per-chip price for its
capacity (on-demand, spot, reserved, flex-start), a CPU VM its machine type's price. Where the
catalog publishes no price (reserved, flex-start), its host-hours are counted as unpriced and
left out of the USD totals, never guessed.

A slice can run a job only when every host of it is up: each host its group asks for (a MIG's
target size, a node's workers) RUNNING or READY. While a group is not whole, every host of it
that bills is waste: a partly created slice, a partly broken one, a host left over. A lone VM
(no group) is billed and never counted as waste: the twin cannot tell what it is for.

The twin reports, after every change and every clock move, what bills now (`Line`s); `Bill`
keeps them as segments of time and answers for any interval. Units: `Bill.total` and
`Bill.wasted_usd` are USD; `Bill.host_hours` and `Bill.wasted` are host-hours.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rayslice import catalog


@dataclass(frozen=True)
class Line:
    """One resource's billing at an instant: `hosts` billed hosts (RUNNING or READY; for a
    cluster's fee, 0), `usd_per_hour` for all of them (None: no published price), of which
    `wasted_hosts` cannot run a job."""

    resource: str
    hosts: int
    usd_per_hour: float | None
    wasted_hosts: int = 0


@dataclass
class Charge:
    """What one resource (or a whole bill) cost over an interval."""

    usd: float = 0.0
    host_hours: float = 0.0
    wasted_host_hours: float = 0.0
    wasted_usd: float = 0.0
    unpriced_host_hours: float = 0.0  # host-hours whose capacity has no published price

    def add(self, line: Line, hours: float) -> None:
        self.host_hours += line.hosts * hours
        self.wasted_host_hours += line.wasted_hosts * hours
        if line.usd_per_hour is None:
            self.unpriced_host_hours += line.hosts * hours
            return
        self.usd += line.usd_per_hour * hours
        if line.hosts:
            self.wasted_usd += line.usd_per_hour * line.wasted_hosts / line.hosts * hours


@dataclass
class _Segment:
    start: float
    lines: list[Line]
    end: float | None = None


@dataclass
class Bill:
    """Segments of time, each with what billed during it. `observe` starts a new segment at the
    clock's time with the twin's lines of now (a segment of no length is replaced)."""

    clock: Callable[[], float]
    lines_now: Callable[[], list[Line]]
    segments: list[_Segment] = field(default_factory=list)  # in time order; the last one open

    def observe(self) -> None:
        now, lines = self.clock(), self.lines_now()
        if self.segments:
            last = self.segments[-1]
            if now <= last.start:
                last.lines = lines
                return
            if lines == last.lines:
                return  # nothing changed: the open segment goes on (the segments grow with changes only)
            last.end = now
        self.segments.append(_Segment(now, lines))

    def by_resource(self, since: float | None = None, until: float | None = None) -> dict[str, Charge]:
        """Each resource's charge between `since` and `until` (default: from the first change the
        twin saw to now)."""
        self.observe()
        now = self.clock()
        charges: dict[str, Charge] = {}
        for segment in self.segments:
            start = max(segment.start, since if since is not None else segment.start)
            end = min(segment.end if segment.end is not None else now, until if until is not None else now)
            if end <= start:
                continue
            hours = (end - start) / 3600
            for line in segment.lines:
                charges.setdefault(line.resource, Charge()).add(line, hours)
        return charges

    def charge(self, since: float | None = None, until: float | None = None) -> Charge:
        """The whole project's charge between `since` and `until`."""
        whole = Charge()
        for part in self.by_resource(since, until).values():
            whole.usd += part.usd
            whole.host_hours += part.host_hours
            whole.wasted_host_hours += part.wasted_host_hours
            whole.wasted_usd += part.wasted_usd
            whole.unpriced_host_hours += part.unpriced_host_hours
        return whole

    def total(self, since: float | None = None, until: float | None = None) -> float:
        """USD billed between `since` and `until`, at the catalog's published prices."""
        return self.charge(since, until).usd

    def host_hours(self, since: float | None = None, until: float | None = None) -> float:
        """Host-hours billed between `since` and `until`."""
        return self.charge(since, until).host_hours

    def wasted(self, since: float | None = None, until: float | None = None) -> float:
        """Host-hours billed for hosts of slices that could not run a job (module docstring)."""
        return self.charge(since, until).wasted_host_hours

    def wasted_usd(self, since: float | None = None, until: float | None = None) -> float:
        """USD of `wasted`'s host-hours, where their price is published."""
        return self.charge(since, until).wasted_usd


# ---- prices --------------------------------------------------------------------------------------

ON_DEMAND, SPOT, RESERVED, FLEX_START = catalog.CAPACITIES


def tpu_host_hour_price(generation: str, chips: int, zone: str, capacity: str) -> float | None:
    """USD per hour of one TPU host of `chips` chips (the catalog's per-chip price)."""
    per_chip = catalog.chip_hour_price(generation, catalog.region_of(zone), capacity)
    return None if per_chip is None else per_chip * chips


def vm_hour_price(machine_type: str, zone: str, capacity: str) -> float | None:
    """USD per hour of one CPU VM (the catalog's machine price; None where none is published)."""
    return catalog.machine_hour_price(machine_type, catalog.region_of(zone), capacity)


def gke_fee_per_hour() -> float:
    """GKE's cluster management fee, USD per hour (the catalog's)."""
    return catalog.gke_cluster_hour_price()[0]
