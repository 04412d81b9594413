"""Connects the cloud API emulation (`google.cloud_api`) to a simulated cluster (`simulator`).

The emulation then holds one TPU node (``tpu-vm``) or one MIG (``compute``) per simulated slice,
named as infra names it; it answers guest attributes from the hosts' own metadata servers; and
when the controller's deletion of a slice finishes, the slice's hosts power off, and when the
recreation finishes, they boot again and run their startup script, as a recreated slice's hosts
would. `preempt` is what ``rayslice local preempt SLICE`` does: the hosts power off at once and the
API reports the slice as Google reports a preempted one.

The simulation is reached through a small protocol (`SimulatedCluster`), so this wiring is tested
without root; the real `rayslice.local.simulation.simulator.Simulation` satisfies it.
"""

from __future__ import annotations

import argparse
import json
import secrets
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from rayslice.errors import SimulatorError
from rayslice.local.google.cloud_api.emulator import ADMIN_HEADER, ADMIN_PREFIX, CloudApiEmulator
from rayslice.local.google.host_metadata import LOCAL_PROJECT, numeric_id
from rayslice.local.host.private_files import write_private
from rayslice.local.simulation.simulator import Simulation
from rayslice.local.simulation.state import (
    CLOUD_API_CREDENTIALS_FILE,
    CLOUD_API_ENDPOINT_FILE,
    ROLE_HEAD_VM,
    Plan,
)
from rayslice.names import GUEST_ATTRIBUTE_NAMESPACE, controller_name, slice_name
from rayslice.platforms import MIG, VM_PLATFORMS
from rayslice.recovery import permissions
from rayslice.spec import ClusterSpec


class SimulatedCluster(Protocol):
    plan: Plan

    def guest_attributes(self, name: str) -> dict[str, str]: ...

    def power_off(self, name: str) -> None: ...

    def boot(self, name: str) -> None: ...


def project_of(spec: ClusterSpec) -> str:
    return spec.project or LOCAL_PROJECT


def slice_hosts(plan: Plan, index: int) -> list[str]:
    """The host names of slice `index`, worker 0 first."""
    hosts = [h for h in plan.hosts if h.role != ROLE_HEAD_VM and h.slice_index == index]
    return [h.name for h in sorted(hosts, key=lambda h: h.worker)]


def mig_shape(spec: ClusterSpec) -> dict[str, object]:
    """The fields of a slice's MIG that the program's shape decides (rayslice/infra/compute:
    target size 0 raised by one per-instance config per host, which `add_mig` stands for; no
    bulk target-size policy; a Spot MIG does nothing on a failed host, rule spot-tpu-do-nothing)."""
    if spec.capacity != "spot":
        return {}
    return {"instanceLifecyclePolicy": {"defaultActionOnFailure": "DO_NOTHING"}}


def attach(emulator: CloudApiEmulator, sim: SimulatedCluster, spec: ClusterSpec) -> None:
    """Seed `emulator` with the simulation's slices and wire its hooks to the simulated hosts."""
    project, zone = project_of(spec), str(spec.zone)
    by_slice = {slice_name(spec.name, i): slice_hosts(sim.plan, i) for i in range(spec.slices)}
    known = {h.name for h in sim.plan.machines}
    for index, (name, hosts) in enumerate(by_slice.items()):
        if VM_PLATFORMS[spec.platform].slice_resource == MIG:
            emulator.add_mig(
                project,
                zone,
                name,
                hosts,
                baseInstanceName=name,
                instanceTemplate=f"projects/{project}/global/instanceTemplates/{name}-local",
                **mig_shape(spec),
            )
        else:
            ips = {h.name: h.ip for h in sim.plan.hosts}
            emulator.add_node(
                project,
                zone,
                name,
                acceleratorType=spec.accelerator_type,
                runtimeVersion=spec.runtime_version or "",
                schedulingConfig={"spot": spec.capacity == "spot"},
                networkEndpoints=[{"ipAddress": ips[h]} for h in hosts],
                metadata={"rayslice-slice-index": str(index)},
            )

    def namespaced(name: str) -> dict[str, dict[str, str]] | None:
        return {GUEST_ATTRIBUTE_NAMESPACE: sim.guest_attributes(name)} if name in known else None

    def worker(node: str, worker_id: int) -> dict[str, dict[str, str]] | None:
        hosts = by_slice.get(node, [])
        return namespaced(hosts[worker_id]) if worker_id < len(hosts) else None

    def down(name: str) -> None:
        for host in by_slice.get(name, []):
            sim.power_off(host)

    def up(name: str) -> None:
        for host in by_slice.get(name, []):
            sim.boot(host)

    emulator.guest_source = namespaced
    emulator.worker_guest_source = worker
    emulator.on_slice_down = down
    emulator.on_slice_up = up


