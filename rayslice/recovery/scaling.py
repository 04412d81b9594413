"""Elastic slices: how many whole slices Ray's demand needs, and which slices to add or remove.

An elastic cluster (spec ``minSlices``) has `Target.slices` slices declared; the first
`ScalingPolicy.min_slices` always have hosts (Pulumi's per-instance configs), the rest are the
controller's: their MIGs exist empty and the controller adds or removes their hosts, whole
slices only (`rayslice.infra.compute.slice.controller_owns`).

What Ray needs comes from the head: it publishes Ray's own autoscaling demand and each slice's
use as a guest attribute (`rayslice.recovery.demand`), which the controller reads through the
Compute API, since it has no network path to Ray. `decide` is pure: one reading, the slices that
have hosts, and the time, in; the slices to add and to remove and what demand waits on, out.

- **Up.** The demand in whole slices (`demand.slices_wanted`) minus the slices that could take it
  now (a slice with hosts and nothing scheduled, or hosts still booting) is what is missing.
  Missing slices are added in index order, up to `Target.slices` and the price ceiling
  (`ScalingPolicy.price_cap_slices`); what is left says which limit it waits on. Demand must be
  missing in two readings in a row: ``slice_placement_group`` reserves a slice's head bundle, then
  asks for the slice's hosts in a second placement group that is pending for a moment while the
  slice is already busy, and one reading of it would add a slice nobody needs.
- **Asked.** What ``ray.autoscaler.sdk.request_resources`` asks the cluster to hold in all
  (`demand.slices_asked`; Ray Train's elastic JaxTrainer asks for its workers so) is a floor:
  fewer slices than that are missing, busy or not, and no slice is removed below it.
- **Down.** A controller-owned slice whose every host joined Ray, with nothing scheduled on any of
  them (no task, actor or placement group bundle: Ray's own idle time, `idle_time_ms`) for
  `ScalingPolicy.idle_timeout_s`, is removed, unless the demand still needs it. A slice with a
  running job is never idle, so it is never removed. No reading, or a stale one (the head down),
  removes nothing, and neither does one stamped in the future (`AHEAD_AFTER_S`).
- **Trust.** Any job on the cluster can write the reading (`rayslice.recovery.demand`). A forged
  one can make the controller add slices, never beyond `Target.slices` and the price ceiling, and
  remove the slices above `ScalingPolicy.min_slices` (by calling them idle); it cannot reach the
  first `min_slices`, another cluster's slices or anything else.
- **Flex-start** (`ScalingPolicy.run_duration_s` set). A slice is added by resizing its bulk MIG
  from 0 to its hosts, which waits for capacity (Compute Engine, "About bulk mode"). While it
  waits, the slice counts as added (it takes the demand that asked for it: no second resize, and
  it counts against the limits); if the demand no longer needs it before its hosts come, it is
  cancelled (resized back to 0), last slice first, before any idle slice with hosts is removed.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from rayslice.names import NIC, address_name
from rayslice.recovery.demand import Demand, slices_asked, slices_wanted

# A reading older than this is stale: the head stopped publishing (down, restarting), so nothing
# is removed and nothing added on it.
STALE_AFTER_S = 120.0
# A reading stamped further ahead of the controller's clock than this is not believed: it would
# never go stale. Two VMs that keep Google's time differ by far less; a forged ``at`` does not.
AHEAD_AFTER_S = 60.0


@dataclasses.dataclass(frozen=True)
class ScalingPolicy:
    """What the spec says about an elastic cluster, as the controller VM's metadata carries it
    (`rayslice.startup_scripts.controller`: JSON, since the controller's bundle has no spec)."""

    min_slices: int
    idle_timeout_s: float
    accelerator_type: str  # as Ray names it in a slice's head resource, TPU-<type>-head
    chips_per_slice: int
    hosts_per_slice: int
    head_instance: str  # the head VM, whose guest attributes carry the demand
    region: str  # where the slices' reserved addresses are
    price_cap_slices: int | None = None  # the most slices under maxUsdPerHour; None: no ceiling
    ceiling: str = ""  # how status names the ceiling, e.g. "maxUsdPerHour=100 ($43.20/h a slice)"
    # capacity=flex-start: a slice is added by resizing its bulk MIG from 0, its hosts running for
    # this long (maxRunHours in seconds, set in the template); None: createInstances of named hosts.
    run_duration_s: int | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ScalingPolicy:
        """The policy in `text`; ValueError names what is wrong (the controller then exits 2)."""
        try:
            data = json.loads(text)
            return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})
        except (ValueError, TypeError) as exc:
            raise ValueError(f"not an elastic scaling policy: {exc}") from None


@dataclasses.dataclass(frozen=True)
class Decision:
    add: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()
    cancel: tuple[str, ...] = ()  # slices whose waiting resize request is no longer needed
    waiting: str = ""  # what unmet demand waits on ("" when none waits)
    wanted: int = 0  # slices the demand needs now
    asked: int = 0  # slices request_resources asks the cluster to hold in all
    missing: int = 0  # of those, slices no slice with hosts can take


