"""What a simulation is made of, and the state file that lets `down` find it.

`make_plan` is pure: from a spec, a run id and a subnet it names every host, namespace, veth and
directory. The plan is written to ``state.json`` BEFORE anything is created, and every process
is recorded as soon as it starts, so `rayslice local down` can remove exactly what exists after
a crash or a Ctrl-C of `up` — by exact name and PID, never by pattern.

Names carry a random run id, so parallel simulations and other people's namespaces never
collide. Interface names must fit Linux's 15 characters: ``rsl<id>`` is 9.

The simulator acts on this file as root, so it trusts nothing in it (`check_state`): the state
dir is the directory the file was loaded from (a different one recorded inside is refused), the
file must be private (`private_files`), and every recorded name must be exactly what `make_plan`
would derive from the run id — a host name in GCE's instance-name form, ``rsl-<run id>-<host>``
for its namespace, ``rsl<run id>h<i>`` / ``p<i>`` for its veth pair, ``/run/rayslice-local/<run
id>`` for the root — before `destroy` deletes anything. Process keys name a host of the plan
(``metadata:<host>``, ``boot:<host>``) or are exactly `CLOUD_API_PROCESS`, the simulation's
one root-namespace process.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from rayslice.errors import InvalidInput, SimulatorError
from rayslice.local.host.netns import RUN_ID, bridge_name, host_links
from rayslice.local.host.paths import HOST_NAME
from rayslice.local.host.private_files import read_private, write_private
from rayslice.local.host.processes import ProcessRef
from rayslice.names import (
    ATTR_HEAD_ADDRESS,
    CONTROLLER_VM_ROLE,
    HEAD_VM_ROLE,
    HEAD_VM_SLICE_INDEX,
    controller_name,
    head_name,
    host_name,
)
from rayslice.spec import ClusterSpec

STATE_FILE = "state.json"
STATE_DIR_ENV = "RAYSLICE_STATE_DIR"
DEFAULT_STATE_DIR = Path(".state/local")


def default_state_dir() -> Path:
    """Where `rayslice local` keeps a simulation unless told otherwise (and where `run` looks)."""
    return Path(os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


# Every host runs the same script, rendered with one root: ROOTS_DIR/<run id>. Inside each host's
# mount namespace that path is a bind mount of the host's own directory under the state dir. The
# path is short because Ray's AF_UNIX socket paths below the root must stay under 108 bytes.
DEFAULT_ROOTS_DIR = Path("/run/rayslice-local")

ROLE_HEAD = "head"  # the first host of the slice with head=slice (`_leads`)
ROLE_WORKER = "worker"  # every other TPU host
ROLE_HEAD_VM = HEAD_VM_ROLE  # the CPU head VM with head=vm
# The recovery controller's own VM (`ClusterSpec.runs_recovery`): no Ray, booted with the
# controller's script, holding the emulated cloud API's credentials (`Plan.controller`).
ROLE_CONTROLLER_VM = CONTROLLER_VM_ROLE
ROLES = (ROLE_HEAD, ROLE_WORKER, ROLE_HEAD_VM, ROLE_CONTROLLER_VM)
# The roles of a lone VM (no MIG, no TPU node) the Pulumi program may declare, read from the
# role label it puts on the instance (`HostRecord.role`): any other lone VM is a stray.
LONE_VM_ROLES = (ROLE_HEAD_VM, ROLE_CONTROLLER_VM)

PROCESS_KINDS = ("metadata", "boot")  # state.processes keys are "<kind>:<host name>"
# The one process of the simulation itself rather than of a host: the cloud API emulation
# (`cloud_bridge`), in the root namespace on the bridge address. Its key has no host part, and
# `destroy` stops it only while its command line is still exactly `cloud_api_argv`.
CLOUD_API_PROCESS = "cloud-api"
CLOUD_API_MODULE = "rayslice.local.simulation.cloud_bridge"
# Its files, directly in the state dir (0600 where secret): URL, admin token and endpoint
# overrides; the owner's service-account key for `rayslice status`; its output.
CLOUD_API_ENDPOINT_FILE = "cloud-api.json"
CLOUD_API_CREDENTIALS_FILE = "cloud-api-credentials.json"
CLOUD_API_LOG = "cloud-api.log"
# What the Pulumi program deployed to the emulation's twin (the hosts `create` then builds), or
# the rules the twin refused it with.
CLOUD_API_HOSTS_FILE = "cloud-hosts.json"
# The zone's free hosts when the emulation starts (`local up --zone-capacity`), if limited.
CLOUD_API_CAPACITY_FILE = "cloud-capacity.json"
CLOUD_API_FILES = (
    CLOUD_API_ENDPOINT_FILE,
    CLOUD_API_CREDENTIALS_FILE,
    CLOUD_API_LOG,
    CLOUD_API_HOSTS_FILE,
    CLOUD_API_CAPACITY_FILE,
)
FIREWALL_BACKENDS = ("nft", "iptables", "none")


@dataclass(frozen=True)
class HostPlan:
    """One simulated host: its hostname, role, place in the cluster and its namespace plumbing."""

    name: str  # hostname (`names.host_name`, e.g. rayslice-slice-0-w1) or rayslice-head
    role: str  # one of ROLES
    slice_index: int  # -1 for the head VM
    worker: int  # TPU worker number in its slice; -1 for the head VM
    ip: str
    netns: str
    veth: str  # root-namespace end, enslaved to the bridge
    veth_peer: str  # the host's end until it is moved into the namespace and renamed eth0


@dataclass(frozen=True)
class Plan:
    run_id: str
    config: dict  # spec.as_config(), so status/down can rebuild the spec
    network: str  # CIDR of the simulation's private subnet
    gateway: str  # the bridge's address: the owner reaches hosts (dashboard) through it
    bridge: str
    root: str  # RenderOptions.root of every host (a per-host bind mount inside each host)
    hosts: tuple[HostPlan, ...]  # the Ray hosts
    controller: HostPlan | None = None  # the recovery controller's VM: a machine, not a Ray host

    @property
    def shared_dir(self) -> str:
        """A folder of the machine that every host sees at this same path and may write, as every
        host of a real cluster mounts the same bucket or Filestore share: where a multi-host job
        keeps its checkpoints. Everything else of the machine is read-only to a host
        (`confinement`); the folder goes with the simulation (`destroy`)."""
        return f"{self.root}-shared"

    @property
    def machines(self) -> tuple[HostPlan, ...]:
        """Every simulated VM: the controller's first, then the Ray hosts, in the order of their
        veth indices (`host_links`), so that a host the cloud creates later (`extend_plan`) is
        appended without renaming any other."""
        return ((self.controller,) if self.controller is not None else ()) + self.hosts

    @property
    def ip_network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.network)

    @property
    def head(self) -> HostPlan:
        head = next((h for h in self.hosts if h.role in (ROLE_HEAD, ROLE_HEAD_VM)), None)
        if head is None:  # saved before the cloud twin's hosts are known (`Simulation.create`)
            raise SimulatorError("this simulation has no hosts yet: `rayslice local up` is still creating it")
        return head

    @property
    def admitted(self) -> list[str]:
        """Addresses of the hosts that may open connections to the machine: the controller VM's,
        the one host the cloud API emulation and the machine's packet filter admit (`cloud_bridge`,
        `firewall`)."""
        return [self.controller.ip] if self.controller is not None else []

    def host(self, name: str) -> HostPlan:
        for h in self.machines:
            if h.name == name:
                return h
        raise KeyError(
            f"no host {name!r} in this simulation; hosts: {', '.join(h.name for h in self.machines)}"
        )

    def slice_ips(self, slice_index: int) -> list[str]:
        return [h.ip for h in sorted(self.hosts, key=lambda h: h.worker) if h.slice_index == slice_index]


@dataclass
class SimulationState:
    """The state file's content: the plan plus what has been started so far.

    `state_dir` is where the file lives; it is written into the file for people reading it, and
    `load` refuses a file whose recorded dir is not the one it was loaded from.
    """

    plan: Plan
    state_dir: str
    # "metadata:<host>" / "boot:<host>" / CLOUD_API_PROCESS
    processes: dict[str, ProcessRef] = field(default_factory=dict)
    # Directories of this machine every host must see although each host gets a private /tmp:
    # the venv and source tree rayslice runs from and the package source (they may live in /tmp).
    shared_paths: tuple[str, ...] = ()
    firewall: str = "none"  # FIREWALL_BACKENDS: what guards the bridge subnet (`firewall`)
    insecure: bool = False  # created with insecure=True: no token auth

    def save(self) -> None:
        write_private(Path(self.state_dir) / STATE_FILE, json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, state_dir: Path) -> SimulationState | None:
        """The state in `state_dir`, checked (`check_state`); None when there is no state file."""
        path = Path(os.path.abspath(state_dir)) / STATE_FILE
        if not os.path.lexists(path):
            return None
        try:
            raw = json.loads(read_private(path))
            plan = raw["plan"]
            controller = plan.get("controller")
            hosts = tuple(HostPlan(**h) for h in plan["hosts"])
            state = cls(
                plan=Plan(**{**plan, "hosts": hosts, "controller": controller and HostPlan(**controller)}),
                state_dir=raw["state_dir"],
                processes={k: ProcessRef(**v) for k, v in raw["processes"].items()},
                shared_paths=tuple(raw.get("shared_paths", ())),
                firewall=raw.get("firewall", "none"),
                insecure=bool(raw.get("insecure", False)),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise SimulatorError(
                f"{path} is not a rayslice simulation state file ({exc!r}); nothing was touched"
            ) from None
        if state.state_dir != str(path.parent):
            raise SimulatorError(
                f"{path} names state dir {state.state_dir!r} but was loaded from {path.parent}: refusing "
                "to act on a state file that was moved or edited; nothing was touched"
            )
        check_state(state)
        return state


def check_state(state: SimulationState) -> None:
    """Refuse a state whose names or paths are not exactly what this simulator would have made.

    Everything `destroy` deletes or kills is derived from these values, so each is checked
    against the simulator's own patterns before anything is touched.
    """
    problems = _plan_problems(state.plan)
    host_names = {h.name for h in state.plan.machines}
    for key, ref in state.processes.items():
        kind, _, host = key.partition(":")
        if key != CLOUD_API_PROCESS and (kind not in PROCESS_KINDS or host not in host_names):
            problems.append(
                f"process key {key!r} is not {CLOUD_API_PROCESS!r} or "
                f"<{'|'.join(PROCESS_KINDS)}>:<host of this plan>"
            )
        if not (isinstance(ref.pid, int) and isinstance(ref.start_time, int) and ref.pid > 1):
            problems.append(f"process {key!r} has no valid pid/start time: {ref!r}")
    for shared in state.shared_paths:
        if not _clean_absolute(shared):
            problems.append(f"shared path {shared!r} is not a normalized absolute path")
    if state.firewall not in FIREWALL_BACKENDS:
        problems.append(f"firewall {state.firewall!r} is not one of {', '.join(FIREWALL_BACKENDS)}")
    if problems:
        raise SimulatorError(
            "refusing a state file this simulator did not write (tampered or from another tool); "
            "nothing was touched:\n" + "\n".join(f"  - {p}" for p in problems)
        )


def cloud_api_argv(python: str, state_dir: str | Path) -> list[str]:
    """The command line of the simulation's cloud API emulation (what `destroy` checks before stopping it)."""
    return [python, "-m", CLOUD_API_MODULE, "--state-dir", str(state_dir)]


