"""The simulator on real namespaces: first its plumbing with a tiny boot script (fast, no Ray),
then what `rayslice local status` shows of real Ray clusters booted by the real rendered startup
script, on the shared clusters: a slice of TPU VMs, and two Compute Engine slices behind a head VM.
`rayslice local up` and `down` through the CLI run in test_readme.py, on the README's slice."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rayslice import catalog, cli, names, spec
from rayslice.cli import load_spec
from rayslice.errors import EXIT_INVALID, InvalidInput
from rayslice.local.google.metadata_server import load_tree
from rayslice.local.host import firewall, netns
from rayslice.local.host.private_files import write_private
from rayslice.local.host.processes import is_alive, process_ref
from rayslice.local.simulation.cloud_bridge import cloud_access, cloud_config, request_capacity
from rayslice.local.simulation.simulator import TOKEN_PATH, Simulation
from rayslice.local.simulation.state import STATE_FILE
from rayslice.recovery.commands import client_for, gather
from tests.integration.clusters import bring_up, on

# Just enough of a boot script to observe a host from inside: it waits for metadata (which may
# answer 503 at first), publishes what it sees as guest attributes (a boot counter among them),
# then `joined`, and leaves a long-lived process behind, as the real script's supervisor does.
TINY_SCRIPT = r"""#!/bin/bash
set -euo pipefail
url=http://metadata.google.internal/computeMetadata/v1
md() { curl -sSf --max-time 2 -H 'Metadata-Flavor: Google' "$url/$1"; }
put() {
  curl -sSf -X PUT --data-binary "$2" -H 'Metadata-Flavor: Google' \
    "$url/instance/guest-attributes/rayslice/$1"
}
until md instance/id >/dev/null 2>&1; do sleep 0.2; done
put boots $(( $(md instance/guest-attributes/rayslice/boots 2>/dev/null || echo 0) + 1 ))
put hostname "$(hostname)"
put home "$HOME"
put ppid "$PPID"
put pidns "$(readlink /proc/self/ns/pid)"
put ip "$(md instance/network-interfaces/0/ip)"
put worker "$(md instance/attributes/agent-worker-number)"
put peer "$(getent hosts rayslice-slice-0-w0 | cut -d' ' -f1)"
put outside "$(ip route get 192.0.2.1 >/dev/null 2>&1 && echo reachable || echo unreachable)"
gateway=$(md instance/network-interfaces/0/gateway)
put gateway "$(timeout 3 bash -c "exec 3<>/dev/tcp/$gateway/9" 2>/dev/null; echo $?)"
put http_proxy "${http_proxy:-none}"
put state joined
setsid sleep 1000 </dev/null >/dev/null 2>&1 &
"""


def _joined(states: dict[str, str]) -> bool:
    return all(v == "joined" for v in states.values())


# Connect from this machine's root namespace to a host's port with no listener: root gets
# "connection refused" from the host (it is reachable); any other user's SYN is dropped by the
# simulation's packet filter before it leaves (EPERM, or a timeout while TCP retransmits).
_CONNECT = """
import errno, socket, sys
try:
    socket.create_connection((sys.argv[1], 9), timeout=3)
    print(0)
except OSError as exc:
    print(exc.errno or errno.ETIMEDOUT)
