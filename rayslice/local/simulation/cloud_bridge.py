"""Connects the cloud API emulation (`google.cloud_api`) to a simulated cluster (`simulator`).

The emulation's cloud twin (`rayslice.cloud.twin`) holds what the Pulumi program deploys
(`deploy_spec`, addresses from the simulation's network), and the simulation is made of exactly
those hosts (`deployed_hosts`). Once they exist, the emulation answers guest attributes from the
hosts' own metadata servers; every host the twin stops or deletes powers off, and every host it
creates or repairs boots and runs its startup script, as a cloud host would. `preempt` is what
``rayslice local preempt SLICE`` does: first the preemption notice, as Compute Engine gives it
(each host's ``instance/preempted`` turns TRUE; "Spot VMs" -> "Preemption process": up to 30 s
before the stop, `names.PREEMPTION_NOTICE_S`), then, once the notice window has passed, a Spot
preemption in the twin, which stops (STOP) or deletes (DELETE) each host per its termination
action and lets the MIG's lifecycle policy decide whether anything comes back (a TPU node turns
PREEMPTED); the hosts it hits power off.

The simulation is reached through a small protocol (`SimulatedCluster`), so this wiring is tested
without root; the real `rayslice.local.simulation.simulator.Simulation` satisfies it.
"""

from __future__ import annotations

import argparse
import json
import secrets
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rayslice.cloud.twin import CloudTwin
from rayslice.cloud.twin.state import CloudRuleError, TwinHost
from rayslice.clusters import CloudAccess
from rayslice.errors import RaysliceError, SimulatorError
from rayslice.infra.identity import CONTROLLER, account_id
from rayslice.infra.labels import LABEL_ROLE
from rayslice.infra.mocks import Registration
from rayslice.infra.preview import deploy, pulumi_config
from rayslice.local.google.cloud_api.emulator import (
    ADMIN_HEADER,
    ADMIN_PREFIX,
    CAPACITY_PATH,
    NOTICE_PARAMETER,
    CloudApiEmulator,
)
from rayslice.local.google.cloud_api.iam import Grant
from rayslice.local.google.host_metadata import LOCAL_PROJECT, access_token_of
from rayslice.local.google.metadata_server import load_tree
from rayslice.local.host.private_files import write_private
from rayslice.local.simulation.simulator import Simulation
from rayslice.local.simulation.state import (
    CLOUD_API_CAPACITY_FILE,
    CLOUD_API_CREDENTIALS_FILE,
    CLOUD_API_ENDPOINT_FILE,
    ROLE_HEAD_VM,
    HostRecord,
    Plan,
    write_deployed,
)
from rayslice.names import GUEST_ATTRIBUTE_NAMESPACE, slice_name
from rayslice.recovery import kinds, permissions
from rayslice.spec import ClusterSpec


class SimulatedCluster(Protocol):
    @property
    def plan(self) -> Plan: ...

    def guest_attributes(self, name: str) -> dict[str, str]: ...

    def power_off(self, name: str) -> None: ...

    def boot(self, name: str) -> None: ...

    def set_preempted(self, name: str, notice: bool) -> bool: ...

    def add_hosts(self, records: Sequence[HostRecord]) -> list[str]: ...


def project_of(spec: ClusterSpec) -> str:
    return spec.project or LOCAL_PROJECT


def cloud_config(spec: ClusterSpec) -> dict[str, object]:
    """The simulation's stack config as its emulated cloud knows it: with the project it serves."""
    return {**spec.as_config(), "project": project_of(spec)}


def slice_hosts(plan: Plan, index: int) -> list[str]:
    """The host names of slice `index`, worker 0 first."""
    hosts = [h for h in plan.hosts if h.role != ROLE_HEAD_VM and h.slice_index == index]
    return [h.name for h in sorted(hosts, key=lambda h: h.worker)]


@dataclass(frozen=True)
class Deployment:
    """What the Pulumi program deployed to the emulation's twin: the hosts to simulate
    (`deployed_hosts`) and the role bindings it gave the recovery controller (`controller_grants`)."""

    hosts: list[HostRecord]
    controller_grants: list[Grant]


