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
`exec_in` (`power`), read progress with `states` (`progress`), and inject faults with the
metadata knobs of `create` and `restart_metadata` (`services`: 503 for a while, or accept and
never answer) or by never booting a host (`boot_all(skip=...)`). `Simulation` is those parts
together, plus creating and removing the whole simulation, here.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import rayslice
from rayslice import compilation_cache
from rayslice import spec as spec_module
from rayslice.errors import InvalidInput, SimulatorError
from rayslice.local.google.host_metadata import instance_tree
from rayslice.local.google.metadata_server import dump_tree
from rayslice.local.host import firewall, netns
from rayslice.local.host.private_files import (
    check_private,
    ensure_private_dir,
    make_private_subdir,
    write_private,
)
from rayslice.local.host.processes import process_ref, stop
from rayslice.local.simulation import images
from rayslice.local.simulation.power import HostPower
from rayslice.local.simulation.progress import HostProgress
from rayslice.local.simulation.recorded import wait_until
from rayslice.local.simulation.services import SimulationServices
from rayslice.local.simulation.state import (
    CLOUD_API_CAPACITY_FILE,
    CLOUD_API_FILES,
    CLOUD_API_PROCESS,
    LONE_VM_ROLES,
    ROLE_CONTROLLER_VM,
    HostPlan,
    HostRecord,
    SimulationState,
    address_room,
    extend_plan,
    make_plan,
    new_run_id,
    subnet_prefix,
)
from rayslice.platforms import VM_PLATFORMS
from rayslice.spec import ClusterSpec
from rayslice.startup_scripts import RenderOptions, render
from rayslice.startup_scripts.controller import render_controller

TOKEN_PATH = "etc/rayslice/ray-token"  # below a host's root, where the boot script reads it
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


# `Simulation.create`'s package_source that makes hosts install from the spec's packageIndex, as
# real hosts do: the simulated internet's (`internet`), which the simulation itself does not run.
INDEX_SOURCE = "index"


def default_package_source() -> str:
    """The environment rayslice runs from: it already has Ray, and the hosts have no internet."""
    return f"venv:{sys.prefix}"