def _clean_absolute(path: str) -> bool:
    return (
        isinstance(path, str) and os.path.isabs(path) and os.path.normpath(path) == path and "\0" not in path
    )


def _plan_problems(plan: Plan) -> list[str]:
    problems: list[str] = []
    run_id = plan.run_id
    if not (isinstance(run_id, str) and RUN_ID.fullmatch(run_id)):
        return [f"run id {run_id!r} is not six hex digits"]
    if plan.bridge != bridge_name(run_id):
        problems.append(f"bridge {plan.bridge!r} is not {bridge_name(run_id)!r}")
    if plan.root != str(DEFAULT_ROOTS_DIR / run_id):
        problems.append(f"root {plan.root!r} is not {str(DEFAULT_ROOTS_DIR / run_id)!r}")
    try:
        network = ipaddress.IPv4Network(plan.network)
        addresses = [
            ipaddress.IPv4Address(plan.gateway),
            *(ipaddress.IPv4Address(h.ip) for h in plan.machines),
        ]
        if not all(a in network for a in addresses):
            problems.append(f"an address is outside the simulation's network {network}")
    except (ValueError, TypeError) as exc:
        problems.append(f"bad network or address: {exc}")
    seen: set[str] = set()
    for i, host in enumerate(plan.machines):
        if not (isinstance(host.name, str) and HOST_NAME.fullmatch(host.name)) or host.name in seen:
            problems.append(
                f"host name {host.name!r} is not a unique GCE instance name ([a-z][-a-z0-9]*, <= 63)"
            )
            continue
        seen.add(host.name)
        expected = HostPlan(
            host.name, host.role, host.slice_index, host.worker, host.ip, *host_links(run_id, i, host.name)
        )
        for attribute in ("netns", "veth", "veth_peer"):
            found, wanted = getattr(host, attribute), getattr(expected, attribute)
            if found != wanted:
                problems.append(f"host {host.name}: {attribute} {found!r} is not {wanted!r}")
        if host.role not in ROLES or (host.role == ROLE_CONTROLLER_VM) != (host is plan.controller):
            problems.append(
                f"host {host.name}: role {host.role!r} is not one of {', '.join(ROLES)} in its place"
            )
    return problems


