"""The simulator's pure parts: naming and addressing hosts, the state file, the root check and
the status layout. Nothing here needs root or creates a namespace."""

from __future__ import annotations

import dataclasses
import ipaddress
import random
from pathlib import Path

import pytest

from rayslice import cli, spec
from rayslice.errors import EXIT_INVALID, SimulatorError
from rayslice.local.host.netns import CANDIDATE_SPACE, free_subnet
from rayslice.local.host.paths import HostPaths
from rayslice.local.host.processes import ProcessRef
from rayslice.local.simulation import simulator, status
from rayslice.local.simulation.state import (
    ROLE_CONTROLLER_VM,
    ROLE_HEAD,
    ROLE_HEAD_VM,
    ROLE_WORKER,
    HostRecord,
    SimulationState,
    check_state,
    extend_plan,
    make_plan,
    spec_hosts,
    subnet_prefix,
)
from rayslice.names import ATTR_SLICE_HOSTS
from rayslice.startup_scripts import host_attributes

NET = ipaddress.IPv4Network("100.64.9.0/24")


def _plan(raw=None, run_id="a1b2c3"):
    return make_plan(spec.load(raw or {}, require_zone=False), run_id=run_id, network=NET)


def test_the_shared_folder_is_the_runs_own_beside_the_hosts_root_and_outside_the_state_dir(tmp_path):
    """Hosts see the machine read-only but for this folder, where multi-host jobs keep checkpoints
    (tests/integration/test_recovery.py writes there from every host)."""
    one, other = _plan(run_id="a1b2c3"), _plan(run_id="d4e5f6")
    assert one.shared_dir == "/run/rayslice-local/a1b2c3-shared" != other.shared_dir
    assert not Path(one.shared_dir).is_relative_to(one.root)  # not below a host's private root


def test_tpu_vm_plan_is_one_v6e16_slice_with_head_on_worker_0():
    plan = _plan({"platform": "tpu-vm", "acceleratorType": "v6e-16"})
    assert [h.name for h in plan.hosts] == [f"rayslice-slice-0-w{i}" for i in range(4)]
    assert [h.role for h in plan.hosts] == [ROLE_HEAD, ROLE_WORKER, ROLE_WORKER, ROLE_WORKER]
    assert plan.head.ip == "100.64.9.2" and plan.gateway == "100.64.9.1"
    assert plan.slice_ips(0) == ["100.64.9.2", "100.64.9.3", "100.64.9.4", "100.64.9.5"]
    assert plan.root == "/run/rayslice-local/a1b2c3"


def test_compute_hosts_carry_the_instance_names_infra_lists_for_the_slice():
    """Each compute host's name is its MIG instance's: the list in its metadata finds its worker number."""
    cluster = spec.load({"platform": "compute", "acceleratorType": "v6e-16", "slices": 2}, require_zone=False)
    plan = make_plan(cluster, run_id="a1b2c3", network=NET)
    assert plan.hosts[0].name == "rayslice-head"
    for index in range(2):
        listed = host_attributes(cluster, index)[ATTR_SLICE_HOSTS].split(",")
        workers = sorted((h for h in plan.hosts if h.slice_index == index), key=lambda h: h.worker)
        assert [h.name for h in workers] == listed
        assert listed == [f"rayslice-slice-{index}-w{w}" for w in range(4)]


def test_multislice_plan_puts_the_head_vm_first():
    plan = _plan({"slices": 2, "acceleratorType": "v6e-16", "platform": "tpu-vm"})
    assert plan.hosts[0].role == ROLE_HEAD_VM and plan.hosts[0].slice_index == -1
    assert plan.head is plan.hosts[0]
    assert [h.role for h in plan.hosts[1:]] == [ROLE_WORKER] * 8
    # .1 the bridge, .2 the controller's VM, .3 the head VM, .4 to .7 slice 0
    assert plan.slice_ips(1) == [f"100.64.9.{i}" for i in range(8, 12)]


