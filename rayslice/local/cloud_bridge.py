"""Connects the cloud API emulation (`cloud_api`) to a simulated cluster (`simulator`).

The emulation then holds one TPU node (``tpu-vm``) or one MIG (``compute``) per simulated slice,
named as infra names it; it answers guest attributes from the hosts' own metadata servers; and
when the controller's deletion of a slice finishes, the slice's hosts power off, and when the
recreation finishes, they boot again and run their startup script, as a recreated slice's hosts
would. `preempt` is what ``rayslice local preempt SLICE`` does: the hosts power off at once and the
API reports the slice as Google reports a preempted one.

The simulation is reached through a small protocol (`SimulatedCluster`), so this wiring is tested
without root; the real `rayslice.local.simulator.Simulation` satisfies it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rayslice.local.cloud_api import CloudApiEmulator
from rayslice.local.state import ROLE_HEAD_VM, Plan
from rayslice.names import GUEST_ATTRIBUTE_NAMESPACE, slice_name
from rayslice.spec import ClusterSpec

LOCAL_PROJECT = "rayslice-local"  # the project the emulation uses when the spec names none


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


def attach(emulator: CloudApiEmulator, sim: SimulatedCluster, spec: ClusterSpec) -> None:
    """Seed `emulator` with the simulation's slices and wire its hooks to the simulated hosts."""
    project, zone = project_of(spec), str(spec.zone)
    by_slice = {slice_name(spec.name, i): slice_hosts(sim.plan, i) for i in range(spec.slices)}
    known = {h.name for h in sim.plan.hosts}
    for index, (name, hosts) in enumerate(by_slice.items()):
        if spec.platform == "compute":
            emulator.add_mig(
                project,
                zone,
                name,
                hosts,
                baseInstanceName=name,
                instanceTemplate=f"projects/{project}/global/instanceTemplates/{name}-local",
                targetSizePolicy={"mode": "BULK"},
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
