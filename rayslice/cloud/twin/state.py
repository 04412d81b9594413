"""What the twin's three APIs share: the project's resources as the rules read them, its
subnetworks' addresses, the zones' capacity, the clock, the simulator's hooks and the hosts.

`TwinState` is the base of the API mixins (`rayslice.cloud.twin.compute`, `.tpu`, `.container`):
`apply` checks a create call against the rules of `rayslice.cloud.rules` (`admit`, refusing with
`CloudRuleError`) and hands it to the API whose resource it is (`_create`, which each mixin
extends for its own type tokens); `hosts` lists what every API holds (`_all_hosts`, extended the
same way).

- Internal IPs come from the declared subnetwork's ``ipCidrRange``, the first address being the
  gateway (Compute Engine, "Subnets": "the first two ... in the primary IPv4 range are reserved"
  -- .0 network and .1 gateway); a reserved INTERNAL address keeps its IP for the instance that
  names it (per-instance config ``preservedState.internalIPs``, Instance ``networkIP``).
- A Compute Engine TPU host serves ``accelerator-type`` as the host reports it (``v7x-16`` on
  TPU7x), ``worker-id``, ``worker-network-endpoints`` and ``tpu-env``
  (`rayslice.platforms.COMPUTE_TPU_ATTRIBUTES`, whose comment gives the published log); a
  Cloud TPU API worker the attributes of `rayslice.platforms.TPU_API_ATTRIBUTES`. Where no
  source gives an order, the worker id of a MIG's instance is its creation order.
- Capacity (`rayslice.cloud.capacity`, sources there): a direct create of an instance or a TPU
  node takes its hosts from the zone's capacity or fails with ``ZONE_RESOURCE_POOL_EXHAUSTED``
  and creates nothing; an individual-mode MIG creates what the zone has and the rest as hosts
  come (`rayslice.cloud.twin.compute`); a zone never given a number has room for everything.
  Deleting a slice (MIG or TPU node) gives its hosts back to the zone; a preempted host's
  capacity stays with Google. What waits for capacity, and how, is each API's (a bulk MIG, a
  resize request, a queued resource, a flex-start node pool).
- Time (`rayslice.cloud.twin.clock`): `clock` is the wall clock unless a test sets its own;
  `advance` moves it and runs, in time order, every event due on the `schedule`: what Google
  does later (a restart after a host error, the end of a run, a queued request's deadline, its
  provisioning) and what a test put there (`at`, `schedule_capacity`). How long the transitions
  Google gives no figure for take is `timings`. Time never moves back (`TwinTimeError`).
- The bill (`rayslice.cloud.billing`): after every change and clock move the twin tells `bill`
  what bills now (`_bill_lines`, each API's), so a test can ask what a timeline cost and how many
  host-hours bought nothing.
"""

from __future__ import annotations

import ipaddress
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rayslice import catalog
from rayslice.cloud import bodies, rules
from rayslice.cloud.billing import Bill, Line
from rayslice.cloud.bodies import Request
from rayslice.cloud.capacity import Capacity
from rayslice.cloud.twin.clock import (
    NoSuchResource,
    Schedule,
    Timings,
    TwinClock,
    TwinEvent,
    TwinEventError,
    TwinTimeError,
)
from rayslice.errors import InvalidInput

DELETED = "DELETED"  # a host the twin no longer holds (the status its last hook call carries)
MIG_HOST, LONE_VM, TPU_WORKER = "mig", "vm", "tpu-node"
# The collection of a resource's self link, by the Pulumi type token the program declares it with.
COLLECTIONS = {
    bodies.TEMPLATE: "instanceTemplates",
    bodies.MIG: "instanceGroupManagers",
    bodies.RESOURCE_POLICY: "resourcePolicies",
    bodies.INSTANCE: "instances",
    bodies.ADDRESS: "addresses",
    bodies.FIREWALL: "firewalls",
    bodies.NETWORK: "networks",
    bodies.SUBNETWORK: "subnetworks",
    bodies.ROUTER: "routers",
    bodies.PER_INSTANCE_CONFIG: "perInstanceConfigs",
    bodies.SLICE_HOSTS: "perInstanceConfigs",
    bodies.TPU_NODE: "nodes",
    bodies.IMAGE: "images",
    bodies.RESIZE_REQUEST: "resizeRequests",
    bodies.QUEUED_RESOURCE: "queuedResources",
}