def test_a_recovering_cluster_gets_the_controller_vm_as_a_machine_apart_from_the_ray_hosts():
    plan = _plan({"slices": 2, "acceleratorType": "v6e-16", "capacity": "spot"})
    assert plan.controller is not None and plan.controller.role == ROLE_CONTROLLER_VM
    assert plan.controller.name == "rayslice-controller" and plan.controller not in plan.hosts
    assert (
        plan.machines == (plan.controller, *plan.hosts)
        and plan.host("rayslice-controller") is plan.controller
    )
    assert len({h.ip for h in plan.machines}) == len(plan.machines) == 10
    check_state(SimulationState(plan=plan, state_dir="/x"))
    off = _plan({"slices": 2, "acceleratorType": "v6e-16", "capacity": "spot", "recovery": False})
    assert off.controller is None and off.machines == off.hosts
    # A controller role among the Ray hosts is not what make_plan writes: refused.
    swapped = dataclasses.replace(plan, hosts=(*plan.hosts[:-1], plan.controller), controller=plan.hosts[-1])
    with pytest.raises(SimulatorError, match="in its place"):
        check_state(SimulationState(plan=swapped, state_dir="/x"))


@pytest.mark.parametrize("platform", ["tpu-vm", "compute"])
def test_names_are_unique_per_run_and_fit_linux_interface_names(platform):
    plan = _plan({"slices": 4, "acceleratorType": "v6e-64", "platform": platform})
    other = _plan({"platform": platform}, run_id="ffffff")
    interfaces = [plan.bridge] + [n for h in plan.hosts for n in (h.veth, h.veth_peer)]
    assert all(len(n) <= 15 for n in interfaces)
    assert len(set(interfaces)) == len(interfaces)
    assert not {h.netns for h in plan.hosts} & {h.netns for h in other.hosts}
    assert plan.bridge != other.bridge
    check_state(SimulationState(plan=plan, state_dir="/x"))  # what make_plan names passes its own check


def test_subnet_sizes_and_choice_avoid_used_networks():
    assert subnet_prefix(4) == 24 and subnet_prefix(253) == 24 and subnet_prefix(300) == 23
    used = [ipaddress.IPv4Network("100.64.0.0/11")]  # half the candidate space taken
    for seed in range(20):
        net = free_subnet(24, used, random.Random(seed))
        assert net.subnet_of(CANDIDATE_SPACE) and not net.overlaps(used[0])
    with pytest.raises(SimulatorError, match="no free"):
        free_subnet(24, [CANDIDATE_SPACE], random.Random(0))


def test_state_file_round_trip(tmp_path):
    plan = _plan({"head": "vm", "platform": "tpu-vm"})
    state = SimulationState(
        plan=plan,
        state_dir=str(tmp_path),
        processes={f"boot:{plan.hosts[1].name}": ProcessRef(12, 345)},
        shared_paths=("/opt/venv",),
        firewall="nft",
    )
    state.save()
    assert SimulationState.load(tmp_path) == state
    assert SimulationState.load(tmp_path / "missing") is None