def deploy_spec(emulator: CloudApiEmulator, spec: ClusterSpec) -> Deployment:
    """Run the Pulumi program for `spec` against the emulation's twin, as `pulumi up` runs it
    against Google's project (with the project the emulation serves). `CloudRuleError` names
    every rule the twin refused it with."""
    registrations = deploy(pulumi_config(cloud_config(spec)), emulator.twin)
    return Deployment(deployed_hosts(emulator.twin), controller_grants(registrations, spec))


# What `rayslice.infra.identity` grants the controller's account with: project bindings of its
# custom roles (some with an IAM Condition), and a predefined role on the hosts' account.
ACCOUNT = "gcp:serviceaccount/account:Account"
CUSTOM_ROLE = "gcp:projects/iAMCustomRole:IAMCustomRole"
MEMBERS = ("gcp:projects/iAMMember:IAMMember", "gcp:serviceaccount/iAMMember:IAMMember")
# The permissions of a predefined role the program grants it that the emulation checks.
PREDEFINED_ROLES = {permissions.ACT_AS_ROLE: (permissions.ACT_AS_PERMISSION,)}


def controller_grants(registrations: Sequence[Registration], spec: ClusterSpec) -> list[Grant]:
    """The role bindings the program gave the recovery controller's account, each with its
    role's permissions and its condition: the emulated IAM binds them to the controller VM's
    token, so the controller holds in the simulator what the program grants it on the cloud."""
    by_urn = {r.urn: r for r in registrations}
    wanted = account_id(spec.name, CONTROLLER)
    account = next(
        (r.urn for r in registrations if r.type == ACCOUNT and r.inputs["accountId"] == wanted), None
    )
    grants = []
    for member in registrations:
        if member.type not in MEMBERS or account not in member.property_dependencies.get("member", ()):
            continue
        custom = [
            by_urn[u] for u in member.property_dependencies.get("role", ()) if by_urn[u].type == CUSTOM_ROLE
        ]
        role = member.inputs["role"]
        if custom:
            held = tuple(custom[0].inputs["permissions"])
        elif role in PREDEFINED_ROLES:
            held = PREDEFINED_ROLES[role]
        else:
            raise SimulatorError(
                f"the program grants the recovery controller {role}, unknown to the emulated IAM"
            )
        grants.append(Grant(frozenset(held), (member.inputs.get("condition") or {}).get("expression")))
    return grants


def refusal(error: RaysliceError) -> str:
    """Why the program could not be deployed, on one line: each rule the twin refused it with
    (resource, rule and source), or the program's own error."""
    if isinstance(error, CloudRuleError):
        found = "; ".join(str(v) for v in error.violations)
        return f"the cloud twin refused the Pulumi program, as Google would (nothing was created): {found}"
    return " ".join(str(error).split())


def deployed_hosts(twin: CloudTwin) -> list[HostRecord]:
    """The hosts to simulate after the Pulumi program ran against `twin` (`infra.preview.deploy`):
    one per instance and TPU worker it holds, with the name, group, worker number, IP,
    ``instance/attributes/`` and machine type it gives each, and a lone VM's role as the program
    labels it (`state.LONE_VM_ROLES`: the head VM)."""
    return [host_record(h) for h in twin.hosts()]


def host_record(host: TwinHost) -> HostRecord:
    """How the simulation builds a host the twin holds."""
    return HostRecord(
        host.name,
        host.group,
        host.worker,
        host.ip,
        dict(host.metadata),
        role=host.labels.get(LABEL_ROLE) if host.group is None else None,
        machine_type=host.machine_type,
    )