# The resources only the program creates and deletes (no API of the twin makes or removes them),
# so the ledger (`TwinState.resources`) is what the project holds of them. The others are checked
# against the tables their API keeps (`ComputeTwin._precheck`, `TpuTwin._precheck`). Not checked:
# an instance template's name is its prefix plus a suffix the provider makes unique per create
# (the twin's stand-in suffix is fixed: `bodies._generated_name`), and per-instance configs and a
# slice's hosts are checked by createInstances itself (`DuplicateInstanceError`).
# A router's NAT is an entry of the router (compute v1 discovery, RouterNat.name: "Unique name of
# this Nat service"), held in the ledger like them.
LEDGER_ONLY = frozenset(
    {
        bodies.RESOURCE_POLICY,
        bodies.FIREWALL,
        bodies.NETWORK,
        bodies.SUBNETWORK,
        bodies.ROUTER,
        bodies.ROUTER_NAT,
        bodies.IMAGE,
    }
)
# Why a create of a name the project holds fails, and how rayslice words it.
ALREADY_EXISTS_SOURCE = (
    "Google Cloud API design guide, 'Errors' (https://cloud.google.com/apis/design/errors): "
    "ALREADY_EXISTS, HTTP 409, 'The resource that a client tried to create already exists.'; the "
    "emulated HTTP APIs answer a second MIG, node or queued resource of one name the same way"
)


def _call_link(call: Create) -> str:
    """The self link `TwinState.admit` records `call`'s resource under."""
    return _self_link(call.type_token, call.resource_name, call.project, call.zone, call.region)


def _self_link(type_token: str, name: str, project: str, zone: str | None, region: str | None) -> str:
    scope = f"zones/{zone}" if zone else f"regions/{region}" if region else "global"
    return f"projects/{project}/{scope}/{COLLECTIONS.get(type_token, 'other')}/{name}"


class CloudRuleError(InvalidInput):
    """Requests the twin refused, as Google would: each names the resource, rule and source."""

    def __init__(self, violations: list[rules.Violation]):
        self.violations = list(violations)
        theirs = "Google's documented rules; Google would refuse this deployment"
        if any(v.ours for v in self.violations):  # rayslice's own rules (rules.Rule.ours) too
            theirs = "Google's documented rules and rayslice's own; this deployment is refused"
        super().__init__(
            f"{len(self.violations)} violation(s) of {theirs}:\n"
            + "\n".join(f"  - {v}" for v in self.violations)
        )


@dataclass(frozen=True)
class TwinHost:
    """One host as the twin holds it and as a real one of its kind presents itself."""

    name: str
    project: str
    zone: str
    group: str | None  # MIG or TPU node; None for a lone VM
    kind: str  # MIG_HOST, LONE_VM or TPU_WORKER
    worker: int
    status: str
    ip: str
    machine_type: str | None
    metadata: dict[str, str]  # instance/attributes/: user metadata and Google's attributes
    labels: dict[str, str]


@dataclass
class Subnet:
    """A subnetwork's range and the addresses handed out of it."""

    network: ipaddress.IPv4Network
    used: set[str] = field(default_factory=set)

    def take(self, wanted: str | None = None) -> str:
        if wanted:
            self.used.add(wanted)
            return wanted
        for address in itertools.islice(self.network.hosts(), 1, None):  # .1 is the gateway
            if str(address) not in self.used:
                self.used.add(str(address))
                return str(address)
        raise InvalidInput(f"subnetwork {self.network} has no free address")


Hook = Callable[[TwinHost], None]


@dataclass(frozen=True)
class Create:
    """One create call, as `TwinState.apply` hands it to the API whose resource it is."""

    type_token: str
    name: str  # the Pulumi resource's name
    request: Request
    project: str
    zone: str | None
    target: str | None  # the resource the call's URL names besides the project and zone
    region: str | None = None

    @property
    def resource_name(self) -> str:
        """The name the resource gets in the cloud (the request's, else the Pulumi name)."""
        return self.request.name or self.name


def short_name(link: Any) -> str:
    """The name at the end of a self link (``...?uniqueId=`` dropped)."""
    return str(link).split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]


def metadata_of(holder: dict[str, Any]) -> dict[str, str]:
    """The ``metadata.items`` of an instance's properties, as a mapping."""
    return {i["key"]: str(i["value"]) for i in holder.get("metadata", {}).get("items", [])}