def extend_plan(plan: Plan, spec: ClusterSpec, records: Sequence[HostRecord]) -> Plan:
    """`plan` with the slice hosts `records` appended: hosts the cloud created after `local up`
    (a flex-start slice's resize request, fulfilled when capacity came). Each keeps its record's
    name, worker and IP (from the simulation's network, `cloud_bridge`) and gets the next veth
    index, so no host already there is renamed; `check_state` accepts the result as it accepts
    a plan of `make_plan`."""
    slices = {spec.slice_name(s): s for s in range(spec.slices)}
    taken = {h.name for h in plan.machines} | {h.ip for h in plan.machines} | {plan.gateway}
    problems = [
        r.name
        for r in records
        if r.group not in slices
        or not r.ip
        or not HOST_NAME.fullmatch(r.name)
        or r.name in taken
        or r.ip in taken
        or ipaddress.IPv4Address(r.ip) not in plan.ip_network
    ]
    if problems:
        raise SimulatorError(f"cannot add hosts {problems} to the simulation: not new workers of its slices")
    start = len(plan.machines)
    added = tuple(
        HostPlan(
            r.name,
            ROLE_WORKER,  # the head is elsewhere: a slice whose hosts come later runs head=vm
            slices[str(r.group)],
            r.worker,
            str(r.ip),
            *host_links(plan.run_id, start + i, r.name),
        )
        for i, r in enumerate(records)
    )
    return replace(plan, hosts=plan.hosts + added)


