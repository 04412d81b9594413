"""The services a simulation runs beside its hosts: one GCE metadata server per host (in the
host's namespace, with its fault knobs) and the cloud API emulation (`cloud_bridge`, on the
bridge address), each a recorded process of the simulation."""

from __future__ import annotations

import sys

from rayslice.errors import SimulatorError
from rayslice.local.host.processes import cmdline, is_alive, stop
from rayslice.local.simulation.recorded import RecordedSimulation, metadata_process, wait_until
from rayslice.local.simulation.state import (
    CLOUD_API_ENDPOINT_FILE,
    CLOUD_API_HOSTS_FILE,
    CLOUD_API_LOG,
    CLOUD_API_PROCESS,
    HostPlan,
    HostRecord,
    cloud_api_argv,
    read_deployed,
)

# Seconds the emulation may take for each step: importing Pulumi and running the program offline
# takes ~10 s on a busy two-core machine.
CLOUD_API_START_S = 120


class SimulationServices(RecordedSimulation):
    """Starts, restarts and stops the metadata servers and the cloud API emulation."""

    def _start_metadata(self, host: HostPlan, unavailable_for: float, silent_for: float) -> None:
        paths = self.paths(host.name)
        self._start(
            metadata_process(host.name),
            paths.metadata_log,
            [
                "ip",
                "netns",
                "exec",
                host.netns,
                sys.executable,
                "-m",
                "rayslice.local.google.metadata_server",
                "--tree",
                str(paths.metadata_tree),
                "--guest-file",
                str(paths.guest_file),
                "--unavailable-for",
                str(float(unavailable_for)),
                "--silent-for",
                str(float(silent_for)),
            ],
        )

    def restart_metadata(self, name: str, *, unavailable_for: float = 0.0, silent_for: float = 0.0) -> None:
        """Restart one host's metadata server with new fault knobs (see `create`); guest attributes persist.

        Returns once the new server listens (it rewrites the guest file when it starts).
        """
        host = self.plan.host(name)
        guest_file = self.paths(name).guest_file
        before = guest_file.stat().st_ino if guest_file.exists() else None
        ref = self.state.processes.pop(metadata_process(host.name), None)
        if ref is not None:
            self._stop(host, ref, grace_s=2)
        self.state.save()
        self._start_metadata(host, unavailable_for, silent_for)
        wait_until(
            lambda: guest_file.exists() and guest_file.stat().st_ino != before,
            30,
            f"the metadata server of {name} did not start again; see {self.paths(name).metadata_log}",
        )

    def _start_cloud_api(self) -> list[HostRecord]:
        """Start the cloud API emulation (`cloud_bridge`) on the bridge; return the hosts the
        Pulumi program deployed to its twin (`read_deployed`: `InvalidInput` naming the rules if
        the twin refused it). The emulation serves once the hosts exist (`_await_cloud_api`).

        Every simulation gets one, whatever its head: its twin holds the simulation's hosts, and
        `rayslice status`, `rayslice local preempt` and the recovery controller act on it (the
        controller through the endpoint overrides it writes to the state dir,
        `CLOUD_API_ENDPOINT_FILE`).
        """
        self._start(
            CLOUD_API_PROCESS,
            self.state_dir / CLOUD_API_LOG,
            cloud_api_argv(sys.executable, self.state_dir),
        )
        self._await_emulation(CLOUD_API_HOSTS_FILE, "did not deploy the Pulumi program")
        return read_deployed(self.state_dir)

    def _await_cloud_api(self) -> None:
        """Wait until the emulation serves (it does once every host's metadata server runs)."""
        self._await_emulation(CLOUD_API_ENDPOINT_FILE, "did not start serving")

    def _await_emulation(self, name: str, what: str) -> None:
        ref = self.state.processes[CLOUD_API_PROCESS]
        written = self.state_dir / name
        log = self.state_dir / CLOUD_API_LOG
        wait_until(
            lambda: written.exists() or not is_alive(ref),
            CLOUD_API_START_S,
            f"the cloud API emulation {what} within {CLOUD_API_START_S} s; see {log}",
        )
        if not written.exists():
            raise SimulatorError(
                f"the cloud API emulation exited: it {what}; see {log} "
                "(`rayslice local down` removes the simulation)"
            )

    def _stop_cloud_api(self) -> None:
        """Stop the emulation, only while the recorded PID still runs exactly `cloud_api_argv`."""
        ref = self.state.processes.get(CLOUD_API_PROCESS)
        if ref is None or not is_alive(ref):
            return
        if cmdline(ref.pid)[1:] == cloud_api_argv(sys.executable, self.state_dir)[1:]:
            stop(ref, grace_s=5)