def attach(emulator: CloudApiEmulator, sim: SimulatedCluster, spec: ClusterSpec) -> None:
    """Wire the emulation's hooks to the simulated hosts (the twin holds them already, `deploy_spec`).

    A slice host the twin creates later under a new name (a flex-start slice's hosts, when its
    bulk MIG finds capacity) is made first (`SimulatedCluster.add_hosts`), then booted."""
    slices = [slice_name(spec.name, i) for i in range(spec.slices)]
    known = {h.name for h in sim.plan.machines}

    def namespaced(name: str) -> dict[str, dict[str, str]] | None:
        return {GUEST_ATTRIBUTE_NAMESPACE: sim.guest_attributes(name)} if name in known else None

    def worker(node: str, worker_id: int) -> dict[str, dict[str, str]] | None:
        hosts = slice_hosts(sim.plan, slices.index(node)) if node in slices else []
        return namespaced(hosts[worker_id]) if worker_id < len(hosts) else None

    def down(host: TwinHost) -> None:
        if host.name in known:
            sim.power_off(host.name)

    def up(host: TwinHost) -> None:
        if host.name not in known and host.group in slices:
            known.update(sim.add_hosts([host_record(host)]))
        if host.name in known:
            sim.boot(host.name)

    emulator.guest_source = namespaced
    emulator.worker_guest_source = worker
    # From here on every host the twin stops, deletes, creates or repairs is powered off or
    # booted: a preemption, the controller's deletion and recreation, a MIG's own repair.
    emulator.twin.on_host_down = down
    emulator.twin.on_host_up = up


def preempt(
    emulator: CloudApiEmulator, sim: SimulatedCluster, spec: ClusterSpec, name: str, notice_s: float = 0.0
) -> Sequence[str]:
    """A Spot preemption of slice `name`: each host gets the preemption notice, `notice_s`
    seconds pass (the guest's time to react; none by default), then the twin stops or deletes
    each host per its termination action and the MIG's lifecycle policy decides what comes back
    (a TPU node turns PREEMPTED); the hook of `attach` powers each host it hit off. Returns the
    hosts hit."""
    slices = [slice_name(spec.name, i) for i in range(spec.slices)]
    if name not in slices:
        raise KeyError(f"no slice {name!r} in this simulation (slices: {', '.join(slices)})")
    if notice_s > 0:
        for host in slice_hosts(sim.plan, slices.index(name)):
            sim.set_preempted(host, notice=True)
        time.sleep(notice_s)  # the notice window itself, which the cloud waits out too
    return [host.name for host in emulator.preempt(project_of(spec), str(spec.zone), name, mode="spot")]


def capacity_kind(spec: ClusterSpec) -> str:
    """What the zone's capacity counts for this spec's slices (`rayslice.cloud.capacity`), as
    their kind says (`rayslice.recovery.kinds`): the hosts' machine type on Compute Engine, the
    TPU generation on the TPU API (`twin.tpu.node_kind`)."""
    kind = kinds.of(spec.platform)
    if kind is None:
        raise SimulatorError(f"the simulator simulates the VM platforms, not {spec.platform}")
    return kind.capacity_kind(spec.tpu.machine_type, spec.tpu.generation)


def set_capacity(
    emulator: CloudApiEmulator, spec: ClusterSpec, hosts: int, zone: str | None, kind: str | None
) -> dict[str, Any]:
    """What ``rayslice local capacity`` does: the zone (default: the spec's) now has `hosts`
    free hosts of `kind` (default: `capacity_kind`); requests that now fit are fulfilled, and
    the hosts they create boot (`attach`'s hook). Returns what was set and the requests still
    waiting there."""
    zone, kind = zone or str(spec.zone), kind or capacity_kind(spec)
    emulator.twin.set_capacity(zone, kind, hosts)
    waiting = [r.name for r in emulator.twin.capacity.waiting() if (r.zone, r.kind) == (zone, kind)]
    return {"zone": zone, "type": kind, "free": emulator.twin.capacity.free[(zone, kind)], "waiting": waiting}


# ---- the emulation as a process of a simulation (root) ---------------------------------------

ENDPOINT_FILE = CLOUD_API_ENDPOINT_FILE  # in the state dir, 0600: the emulation's URL and admin token
CREDENTIALS_FILE = CLOUD_API_CREDENTIALS_FILE  # 0600: ADC for `rayslice status` on the simulation
DEFAULT_PORT = 0  # any free port on the bridge address; the endpoint file says which
BUILD_TIMEOUT_S = 600  # how long the emulation waits for `create` to make the deployed hosts