def rfc3339(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


class TwinState:
    """The project's resources. Keyed by (project, zone or region or "global", name)."""

    def __init__(self, default_range: str | None = None, address_range: str | None = None) -> None:
        """`default_range`: where a subnetwork the twin never saw created (an existing one)
        takes its addresses. `address_range`: where every subnetwork, declared or existing,
        takes them (the simulator's free range; a declared ``ipCidrRange`` still goes through
        the rules but hands out none); its first address is the gateway, as in a subnetwork."""
        self.resources: dict[str, rules.Resource] = {}  # self link -> what the rules read
        self.subnets: dict[str, Subnet] = {}  # subnetwork name -> its range
        # Where a subnetwork the twin never saw created (an existing one) takes its addresses.
        self.default_subnet = Subnet(ipaddress.IPv4Network(default_range)) if default_range else None
        # One pool for every subnetwork when the addresses must come from a given range.
        self.address_pool = Subnet(ipaddress.IPv4Network(address_range)) if address_range else None
        self.refused: list[rules.Violation] = []
        self.on_host_up: Hook | None = None
        self.on_host_down: Hook | None = None
        # Free hosts per zone and type, and the requests that wait for them (`capacity`); the
        # clock dates requests and decides deadlines; the schedule holds what happens later
        # (`rayslice.cloud.twin.clock`); the bill what every change cost (`rayslice.cloud.billing`).
        self.capacity = Capacity()
        self._clock = TwinClock()
        self.schedule = Schedule()
        self.timings = Timings()
        self.bill = Bill(self._now, self._bill_lines)
        self._ids = itertools.count(1)

    # ---- time ------------------------------------------------------------------------------------

    @property
    def clock(self) -> TwinClock:
        """The twin's clock (`clock.now`, seconds since the epoch): the wall clock unless a test
        sets its own (`TwinClock.manual`, or any callable that returns the time)."""
        return self._clock

    @clock.setter
    def clock(self, clock: TwinClock | Callable[[], float]) -> None:
        """A new clock; the bill starts afresh on it (its times are that clock's)."""
        self._clock = clock if isinstance(clock, TwinClock) else TwinClock(clock)
        self.bill.segments.clear()
        self.bill.observe()

    def _now(self) -> float:
        return self._clock.now

    def at(self, when: float, what: str, run: Callable[[], None]) -> TwinEvent:
        """Schedule `run` (described by `what`) for time `when`; it runs when `advance` (or
        `catch_up`) reaches it. `TwinTimeError` for a time already past."""
        now = self.clock.now
        if when < now:
            past = f"{what} scheduled at {rfc3339(when)}, before the twin's time {rfc3339(now)}"
            raise TwinTimeError("no-event-in-the-past", past)
        return self.schedule.add(when, what, run)

    def after(self, seconds: float, what: str, run: Callable[[], None]) -> TwinEvent:
        """Schedule `run` `seconds` from now (`at`)."""
        return self.at(self.clock.now + seconds, what, run)

    def advance(self, seconds: float) -> list[TwinEvent]:
        """Move the clock `seconds` forward, running every event due on the way in time order
        (the clock reads each event's time while it runs); the events run. `TwinTimeError` for a
        negative time: Google's time does not run backwards."""
        if seconds < 0:
            raise TwinTimeError("time-moves-forward", f"cannot advance the twin's clock by {seconds} s")
        return self.advance_to(self.clock.now + seconds)

    def advance_to(self, when: float) -> list[TwinEvent]:
        """Move the clock to `when` (not before now: `TwinTimeError`), running what falls due."""
        now = self.clock.now
        if when < now:
            back = f"cannot move the twin's clock back from {rfc3339(now)} to {rfc3339(when)}"
            raise TwinTimeError("time-moves-forward", back)
        ran = self._run_due(when)
        self.bill.observe()
        self.clock.set(max(when, self.clock.now))
        self.bill.observe()
        return ran

    def catch_up(self) -> list[TwinEvent]:
        """Run what is due at the clock's time without moving it (a wall clock, or a clock a test
        moves itself); the emulated HTTP APIs call it before answering any request. An event
        whose time has passed runs now, late (the clock cannot go back to it), in time order."""
        ran = self._run_due(self.clock.now)
        self.bill.observe()
        return ran

    def _run_due(self, until: float) -> list[TwinEvent]:
        ran = []
        while (event := self.schedule.next_due(until)) is not None:
            self.bill.observe()
            if event.at > self.clock.now:
                self.clock.set(event.at)
            self.bill.observe()
            event.run()
            self.schedule.done.append(event)
            ran.append(event)
            self.bill.observe()
        return ran

    def schedule_capacity(self, zone: str, kind: str, hosts: int, at: float) -> TwinEvent:
        """At time `at`, the zone has `hosts` free hosts of `kind` (`set_capacity` then): capacity
        that arrives, piecemeal or late, or goes. `TwinTimeError` for a time past or a negative
        number of hosts."""
        _check_hosts(zone, kind, hosts)
        what = f"zone {zone} has {hosts} free {kind} host(s)"
        return self.at(at, what, lambda: self.set_capacity(zone, kind, hosts))

    # ---- the bill ------------------------------------------------------------------------------

    def _bill_lines(self) -> list[Line]:
        """What bills now, one line per resource (each API's mixin adds its own)."""
        return []

    # ---- applying the program's resources ------------------------------------------------------

    def apply(
        self,
        type_token: str,
        name: str,
        request: Request,
        *,
        project: str,
        zone: str | None = None,
        region: str | None = None,
        target: str | None = None,
        urn: str | None = None,
    ) -> dict[str, Any]:
        """One create call for Pulumi resource `name`; the outputs Google returns for it.
        `target` is the resource the call's URL names besides the project and zone (a
        per-instance config's MIG); `urn` the Pulumi URN a violation names (see `admit`).

        A broken rule raises `CloudRuleError` and creates nothing (also kept in `refused`)."""
        call = Create(type_token, name, request, project, zone, target, region)
        self._precheck(call, urn)
        link = self.admit(call, urn)
        outputs: dict[str, Any] = {}
        if COLLECTIONS.get(type_token):
            outputs = {"selfLink": link, "selfLinkUnique": f"{link}?uniqueId={next(self._ids)}"}
        outputs.update(self._create(call))
        return outputs

    def _precheck(self, call: Create, urn: str | None) -> None:
        """Refuse, before `admit`, a call that breaks a rule on what the twin holds rather than
        on what the call declares (an image of a running instance's disk, a name its collection
        holds already); each API's mixin adds its own. Raises `CloudRuleError`, kept in
        `refused`. Here: the resources nothing but the program creates or deletes, which only
        the ledger (`resources`) holds."""
        if call.type_token in LEDGER_ONLY and _call_link(call) in self.resources:
            self.already_exists(call, urn)

    def already_exists(self, call: Create, urn: str | None) -> None:
        """Refuse `call`: its collection holds the name already (`ALREADY_EXISTS_SOURCE`)."""
        violation = rules.Violation(
            urn=urn or _call_link(call),
            resource=call.name,
            rule="already-exists",
            message=f"{COLLECTIONS.get(call.type_token, call.type_token)} {call.resource_name} "
            f"already exists in project {call.project} (409 ALREADY_EXISTS): a create whose answer "
            "was lost made it; import it into the stack (`pulumi import`) or delete it, then run "
            "`pulumi up` again",
            source=ALREADY_EXISTS_SOURCE,
        )
        self.refused.append(violation)
        raise CloudRuleError([violation])

    def _create(self, call: Create) -> dict[str, Any]:
        """Make what an admitted create call declares; the outputs beyond its self links. Each
        API's mixin makes its own types and passes the others on; what none makes (a template,
        a firewall, a network) is only recorded, by `admit`."""
        return {}

    def admit(self, call: Create, urn: str | None = None) -> str:
        """Check a create call against the rules and, if none is broken, record what it
        declares for later references; the resource's self link. A broken rule raises
        `CloudRuleError` (kept in `refused` too) and records nothing.

        Violations name the resource by `urn` (the Pulumi URN, so `rayslice preview` shows them
        beside the resource) or, for a call that has none (the HTTP APIs), its self link."""
        link = _call_link(call)
        refs = self._refs(call.type_token, call.request, call.target)
        resource = rules.Resource(call.type_token, urn or link, call.name, call.request, refs)
        try:
            self._check(resource)
        except CloudRuleError as exc:
            self.refused.extend(exc.violations)
            raise
        self.resources[link] = resource
        return link

    def audit(self) -> list[rules.Violation]:
        """The rules that read the finished deployment (a MIG's final size, rules.Rule.at_end)."""
        stack = rules.Stack(self.resources.values())
        return rules.check(stack, [r for r in rules.RULES if r.at_end])

    def violations(self) -> list[rules.Violation]:
        """What Google would refuse of everything applied so far: each refused request, then the
        rules on the finished deployment (`audit`)."""
        return [*self.refused, *self.audit()]

    def _refs(self, type_token: str, request: Request, target: str | None) -> dict[str, frozenset[str]]:
        """What a request refers to, as Google resolves it: the `rules.Resource.urn` of each
        resource this twin holds (or the reference as given)."""
        body = request.body
        refs: dict[str, set[str]] = {}
        if type_token in (bodies.PER_INSTANCE_CONFIG, bodies.SLICE_HOSTS, bodies.RESIZE_REQUEST) and target:
            refs["instanceGroupManager"] = {self._link(f"instanceGroupManagers/{short_name(target)}")}
        if type_token == bodies.MIG:
            refs["versions"] = {self._link(v.get("instanceTemplate")) for v in body.get("versions", [])}
            policy = body.get("resourcePolicies", {}).get("workloadPolicy")
            if policy:
                refs["resourcePolicies"] = {self._link(policy)}
        return {
            k: frozenset(self.resources[u].urn if u in self.resources else u for u in v)
            for k, v in refs.items()
        }

    def _link(self, reference: Any) -> str:
        """The self link of a referenced resource this twin holds (or the reference as given)."""
        text = str(reference).split("?", 1)[0]
        for link in self.resources:
            if text == link or text.endswith(f"/{link}") or link.endswith(f"/{text}"):
                return link
        return text

    def _check(self, resource: rules.Resource) -> None:
        """Refuse `resource` if a rule finds fault with it or with it beside what it refers to."""
        wanted = {u for urns in resource.refs.values() for u in urns}
        related = [r for r in self.resources.values() if r.urn in wanted]
        stack = rules.Stack([resource, *related])
        found = [
            v for v in rules.check(stack, [r for r in rules.RULES if not r.at_end]) if v.urn == resource.urn
        ]
        if found:
            raise CloudRuleError(found)

    def _subnet(self, reference: Any) -> Subnet | None:
        if self.address_pool is not None:
            return self.address_pool
        found = self.subnets.get(short_name(reference)) if reference else None
        return found if found is not None else self.default_subnet

    def set_capacity(self, zone: str, kind: str, hosts: int) -> None:
        """The zone now has `hosts` free hosts of `kind` (a machine type, or a TPU generation on
        the TPU API): requests that now fit are fulfilled, in order."""
        _check_hosts(zone, kind, hosts)
        self.capacity.set(zone, kind, hosts, self.clock.now)
        self.bill.observe()

    def _call(self, hook: Hook | None, host: TwinHost) -> None:
        """Tell the simulator a host went up or down (`hook`); the bill sees the change."""
        if hook is not None:
            hook(host)
        self.bill.observe()

    # ---- failures ------------------------------------------------------------------------------

    def preempt(
        self, project: str, zone: str, group: str, *, action: str | None = None, repair: bool = True
    ) -> list[TwinHost]:
        """A Spot preemption of slice `group`; the API that holds the slice does it (see its
        mixin). `NoSuchResource` (a `KeyError`) when none holds it: a host cannot be preempted
        before it exists."""
        raise NoSuchResource("preempt-existing-host", f"no slice {group} in {project}/{zone} to preempt")

    # ---- what the hosts see --------------------------------------------------------------------

    def hosts(self, project: str | None = None, zone: str | None = None) -> list[TwinHost]:
        """Every instance and TPU worker that exists, by group and worker."""
        return sorted(
            (h for h in self._all_hosts() if project in (None, h.project) and zone in (None, h.zone)),
            key=lambda h: (h.group or "", h.worker, h.name),
        )

    def host(self, name: str) -> TwinHost | None:
        return next((h for h in self.hosts() if h.name == name), None)

    def _all_hosts(self) -> list[TwinHost]:
        """The hosts each API holds (each mixin adds its own)."""
        return []


def _check_hosts(zone: str, kind: str, hosts: int) -> None:
    """A zone's free hosts are a count: `TwinEventError` for a negative one."""
    if hosts < 0:
        raise TwinEventError("capacity-not-negative", f"zone {zone} cannot have {hosts} free {kind} host(s)")


def google_attributes(
    names: tuple[str, ...],
    *,
    accelerator_type: str,
    topology: str,
    worker: int,
    ips: list[str],
    node_id: str,
    project: str,
    zone: str,
    runtime_version: str,
) -> dict[str, str]:
    """The identity attributes `names` a TPU host of `accelerator_type` serves, valued as a real
    host serves them: the accelerator type as the host reports it (`catalog.reported_name`),
    endpoints as ``unknown:unknown:<ip>`` entries, `tpu-env` as ``KEY: 'value'`` lines."""
    reported = catalog.reported_name(accelerator_type) if accelerator_type else ""
    tpu_env = {
        "ACCELERATOR_TYPE": reported,
        "CONSUMER_PROJECT_ID": project,
        "NODE_ID": node_id,
        "RUNTIME_VERSION": runtime_version,
        "TOPOLOGY": topology,
        "WORKER_ID": str(worker),
        "ZONE": zone,
    }
    served = {
        "accelerator-type": reported,
        "agent-worker-number": str(worker),
        "worker-id": str(worker),
        "instance-id": node_id,
        "worker-network-endpoints": ",".join(f"unknown:unknown:{ip}" for ip in ips),
        "tpu-env": "".join(f"{key}: '{value}'\n" for key, value in tpu_env.items()),
    }
    return {key: served[key] for key in names}