def new_run_id() -> str:
    return secrets.token_hex(3)


def subnet_prefix(host_count: int) -> int:
    """The longest prefix (at most /24) with room for the hosts, the bridge, network and broadcast."""
    return min(24, 32 - math.ceil(math.log2(host_count + 3)))


def address_room(spec: ClusterSpec) -> int:
    """How many addresses a simulation's network keeps for hosts. It is chosen before the Pulumi
    program runs, so it holds twice the spec's TPU hosts (a program that creates too many shows
    as too many hosts, not as a twin out of addresses) plus every lone VM it may declare."""
    return 2 * spec.total_hosts + len(LONE_VM_ROLES)


@dataclass(frozen=True)
class HostRecord:
    """One host to simulate, as the cloud holds it: its instance name, its slice (MIG or TPU node
    name; None for a lone VM such as the head VM) and worker number, its IP (None: the next free
    address of the simulation's network), the ``instance/attributes/`` Google serves it, its
    role if it is a lone VM, and its machine type. `make_plan` places and names a simulation's
    hosts from these; `Simulation.create` takes them from the cloud twin (`cloud_bridge`)."""

    name: str
    group: str | None
    worker: int
    ip: str | None = None
    metadata: Mapping[str, str] | None = None
    role: str | None = None  # a lone VM's role as the program labels it (LONE_VM_ROLES)
    machine_type: str | None = None  # None: the spec's (head VM or TPU host)


def write_deployed(state_dir: Path, hosts: Sequence[HostRecord] = (), refused: str = "") -> None:
    """Write what the cloud twin holds after the Pulumi program ran (the emulation does, as
    root), or `refused`: the rules it refused the program with, on one line."""
    content = {"refused": refused} if refused else {"hosts": [asdict(h) for h in hosts]}
    write_private(Path(state_dir) / CLOUD_API_HOSTS_FILE, json.dumps(content))