class _Refreshing:
    """The simulation as this process acts on it: the recorded processes are reread before each
    power-off or boot, since `rayslice local up`, `reboot` and tests record processes meanwhile,
    and saving a stale copy would hide them from `rayslice local down`."""

    def __init__(self, sim: Simulation):
        self.sim = sim

    @property
    def plan(self) -> Plan:
        return self.sim.plan

    def add_hosts(self, records: Sequence[HostRecord]) -> list[str]:
        return self.sim.add_hosts(records)

    def guest_attributes(self, name: str) -> dict[str, str]:
        return self.sim.guest_attributes(name)

    def power_off(self, name: str) -> None:
        self.sim.refresh()
        self.sim.power_off(name)

    def boot(self, name: str) -> None:
        self.sim.refresh()
        if not self.sim.running(name):
            self.sim.boot(name)

    def set_preempted(self, name: str, notice: bool) -> bool:
        self.sim.refresh()
        return self.sim.set_preempted(name, notice)


def serve(state_dir: Path, port: int = DEFAULT_PORT) -> None:
    """Deploy the simulation's spec to the emulation's twin, then serve it on the simulation's
    bridge address until killed.

    `Simulation.create` starts this with the bridge up and no hosts yet: the program runs against
    the twin with addresses from the simulation's network, the hosts it deployed (or the rules
    the twin refused it with, exit 2) go to the state dir for `create` (`state.write_deployed`),
    and the emulation serves once `create` has made those hosts.

    Hosts reach it at ``http://<gateway>:<port>`` (the bridge is the root namespace's end of
    every host's link), but only the controller VM's host is admitted (`Plan.controller`), and its
    metadata server's token is accepted as one the emulation issued, as Google accepts the
    service-account token of a VM whose account holds the roles, and bound to the role bindings
    the program gave the controller's account, conditions included (`controller_grants`, `iam`):
    a call they do not allow is refused, as on the cloud. Every host's token is a
    random secret of the run (`host_metadata.instance_tree`); the others are refused.
    """
    opened = Simulation.open(state_dir)
    spec = opened.spec()
    emulator = CloudApiEmulator((opened.plan.gateway, port), address_range=opened.plan.network)
    limited = state_dir / CLOUD_API_CAPACITY_FILE
    if limited.exists():  # `local up --zone-capacity`: the zone's free hosts before the program runs
        emulator.twin.set_capacity(str(spec.zone), capacity_kind(spec), int(json.loads(limited.read_text())))
    try:
        deployment = deploy_spec(emulator, spec)
        write_deployed(state_dir, deployment.hosts)
    except RaysliceError as exc:  # the twin's refusal, or input the program itself refuses
        write_deployed(state_dir, refused=refusal(exc))
        raise SystemExit(exc.exit_code) from None
    opened = _built(state_dir)
    sim = _Refreshing(opened)
    controller = sim.plan.controller
    emulator.clients = frozenset(sim.plan.admitted)
    attach(emulator, sim, spec)
    if controller is not None:
        token = access_token_of(load_tree(opened.paths(controller.name).metadata_tree.read_text()))
        emulator.tokens.add(token)
        for grant in deployment.controller_grants:
            emulator.bind(token, grant.permissions, grant.condition)
    emulator.admin_token = secrets.token_urlsafe(24)
    emulator.admin_preempt = lambda name, notice_s: preempt(emulator, sim, spec, name, notice_s)
    emulator.admin_capacity = lambda hosts, zone, kind: set_capacity(emulator, spec, hosts, zone, kind)
    publish(emulator, state_dir, spec)
    emulator.serve_forever()