class Simulation(HostPower, HostProgress, SimulationServices):
    """One simulated cluster, backed by the state file in `state_dir`: created, opened and
    destroyed here; its hosts driven and read through the parts it inherits."""

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
        host_image: Path | None = None,
        zone_capacity: int | None = None,
    ) -> Simulation:
        """Create every host (network, metadata server, files) without booting any.

        The hosts are what the Pulumi program deploys: the cloud API emulation starts first, runs
        the program against its cloud twin with addresses from the simulation's network
        (`cloud_bridge`), and hands back one record per instance and TPU worker the twin then
        holds, with the name, IP, metadata and machine type the twin gives it
        (`state.HostRecord`). If the twin refuses the program, nothing is left behind and
        `InvalidInput` names the rules.

        `script` replaces the rendered startup script (tests of the plumbing itself); by default
        every host gets ``render(spec, RenderOptions(supervisor="process", ...))``.
        `package_source`: ``wheels:DIR``, ``venv:DIR`` (default: `default_package_source`) or
        `INDEX_SOURCE`, the spec's packageIndex (which the caller serves: `internet`).
        `insecure` runs the cluster without Ray token auth (rayAuth=none); without it a spec
        with rayAuth=none is refused, since every local user who reached the hosts could run
        code on them as root.
        Fault knobs, for every host's metadata server: `metadata_unavailable_for` answers 503
        for that many seconds; `metadata_silent_for` accepts connections and answers nothing
        for that long (``math.inf``: never). `restart_metadata` sets them for one host later.
        `host_image`: the local copy of the spec's ``hostImage`` (`images`, made with
        `capture_image`), whose files every slice host's root starts with; required exactly
        when the spec names a hostImage.
        `zone_capacity`: the zone's free hosts of the slices' type in the twin before the program
        runs (default: room for everything): a direct create beyond it is refused, a flex-start
        slice's request waits, and its hosts are made and booted when `rayslice local capacity`
        gives the zone room (`add_hosts`).
        """
        if spec.platform not in VM_PLATFORMS:
            raise SimulatorError(
                f"the simulator simulates the VM platforms ({', '.join(VM_PLATFORMS)}), not {spec.platform}"
            )
        require_root()
        spec = _auth_spec(spec, insecure)
        if (spec.host_image is None) != (host_image is None):
            raise SimulatorError(
                f"hostImage={spec.host_image} names a Compute Engine image; the simulator boots from a local "
                "copy of it: pass host_image=DIR (made with Simulation.capture_image)"
                if host_image is None
                else "host_image is the local copy of the spec's hostImage, and this spec names none: set "
                "hostImage (e.g. to `rayslice image name`'s answer)"
            )
        if host_image is not None:
            images.check(host_image)
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
        network = netns.free_subnet(subnet_prefix(address_room(spec)), netns.used_networks(), random.Random())
        plan = make_plan(spec, run_id=new_run_id(), network=network, hosts=())
        source = package_source or default_package_source()
        from_index = source == INDEX_SOURCE
        if from_index and not spec.package_index:
            raise SimulatorError(f"package source {INDEX_SOURCE!r} needs a spec with a packageIndex")
        own = (sys.prefix, str(Path(rayslice.__file__).resolve().parents[1]))
        shared = tuple(
            os.path.normpath(os.path.abspath(p))
            for p in (*own, *(() if from_index else (source.partition(":")[2],)))
        )
        state = SimulationState(
            plan=plan, state_dir=str(state_dir), shared_paths=shared, firewall=backend, insecure=insecure
        )
        sim = cls(state)
        sim.state.save()  # before anything exists, with no hosts yet: `down` works from here on
        if backend == firewall.NONE:
            sim.warnings.append(
                "no nft or iptables on this machine: the bridge subnet is not filtered, so other local "
                "users can reach the hosts' ports (Ray token auth still applies); install nftables"
            )
        # Every host's jobs cache their compiled steps in the shared folder, as a real cluster's
        # do in its bucket (`rayslice.compilation_cache`).
        options = RenderOptions(
            supervisor="process",
            package_source=None if from_index else source,
            root=plan.root,
            compilation_cache=compilation_cache.folder_location(plan.shared_dir),
            record=sim.record_mount,  # every machine ships its logs there (`recording`)
        )
        netns.create_bridge(plan.bridge, plan.gateway, network.prefixlen)  # the emulation listens on it
        if zone_capacity is not None:
            write_private(state_dir / CLOUD_API_CAPACITY_FILE, json.dumps(zone_capacity))
        try:
            records = sim._start_cloud_api()
        except InvalidInput:
            sim.destroy()  # the twin refused the program: as `pulumi up` would, nothing is created
            raise
        sim.state.plan = sim.plan = make_plan(spec, run_id=plan.run_id, network=network, hosts=records)
        sim.state.save()
        if script is None:
            script = render(spec, options)
        # The recovery controller's VM boots its own script, as on the cloud.
        scripts = {ROLE_CONTROLLER_VM: render_controller(spec, options)} if sim.plan.controller else {}
        records_by_name = {r.name: r for r in records}
        sim._build(spec, script, scripts, records_by_name, metadata_unavailable_for, metadata_silent_for)
        if host_image is not None:
            for host in sim.plan.machines:
                if host.role not in LONE_VM_ROLES:  # the slices boot hostImage, lone VMs their own
                    images.install(host_image, sim.paths(host.name).root)
        sim._await_cloud_api()
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

    def _build(
        self,
        spec: ClusterSpec,
        script: str,
        scripts: dict[str, str],
        records: Mapping[str, HostRecord],
        unavailable_for: float,
        silent_for: float,
    ) -> None:
        """Make every machine of the plan; its ``instance/attributes/`` and machine type are its
        record's (the twin's), its startup script `scripts`' entry for its role, else `script`,
        rendered for the simulator (`host_metadata.instance_tree`)."""
        plan = self.plan
        Path(plan.root).mkdir(parents=True, exist_ok=True)
        Path(plan.shared_dir).mkdir(mode=0o755, exist_ok=True)
        firewall.install(self.state.firewall, plan.run_id, plan.network, plan.admitted)
        token = secrets.token_hex(32) if spec.ray_auth == "token" else None
        if token is not None:
            write_private(self.token_file, token)
        for host in plan.machines:
            self._make_host(spec, host, scripts.get(host.role, script), records[host.name], token)
            self._start_metadata(host, unavailable_for, silent_for)
        self._await_metadata(plan.machines)

    def _make_host(
        self, spec: ClusterSpec, host: HostPlan, script: str, record: HostRecord, token: str | None
    ) -> None:
        """One machine: its namespace on the bridge, files, Ray token and metadata tree, whose
        ``instance/attributes/`` and machine type are `record`'s (the twin's)."""
        plan = self.plan
        netns.create_host_network(
            host.netns, host.veth, host.veth_peer, plan.bridge, host.ip, plan.ip_network.prefixlen
        )
        netns.write_etc(host.netns, host.name, {h.name: h.ip for h in plan.machines})
        paths = self.paths(host.name)
        make_private_subdir(paths.root / "tmp")
        paths.script.write_text(script)
        if token is not None and host.role != ROLE_CONTROLLER_VM:  # no Ray there, no Ray token
            token_file = paths.root / TOKEN_PATH
            make_private_subdir(token_file.parent)
            write_private(token_file, token)
        tree = instance_tree(
            spec,
            hostname=host.name,
            ip=host.ip,
            network=plan.ip_network,
            gateway=plan.gateway,
            attributes=dict(record.metadata or {}),
            startup_script=script,
            access_token=secrets.token_urlsafe(32),  # the emulation admits only the controller's
            machine_type=record.machine_type or spec.tpu.machine_type,  # a TPU node's workers name none
        )
        paths.metadata_tree.write_text(dump_tree(tree))

    def _await_metadata(self, hosts: Sequence[HostPlan]) -> None:
        wait_until(
            lambda: all(self.paths(h.name).guest_file.exists() for h in hosts),
            30,
            "metadata servers did not start; see hosts/*/metadata.log in the state dir",
        )

    def capture_image(self, name: str, image: Path) -> str:
        """Make a host image (`images`) in the new directory `image` from host `name`'s install;
        the install fingerprint it holds. The host must have finished installing."""
        return images.capture(self.paths(name).root, image)

    def add_hosts(self, records: Sequence[HostRecord]) -> list[str]:
        """Make the slice hosts the cloud created after `local up` (`state.extend_plan`: a
        flex-start slice's resize request, fulfilled when `rayslice local capacity` gave the zone
        room), as `create` made the others: the same startup script (the head VM's, which every
        Ray host runs) and Ray token. They are recorded in the state file before anything is
        made, so `local down` removes them; the caller boots them. Returns their names."""
        spec = self.spec()
        self.refresh()
        self.state.plan = self.plan = extend_plan(self.plan, spec, records)
        self.state.save()
        added = [self.plan.host(r.name) for r in records]
        script = self.paths(self.plan.head.name).script.read_text()
        token = self.token_file.read_text() if self.token_file.exists() else None
        for host, record in zip(added, records, strict=True):
            self._make_host(spec, host, script, record, token)
            self._start_metadata(host, 0.0, 0.0)
        self._await_metadata(added)
        return [h.name for h in added]

    def destroy(self) -> None:
        """Remove every process, namespace, veth, bridge, filter rule and file this simulation made.

        Everything removed is named by the (checked) plan or lies under the state dir it was
        loaded from; nothing is found by pattern.
        """
        if self.plan.controller is not None:  # first the recovery controller, which acts on hosts
            self.power_off(self.plan.controller.name)
        self._stop_cloud_api()
        self.power_off_all([host.name for host in self.plan.hosts])
        for key, ref in list(self.state.processes.items()):
            if key != CLOUD_API_PROCESS:
                self._stop(self.plan.host(key.partition(":")[2]), ref, grace_s=5)
        for host in self.plan.machines:
            for pid in netns.netns_pids(host.netns):  # anything left in our own namespaces
                left = process_ref(pid)
                if left is not None:
                    stop(left, grace_s=2)
            netns.delete_netns(host.netns)
            netns.delete_link(host.veth)
            netns.delete_link(host.veth_peer)
        netns.delete_link(self.plan.bridge)
        firewall.remove(self.state.firewall, self.plan.run_id, self.plan.network, self.plan.admitted)
        root = Path(self.plan.root)
        if root.is_dir() and not root.is_symlink():
            root.rmdir()
        shutil.rmtree(self.plan.shared_dir, ignore_errors=True)
        if root.parent.is_dir() and not any(root.parent.iterdir()):
            root.parent.rmdir()
        shutil.rmtree(self.state_dir / "hosts", ignore_errors=True)
        self.token_file.unlink(missing_ok=True)
        for name in CLOUD_API_FILES:
            (self.state_dir / name).unlink(missing_ok=True)
        (self.state_dir / "state.json").unlink()
        if not any(self.state_dir.iterdir()):
            self.state_dir.rmdir()
