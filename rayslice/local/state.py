"""What a simulation is made of, and the state file that lets `down` find it.

`make_plan` is pure: from a spec, a run id and a subnet it names every host, namespace, veth and
directory. The plan is written to ``state.json`` BEFORE anything is created, and every process
is recorded as soon as it starts, so `rayslice local down` can remove exactly what exists after
a crash or a Ctrl-C of `up` — by exact name and PID, never by pattern.

Names carry a random run id, so parallel simulations and other people's namespaces never
collide. Interface names must fit Linux's 15 characters: ``rsl<id>`` is 9.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rayslice.local.processes import ProcessRef
from rayslice.names import HEAD_VM_ROLE, HEAD_VM_SLICE_INDEX
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

ROLE_HEAD = "head"  # worker 0 of slice 0 with head=slice
ROLE_WORKER = "worker"  # every other TPU host
ROLE_HEAD_VM = HEAD_VM_ROLE  # the CPU head VM with head=vm


@dataclass(frozen=True)
class HostPlan:
    """One simulated host: its hostname, role, place in the cluster and its namespace plumbing."""

    name: str  # hostname, e.g. rayslice-slice-0-w-1 or rayslice-head
    role: str  # ROLE_HEAD, ROLE_WORKER or ROLE_HEAD_VM
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
    hosts: tuple[HostPlan, ...]

    @property
    def ip_network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.network)

    @property
    def head(self) -> HostPlan:
        return next(h for h in self.hosts if h.role in (ROLE_HEAD, ROLE_HEAD_VM))

    def host(self, name: str) -> HostPlan:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no host {name!r} in this simulation; hosts: {', '.join(h.name for h in self.hosts)}")

    def slice_ips(self, slice_index: int) -> list[str]:
        return [h.ip for h in sorted(self.hosts, key=lambda h: h.worker) if h.slice_index == slice_index]


@dataclass
class SimulationState:
    """The state file's content: the plan plus what has been started so far."""

    plan: Plan
    state_dir: str
    processes: dict[str, ProcessRef] = field(default_factory=dict)  # "metadata:<host>" / "boot:<host>"
    # Directories of this machine every host must see although each host gets a private /tmp:
    # the venv and source tree rayslice runs from and the package source (they may live in /tmp).
    shared_paths: tuple[str, ...] = ()

    def save(self) -> None:
        path = Path(self.state_dir) / STATE_FILE
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, path)

    @classmethod
    def load(cls, state_dir: Path) -> SimulationState | None:
        path = state_dir / STATE_FILE
        if not path.exists():
            return None
        raw = json.loads(path.read_text())
        plan = raw["plan"]
        return cls(
            plan=Plan(**{**plan, "hosts": tuple(HostPlan(**h) for h in plan["hosts"])}),
            state_dir=raw["state_dir"],
            processes={k: ProcessRef(**v) for k, v in raw["processes"].items()},
            shared_paths=tuple(raw.get("shared_paths", ())),
        )


def new_run_id() -> str:
    return secrets.token_hex(3)


def subnet_prefix(host_count: int) -> int:
    """The longest prefix (at most /24) with room for the hosts, the bridge, network and broadcast."""
    return min(24, 32 - math.ceil(math.log2(host_count + 3)))


def make_plan(
    spec: ClusterSpec, *, run_id: str, network: ipaddress.IPv4Network, roots_dir: Path = DEFAULT_ROOTS_DIR
) -> Plan:
    """Name and address every host: the head VM first (head=vm), then each slice's workers in order."""
    head_vm = spec.head == "vm"
    layout: list[tuple[str, str, int, int]] = []
    if head_vm:
        layout.append((f"{spec.name}-head", ROLE_HEAD_VM, HEAD_VM_SLICE_INDEX, -1))
    for s in range(spec.slices):
        for w in range(spec.tpu.hosts):
            role = ROLE_HEAD if (not head_vm and s == 0 and w == 0) else ROLE_WORKER
            layout.append((f"{spec.slice_name(s)}-w-{w}", role, s, w))
    addresses = list(network.hosts())
    if len(addresses) < len(layout) + 1:
        raise ValueError(f"subnet {network} is too small for {len(layout)} hosts")
    hosts = tuple(
        HostPlan(
            name=name,
            role=role,
            slice_index=s,
            worker=w,
            ip=str(addresses[i + 1]),
            netns=f"rsl-{run_id}-{name}",
            veth=f"rsl{run_id}h{i}",
            veth_peer=f"rsl{run_id}p{i}",
        )
        for i, (name, role, s, w) in enumerate(layout)
    )
    return Plan(
        run_id=run_id,
        config=spec.as_config(),
        network=str(network),
        gateway=str(addresses[0]),
        bridge=f"rsl{run_id}",
        root=str(roots_dir / run_id),
        hosts=hosts,
    )


@dataclass(frozen=True)
class HostPaths:
    """The files of one simulated host, all under ``<state dir>/hosts/<name>/``."""

    dir: Path

    @classmethod
    def of(cls, state_dir: str | Path, name: str) -> HostPaths:
        return cls(Path(state_dir) / "hosts" / name)

    @property
    def root(self) -> Path:
        """Bound over the plan's root inside the host: what the boot script writes lands here."""
        return self.dir / "root"

    @property
    def script(self) -> Path:
        return self.dir / "startup-script"

    @property
    def console(self) -> Path:
        """Startup-script output, like a VM's serial console."""
        return self.dir / "console.log"

    @property
    def exit_file(self) -> Path:
        """The startup script's exit status; empty while it runs."""
        return self.dir / "startup-script.exit"

    @property
    def metadata_tree(self) -> Path:
        return self.dir / "metadata.json"

    @property
    def guest_file(self) -> Path:
        return self.dir / "guest-attributes.json"

    @property
    def metadata_log(self) -> Path:
        return self.dir / "metadata.log"