def _built(state_dir: Path, timeout: float = BUILD_TIMEOUT_S) -> Simulation:
    """The simulation once `create` has made the deployed hosts: in its state file, each with its
    metadata server running (which also means its metadata tree, with its token, is written)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sim = Simulation.open(state_dir)
        if sim.plan.hosts and all(sim.paths(h.name).guest_file.exists() for h in sim.plan.hosts):
            return sim
        time.sleep(0.2)
    raise SimulatorError(f"the simulation's hosts were not created within {timeout} s")


def publish(emulator: CloudApiEmulator, state_dir: Path, spec: ClusterSpec) -> None:
    """Write where the emulation answers into the state dir (0600): its URL, admin token and
    endpoint overrides, and the owner's credentials for `rayslice status` against it, a
    service-account key the emulation made (`cloud_access` reads both)."""
    write_private(state_dir / CREDENTIALS_FILE, json.dumps(emulator.service_account_info(project_of(spec))))
    write_private(
        state_dir / ENDPOINT_FILE,
        json.dumps({"url": emulator.url, "admin_token": emulator.admin_token, "env": emulator.environment()}),
    )


def cloud_access(state_dir: Path) -> CloudAccess:
    """How the owner reaches the running emulation of the simulation in `state_dir` (what
    `rayslice status` uses); `SimulatorError` when none runs or its files cannot be read."""
    try:
        endpoints = dict(json.loads((state_dir / ENDPOINT_FILE).read_text())["env"])
        (state_dir / CREDENTIALS_FILE).read_bytes()
    except FileNotFoundError:
        raise SimulatorError(
            f"no cloud API emulation runs for the simulation in {state_dir} (`rayslice local up` starts "
            "one with every simulation)"
        ) from None
    except PermissionError as exc:
        raise SimulatorError(
            f"cannot read {exc.filename}: the simulation's cloud API credentials belong to the user who "
            "ran `rayslice local up` (root); run this as that user"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SimulatorError(
            f"cannot read the cloud API endpoint of the simulation in {state_dir}: {exc!r}"
        ) from None
    return CloudAccess(state_dir / CREDENTIALS_FILE, endpoints)


def _admin_call(state_dir: Path, path: str, params: dict[str, str], timeout: float) -> Any:
    """POST one admin call to the running emulation of the simulation in `state_dir` (with the
    admin token from its endpoint file); `SimulatorError` with the emulation's message if refused."""
    try:
        endpoint = json.loads((state_dir / ENDPOINT_FILE).read_text())
    except FileNotFoundError as exc:
        raise SimulatorError(
            f"no cloud API emulation runs for the simulation in {state_dir}: `rayslice local up` "
            "starts one with every simulation; is this a simulation at all?"
        ) from exc
    request = urllib.request.Request(
        f"{endpoint['url']}{path}?{urllib.parse.urlencode(params)}",
        data=b"",
        method="POST",
        headers={ADMIN_HEADER: endpoint["admin_token"]},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        message = json.loads(exc.read() or b"{}").get("error", {}).get("message", str(exc))
        raise SimulatorError(message) from exc


def request_preempt(state_dir: Path, name: str, notice_s: float) -> list[str]:
    """Ask the running emulation of the simulation in `state_dir` to preempt slice `name`, its
    hosts powered off `notice_s` seconds after their preemption notice."""
    path = f"{ADMIN_PREFIX}{urllib.parse.quote(name, safe='')}"
    try:
        answer = _admin_call(state_dir, path, {NOTICE_PARAMETER: str(notice_s)}, notice_s + 60)
    except SimulatorError as exc:
        raise SimulatorError(f"cannot preempt {name}: {exc}") from exc
    return list(answer["hosts"])


def request_capacity(state_dir: Path, hosts: int, zone: str | None, kind: str | None) -> dict[str, Any]:
    """Ask the running emulation to give a zone `hosts` free hosts of a type (`set_capacity`)."""
    params = {"hosts": str(hosts), **({"zone": zone} if zone else {}), **({"type": kind} if kind else {})}
    try:
        return dict(_admin_call(state_dir, CAPACITY_PATH, params, BUILD_TIMEOUT_S))
    except SimulatorError as exc:
        raise SimulatorError(f"cannot set capacity: {exc}") from exc


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rayslice.local.simulation.cloud_bridge")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    args = parser.parse_args(argv)
    serve(args.state_dir, args.port)


if __name__ == "__main__":
    main()
