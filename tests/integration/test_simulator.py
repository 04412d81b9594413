"""The simulator on real namespaces: first its plumbing with a tiny boot script (fast, no Ray),
then the real rendered startup script bringing up real Ray clusters through the CLI."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from rayslice import cli, spec
from rayslice.local import netns
from rayslice.local.processes import is_alive
from rayslice.local.simulator import Simulation

# Just enough of a boot script to observe a host from inside: it waits for metadata (which may
# answer 503 at first), publishes what it sees as guest attributes (a boot counter among them),
# then `joined`, and leaves a long-lived process behind, as the real script's supervisor does.
TINY_SCRIPT = r"""#!/bin/bash
set -euo pipefail
url=http://metadata.google.internal/computeMetadata/v1
md() { curl -sSf --max-time 2 -H 'Metadata-Flavor: Google' "$url/$1"; }
put() { curl -sSf -X PUT --data-binary "$2" -H 'Metadata-Flavor: Google' "$url/instance/guest-attributes/rayslice/$1"; }
until md instance/id >/dev/null 2>&1; do sleep 0.2; done
put boots $(( $(md instance/guest-attributes/rayslice/boots 2>/dev/null || echo 0) + 1 ))
put hostname "$(hostname)"
put home "$HOME"
put pid "$$"
put ip "$(md instance/network-interfaces/0/ip)"
put worker "$(md instance/attributes/agent-worker-number)"
put peer "$(getent hosts rayslice-slice-0-w-0 | cut -d' ' -f1)"
put outside "$(ip route get 192.0.2.1 >/dev/null 2>&1 && echo reachable || echo unreachable)"
put http_proxy "${http_proxy:-none}"
put state joined
setsid sleep 1000 </dev/null >/dev/null 2>&1 &
"""


def _joined(states: dict[str, str]) -> bool:
    return all(v == "joined" for v in states.values())


def test_hosts_are_isolated_machines_with_their_own_metadata(simulation_dir, monkeypatch):
    monkeypatch.setenv("http_proxy", "http://192.0.2.1:3128")  # must not leak into the hosts
    cluster = spec.load({}, require_zone=False)
    sim = Simulation.create(cluster, simulation_dir, script=TINY_SCRIPT, metadata_unavailable_for=2.0)
    sim.boot_all()
    sim.wait_for(_joined, timeout=60)

    for host in sim.plan.hosts:
        facts = sim.guest_attributes(host.name)
        assert facts["hostname"] == host.name
        assert facts["home"] == f"{sim.plan.root}/root"
        assert int(facts["pid"]) < 50, "the script runs in the host's own PID namespace"
        assert facts["ip"] == host.ip and facts["worker"] == str(host.worker)
        assert facts["peer"] == sim.plan.head.ip
        assert facts["outside"] == "unreachable"
        assert facts["http_proxy"] == "none"
        assert sim.script_exit(host.name) == 0
    assert " 503 " in sim.paths(sim.plan.hosts[0].name).metadata_log.read_text(), (
        "metadata answered 503 at first"
    )

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
        Simulation.create(spec.load({}, require_zone=False), simulation_dir, script="true\n")
    assert all(netns.netns_exists(name) for name in created)
    assert cli.main(["local", "down", "--state-dir", str(simulation_dir)]) == 0
    assert not any(netns.netns_exists(name) for name in created)
    assert not simulation_dir.exists()


# ---- the real startup script, through the CLI ---------------------------------------------------


def _status(state_dir, capsys) -> dict:
    capsys.readouterr()
    assert cli.main(["local", "status", "--json", "--state-dir", str(state_dir)]) == 0
    return json.loads(capsys.readouterr().out)


def test_up_status_down_v6e16(simulation_dir, capsys):
    assert cli.main(["local", "up", "--state-dir", str(simulation_dir), "--timeout", "240"]) == 0
    out = capsys.readouterr().out
    assert "waiting-for-head" in out and "all hosts joined" in out

    report = _status(simulation_dir, capsys)
    assert [h["state"] for h in report["hosts"]] == ["joined"] * 4
    assert [h["role"] for h in report["hosts"]] == ["head", "worker", "worker", "worker"]
    nodes = report["ray"]["nodes"]
    assert len(nodes) == 4
    assert report["ray"]["totals"]["TPU"] == 16 and report["ray"]["totals"]["TPU-v6e-16-head"] == 1
    by_ip = {n["ip"]: n for n in nodes}
    for host in report["hosts"]:  # Ray's own TPU detection read each host's metadata server
        node = by_ip[host["ip"]]
        assert node["resources"]["TPU"] == 4 and node["resources"]["rayslice-slice-0"] == 1
        assert node["labels"]["ray.io/tpu-worker-id"] == str(host["worker"])
        assert ("TPU-v6e-16-head" in node["resources"]) == (host["worker"] == 0)

    with pytest.raises(urllib.error.HTTPError) as denied:  # rayAuth=token: no token, no answer
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        opener.open(f"{report['dashboard']}/api/v0/nodes", timeout=5)
    assert denied.value.code in (401, 403)

    sim = Simulation.open(simulation_dir)
    refs = list(sim.state.processes.values())
    assert cli.main(["local", "down", "--state-dir", str(simulation_dir)]) == 0
    assert not any(is_alive(ref) for ref in refs)
    assert not any(netns.netns_exists(h.netns) for h in sim.plan.hosts)
    assert not simulation_dir.exists()


def test_multislice_with_a_head_vm(simulation_dir, capsys):
    args = ["--set", "acceleratorType=v6e-4", "--set", "slices=2", "--set", "rayAuth=none"]
    assert cli.main(["local", "up", "--state-dir", str(simulation_dir), "--timeout", "240", *args]) == 0
    report = _status(simulation_dir, capsys)
    head, *tpu_hosts = report["hosts"]
    assert head["role"] == "head-vm" and [h["slice"] for h in tpu_hosts] == [0, 1]
    by_ip = {n["ip"]: n["resources"] for n in report["ray"]["nodes"]}
    assert "TPU" not in by_ip[head["ip"]]
    for host in tpu_hosts:
        resources = by_ip[host["ip"]]
        assert resources["TPU"] == 4 and resources["TPU-v6e-4-head"] == 1
        assert resources[f"rayslice-slice-{host['slice']}"] == 1


def _wait(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.2)
