"""Powering simulated hosts on and off, and reaching into a running one.

A host is powered on by starting its PID 1 (`rayslice.local.host.boot`) in fresh PID, UTS,
mount and IPC namespaces inside its network namespace; powering off kills that PID namespace at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from rayslice.errors import SimulatorError
from rayslice.local.host.boot import command, host_environment
from rayslice.local.host.private_files import ensure_private_dir
from rayslice.local.host.processes import children, is_alive
from rayslice.local.simulation.recorded import RecordedSimulation, boot_process, record_root
from rayslice.local.simulation.state import CLOUD_API_ENDPOINT_FILE, ROLE_CONTROLLER_VM
from rayslice.observability import record

# How often the simulated recovery controller looks (the cloud default is 30 s), through
# the boot script's RAYSLICE_RECOVERY_INTERVAL_S: a simulated preemption is noticed within seconds.
LOCAL_RECOVERY_INTERVAL_S = 5


class HostPower(RecordedSimulation):
    """Boots, powers off and reboots hosts; runs commands inside a running one."""

    def boot(self, name: str, env: Mapping[str, str] | None = None) -> None:
        """Power the host on: fresh PID/UTS/mount/IPC namespaces run the startup script (GCE: at every boot).

        A preemption notice the host got before it stopped is cleared (``instance/preempted``
        FALSE again). `env` adds variables to the script's otherwise clean environment (tests shorten the
        script's documented RAYSLICE_HEAD_DEADLINE_S with it). The controller VM's environment
        also points the cloud API clients at the emulation (the endpoint overrides gcloud and
        `rayslice.recovery.cloud` honour) and shortens the recovery controller's interval; no
        Ray host gets these.
        """
        host = self.plan.host(name)
        if host.role == ROLE_CONTROLLER_VM:
            env = {**self._controller_environment(), **(env or {})}
        if self.running(name):
            raise SimulatorError(f"host {name} is already running; use reboot")
        paths = self.paths(name)
        paths.exit_file.unlink(missing_ok=True)
        self.set_preempted(name, notice=False)  # a VM boots without a preemption notice
        self._start(
            boot_process(name),
            paths.console,
            [
                "ip",
                "netns",
                "exec",
                host.netns,
                *command(
                    hostname=host.name,
                    host_dir=paths.dir,
                    root=self.plan.root,
                    shares=self.state.shared_paths,
                    shared_writable=self.plan.shared_dir,
                    mounts=self.record_mounts(name),
                    env=env or {},
                ),
            ],
        )

    def record_mounts(self, name: str) -> dict[str, str]:
        """What of the cluster's record host `name` sees (at `record_mount`) and may write: its own
        ``hosts/<host>/`` folder, and on the controller's VM its ``events/<host>/`` stream too, as
        the record bucket's IAM conditions let each machine of a real cluster create objects
        under those prefixes only (`rayslice.infra.record_bucket`). The rest (``cluster.json``,
        ``jobs/``, ``ended.json``), which the machine's root writes, no host can reach."""
        host = self.plan.host(name)
        bucket = record.FolderBucket(ensure_private_dir(record_root(self.state_dir)))
        prefix = record.cluster_prefix(self.spec().name, self.plan.run_id)
        own = [record.join(record.HOSTS_DIR, host.name)]
        if host.role == ROLE_CONTROLLER_VM:
            own.append(record.join(record.EVENTS_DIR, host.name))
        return {f"{self.record_mount}/{key}": str(bucket.folder(record.join(prefix, key))) for key in own}

    def boot_all(self, skip: Collection[str] = ()) -> None:
        """Boot every machine except those named in `skip` (a host that never boots is a fault to test)."""
        unknown = set(skip) - {h.name for h in self.plan.machines}
        if unknown:
            raise SimulatorError(f"no hosts {sorted(unknown)} in this simulation")
        for host in self.plan.machines:
            if host.name not in skip:
                self.boot(host.name)

    def power_off(self, name: str) -> None:
        """Kill every process of the host at once (its PID namespace ends), like pulling the plug."""
        self.power_off_all([name])

    def power_off_all(self, names: Collection[str]) -> None:
        """Pull the plug of every host in `names` at once, then wait until each is off: their
        processes exit side by side (a Ray node's take about 2 s), not one host after another."""
        namespaces: list[str] = []
        stopped = False
        for name in names:
            host = self.plan.host(name)
            ref = self.state.processes.pop(boot_process(host.name), None)
            if ref is not None:
                init = children(ref.pid) if is_alive(ref) else []
                namespace = _pid_namespace(init[0]) if init else None
                namespaces += [namespace] if namespace is not None else []
                self._stop(host, ref, grace_s=0)
                stopped = True
        if stopped:
            self.state.save()
        for namespace in namespaces:
            _wait_gone(namespace)

    def reboot(self, name: str) -> None:
        """Power off, then boot again: the same startup script runs a second time."""
        self.power_off(name)
        self.boot(name)

    def running(self, name: str) -> bool:
        ref = self.state.processes.get(boot_process(self.plan.host(name).name))
        return ref is not None and is_alive(ref)

    def exec_in(
        self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` inside a running host (all its namespaces), as the host's own processes run."""
        ref = self.state.processes.get(boot_process(self.plan.host(name).name))
        init = children(ref.pid) if ref is not None and is_alive(ref) else []
        if not init:
            raise SimulatorError(f"host {name} is not running")
        environment = {**host_environment(f"{self.plan.root}/root"), **(env or {})}
        return subprocess.run(
            [
                "nsenter",
                f"--target={init[0]}",
                "--mount",
                "--uts",
                "--net",
                "--pid",
                "--ipc",
                "--",
                "env",
                "-i",
                *(f"{k}={v}" for k, v in environment.items()),
                *argv,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def restart_head_ray(self) -> subprocess.CompletedProcess[str]:
        """`ray stop` inside the head host only (its own PID namespace); its supervisor restarts Ray."""
        ray = str(Path(sys.executable).with_name("ray"))
        return self.exec_in(self.plan.head.name, [ray, "stop", "--force"])

    def _controller_environment(self) -> dict[str, str]:
        endpoint = json.loads((self.state_dir / CLOUD_API_ENDPOINT_FILE).read_text())
        return {**endpoint["env"], "RAYSLICE_RECOVERY_INTERVAL_S": str(LOCAL_RECOVERY_INTERVAL_S)}


def _pid_namespace(pid: int) -> str | None:
    """The PID namespace `pid` lives in (``pid:[inode]``), None once it is gone."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _wait_gone(namespace: str, timeout_s: float = 30.0) -> None:
    """Wait until no process is left in a powered-off host's PID namespace. Its init's death makes
    the kernel kill the rest, but they exit a while later (a Ray node has dozens of processes): a
    VM is off before it can boot again, so the next boot must not start beside the last one's."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _left_in(namespace):
            return
        time.sleep(0.1)
    left = "; ".join(_describe(pid) for pid in _left_in(namespace))
    raise SimulatorError(
        f"processes of a powered-off host ({namespace}) still run after {timeout_s:.0f} s: {left}"
    )


def _left_in(namespace: str) -> list[int]:
    pids = (int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit())
    return [pid for pid in pids if _pid_namespace(pid) == namespace]


def _describe(pid: int) -> str:
    """`pid`, its name, state and where in the kernel it waits: why a killed process has not exited
    (state D is uninterruptible I/O, Z a zombie whose parent has not reaped it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        wchan = Path(f"/proc/{pid}/wchan").read_text() or "-"
    except OSError:
        return f"{pid} (gone)"
    name, _, rest = stat[stat.index("(") + 1 :].rpartition(")")
    state, parent = rest.split()[:2]
    return f"{pid} {name} state {state} parent {parent} waiting in {wchan}"