"""


def _connect_errno(ip: str, as_nobody: bool) -> int:
    prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if as_nobody else []
    out = subprocess.run(
        [*prefix, "/usr/bin/python3", "-c", _CONNECT, ip], capture_output=True, text=True, timeout=30
    )
    return int(out.stdout.strip())


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_hosts_are_isolated_machines_with_their_own_metadata(simulation_dir, monkeypatch):
    monkeypatch.setenv("http_proxy", "http://192.0.2.1:3128")  # must not leak into the hosts
    cluster = spec.load({"platform": "tpu-vm", "acceleratorType": "v6e-16"}, require_zone=False)
    sim = Simulation.create(cluster, simulation_dir, script=TINY_SCRIPT, metadata_unavailable_for=6.0)
    sim.boot_all()
    sim.wait_for(_joined, timeout=60)
    # The script publishes `joined` a moment before it exits; its exit status comes after.
    _wait(lambda: all(sim.script_exit(h.name) is not None for h in sim.plan.hosts))

    namespaces = {sim.guest_attributes(h.name)["pidns"] for h in sim.plan.hosts}
    assert len(namespaces) == len(sim.plan.hosts)  # one per host
    for host in sim.plan.hosts:
        facts = sim.guest_attributes(host.name)
        assert facts["hostname"] == host.name
        assert facts["home"] == f"{sim.plan.root}/root"
        # The script runs in the host's own PID namespace, as a child of the host's PID 1 (its
        # PID itself says little: the host's setup runs a mount(8) per mount point first).
        assert facts["ppid"] == "1" and facts["pidns"] != os.readlink("/proc/self/ns/pid")
        assert facts["ip"] == host.ip and facts["worker"] == str(host.worker)
        assert facts["peer"] == sim.plan.head.ip
        assert facts["outside"] == "unreachable"
        assert facts["gateway"] == "124", "the machine's INPUT drops a host's SYN (refused would be 1)"
        assert facts["http_proxy"] == "none"
        assert sim.script_exit(host.name) == 0
    assert " 503 " in sim.paths(sim.plan.hosts[0].name).metadata_log.read_text(), (
        "metadata answered 503 at first"
    )

    # Private state: the dir 0700, every token file 0600 (issue 14.2).
    assert _mode(simulation_dir) == 0o700 and _mode(simulation_dir / STATE_FILE) == 0o600
    assert _mode(sim.token_file) == 0o600
    for host in sim.plan.hosts:
        assert _mode(sim.paths(host.name).root / TOKEN_PATH) == 0o600

    # The bridge subnet is root's: root reaches a host (refused port), nobody's packets are dropped.
    head_ip = sim.plan.head.ip
    assert sim.state.firewall == firewall.available_backend() != firewall.NONE
    assert _connect_errno(head_ip, as_nobody=False) == errno.ECONNREFUSED
    assert _connect_errno(head_ip, as_nobody=True) in (errno.EPERM, errno.ETIMEDOUT)  # dropped
    # The gateway is the machine's own address on the bridge, where the cloud API emulation listens.
    assert _connect_errno(sim.plan.gateway, as_nobody=False) == errno.ECONNREFUSED
    assert _connect_errno(sim.plan.gateway, as_nobody=True) in (errno.EPERM, errno.ETIMEDOUT)

    # A reboot runs the same script again on that host only; a power-off ends all its processes.
    target = sim.plan.hosts[2]
    sim.reboot(target.name)
    _wait(lambda: sim.guest_attributes(target.name)["boots"] == "2" and sim.script_exit(target.name) == 0)
    assert sim.guest_attributes(sim.plan.hosts[1].name)["boots"] == "1"
    assert netns.netns_pids(target.netns), "the rebooted host runs its processes again"
    inside = sim.exec_in(target.name, ["ps", "-e", "-o", "comm="]).stdout.split()
    assert "sleep" in inside and "pytest" not in inside and len(inside) < 20

    refs = list(sim.state.processes.values())
    sim.destroy()
    assert not any(is_alive(ref) for ref in refs)
    if sim.state.firewall == firewall.NFT:
        listed = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=True).stdout
        assert sim.plan.bridge not in listed
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert sim.plan.run_id not in listed
    assert not netns.link_exists(sim.plan.bridge)
    assert not any(netns.link_exists(h.veth) for h in sim.plan.hosts)
    assert not simulation_dir.exists()


def test_down_cleans_up_after_an_interrupted_up(simulation_dir, monkeypatch):
    """A crash half-way through creating hosts leaves a state file that `down` works from."""
    original = netns.create_host_network
    created = []

    def crash_on_third(*args, **kwargs):
        if len(created) == 2:
            raise KeyboardInterrupt
        created.append(args[0])
        original(*args, **kwargs)

    monkeypatch.setattr(netns, "create_host_network", crash_on_third)
    with pytest.raises(KeyboardInterrupt):
        Simulation.create(
            spec.load({"platform": "tpu-vm"}, require_zone=False), simulation_dir, script="true\n"
        )
    assert all(netns.netns_exists(name) for name in created)
    assert cli.main(["local", "down", "--state-dir", str(simulation_dir)]) == 0
    assert not any(netns.netns_exists(name) for name in created)
    assert not simulation_dir.exists()


def test_down_refuses_a_tampered_state_and_never_kills_a_foreign_pid(simulation_dir):
    """`local down` on a state file that names something outside the simulation deletes nothing;
    a recorded PID that is not in its host's namespace is never signalled."""
    sim = Simulation.create(
        spec.load({"platform": "tpu-vm"}, require_zone=False), simulation_dir, script="true\n"
    )
    victim = subprocess.Popen(["sleep", "300"])
    try:
        raw = json.loads((simulation_dir / STATE_FILE).read_text())
        good = json.dumps(raw)
        raw["plan"]["hosts"][1]["netns"] = "../../etc"
        write_private(simulation_dir / STATE_FILE, json.dumps(raw))
        assert cli.main(["local", "down", "--state-dir", str(simulation_dir)]) == EXIT_INVALID
        assert all(netns.netns_exists(h.netns) for h in sim.plan.hosts), "nothing was deleted"
        assert os.path.isdir("/etc")

        # A well-formed state whose metadata process is swapped for a stranger's PID.
        raw = json.loads(good)
        host = sim.plan.hosts[1].name
        real = raw["processes"][f"metadata:{host}"]
        ref = process_ref(victim.pid)
        assert ref is not None
        raw["processes"][f"metadata:{host}"] = {"pid": ref.pid, "start_time": ref.start_time}
        write_private(simulation_dir / STATE_FILE, json.dumps(raw))
        Simulation.open(simulation_dir).destroy()
        assert victim.poll() is None, "destroy signalled a process that is not the simulation's"
        assert not any(netns.netns_exists(h.netns) for h in sim.plan.hosts)
        assert not is_alive(type(ref)(**real)), "the real metadata server died with its namespace"
    finally:
        victim.kill()
        victim.wait()


