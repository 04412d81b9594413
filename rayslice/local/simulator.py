"""A simulated slice on one Linux machine: hosts that boot the real startup script.

Each host is a network namespace on a private bridge with its own IP, ``/etc/hosts``, metadata
server (169.254.169.254 on its loopback, serving `host_metadata`), and — while it runs — its own
PID, UTS and mount namespaces (`boot`). Every host runs the SAME rendered script; the only knobs
are the rendered ones: ``supervisor="process"``, the package source (by default ``venv:`` the
environment rayslice runs from, since the hosts have no internet; or ``wheels:DIR``) and the
root, one short path that each host's mount namespace binds to its own directory.

`Simulation.create` records the plan before creating anything; `destroy` (``rayslice local
down``) removes exactly what the state file names. Owners and tests drive hosts with `boot`,
`power_off`, `reboot`, `restart_head_ray` and `exec_in`, and read progress with `states`.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import rayslice
from rayslice import spec as spec_module
from rayslice.errors import SimulatorError
from rayslice.local import netns
from rayslice.local.boot import host_environment
from rayslice.local.host_metadata import head_vm_attributes, instance_tree, tpu_attributes
from rayslice.local.metadata import dump_tree
from rayslice.local.processes import children, is_alive, process_ref, start_detached, stop
from rayslice.local.state import (
    DEFAULT_ROOTS_DIR,
    ROLE_HEAD_VM,
    HostPaths,
    HostPlan,
    SimulationState,
    make_plan,
    new_run_id,
    subnet_prefix,
)
from rayslice.names import DASHBOARD_PORT, GUEST_ATTRIBUTE_NAMESPACE
from rayslice.spec import ClusterSpec
from rayslice.startup_scripts import RenderOptions, render

TOKEN_PATH = "etc/rayslice/ray-token"  # below a host's root, where the boot script reads it
STATE_KEY = "state"  # guest attribute the boot script publishes its progress in
JOINED = "joined"
FAILED_PREFIX = "failed"
REQUIRED_TOOLS = ("ip", "unshare", "nsenter", "mount")


def require_root() -> None:
    """Namespaces, veths and bridges need root (CAP_NET_ADMIN + CAP_SYS_ADMIN): say so up front."""
    if os.geteuid() != 0:
        raise SimulatorError(
            "the local simulator needs root: it creates network namespaces, veth pairs and a bridge "
            "(CAP_NET_ADMIN) and PID/UTS/mount namespaces (CAP_SYS_ADMIN). Run it as root, e.g. "
            "`sudo $(command -v rayslice) local up`, or in a container started with --privileged."
        )
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        raise SimulatorError(
            f"the local simulator needs {', '.join(missing)} (Debian: apt-get install iproute2 util-linux mount)"
        )


def default_package_source() -> str:
    """The environment rayslice runs from: it already has Ray, and the hosts have no internet."""
    return f"venv:{sys.prefix}"


class Simulation:
    """One simulated cluster, backed by the state file in `state_dir`."""

    def __init__(self, state: SimulationState):
        self.state = state
        self.plan = state.plan
        self.state_dir = Path(state.state_dir)

    # ---- lifecycle ---------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        spec: ClusterSpec,
        state_dir: Path,
        *,
        script: str | None = None,
        package_source: str | None = None,
        metadata_unavailable_for: float = 0.0,
        roots_dir: Path = DEFAULT_ROOTS_DIR,
    ) -> Simulation:
        """Create every host (network, metadata server, files) without booting any.

        `script` replaces the rendered startup script (tests of the plumbing itself); by default
        every host gets ``render(spec, RenderOptions(supervisor="process", ...))``.
        `metadata_unavailable_for` makes every metadata server answer 503 for that many seconds.
        """
        require_root()
        state_dir = Path(state_dir).resolve()
        existing = SimulationState.load(state_dir)
        if existing is not None:
            raise SimulatorError(
                f"a simulation (run {existing.plan.run_id}) already exists in {state_dir}; "
                "run `rayslice local down` first"
            )
        state_dir.mkdir(parents=True, exist_ok=True)
        host_count = spec.total_hosts + (1 if spec.head == "vm" else 0)
        network = netns.free_subnet(subnet_prefix(host_count), netns.used_networks(), random.Random())
        plan = make_plan(spec, run_id=new_run_id(), network=network, roots_dir=roots_dir)
        source = package_source or default_package_source()
        shared = (sys.prefix, str(Path(rayslice.__file__).resolve().parents[1]), source.partition(":")[2])
        sim = cls(SimulationState(plan=plan, state_dir=str(state_dir), shared_paths=shared))
        sim.state.save()  # before anything exists: `down` works from here on
        if script is None:
            options = RenderOptions(supervisor="process", package_source=source, root=plan.root)
            script = render(spec, options)
        sim._build(spec, script, metadata_unavailable_for)
        return sim

    @classmethod
    def open(cls, state_dir: Path) -> Simulation:
        state = SimulationState.load(Path(state_dir).resolve())
        if state is None:
            raise SimulatorError(f"no simulation in {state_dir}; start one with `rayslice local up`")
        return cls(state)

    def _build(self, spec: ClusterSpec, script: str, unavailable_for: float) -> None:
        plan = self.plan
        prefix = plan.ip_network.prefixlen
        Path(plan.root).mkdir(parents=True, exist_ok=True)
        netns.create_bridge(plan.bridge, plan.gateway, prefix)
        token = secrets.token_hex(32) if spec.ray_auth == "token" else None
        if token is not None:
            self.token_file.write_text(token)
            self.token_file.chmod(0o600)
        peers = {h.name: h.ip for h in plan.hosts}
        for host in plan.hosts:
            netns.create_host_network(host.netns, host.veth, host.veth_peer, plan.bridge, host.ip, prefix)
            netns.write_etc(host.netns, host.name, peers)
            paths = self.paths(host.name)
            (paths.root / "tmp").mkdir(parents=True, exist_ok=True)
            paths.script.write_text(script)
            if token is not None:
                token_file = paths.root / TOKEN_PATH
                token_file.parent.mkdir(parents=True, exist_ok=True)
                token_file.write_text(token)
                token_file.chmod(0o600)
            tree = instance_tree(
                spec,
                hostname=host.name,
                ip=host.ip,
                network=plan.ip_network,
                gateway=plan.gateway,
                attributes=self._attributes(spec, host),
                startup_script=script,
            )
            paths.metadata_tree.write_text(dump_tree(tree))
            self._start(
                f"metadata:{host.name}",
                paths.metadata_log,
                [
                    "ip",
                    "netns",
                    "exec",
                    host.netns,
                    sys.executable,
                    "-m",
                    "rayslice.local.metadata",
                    "--tree",
                    str(paths.metadata_tree),
                    "--guest-file",
                    str(paths.guest_file),
                    "--unavailable-for",
                    str(unavailable_for),
                ],
            )
        _wait_for(
            lambda: all(self.paths(h.name).guest_file.exists() for h in plan.hosts),
            30,
            "metadata servers did not start; see hosts/*/metadata.log in the state dir",
        )

    def _attributes(self, spec: ClusterSpec, host: HostPlan) -> dict[str, str]:
        if host.role == ROLE_HEAD_VM:
            return head_vm_attributes(spec)
        head = self.plan.head
        # Hosts outside the head's slice (or all, with a head VM) learn its address from metadata.
        head_address = (
            head.ip if (head.role == ROLE_HEAD_VM or host.slice_index != head.slice_index) else None
        )
        return tpu_attributes(
            spec, host.slice_index, host.worker, self.plan.slice_ips(host.slice_index), head_address
        )

    def _start(self, key: str, log: Path, argv: Sequence[str]) -> None:
        self.state.processes[key] = start_detached(argv, log, host_environment("/root"))
        self.state.save()

    def destroy(self) -> None:
        """Remove every process, namespace, veth, bridge and file this simulation made."""
        for host in self.plan.hosts:
            self.power_off(host.name)
        for ref in self.state.processes.values():
            stop(ref)
        for host in self.plan.hosts:
            for pid in netns.netns_pids(host.netns):  # anything left in our own namespaces
                left = process_ref(pid)
                if left is not None:
                    stop(left, grace_s=2)
            netns.delete_netns(host.netns)
            netns.delete_link(host.veth)
            netns.delete_link(host.veth_peer)
        netns.delete_link(self.plan.bridge)
        root = Path(self.plan.root)
        if root.is_dir():
            root.rmdir()
        if root.parent.is_dir() and not any(root.parent.iterdir()):
            root.parent.rmdir()
        shutil.rmtree(self.state_dir / "hosts", ignore_errors=True)
        self.token_file.unlink(missing_ok=True)
        (self.state_dir / "state.json").unlink()
        if not any(self.state_dir.iterdir()):
            self.state_dir.rmdir()

    # ---- hosts -------------------------------------------------------------------------------

    def paths(self, name: str) -> HostPaths:
        return HostPaths.of(self.state_dir, self.plan.host(name).name)

    @property
    def token_file(self) -> Path:
        """The simulation's Ray token (rayAuth=token) for clients on this machine."""
        return self.state_dir / "ray-token"

    def boot(self, name: str, env: Mapping[str, str] | None = None) -> None:
        """Power the host on: a fresh PID/UTS/mount namespace runs the startup script (GCE runs it at every boot).

        `env` adds variables to the script's otherwise clean environment (tests shorten the
        script's documented RAYSLICE_HEAD_DEADLINE_S with it).
        """
        host = self.plan.host(name)
        if self.running(name):
            raise SimulatorError(f"host {name} is already running; use reboot")
        paths = self.paths(name)
        paths.exit_file.unlink(missing_ok=True)
        self._start(
            f"boot:{name}",
            paths.console,
            [
                "ip",
                "netns",
                "exec",
                host.netns,
                "unshare",
                "--pid",
                "--fork",
                "--kill-child",
                "--mount-proc",
                "--uts",
                "--",
                sys.executable,
                "-m",
                "rayslice.local.boot",
                "--hostname",
                host.name,
                "--host-dir",
                str(paths.dir),
                "--root",
                self.plan.root,
                *(f"--share={path}" for path in self.state.shared_paths),
                *(f"--env={key}={value}" for key, value in (env or {}).items()),
            ],
        )

    def boot_all(self) -> None:
        for host in self.plan.hosts:
            self.boot(host.name)

    def power_off(self, name: str) -> None:
        """Kill every process of the host at once (its PID namespace ends), like pulling the plug."""
        ref = self.state.processes.pop(f"boot:{self.plan.host(name).name}", None)
        if ref is not None:
            stop(ref, grace_s=0)
            self.state.save()

    def reboot(self, name: str) -> None:
        """Power off, then boot again: the same startup script runs a second time."""
        self.power_off(name)
        self.boot(name)

    def running(self, name: str) -> bool:
        ref = self.state.processes.get(f"boot:{self.plan.host(name).name}")
        return ref is not None and is_alive(ref)

    def exec_in(
        self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` inside a running host (all its namespaces), as the host's own processes run."""
        ref = self.state.processes.get(f"boot:{self.plan.host(name).name}")
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
        """`ray stop` inside the head host only (its own PID namespace); the boot script's supervisor restarts Ray."""
        ray = str(Path(sys.executable).with_name("ray"))
        return self.exec_in(self.plan.head.name, [ray, "stop", "--force"])

    # ---- progress and status -----------------------------------------------------------------

    def guest_attributes(self, name: str) -> dict[str, str]:
        """The host's guest attributes in the rayslice namespace (from its metadata server's file)."""
        try:
            data = json.loads(self.paths(name).guest_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        return data.get(GUEST_ATTRIBUTE_NAMESPACE, {})

    def script_exit(self, name: str) -> int | None:
        """The startup script's exit status at the last boot; None while it runs or before a boot."""
        try:
            text = self.paths(name).exit_file.read_text().strip()
        except FileNotFoundError:
            return None
        return int(text) if text else None

    def states(self) -> dict[str, str]:
        """Each host's published state (``installing``, ``waiting-for-head``, ``joined``, ``failed: …``).

        A script that exited non-zero without publishing a failure reads as ``failed: startup-script
        exited N``, so nobody waits for a host that has given up.
        """
        states = {}
        for host in self.plan.hosts:
            state = self.guest_attributes(host.name).get(STATE_KEY, "")
            code = self.script_exit(host.name)
            if code not in (None, 0) and not state.startswith(FAILED_PREFIX):
                state = f"{FAILED_PREFIX}: startup-script exited {code}"
            states[host.name] = state
        return states

    def wait_for(
        self,
        condition: Callable[[dict[str, str]], bool],
        timeout: float,
        on_change: Callable[[dict[str, str]], None] | None = None,
    ) -> dict[str, str]:
        """Poll `states()` until `condition` holds; raise SimulatorError on timeout."""
        deadline = time.monotonic() + timeout
        last: dict[str, str] = {}
        while True:
            current = self.states()
            if current != last and on_change is not None:
                on_change(current)
            last = current
            if condition(current):
                return current
            if time.monotonic() > deadline:
                raise SimulatorError(f"timed out after {timeout:.0f}s; host states: {current}")
            time.sleep(0.5)

    def dashboard_url(self) -> str:
        return f"http://{self.plan.head.ip}:{DASHBOARD_PORT}"

    def ray_nodes(self, timeout: float = 5) -> list[dict]:
        """Alive Ray nodes from the head's state API (reached through the bridge): ip, head, resources, labels."""
        request = urllib.request.Request(f"{self.dashboard_url()}/api/v0/nodes?detail=1&limit=10000")
        if self.token_file.exists():
            request.add_header("Authorization", f"Bearer {self.token_file.read_text().strip()}")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
        with opener.open(request, timeout=timeout) as response:
            nodes = json.load(response)["data"]["result"]["result"]
        return [
            {
                "id": n["node_id"],
                "ip": n["node_ip"],
                "head": n["is_head_node"],
                "resources": n["resources_total"],
                "labels": n["labels"],
                "start_time_ms": n.get("start_time_ms"),  # tells a rebooted host's old node from its new one
            }
            for n in nodes
            if n["state"] == "ALIVE"
        ]

    def spec(self) -> ClusterSpec:
        return spec_module.load(self.plan.config, require_zone=False)


def _wait_for(condition: Callable[[], bool], timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SimulatorError(message)
        time.sleep(0.1)
