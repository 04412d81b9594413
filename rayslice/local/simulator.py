"""A simulated slice on one Linux machine: hosts that boot the real startup script.

Each host is a network namespace on a private bridge with its own IP, ``/etc/hosts``, metadata
server (169.254.169.254 on its loopback, serving `host_metadata`), and — while it runs — its own
PID, UTS and mount namespaces (`boot`). Every host runs the SAME rendered script; the only knobs
are the rendered ones: ``supervisor="process"``, the package source (by default ``venv:`` the
environment rayslice runs from, since the hosts have no internet; or ``wheels:DIR``) and the
root, one short path that each host's mount namespace binds to its own directory.

`Simulation.create` records the plan before creating anything; `destroy` (``rayslice local
down``) removes exactly what the state file names, after `state.check_state` has matched every
name in it against the simulator's own patterns, and signals a recorded PID only while it still
runs in the namespace of the host it was recorded for. The state dir is private (0700, see
`private_files`), token files are 0600 from creation, the cluster uses Ray token auth unless
``insecure=True``, and a packet filter keeps the bridge subnet to root (`firewall`).

Owners and tests drive hosts with `boot`, `power_off`, `reboot`, `restart_head_ray` and
`exec_in`, read progress with `states`, and inject faults with the metadata knobs of `create`
and `restart_metadata` (503 for a while, or accept and never answer) or by never booting a host
(`boot_all(skip=...)`).
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
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import rayslice
from rayslice import spec as spec_module
from rayslice.errors import SimulatorError
from rayslice.local import firewall, netns
from rayslice.local.boot import host_environment
from rayslice.local.host_metadata import head_vm_attributes, instance_tree, slice_host_attributes
from rayslice.local.metadata import dump_tree
from rayslice.local.private_files import check_private, ensure_private_dir, make_private_subdir, write_private
from rayslice.local.processes import (
    ProcessRef,
    children,
    cmdline,
    is_alive,
    process_ref,
    start_detached,
    stop,
)
from rayslice.local.state import (
    CLOUD_API_ENDPOINT_FILE,
    CLOUD_API_FILES,
    CLOUD_API_LOG,
    CLOUD_API_PROCESS,
    ROLE_HEAD_VM,
    HostPaths,
    HostPlan,
    SimulationState,
    cloud_api_argv,
    make_plan,
    new_run_id,
    subnet_prefix,
)
from rayslice.names import (
    DASHBOARD_PORT,
    GUEST_ATTRIBUTE_NAMESPACE,
    STATE_FAILED_PREFIX,
    STATE_KEY,
)
from rayslice.platforms import VM_PLATFORMS
from rayslice.spec import ClusterSpec
from rayslice.startup_scripts import RenderOptions, render

TOKEN_PATH = "etc/rayslice/ray-token"  # below a host's root, where the boot script reads it
REQUIRED_TOOLS = ("ip", "unshare", "nsenter", "mount")
# How often the simulated head's recovery controller looks (the cloud default is 30 s), through
# the boot script's RAYSLICE_RECOVERY_INTERVAL_S: a simulated preemption is noticed within seconds.
LOCAL_RECOVERY_INTERVAL_S = 5


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
            f"the local simulator needs {', '.join(missing)} "
            "(Debian: apt-get install iproute2 util-linux mount)"
        )


def _auth_spec(spec: ClusterSpec, insecure: bool) -> ClusterSpec:
    """The spec the simulation runs: token auth unless `insecure`, which turns it off explicitly."""
    if insecure:
        if spec.ray_auth == "none":
            return spec
        return spec_module.load({**spec.as_config(), "rayAuth": "none"}, require_zone=False)
    if spec.ray_auth != "token":
        raise SimulatorError(
            f"rayAuth={spec.ray_auth} would let every local user reach the simulated cluster's dashboard, "
            "GCS and Jobs API and run code on its hosts as root; keep rayAuth=token, or pass --insecure to "
            "run without token auth on purpose"
        )
    return spec


def default_package_source() -> str:
    """The environment rayslice runs from: it already has Ray, and the hosts have no internet."""
    return f"venv:{sys.prefix}"


class Simulation:
    """One simulated cluster, backed by the state file in `state_dir`."""

    def __init__(self, state: SimulationState):
        self.state = state
        self.plan = state.plan
        self.state_dir = Path(state.state_dir)
        self.warnings: list[str] = []  # what the caller should tell the user (e.g. no packet filter)

    # ---- lifecycle ---------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        spec: ClusterSpec,
        state_dir: Path,
        *,
        script: str | None = None,
        package_source: str | None = None,
        insecure: bool = False,
        metadata_unavailable_for: float = 0.0,
        metadata_silent_for: float = 0.0,
    ) -> Simulation:
        """Create every host (network, metadata server, files) without booting any.

        `script` replaces the rendered startup script (tests of the plumbing itself); by default
        every host gets ``render(spec, RenderOptions(supervisor="process", ...))``.
        `insecure` runs the cluster without Ray token auth (rayAuth=none); without it a spec
        with rayAuth=none is refused, since every local user who reached the hosts could run
        code on them as root.
        Fault knobs, for every host's metadata server: `metadata_unavailable_for` answers 503
        for that many seconds; `metadata_silent_for` accepts connections and answers nothing
        for that long (``math.inf``: never). `restart_metadata` sets them for one host later.
        """
        if spec.platform not in VM_PLATFORMS:
            raise SimulatorError(
                f"the simulator simulates the VM platforms ({', '.join(VM_PLATFORMS)}), not {spec.platform}"
            )
        require_root()
        spec = _auth_spec(spec, insecure)
        backend = firewall.available_backend()
        if insecure and backend == firewall.NONE:
            raise SimulatorError(
                "insecure (no token auth) needs a packet filter that keeps the simulated hosts to root, "
                "and this machine has neither nft nor iptables: install nftables (apt-get install nftables) "
                "or drop --insecure"
            )
        state_dir = Path(os.path.abspath(state_dir))
        if os.path.lexists(state_dir):
            check_private(state_dir, directory=True)
            existing = SimulationState.load(state_dir)
            if existing is not None:
                raise SimulatorError(
                    f"a simulation (run {existing.plan.run_id}) already exists in {state_dir}; "
                    "run `rayslice local down` first"
                )
        ensure_private_dir(state_dir)
        host_count = spec.total_hosts + (1 if spec.head == "vm" else 0)
        network = netns.free_subnet(subnet_prefix(host_count), netns.used_networks(), random.Random())
        plan = make_plan(spec, run_id=new_run_id(), network=network)
        source = package_source or default_package_source()
        shared = tuple(
            os.path.normpath(os.path.abspath(p))
            for p in (sys.prefix, str(Path(rayslice.__file__).resolve().parents[1]), source.partition(":")[2])
        )
        state = SimulationState(
            plan=plan, state_dir=str(state_dir), shared_paths=shared, firewall=backend, insecure=insecure
        )
        sim = cls(state)
        sim.state.save()  # before anything exists: `down` works from here on
        if backend == firewall.NONE:
            sim.warnings.append(
                "no nft or iptables on this machine: the bridge subnet is not filtered, so other local "
                "users can reach the hosts' ports (Ray token auth still applies); install nftables"
            )
        if script is None:
            options = RenderOptions(supervisor="process", package_source=source, root=plan.root)
            script = render(spec, options)
        sim._build(spec, script, metadata_unavailable_for, metadata_silent_for)
        sim._start_cloud_api()
        return sim

    @classmethod
    def open(cls, state_dir: Path) -> Simulation:
        """The simulation in `state_dir`; refused if the dir or state file is not private, or is tampered."""
        state_dir = Path(os.path.abspath(state_dir))
        if not os.path.lexists(state_dir):
            raise SimulatorError(f"no simulation in {state_dir}; start one with `rayslice local up`")
        info = check_private(state_dir, directory=True)
        if not os.access(state_dir, os.R_OK | os.X_OK):
            raise SimulatorError(
                f"{state_dir} is private to uid {info.st_uid} (mode {info.st_mode & 0o777:o}, see "
                "docs/simulator.md); run this as that user, e.g. with sudo"
            )
        state = SimulationState.load(state_dir)
        if state is None:
            raise SimulatorError(f"no simulation in {state_dir}; start one with `rayslice local up`")
        return cls(state)

    def _build(self, spec: ClusterSpec, script: str, unavailable_for: float, silent_for: float) -> None:
        plan = self.plan
        prefix = plan.ip_network.prefixlen
        Path(plan.root).mkdir(parents=True, exist_ok=True)
        netns.create_bridge(plan.bridge, plan.gateway, prefix)
        firewall.install(self.state.firewall, plan.run_id, plan.network)
        token = secrets.token_hex(32) if spec.ray_auth == "token" else None
        if token is not None:
            write_private(self.token_file, token)
        peers = {h.name: h.ip for h in plan.hosts}
        for host in plan.hosts:
            netns.create_host_network(host.netns, host.veth, host.veth_peer, plan.bridge, host.ip, prefix)
            netns.write_etc(host.netns, host.name, peers)
            paths = self.paths(host.name)
            make_private_subdir(paths.root / "tmp")
            paths.script.write_text(script)
            if token is not None:
                token_file = paths.root / TOKEN_PATH
                make_private_subdir(token_file.parent)
                write_private(token_file, token)
            tree = instance_tree(
                spec,
                hostname=host.name,
                ip=host.ip,
                network=plan.ip_network,
                gateway=plan.gateway,
                attributes=self._attributes(spec, host),
                startup_script=script,
                machine_type=spec.head_machine_type if host.role == ROLE_HEAD_VM else spec.tpu.machine_type,
            )
            paths.metadata_tree.write_text(dump_tree(tree))
            self._start_metadata(host, unavailable_for, silent_for)
        _wait_for(
            lambda: all(self.paths(h.name).guest_file.exists() for h in plan.hosts),
            30,
            "metadata servers did not start; see hosts/*/metadata.log in the state dir",
        )

    def _start_metadata(self, host: HostPlan, unavailable_for: float, silent_for: float) -> None:
        paths = self.paths(host.name)
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
        ref = self.state.processes.pop(f"metadata:{host.name}", None)
        if ref is not None:
            self._stop(host, ref, grace_s=2)
        self.state.save()
        self._start_metadata(host, unavailable_for, silent_for)
        _wait_for(
            lambda: guest_file.exists() and guest_file.stat().st_ino != before,
            30,
            f"the metadata server of {name} did not start again; see {self.paths(name).metadata_log}",
        )

    def _attributes(self, spec: ClusterSpec, host: HostPlan) -> dict[str, str]:
        if host.role == ROLE_HEAD_VM:
            return head_vm_attributes(spec)
        head = self.plan.head
        # Hosts outside the head's slice (or all, with a head VM) learn its address from metadata.
        head_address = (
            head.ip if (head.role == ROLE_HEAD_VM or host.slice_index != head.slice_index) else None
        )
        return slice_host_attributes(
            spec, host.slice_index, host.worker, self.plan.slice_ips(host.slice_index), head_address
        )

    def _start(self, key: str, log: Path, argv: Sequence[str]) -> None:
        self.state.processes[key] = start_detached(argv, log, host_environment("/root"))
        self.state.save()

    def _start_cloud_api(self) -> None:
        """Start the cloud API emulation (`cloud_bridge`) on the bridge and wait until it serves.

        Every simulation gets one, whatever its head: `rayslice status` and `rayslice local
        preempt` need it on every cluster, and the recovery controller on a head VM reaches it
        through the endpoint overrides it writes to the state dir (`CLOUD_API_ENDPOINT_FILE`).
        """
        self._start(
            CLOUD_API_PROCESS,
            self.state_dir / CLOUD_API_LOG,
            cloud_api_argv(sys.executable, self.state_dir),
        )
        ref = self.state.processes[CLOUD_API_PROCESS]
        endpoint = self.state_dir / CLOUD_API_ENDPOINT_FILE
        _wait_for(lambda: endpoint.exists() or not is_alive(ref), 60, "the cloud API emulation did not start")
        if not endpoint.exists():
            raise SimulatorError(
                f"the cloud API emulation exited at start; see {self.state_dir / CLOUD_API_LOG} "
                "(`rayslice local down` removes the simulation)"
            )

    def _head_vm_environment(self) -> dict[str, str]:
        endpoint = json.loads((self.state_dir / CLOUD_API_ENDPOINT_FILE).read_text())
        return {**endpoint["env"], "RAYSLICE_RECOVERY_INTERVAL_S": str(LOCAL_RECOVERY_INTERVAL_S)}

    def _stop_cloud_api(self) -> None:
        """Stop the emulation, only while the recorded PID still runs exactly `cloud_api_argv`."""
        ref = self.state.processes.get(CLOUD_API_PROCESS)
        if ref is None or not is_alive(ref):
            return
        if cmdline(ref.pid)[1:] == cloud_api_argv(sys.executable, self.state_dir)[1:]:
            stop(ref, grace_s=5)

    def refresh(self) -> None:
        """Reread the recorded processes: another process of this simulation may have started some."""
        fresh = SimulationState.load(self.state_dir)
        if fresh is not None and fresh.plan == self.plan:
            self.state.processes = fresh.processes

    def _stop(self, host: HostPlan, ref: ProcessRef, grace_s: float) -> None:
        """Stop a recorded process, but only while it is still one of `host`'s (netns.in_netns)."""
        if is_alive(ref) and netns.in_netns(ref.pid, host.netns):
            stop(ref, grace_s=grace_s)

    def destroy(self) -> None:
        """Remove every process, namespace, veth, bridge, filter rule and file this simulation made.

        Everything removed is named by the (checked) plan or lies under the state dir it was
        loaded from; nothing is found by pattern.
        """
        if self.plan.head.role == ROLE_HEAD_VM:  # first the recovery controller, which acts on hosts
            self.power_off(self.plan.head.name)
        self._stop_cloud_api()
        for host in self.plan.hosts:
            self.power_off(host.name)
        for key, ref in list(self.state.processes.items()):
            if key != CLOUD_API_PROCESS:
                self._stop(self.plan.host(key.partition(":")[2]), ref, grace_s=5)
        for host in self.plan.hosts:
            for pid in netns.netns_pids(host.netns):  # anything left in our own namespaces
                left = process_ref(pid)
                if left is not None:
                    stop(left, grace_s=2)
            netns.delete_netns(host.netns)
            netns.delete_link(host.veth)
            netns.delete_link(host.veth_peer)
        netns.delete_link(self.plan.bridge)
        firewall.remove(self.state.firewall, self.plan.run_id, self.plan.network)
        root = Path(self.plan.root)
        if root.is_dir() and not root.is_symlink():
            root.rmdir()
        if root.parent.is_dir() and not any(root.parent.iterdir()):
            root.parent.rmdir()
        shutil.rmtree(self.state_dir / "hosts", ignore_errors=True)
        self.token_file.unlink(missing_ok=True)
        for name in CLOUD_API_FILES:
            (self.state_dir / name).unlink(missing_ok=True)
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
        """Power the host on: fresh PID/UTS/mount namespaces run the startup script (GCE: at every boot).

        `env` adds variables to the script's otherwise clean environment (tests shorten the
        script's documented RAYSLICE_HEAD_DEADLINE_S with it). The head VM's environment also
        points the cloud API clients at the emulation (the endpoint overrides gcloud and
        `rayslice.recovery.cloud` honour) and shortens the recovery controller's interval.
        """
        host = self.plan.host(name)
        if host.role == ROLE_HEAD_VM:
            env = {**self._head_vm_environment(), **(env or {})}
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

    def boot_all(self, skip: Collection[str] = ()) -> None:
        """Boot every host except those named in `skip` (a host that never boots is a fault to test)."""
        unknown = set(skip) - {h.name for h in self.plan.hosts}
        if unknown:
            raise SimulatorError(f"no hosts {sorted(unknown)} in this simulation")
        for host in self.plan.hosts:
            if host.name not in skip:
                self.boot(host.name)

    def power_off(self, name: str) -> None:
        """Kill every process of the host at once (its PID namespace ends), like pulling the plug."""
        host = self.plan.host(name)
        ref = self.state.processes.pop(f"boot:{host.name}", None)
        if ref is not None:
            self._stop(host, ref, grace_s=0)
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
        """`ray stop` inside the head host only (its own PID namespace); its supervisor restarts Ray."""
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
        """Each host's published state (``installing``, ``waiting: head``, ``joined``, ``failed: …``).

        A script that exited non-zero without publishing a failure reads as ``failed: startup-script
        exited N``, so nobody waits for a host that has given up.
        """
        states = {}
        for host in self.plan.hosts:
            state = self.guest_attributes(host.name).get(STATE_KEY, "")
            code = self.script_exit(host.name)
            if code not in (None, 0) and not state.startswith(STATE_FAILED_PREFIX):
                state = f"{STATE_FAILED_PREFIX}startup-script exited {code}"
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

    def ray_nodes(self, timeout: float = 5) -> list[dict[str, Any]]:
        """Alive Ray nodes from the head's state API (through the bridge): ip, head, resources, labels."""
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