def test_a_program_the_cloud_refuses_leaves_nothing_behind_and_says_why_on_one_line(simulation_dir):
    """The emulation runs the Pulumi program before any host exists; when it is refused, `create`
    removes what it had made (state, bridge, emulation) and raises one line (exit 2)."""
    networks = set(netns.used_networks())  # a bridge left behind would add its subnet
    requirements = [f"package-number-{i}-with-a-long-name==1.0" for i in range(6000)]
    cluster = spec.load({"acceleratorType": "v6e-4", "requirements": requirements}, require_zone=False)
    with pytest.raises(InvalidInput) as refused:
        Simulation.create(cluster, simulation_dir, script="true\n")
    assert refused.value.exit_code == EXIT_INVALID
    assert "\n" not in str(refused.value) and "GCE metadata allows 262144" in str(refused.value)
    assert not simulation_dir.exists()
    assert set(netns.used_networks()) == networks


def test_metadata_fault_knobs_and_a_host_that_never_boots(simulation_dir):
    """Knobs for the fault tests: a metadata server that accepts and never answers, one restarted
    to answer 503 for a while, and a host left powered off while the others boot."""
    cluster = spec.load({"platform": "tpu-vm", "acceleratorType": "v6e-16"}, require_zone=False)
    sim = Simulation.create(cluster, simulation_dir, script=TINY_SCRIPT, metadata_silent_for=float("inf"))
    silent, later, never = (h.name for h in sim.plan.hosts[1:])
    for name in (sim.plan.hosts[0].name, later):
        sim.restart_metadata(name)  # answering again, the others stay silent
    sim.restart_metadata(later, unavailable_for=3.0)
    sim.boot_all(skip=[never])
    _wait(lambda: sim.states()[sim.plan.hosts[0].name] == "joined" and sim.states()[later] == "joined", 60)
    states = sim.states()
    assert states[silent] == "" and sim.running(silent), "a silent metadata server holds the host's script"
    assert states[never] == "" and not sim.running(never)
    assert " 503 " in sim.paths(later).metadata_log.read_text()
    probe = sim.exec_in(
        silent,
        [
            "curl",
            "-sS",
            "--max-time",
            "2",
            "-H",
            "Metadata-Flavor: Google",
            "http://metadata.google.internal/",
        ],
    )
    assert probe.returncode == 28, "connected, then no answer: curl's timeout"
    sim.restart_metadata(silent)
    _wait(lambda: sim.states()[silent] == "joined", 60)


PACKAGES = {firewall.NFT: "nftables", firewall.IPTABLES: "iptables"}