def decide(
    policy: ScalingPolicy,
    slices: Sequence[str],
    with_hosts: Collection[str],
    demand: Demand | None,
    now: float,
    missing_before: bool,
    waiting: Collection[str] = (),
) -> Decision:
    """One scaling decision.

    `slices` are all the cluster's slices, in index order; `with_hosts` those whose MIG has or is
    creating hosts; `demand` the head's last reading (None: none yet); `missing_before` whether
    the previous reading also found slices missing; `waiting` the slices without hosts whose
    resize request waits for capacity (flex-start).
    """
    if demand is None or now - demand.at > STALE_AFTER_S:
        return Decision(waiting="no recent demand from the head" if demand is None else "")
    if demand.at - now > AHEAD_AFTER_S:
        return Decision(
            waiting=f"the head's demand is stamped {demand.at - now:.0f}s ahead of this controller's "
            "clock: ignored until a reading in time comes"
        )
    owned = list(slices[policy.min_slices :])
    added = set(with_hosts) | set(waiting)  # a waiting request is a slice being added
    present = [s for s in slices if s in added]
    wanted = slices_wanted(demand, policy.accelerator_type, policy.chips_per_slice)
    # What request_resources asks the cluster to hold in all (Ray Train's elastic scaling): that
    # many slices are kept, busy or not, and added if fewer are there.
    asked = slices_asked(demand, policy.accelerator_type, policy.chips_per_slice)
    # A slice takes new work when it has hosts and nothing on them, or its hosts have not all
    # joined yet (booting: the demand is why it was added).
    free = [s for s in present if _free(demand, s, policy.hosts_per_slice)]
    missing = max(wanted - len(free), asked - len(present))
    if missing > 0:
        if not missing_before:  # added if it is still missing at the next reading
            return Decision(wanted=wanted, asked=asked, missing=missing)
        limit = len(slices) if policy.price_cap_slices is None else min(len(slices), policy.price_cap_slices)
        room = max(0, limit - len(present))
        add = tuple([s for s in owned if s not in added][: min(missing, room)])
        waiting = ""
        if missing > len(add):
            waiting = f"{missing - len(add)} more slice(s) wanted; " + (
                f"slices={len(slices)} reached"
                if limit == len(slices)
                else f"the price ceiling {policy.ceiling} allows {limit}"
            )
        return Decision(add=add, wanted=wanted, asked=asked, missing=missing, waiting=waiting)
    idle = [
        s
        for s in owned
        if s in with_hosts and _idle_for(demand, s, policy.hosts_per_slice) >= policy.idle_timeout_s
    ]
    spare = min(len(free) - wanted, len(present) - asked)  # free slices nothing needs or asks for
    # A request no longer needed goes first, while its hosts (which would cost) have not come.
    cancel = [s for s in reversed(owned) if s in waiting][: max(0, spare)]
    spare -= len(cancel)
    idle.sort(key=lambda s: -_idle_for(demand, s, policy.hosts_per_slice))
    return Decision(remove=tuple(idle[: max(0, spare)]), cancel=tuple(cancel), wanted=wanted, asked=asked)


def _free(demand: Demand, name: str, hosts: int) -> bool:
    use = demand.slices.get(name)
    return use is None or use.nodes < hosts or not use.busy


def _idle_for(demand: Demand, name: str, hosts: int) -> float:
    """Seconds every host of slice `name` has had nothing scheduled; 0 if any is busy, or the
    slice has not all joined (a booting slice is not idle, it has not started)."""
    use = demand.slices.get(name)
    if use is None or use.nodes < hosts or use.busy:
        return 0.0
    return use.idle_s


def instances_of(policy: ScalingPolicy, project: str, hosts: Sequence[str]) -> list[Mapping[str, Any]]:
    """The createInstances entries that add a slice's hosts with the names and reserved internal
    addresses infra gave them: the per-instance config Pulumi would have declared
    (rayslice/infra/compute/slice.py; compute v1 PerInstanceConfig.preservedState.internalIPs)."""
    return [host_config(host, address_link(project, policy.region, host)) for host in hosts]


def host_config(host: str, address: Any) -> dict[str, Any]:
    """One createInstances entry (compute v1 PerInstanceConfig): host `host` with its reserved
    internal address `address` (a self link) kept on its first interface, never released with the
    host (``autoDelete`` NEVER: the address is Pulumi's). The program's SliceHosts
    (rayslice/infra/compute/bulk_hosts.py) and the controller send the same entries."""
    return {
        "name": host,
        "preservedState": {"internalIPs": {NIC: {"autoDelete": "NEVER", "ipAddress": {"address": address}}}},
    }


def address_link(project: str, region: str, host: str) -> str:
    """Host `host`'s reserved internal address (`names.address_name`), as a partial URL, which
    Compute Engine takes wherever a resource is referenced."""
    return f"projects/{project}/regions/{region}/addresses/{address_name(host)}"