def read_deployed(state_dir: Path) -> list[HostRecord]:
    """The hosts `write_deployed` wrote; `InvalidInput` with the twin's refusal, if that is what it wrote."""
    path = Path(state_dir) / CLOUD_API_HOSTS_FILE
    try:
        content = json.loads(read_private(path))
        if "refused" in content:
            raise InvalidInput(str(content["refused"]))
        return [HostRecord(**h) for h in content["hosts"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise SimulatorError(
            f"{path} is not a list of deployed hosts ({exc!r}); see {CLOUD_API_LOG}"
        ) from None


def spec_hosts(spec: ClusterSpec) -> list[HostRecord]:
    """The hosts a spec describes, named as infra names them: the head VM (head=vm), then each
    slice's workers in order, then the recovery controller's VM (with recovery)."""
    records = [HostRecord(head_name(spec.name), None, 0, role=ROLE_HEAD_VM)] if spec.head == "vm" else []
    for s in range(spec.slices):
        records += [
            HostRecord(host_name(spec.slice_name(s), w), spec.slice_name(s), w) for w in range(spec.tpu.hosts)
        ]
    if spec.runs_recovery:
        records.append(HostRecord(controller_name(spec.name), None, 0, role=ROLE_CONTROLLER_VM))
    return records


def _leads(record: HostRecord, ip: str) -> bool:
    """Whether a host of slice 0 is the head with head=slice, by the boot script's rule
    (``read_identity``): the host at the head address its metadata names (Compute Engine), else
    worker 0."""
    address = (record.metadata or {}).get(ATTR_HEAD_ADDRESS)
    return ip == address if address else record.worker == 0


def make_plan(
    spec: ClusterSpec,
    *,
    run_id: str,
    network: ipaddress.IPv4Network,
    hosts: Sequence[HostRecord] | None = None,
) -> Plan:
    """Place `hosts` (default: `spec_hosts`) on `network`: the controller's VM (with recovery),
    the head VM (head=vm), then each slice's workers in order (`Plan.machines`). A record's IP is kept;
    one without gets the next free address (the first address of the network is the bridge's).
    A lone VM takes its role from the record (the program's role label); an empty `hosts` is the
    plan `create` saves before the twin's hosts are known."""
    head_vm = spec.head == "vm"
    slices = {spec.slice_name(s): s for s in range(spec.slices)}
    records = list(spec_hosts(spec) if hosts is None else hosts)
    wanted = {ROLE_HEAD_VM: head_vm, ROLE_CONTROLLER_VM: spec.runs_recovery}
    lone_roles = {role for role in LONE_VM_ROLES if wanted[role]}
    strays = [r.name for r in records if r.group is None and r.role not in lone_roles]
    strays += [r.name for r in records if r.group is not None and r.group not in slices]
    if strays:
        raise SimulatorError(
            f"hosts {strays} are neither a lone VM the spec has ({', '.join(sorted(lone_roles)) or 'none'}) "
            f"nor a worker of one of its slices ({', '.join(slices)}); nothing was created"
        )
    heads = [r.name for r in records if r.group is None and r.role == ROLE_HEAD_VM]
    controllers = [r.name for r in records if r.group is None and r.role == ROLE_CONTROLLER_VM]
    if records and head_vm and len(heads) != 1:
        raise SimulatorError(
            f"head=vm needs exactly one head VM, the program declared {heads}; nothing was created"
        )
    if len(controllers) > 1:
        raise SimulatorError(
            f"the program declared several controller VMs {controllers}; nothing was created"
        )

    def order(r: HostRecord) -> tuple[int, int]:  # the controller's VM, the head VM, each slice's workers
        if r.group:
            return slices[r.group], r.worker
        return (-2 if r.role == ROLE_CONTROLLER_VM else -1), 0

    records.sort(key=order)
    addresses = [str(a) for a in network.hosts()]
    if len(addresses) < len(records) + 1:
        raise SimulatorError(f"subnet {network} is too small for {len(records)} hosts")
    given = [r.ip for r in records if r.ip]
    clashes = [ip for ip in given if ip not in addresses[1:] or given.count(ip) > 1]
    if clashes:
        raise SimulatorError(
            f"host addresses {sorted(set(clashes))} are outside {network}, its gateway {addresses[0]}, "
            "or taken twice; nothing was created"
        )
    bad = [r.name for r in records if not HOST_NAME.fullmatch(r.name)]
    if bad:
        raise SimulatorError(f"host names {bad} are not valid GCE instance names; choose a shorter `name`")
    free = (a for a in addresses[1:] if a not in given)
    placed = []
    for i, r in enumerate(records):
        ip = r.ip or next(free)
        if r.group is None:
            role, s, w = str(r.role), HEAD_VM_SLICE_INDEX, -1
        else:
            s, w = slices[r.group], r.worker
            role = ROLE_HEAD if (not head_vm and s == 0 and _leads(r, ip)) else ROLE_WORKER
        placed.append(HostPlan(r.name, role, s, w, ip, *host_links(run_id, i, r.name)))
    controller = next((h for h in placed if h.role == ROLE_CONTROLLER_VM), None)
    placed = [h for h in placed if h is not controller]
    return Plan(
        run_id=run_id,
        config=spec.as_config(),
        network=str(network),
        gateway=str(addresses[0]),
        bridge=bridge_name(run_id),
        root=str(DEFAULT_ROOTS_DIR / run_id),
        hosts=tuple(placed),
        controller=controller,
    )