@pytest.mark.parametrize("backend", [firewall.NFT, firewall.IPTABLES])
def test_each_filter_backend_removes_exactly_its_own_run(backend):
    """Two runs' rules side by side: removing one leaves the other, and removing twice is harmless."""
    if shutil.which(backend) is None:
        pytest.fail(
            f"{backend} is not installed; scripts/setup.sh installs both filter backends "
            f"(apt-get install {PACKAGES[backend]})"
        )

    def present(run_id: str) -> bool:
        if backend == firewall.NFT:
            return (
                subprocess.run(
                    ["nft", "list", "table", "inet", f"rsl{run_id}"], capture_output=True
                ).returncode
                == 0
            )
        checks = [
            [tool, "-w", "-C", chain, *rule] for tool, chain, *rule in firewall.iptables_rules(run_id, net)
        ]
        return all(subprocess.run(c, capture_output=True).returncode == 0 for c in checks)

    net = "100.127.255.0/24"
    mine, other = "f1f1f1", "f2f2f2"
    try:
        firewall.install(backend, mine, net)
        firewall.install(backend, other, net)
        assert present(mine) and present(other)
        firewall.remove(backend, mine, net)
        assert not present(mine) and present(other)
        firewall.remove(backend, mine, net)
        assert present(other)
    finally:
        firewall.remove(backend, mine, net)
        firewall.remove(backend, other, net)
    assert not present(other)


# ---- the real startup script, through the CLI ---------------------------------------------------


def _status(state_dir, capsys) -> dict:
    capsys.readouterr()
    assert cli.main(["local", "status", "--json", "--state-dir", str(state_dir)]) == 0
    return json.loads(capsys.readouterr().out)


@on("v5p-16 tpu-vm")
def test_status_of_a_tpu_vm_slice_shows_each_host_and_its_node(cluster, capsys):
    spec = cluster.spec()
    tpu, head_resource = spec.tpu, f"TPU-{spec.accelerator_type}-head"
    report = _status(cluster.state_dir, capsys)
    assert [h["state"] for h in report["hosts"]] == ["joined"] * tpu.hosts
    assert [h["role"] for h in report["hosts"]] == ["head"] + ["worker"] * (tpu.hosts - 1)
    nodes = report["ray"]["nodes"]
    assert len(nodes) == tpu.hosts
    assert report["ray"]["totals"]["TPU"] == tpu.chips and report["ray"]["totals"][head_resource] == 1
    by_ip = {n["ip"]: n for n in nodes}
    for host in report["hosts"]:  # Ray's own TPU detection read each host's metadata server
        node = by_ip[host["ip"]]
        assert node["resources"]["TPU"] == tpu.chips_per_host and node["resources"][spec.slice_name(0)] == 1
        assert node["labels"]["ray.io/tpu-worker-id"] == str(host["worker"])
        assert (head_resource in node["resources"]) == (host["worker"] == 0)

    with pytest.raises(urllib.error.HTTPError) as denied:  # rayAuth=token: no token, no answer
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        opener.open(f"{report['dashboard']}/api/v0/nodes", timeout=5)
    assert denied.value.code in (401, 403)


@on("2 x tpu7x-16 spot")
def test_status_of_a_multislice_behind_a_head_vm(cluster, capsys):
    spec = cluster.spec()
    report = _status(cluster.state_dir, capsys)
    head, *tpu_hosts = report["hosts"]
    assert head["role"] == "head-vm" and head["name"] == names.head_name(spec.name)
    # Within a slice, worker order is the order Pulumi created the hosts in, which it leaves open.
    assert sorted((h["slice"], h["name"]) for h in tpu_hosts) == [
        (s, names.host_name(spec.slice_name(s), w)) for s in range(spec.slices) for w in range(spec.tpu.hosts)
    ]
    by_ip = {n["ip"]: n["resources"] for n in report["ray"]["nodes"]}
    assert "TPU" not in by_ip[head["ip"]]
    for host in tpu_hosts:
        resources = by_ip[host["ip"]]
        assert resources["TPU"] == spec.tpu.chips_per_host
        assert resources.get(f"TPU-{catalog.reported_name(spec.accelerator_type)}-head", 0) == (
            host["worker"] == 0
        )
        assert resources[spec.slice_name(host["slice"])] == 1
    assert report["ray"]["totals"]["TPU"] == spec.slices * spec.tpu.chips


def _wait(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.2)


FLEX_EXAMPLE = "infra/Pulumi.example-compute-flex-v6e-16.yaml"
QUEUED_EXAMPLE = "infra/Pulumi.example-tpu-vm-queued-v6e-16.yaml"