def preempt(emulator: CloudApiEmulator, sim: SimulatedCluster, spec: ClusterSpec, name: str) -> Sequence[str]:
    """Power off every host of slice `name` and report it preempted; returns the hosts."""
    index = next((i for i in range(spec.slices) if slice_name(spec.name, i) == name), None)
    if index is None:
        valid = ", ".join(slice_name(spec.name, i) for i in range(spec.slices))
        raise KeyError(f"no slice {name!r} in this simulation (slices: {valid})")
    hosts = slice_hosts(sim.plan, index)
    with emulator.lock:
        for host in hosts:
            sim.power_off(host)
        emulator.preempt(project_of(spec), str(spec.zone), name)
    return hosts


# ---- the emulation as a process of a simulation (root) ---------------------------------------

ENDPOINT_FILE = CLOUD_API_ENDPOINT_FILE  # in the state dir, 0600: the emulation's URL and admin token
CREDENTIALS_FILE = CLOUD_API_CREDENTIALS_FILE  # 0600: ADC for `rayslice status` on the simulation
DEFAULT_PORT = 0  # any free port on the bridge address; the endpoint file says which


class _Refreshing:
    """The simulation as this process acts on it: the recorded processes are reread before each
    power-off or boot, since `rayslice local up`, `reboot` and tests record processes meanwhile,
    and saving a stale copy would hide them from `rayslice local down`."""

    def __init__(self, sim: Simulation):
        self.sim = sim
        self.plan = sim.plan

    def guest_attributes(self, name: str) -> dict[str, str]:
        return self.sim.guest_attributes(name)

    def power_off(self, name: str) -> None:
        self.sim.refresh()
        self.sim.power_off(name)

    def boot(self, name: str) -> None:
        self.sim.refresh()
        if not self.sim.running(name):
            self.sim.boot(name)


def controller_token(spec: ClusterSpec) -> str:
    """The access token the simulated controller VM's metadata server hands out (host_metadata)."""
    return f"simulated-token-{numeric_id(controller_name(spec.name))}"


def serve(state_dir: Path, port: int = DEFAULT_PORT) -> None:
    """Serve the emulation on the simulation's bridge address until killed.

    Hosts reach it at ``http://<gateway>:<port>`` (the bridge is the root namespace's end of every
    host's link); the controller VM's metadata token, and no Ray host's, is accepted as a token
    the emulation issued, as Google accepts a VM's service-account token, and bound to the
    controller's roles (`iam`): a call they do not allow is refused, as on the cloud.
    """
    opened = Simulation.open(state_dir)
    spec = opened.spec()
    sim = _Refreshing(opened)
    emulator = CloudApiEmulator((sim.plan.gateway, port))
    attach(emulator, sim, spec)
    if sim.plan.controller is not None:
        emulator.tokens.add(controller_token(spec))
        emulator.bind(controller_token(spec), permissions.held(spec.platform))
    emulator.admin_token = secrets.token_urlsafe(24)
    emulator.admin_preempt = lambda name: preempt(emulator, sim, spec, name)
    # The owner's credentials for `rayslice status` against the simulation: a service-account
    # key the emulation made (GOOGLE_APPLICATION_CREDENTIALS), beside the endpoint overrides.
    write_private(state_dir / CREDENTIALS_FILE, json.dumps(emulator.service_account_info(project_of(spec))))
    write_private(
        state_dir / ENDPOINT_FILE,
        json.dumps({"url": emulator.url, "admin_token": emulator.admin_token, "env": emulator.environment()}),
    )
    emulator.serve_forever()


def request_preempt(state_dir: Path, name: str) -> list[str]:
    """Ask the running emulation of the simulation in `state_dir` to preempt slice `name`."""
    try:
        endpoint = json.loads((state_dir / ENDPOINT_FILE).read_text())
    except FileNotFoundError as exc:
        raise SimulatorError(
            f"no cloud API emulation runs for the simulation in {state_dir}: `rayslice local up` "
            "starts one with every simulation; is this a simulation at all?"
        ) from exc
    request = urllib.request.Request(
        f"{endpoint['url']}{ADMIN_PREFIX}{urllib.parse.quote(name, safe='')}",
        data=b"",
        method="POST",
        headers={ADMIN_HEADER: endpoint["admin_token"]},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return list(json.loads(response.read())["hosts"])
    except urllib.error.HTTPError as exc:
        message = json.loads(exc.read() or b"{}").get("error", {}).get("message", str(exc))
        raise SimulatorError(f"cannot preempt {name}: {message}") from exc


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rayslice.local.simulation.cloud_bridge")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    args = parser.parse_args(argv)
    serve(args.state_dir, args.port)


if __name__ == "__main__":
    main()
