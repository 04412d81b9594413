"""A simulation as its state file records it: what every part of `Simulation` shares.

`RecordedSimulation` holds the loaded state (the plan, the recorded processes), finds a host's
files and the cluster's spec, and starts or stops a process of the simulation only as the state
file records it: a process is recorded as soon as it starts, so `rayslice local down` finds it
after a crash, and stopped only while it still runs in the namespace of the host it belongs to.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rayslice import spec as spec_module
from rayslice.errors import SimulatorError
from rayslice.local.host import netns
from rayslice.local.host.boot import host_environment
from rayslice.local.host.paths import HostPaths
from rayslice.local.host.processes import ProcessRef, is_alive, start_detached, stop
from rayslice.local.simulation.state import HostPlan, SimulationState
from rayslice.observability import record
from rayslice.spec import ClusterSpec

# The simulator's record bucket: a folder beside the state dir (`record_root`), which `rayslice
# local down` keeps (`rayslice.local.simulation.recording`).
RECORD_SUFFIX = ".record"
# Where every machine of a simulation sees its cluster's record folder, after the plan's root
# (under /run, which each machine gets fresh: nothing of the machine's own files is hidden by it).
RECORD_MOUNT_SUFFIX = "-record"


def record_root(state_dir: Path) -> Path:
    """The record bucket of the simulations kept in `state_dir`."""
    state_dir = Path(os.path.abspath(state_dir))
    return state_dir.with_name(state_dir.name + RECORD_SUFFIX)


def metadata_process(name: str) -> str:
    """The key under which host `name`'s metadata server is recorded."""
    return f"metadata:{name}"


def boot_process(name: str) -> str:
    """The key under which host `name`'s PID 1 (its power) is recorded."""
    return f"boot:{name}"


class RecordedSimulation:
    """A simulated cluster as the state file in `state_dir` records it; every part of
    `Simulation` builds on this."""

    def __init__(self, state: SimulationState):
        self.state = state
        self.plan = state.plan
        self.state_dir = Path(state.state_dir)
        self.warnings: list[str] = []  # what the caller should tell the user (e.g. no packet filter)

    def paths(self, name: str) -> HostPaths:
        return HostPaths.of(self.state_dir, self.plan.host(name).name)

    @property
    def token_file(self) -> Path:
        """The simulation's Ray token (rayAuth=token) for clients on this machine."""
        return self.state_dir / "ray-token"

    @property
    def record_folder(self) -> Path:
        """This simulation's cluster record (``clusters/<name>/<run id>`` of `record_root`)."""
        return record_root(self.state_dir) / record.cluster_prefix(self.spec().name, self.plan.run_id)

    @property
    def record_mount(self) -> str:
        """Where every machine sees its own part of `record_folder` (`HostPower.record_mounts`),
        and may create files in it, as every machine of a real cluster may create objects under
        its own prefixes of its record in the bucket."""
        return self.plan.root + RECORD_MOUNT_SUFFIX

    def spec(self) -> ClusterSpec:
        return spec_module.load(self.plan.config, require_zone=False)

    def refresh(self) -> None:
        """Reread the recorded processes: another process of this simulation may have started some."""
        fresh = SimulationState.load(self.state_dir)
        if fresh is not None and fresh.plan == self.plan:
            self.state.processes = fresh.processes

    def _start(self, key: str, log: Path, argv: Sequence[str]) -> None:
        self.state.processes[key] = start_detached(argv, log, host_environment("/root"))
        self.state.save()

    def _stop(self, host: HostPlan, ref: ProcessRef, grace_s: float) -> None:
        """Stop a recorded process, but only while it is still one of `host`'s (netns.in_netns)."""
        if is_alive(ref) and netns.in_netns(ref.pid, host.netns):
            stop(ref, grace_s=grace_s)

    def set_preempted(self, name: str, notice: bool) -> bool:
        """Give host `name` a preemption notice (its ``instance/preempted`` turns TRUE), or clear
        it (FALSE, as a VM boots): a signal to its metadata server (`metadata_server.main`),
        only while the recorded process is still that host's. False when none runs (a fault a
        test made): that host hears nothing, as a guest whose metadata server is down."""
        host = self.plan.host(name)
        ref = self.state.processes.get(metadata_process(host.name))
        if ref is None or not is_alive(ref) or not netns.in_netns(ref.pid, host.netns):
            return False
        os.kill(ref.pid, signal.SIGUSR1 if notice else signal.SIGUSR2)
        return True


def wait_until(condition: Callable[[], bool], timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SimulatorError(message)
        time.sleep(0.1)