def test_without_root_the_cli_says_what_is_needed(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(simulator.os, "geteuid", lambda: 1000)
    assert cli.main(["local", "up", "--state-dir", str(tmp_path)]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert "needs root" in err and "CAP_NET_ADMIN" in err
    assert not (tmp_path / "state.json").exists()


def test_the_simulator_refuses_a_platform_that_is_not_a_vm_platform(tmp_path):
    cluster = spec.load({"platform": "gke", "acceleratorType": "v6e-16"}, require_zone=False)
    with pytest.raises(SimulatorError, match=r"simulates the VM platforms .*not gke"):
        simulator.Simulation.create(cluster, tmp_path / "sim")
    assert not (tmp_path / "sim").exists()


HOSTS = [
    {"name": "rayslice-slice-0-w0", "role": "head", "ip": "100.64.9.2", "running": True, "state": "joined"},
    {
        "name": "rayslice-slice-0-w1",
        "role": "worker",
        "ip": "100.64.9.3",
        "running": True,
        "state": "failed: head 100.64.9.2:6379 not reachable after 5s",
    },
]


def _node(node_id: str, ip: str, start: int, **resources: float) -> dict:
    return {
        "id": node_id,
        "ip": ip,
        "head": False,
        "resources": resources,
        "labels": {},
        "start_time_ms": start,
    }


# `rayslice status --json`'s data for a slice the controller recreated once (`cloud_report`).
CLOUD = {
    "cluster": "rayslice",
    "platform": "compute",
    "project": "rayslice-local",
    "zone": "us-central1-b",
    "head": {"name": "rayslice-head", "boot": "joined"},
    "controller": {"name": "rayslice-controller", "boot": "watching"},
    "slices": [
        {
            "name": "rayslice-slice-0",
            "state": "READY",
            "hosts": [{"worker": 0, "name": "rayslice-slice-0-w0", "instance": "RUNNING", "boot": "joined"}],
        }
    ],
    "events": [
        {
            "time": "2026-01-01T00:00:00Z",
            "slice": "rayslice-slice-0",
            "seen": "MIG rayslice-slice-0: worker 0 STOPPED",
            "action": "recreate",
            "outcome": "recreated",
        }
    ],
    "recovery": True,
}


def _report(nodes: list[dict], hosts: list[dict] = HOSTS, cloud: dict = CLOUD) -> dict:
    """A status report as `status_report` builds it, from hosts and the dashboard's alive nodes."""
    hosts = [dict(h) for h in hosts]
    marked = status.mark_nodes(hosts, nodes)
    for h in hosts:
        h["ray_nodes"] = [{"id": n["id"], "status": n["status"]} for n in marked if n["host"] == h["name"]]
    totals: dict[str, float] = {}
    for n in marked:
        if n["status"] == status.CURRENT:
            for k, v in n["resources"].items():
                totals[k] = totals.get(k, 0) + v
    return {
        "run_id": "a1b2c3",
        "slices": 1,
        "accelerator_type": "v6e-16",
        "head": "slice",
        "network": str(NET),
        "dashboard": "http://100.64.9.2:8265",
        "hosts": hosts,
        "ray": {"nodes": marked, "totals": totals},
        "cloud": cloud,
    }


def test_status_layout_shows_hosts_their_nodes_and_cluster_totals():
    text = status.format_report(
        _report(
            [
                _node(
                    "aaaaaaaa11", "100.64.9.2", 1, TPU=4.0, **{"node:100.64.9.2": 1.0, "TPU-v6e-16-head": 1.0}
                )
            ]
        )
    )
    assert "rayslice-slice-0-w1  worker  100.64.9.3  yes  failed: head" in text
    assert "rayslice-slice-0-w0  head    100.64.9.2  yes  joined" in text and "aaaaaaaa current" in text
    assert "Ray: 1 of 2 host(s) have a current node" in text and "stale" not in text
    assert "cluster: TPU 4, TPU-v6e-16-head 1" in text
    assert "node:" not in text


def test_status_layout_shows_the_clouds_slices_and_the_recovery_events():
    """After a preemption `local status` shows what `rayslice status` shows: the slice's state in
    the cloud, its hosts' instance states and the controller's recreation."""
    text = status.format_report(_report([]))
    assert "slice rayslice-slice-0: READY" in text
    assert "worker 0 rayslice-slice-0-w0 [RUNNING]: joined" in text
    assert "rayslice-slice-0: saw MIG rayslice-slice-0: worker 0 STOPPED; recreate -> recreated" in text
    text = status.format_report(_report([], cloud={"error": "no cloud API emulation runs for X"}))
    assert "cloud API: no cloud API emulation runs for X" in text and "slice rayslice-slice-0" not in text


def test_a_rebooted_hosts_old_node_reads_as_stale_not_as_an_extra_node():
    old = _node("0ld0ld0ld0", "100.64.9.3", 1_000, TPU=4.0)
    new = _node("newnewnew0", "100.64.9.3", 2_000, TPU=4.0)
    head = _node("headhead00", "100.64.9.2", 500, TPU=4.0)
    for order in ([old, new, head], [new, head, old]):  # whatever order the dashboard lists them in
        report = _report(order)
        by_id = {n["id"]: n["status"] for n in report["ray"]["nodes"]}
        assert by_id == {"0ld0ld0ld0": "stale", "newnewnew0": "current", "headhead00": "current"}
        text = status.format_report(report)
        assert "Ray: 2 of 2 host(s) have a current node; 1 stale node(s)" in text
        assert "newnewne current, 1 stale" in text
        assert "cluster: TPU 8" in text  # the stale node's chips are not counted twice


def test_every_node_of_a_powered_off_host_is_stale():
    hosts = [HOSTS[0], {**HOSTS[1], "running": False}]
    report = _report([_node("w1", "100.64.9.3", 5, TPU=4.0), _node("h", "100.64.9.2", 1, TPU=4.0)], hosts)
    assert {n["id"]: n["status"] for n in report["ray"]["nodes"]} == {"w1": "stale", "h": "current"}


def _fake_simulation(state_dir):
    """The state file `local up` writes, for a one-host slice whose head (on loopback) refuses
    connections: status must still show the hosts."""
    plan = make_plan(
        spec.load({"acceleratorType": "v6e-4"}, require_zone=False),
        run_id="c0ffee",
        network=ipaddress.IPv4Network("127.77.0.0/24"),
    )
    state_dir.mkdir(mode=0o700)
    SimulationState(plan=plan, state_dir=str(state_dir)).save()
    return plan


def test_local_status_needs_no_root(monkeypatch, tmp_path, capsys):
    """Not root: `status` reads the state file and asks the dashboard, and nothing else.

    os.geteuid answers 1000 for every module, and the state dir is made read-only, so a status that
    tried to create, boot or write anything would fail here.
    """
    import json
    import os

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    state_dir = tmp_path / "sim"
    [host] = _fake_simulation(state_dir).hosts
    state_dir.chmod(0o500)
    try:
        assert cli.main(["local", "status", "--state-dir", str(state_dir), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert [h["name"] for h in report["hosts"]] == [host.name]
        assert report["hosts"][0]["running"] is False
        assert "head dashboard not reachable" in report["ray"]["error"]
        assert "no cloud API emulation runs" in report["cloud"]["error"]
        assert cli.main(["local", "status", "--state-dir", str(state_dir)]) == 0
        assert f"{host.name}  head" in capsys.readouterr().out
        assert cli.main(["local", "down", "--state-dir", str(state_dir)]) == EXIT_INVALID
        assert "needs root" in capsys.readouterr().err
    finally:
        state_dir.chmod(0o700)


def test_run_finds_the_simulation_in_the_default_state_dir(monkeypatch, tmp_path):
    """`rayslice run` finds the simulation through the `rayslice.clusters` entry point, `default_cluster`."""
    from rayslice.jobs import connection
    from rayslice.local.commands import default_cluster
    from rayslice.local.simulation.state import STATE_DIR_ENV

    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path / "none"))
    assert default_cluster() is None and connection.simulated_cluster() is None
    state_dir = tmp_path / "sim"
    _fake_simulation(state_dir)
    monkeypatch.setenv(STATE_DIR_ENV, str(state_dir))
    assert connection.simulated_cluster() == ("http://127.77.0.2:8265", None)
    (state_dir / "ray-token").write_text("t")
    assert connection.simulated_cluster() == ("http://127.77.0.2:8265", state_dir / "ray-token")
    found = default_cluster()  # what `rayslice status` reads: the spec, with the emulation's project
    assert found is not None and found.config["acceleratorType"] == "v6e-4"
    assert found.config["project"] == "rayslice-local"
    assert found.cloud is None and "no cloud API emulation runs" in found.cloud_problem


def test_restart_head_prints_one_line_per_host_and_keeps_rays_output_in_the_hosts_log(
    monkeypatch, tmp_path, capsys
):
    """Ray's kill log (long lines, escape codes) goes to the head's log, not to the terminal."""
    import subprocess

    from rayslice.local import commands

    plan = make_plan(
        spec.load({"acceleratorType": "v6e-16"}, require_zone=False), run_id="c0ffee", network=NET
    )
    noisy = "\x1b[33mStopped all 17 Ray processes.\x1b[0m " + "x" * 5000 + "\n" * 20

    class FakeSimulation:
        def __init__(self) -> None:
            self.plan = plan

        def restart_head_ray(self):
            return subprocess.CompletedProcess(["ray", "stop"], 0, noisy, "")

        def paths(self, name):
            return HostPaths.of(tmp_path, name)

    for host in plan.hosts:
        HostPaths.of(tmp_path, host.name).dir.mkdir(parents=True)
    monkeypatch.setattr(commands, "require_root", lambda: None)
    monkeypatch.setattr(commands.Simulation, "open", classmethod(lambda cls, d: FakeSimulation()))
    assert cli.main(["local", "restart-head", "--state-dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [h.name for h in plan.hosts]
    assert "Ray stopped" in lines[0] and all(len(line) < 200 and "\x1b" not in line for line in lines)
    log = HostPaths.of(tmp_path, plan.head.name).dir / "restart-head.log"
    assert noisy in log.read_text()


def test_status_on_a_state_dir_it_cannot_read_says_whose_it_is(monkeypatch, tmp_path, capsys):
    from rayslice.local import commands

    def unreadable(cls, state_dir):
        raise PermissionError(13, "Permission denied", str(state_dir / "state.json"))

    monkeypatch.setattr(commands.Simulation, "open", classmethod(unreadable))
    assert cli.main(["local", "status", "--state-dir", str(tmp_path)]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert f"cannot read {tmp_path / 'state.json'}" in err and "Traceback" not in err


@pytest.mark.parametrize(("flags", "insecure"), [([], False), (["--insecure"], True)])
def test_local_up_hands_insecure_to_the_simulation_only_when_asked(
    monkeypatch, capsys, tmp_path, flags, insecure
):
    seen = {}

    def create(spec, state_dir, **kwargs):
        seen.update(kwargs)
        raise SimulatorError("stop before creating anything")

    monkeypatch.setattr(simulator.os, "geteuid", lambda: 0)
    monkeypatch.setattr(simulator.Simulation, "create", create)
    assert cli.main(["local", "up", "--state-dir", str(tmp_path), *flags]) == EXIT_INVALID
    assert seen["insecure"] is insecure
    assert "stop before creating anything" in capsys.readouterr().err


def test_rayauth_none_without_insecure_is_refused_and_names_the_flag():
    cluster = spec.load({"acceleratorType": "v6e-4", "rayAuth": "none"}, require_zone=False)
    with pytest.raises(SimulatorError, match="--insecure"):
        simulator._auth_spec(cluster, insecure=False)
    assert simulator._auth_spec(cluster, insecure=True).ray_auth == "none"


def test_a_plan_from_host_records_keeps_their_names_and_addresses_and_places_them_by_slice():
    """What the cloud holds decides the hosts (the seam for the cloud twin): twice the topology's
    hosts give twice the simulated hosts, named and addressed as recorded, in slice/worker order."""
    cluster = spec.load({"acceleratorType": "v6e-16", "platform": "compute", "slices": 2}, require_zone=False)
    assert cluster.tpu.hosts == 4
    s0, s1 = cluster.slice_name(0), cluster.slice_name(1)
    records = [
        *(HostRecord(f"{s1}-{w:04x}", s1, w, f"100.64.9.{40 + w}") for w in range(8)),
        *(HostRecord(f"{s0}-{w:04x}", s0, w) for w in reversed(range(8))),
        HostRecord("rayslice-head", None, 0, "100.64.9.9", {"rayslice-role": "head-vm"}, role=ROLE_HEAD_VM),
    ]
    plan = make_plan(cluster, run_id="a1b2c3", network=NET, hosts=records)
    assert len(plan.hosts) == 2 * cluster.total_hosts + 1
    assert [(h.name, h.role, h.slice_index, h.worker) for h in plan.hosts[:2]] == [
        ("rayslice-head", ROLE_HEAD_VM, -1, -1),
        (f"{s0}-0000", ROLE_WORKER, 0, 0),
    ]
    assert plan.head.ip == "100.64.9.9"
    assert plan.slice_ips(1) == [f"100.64.9.{40 + w}" for w in range(8)]
    assert plan.slice_ips(0) == [f"100.64.9.{i}" for i in (2, 3, 4, 5, 6, 7, 8, 10)]  # .9 is the head's
    check_state(SimulationState(plan=plan, state_dir="/x"))  # what `down` accepts


@pytest.mark.parametrize(
    "record, message",
    [
        (HostRecord("stray-vm", None, 0), "neither a lone VM the spec has"),
        (HostRecord("stray-vm", None, 0, role="database"), "neither a lone VM the spec has"),
        # head=slice: a head VM the program declared would be a second head
        (HostRecord("rayslice-head", None, 0, role=ROLE_HEAD_VM), r"neither a lone VM the spec has \(none\)"),
        (HostRecord("other-slice-0-w0", "other-slice-0", 0), "nor a worker of one of its slices"),
        (HostRecord("rayslice-slice-0-w9", "rayslice-slice-0", 9, "100.64.9.1"), "its gateway"),
        (HostRecord("rayslice-slice-0-w9", "rayslice-slice-0", 9, "10.0.0.2"), "outside 100.64.9.0/24"),
        (HostRecord("rayslice-slice-0-w9", "rayslice-slice-0", 9, "100.64.9.3"), "taken twice"),
    ],
)
def test_a_plan_refuses_host_records_it_cannot_place(record, message):
    cluster = spec.load({"acceleratorType": "v6e-4"}, require_zone=False)
    records = [HostRecord("rayslice-slice-0-w0", "rayslice-slice-0", 0, "100.64.9.3"), record]
    with pytest.raises(SimulatorError, match=message):
        make_plan(cluster, run_id="a1b2c3", network=NET, hosts=records)


def test_a_lone_vm_is_placed_by_the_role_the_program_labels_it_with_not_by_its_name():
    """The head VM (and any lone VM of `LONE_VM_ROLES`) is recognised by its role label, so a lone
    VM the program names differently still finds its place; head=vm without one is refused."""
    cluster = spec.load({"acceleratorType": "v6e-4", "head": "vm"}, require_zone=False)
    worker = HostRecord("rayslice-slice-0-w0", "rayslice-slice-0", 0)
    plan = make_plan(
        cluster,
        run_id="a1b2c3",
        network=NET,
        hosts=[worker, HostRecord("some-vm", None, 0, role=ROLE_HEAD_VM)],
    )
    assert [(h.name, h.role, h.slice_index) for h in plan.hosts] == [
        ("some-vm", ROLE_HEAD_VM, -1),
        ("rayslice-slice-0-w0", ROLE_WORKER, 0),
    ]
    assert plan.head.name == "some-vm" and plan.controller is None  # the records hold no controller VM
    with pytest.raises(SimulatorError, match="exactly one head VM"):
        make_plan(cluster, run_id="a1b2c3", network=NET, hosts=[worker])
    spot = spec.load({"acceleratorType": "v6e-4", "head": "vm", "capacity": "spot"}, require_zone=False)
    assert spot.runs_recovery
    records = [worker, HostRecord("some-vm", None, 0, role=ROLE_HEAD_VM)]
    plan = make_plan(
        spot,
        run_id="a1b2c3",
        network=NET,
        hosts=[*records, HostRecord("watcher", None, 0, role=ROLE_CONTROLLER_VM)],
    )
    assert plan.controller is not None and (plan.controller.name, plan.controller.role) == (
        "watcher",
        ROLE_CONTROLLER_VM,
    )
    assert "watcher" not in [h.name for h in plan.hosts]  # a machine, not a Ray host
    no_recovery = spec.load({"acceleratorType": "v6e-4", "head": "vm", "recovery": False}, require_zone=False)
    with pytest.raises(SimulatorError, match="neither a lone VM"):  # without recovery it is a stray
        make_plan(
            no_recovery,
            run_id="a1b2c3",
            network=NET,
            hosts=[*records, HostRecord("w", None, 0, role=ROLE_CONTROLLER_VM)],
        )


def test_a_plan_saved_before_the_twins_hosts_are_known_is_a_valid_state_without_a_head():
    """`create` saves the plan with no hosts before the emulation deploys: `down` accepts it, and
    whatever needs the head says the simulation is still being created."""
    plan = make_plan(spec.load({}, require_zone=False), run_id="a1b2c3", network=NET, hosts=())
    assert plan.hosts == () and plan.controller is None and plan.admitted == []
    check_state(SimulationState(plan=plan, state_dir="/x"))
    with pytest.raises(SimulatorError, match="no hosts yet"):
        assert plan.head


def test_hosts_the_cloud_creates_later_are_appended_without_renaming_any_other():
    flex = spec.load({"acceleratorType": "v6e-16", "capacity": "flex-start"}, require_zone=False)
    lone = [r for r in spec_hosts(flex) if r.group is None]  # the slice's request still waits
    plan = make_plan(flex, run_id="a1b2c3", network=NET, hosts=lone)
    assert [h.role for h in plan.machines] == [ROLE_CONTROLLER_VM, ROLE_HEAD_VM]
    free = [str(a) for a in plan.ip_network.hosts()][5:9]
    records = [HostRecord(f"rayslice-slice-0-a{w}b", "rayslice-slice-0", w, ip) for w, ip in enumerate(free)]
    grown = extend_plan(plan, flex, records)
    assert grown.machines[:2] == plan.machines  # the same names, namespaces and veths
    assert [(h.name, h.role, h.slice_index, h.worker) for h in grown.hosts[1:]] == [
        (r.name, "worker", 0, r.worker) for r in records
    ]
    check_state(SimulationState(plan=grown, state_dir="/x"))
    for bad in (
        [dataclasses.replace(records[0], group="other-slice-0")],  # not a slice of this spec
        [dataclasses.replace(records[0], name=plan.hosts[0].name)],  # a name taken
        [dataclasses.replace(records[0], ip=plan.gateway)],  # the bridge's address
        [dataclasses.replace(records[0], ip="192.0.2.9")],  # outside the network
    ):
        with pytest.raises(SimulatorError, match="cannot add hosts"):
            extend_plan(plan, flex, bad)
