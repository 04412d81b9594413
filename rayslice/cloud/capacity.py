"""How much capacity a zone has, and the requests that wait for it: the cloud twin's stockouts.

A twin of a project (`rayslice.cloud.twin.CloudTwin`) creates whatever is asked; Google does
not. This module holds what the twin needs to behave like Google where capacity runs out, kept
apart from the twin so that its resources and its capacity can be read and tested on their own:

- A zone holds a number of free hosts per machine or accelerator type (`Capacity.set`). Where a
  zone was never given a number, capacity is unlimited (the twin's behaviour so far).
- A direct create (an instance, a TPU node, a GKE pool's nodes) takes its hosts at once or fails
  with `ZONE_RESOURCE_POOL_EXHAUSTED`, the Compute Engine error for a zone without the resources
  (Compute Engine, "Troubleshooting resource availability errors",
  https://cloud.google.com/compute/docs/troubleshooting/troubleshooting-resource-availability),
  and the message names the requests that wait instead. An individual-mode MIG takes what there
  is (`free_of`) and puts a one-host request in line for each instance it could not create.
- A request that waits (a flex-start MIG's resize request, a TPU queued resource) is accepted
  at once and waits while the zone lacks capacity for all its hosts; it is fulfilled whole
  when there is ("the resize request ... creates all the VMs at the same time", Compute Engine,
  "About resize requests in a MIG"), in the order requests came; and it fails when its deadline
  passes first (tpu v2 discovery document, QueueingPolicy.validUntilDuration: "If the request
  cannot be provisioned by this time, it will be FAILED").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rayslice.errors import CloudError, RaysliceError

ZONE_RESOURCE_POOL_EXHAUSTED = "ZONE_RESOURCE_POOL_EXHAUSTED"
# Queued resource states (tpu v2 discovery document, QueuedResourceState.state). SUSPENDED: "The
# resources specified in the QueuedResource request have been deleted" (or, SUSPENDING, are being
# deleted, "initiated by the user, or the Cloud TPU service").
WAITING, ACTIVE, FAILED, SUSPENDED = "WAITING_FOR_RESOURCES", "ACTIVE", "FAILED", "SUSPENDED"
# PROVISIONING: "The QueuedResource request has been selected. The associated resources are
# currently being provisioned"; SUSPENDING: "The resources ... are being deleted".
PROVISIONING, SUSPENDING = "PROVISIONING", "SUSPENDING"
CANCELLED = "CANCELLED"  # withdrawn before it was fulfilled (its MIG or queued resource deleted)


class CapacityExhausted(RaysliceError):
    """A direct create found too few hosts in the zone (Google's error code and message); the
    same exit code as any failed cloud call."""

    exit_code = CloudError.exit_code

    def __init__(self, zone: str, kind: str, wanted: int, free: int):
        self.code = ZONE_RESOURCE_POOL_EXHAUSTED
        super().__init__(
            f"{ZONE_RESOURCE_POOL_EXHAUSTED}: zone {zone} has {free} free {kind} host(s), "
            f"{wanted} asked. A direct create does not wait for capacity: use capacity=flex-start "
            "(compute, gke) or queued=true (tpu-vm) for a request that waits until the zone has it"
        )


@dataclass
class Request:
    """A request that waits for `hosts` hosts of `kind` in `zone`, until `deadline` (None: no
    deadline), then `on_fulfilled` creates them."""

    name: str
    zone: str
    kind: str
    hosts: int
    deadline: float | None
    on_fulfilled: Callable[[], None]
    state: str = WAITING
    reason: str = ""


@dataclass
class Capacity:
    """Free hosts per (zone, kind) and the requests waiting on them, in arrival order."""

    free: dict[tuple[str, str], int] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)

    def set(self, zone: str, kind: str, hosts: int, now: float = 0.0) -> None:
        """The zone now has `hosts` free hosts of `kind`; waiting requests that fit are fulfilled."""
        self.free[(zone, kind)] = hosts
        self.advance(now)

    def free_of(self, zone: str, kind: str) -> int | None:
        """The zone's free hosts of `kind`; None for a zone never limited (room for everything)."""
        return self.free.get((zone, kind))

    def take(self, zone: str, kind: str, hosts: int) -> None:
        """A direct create: take `hosts` hosts now or raise `CapacityExhausted`."""
        free = self.free.get((zone, kind))
        if free is None:
            return  # a zone never limited has room for everything
        if free < hosts:
            raise CapacityExhausted(zone, kind, hosts, free)
        self.free[(zone, kind)] = free - hosts

    def give_back(self, zone: str, kind: str, hosts: int, now: float = 0.0) -> None:
        """Hosts deleted in a limited zone are free again (and may fulfil a waiting request)."""
        if (zone, kind) in self.free:
            self.set(zone, kind, self.free[(zone, kind)] + hosts, now)

    def submit(self, request: Request, now: float = 0.0) -> Request:
        """Accept a request that waits; fulfilled at once if the zone has room for all of it."""
        self.requests.append(request)
        self.advance(now)
        return request

    def advance(self, now: float) -> None:
        """At time `now`: requests past their deadline fail, then waiting ones that fit whole are
        fulfilled in arrival order (a larger one first in line does not block a smaller one)."""
        for request in self.waiting():
            if request.deadline is not None and now >= request.deadline:
                request.state = FAILED
                request.reason = (
                    f"the deadline passed before zone {request.zone} had {request.hosts} free "
                    f"{request.kind} host(s)"
                )
        for request in self.waiting():
            free = self.free.get((request.zone, request.kind))
            if free is not None and free < request.hosts:
                continue
            if free is not None:
                self.free[(request.zone, request.kind)] = free - request.hosts
            request.state = ACTIVE
            request.on_fulfilled()

    def cancel(self, request: Request) -> None:
        """A waiting request withdrawn (cancelled, or its MIG deleted): it never takes capacity."""
        if request.state == WAITING:
            request.state = CANCELLED

    def waiting(self) -> list[Request]:
        return [r for r in self.requests if r.state == WAITING]