def _up_in_an_empty_zone(
    example: str, overrides: list[str], simulation_dir: Path
) -> tuple[spec.ClusterSpec, Simulation, Callable[[], list[dict[str, Any]]]]:
    """`example` with `overrides` up on the simulator in a zone without capacity for its slice:
    the head VM only (the slice's request waits), booted; and the slices as status reads them."""
    cluster = load_spec(example, overrides, require_zone=False)
    sim = Simulation.create(cluster, simulation_dir, zone_capacity=0)
    assert [h.slice_index for h in sim.plan.hosts] == [-1]  # the head VM only: the request waits
    bring_up(sim)
    spec_run = spec.load(cloud_config(sim.spec()), require_zone=False)  # with the emulation's project
    client = client_for(spec_run, cloud_access(sim.state_dir))
    return cluster, sim, lambda: list(gather(client, spec_run)["slices"])


def test_a_flex_start_slice_waits_for_capacity_then_its_hosts_boot_and_join(simulation_dir):
    """Issue 21's acceptance on the simulator: the flex-start example (tpu7x-16: two hosts, the
    smallest multi-host shape compute's flex-start offers, in its flex-start zone) in a zone with
    no capacity. The program's part returns with the bulk MIG waiting and no slice host; status
    shows it waiting. `rayslice local capacity` gives the zone room: the MIG creates every host at
    once and names them
    ``<slice>-<4 characters>``, the simulation makes and boots them, each finds its worker and
    its peers from Google's attributes alone (rayslice wrote no host list), and both join Ray;
    status shows the request fulfilled with both hosts joined."""
    overrides = ["acceleratorType=tpu7x-16", "zone=us-central1-c", "recovery=false"]
    cluster, sim, slices = _up_in_an_empty_zone(FLEX_EXAMPLE, overrides, simulation_dir)
    [waiting] = slices()
    assert waiting["state"] == "REQUEST WAITING_FOR_RESOURCES" and waiting["hosts"] == []

    answer = request_capacity(sim.state_dir, 2, None, None)
    assert answer["waiting"] == [] and answer["type"] == cluster.tpu.machine_type
    sim = Simulation.open(simulation_dir)  # with the hosts the emulation added
    slice_name = cluster.slice_name(0)
    workers = [h for h in sim.plan.hosts if h.slice_index == 0]
    assert sorted(h.worker for h in workers) == [0, 1]
    for host in workers:
        assert host.name.startswith(f"{slice_name}-") and len(host.name) == len(slice_name) + 5
        attributes = load_tree(sim.paths(host.name).metadata_tree.read_text())["instance"]["attributes"]
        assert names.ATTR_SLICE_HOSTS not in attributes and attributes["worker-id"] == str(host.worker)
    sim.wait_for(lambda states: all(s == names.STATE_JOINED for s in states.values()), timeout=600)
    [active] = slices()
    assert active["request"]["state"] == "ACTIVE" and active["state"] == "READY"
    assert (active["request"]["hosts_asked"], active["request"]["hosts_joined"]) == (2, 2)


def test_a_queued_tpu_vm_slice_waits_for_capacity_then_its_hosts_boot_and_join(simulation_dir):
    """Issue 21's acceptance for tpu-vm on the simulator: the queued example (as v6e-1, one host:
    the smallest shape that proves it) in a zone with no v6e capacity. The program's part returns
    with the queued resource waiting and no slice host; status shows it waiting with its
    deadline. `rayslice local capacity` gives the zone room: the request is fulfilled, its node is
    created under the slice's name, the simulation makes and boots its host with the same startup
    script, and it joins Ray; status shows the request ACTIVE and the host joined."""
    overrides = ["acceleratorType=v6e-1", "recovery=false"]
    cluster, sim, slices = _up_in_an_empty_zone(QUEUED_EXAMPLE, overrides, simulation_dir)
    [waiting] = slices()
    assert waiting["state"] == "REQUEST WAITING_FOR_RESOURCES" and waiting["hosts"] == []
    assert waiting["request"]["deadline"] and waiting["request"]["hosts_asked"] == 1

    answer = request_capacity(sim.state_dir, 1, None, None)
    assert answer["waiting"] == [] and answer["type"] == "v6e"
    sim = Simulation.open(simulation_dir)  # with the host the emulation added
    [worker] = [h for h in sim.plan.hosts if h.slice_index == 0]
    assert worker.name == names.host_name(cluster.slice_name(0), 0) and worker.worker == 0
    sim.wait_for(lambda states: all(s == names.STATE_JOINED for s in states.values()), timeout=600)
    [active] = slices()
    assert active["state"] == "READY" and active["request"]["state"] == "ACTIVE"
    assert (active["request"]["hosts_asked"], active["request"]["hosts_joined"]) == (1, 1)
