"""The simulator's pure parts: naming and addressing hosts, the state file, the root check and
the status layout. Nothing here needs root or creates a namespace."""

from __future__ import annotations

import ipaddress
import random

import pytest

from rayslice import cli, spec
from rayslice.local import simulator
from rayslice.local.netns import CANDIDATE_SPACE, free_subnet
from rayslice.local.processes import ProcessRef
from rayslice.local.state import (
    ROLE_HEAD,
    ROLE_HEAD_VM,
    ROLE_WORKER,
    SimulationState,
    make_plan,
    subnet_prefix,
)
from rayslice.local.status import format_report

NET = ipaddress.IPv4Network("100.64.9.0/24")


def _plan(raw=None, run_id="a1b2c3"):
    return make_plan(spec.load(raw or {}, require_zone=False), run_id=run_id, network=NET)


def test_default_plan_is_one_v6e16_slice_with_head_on_worker_0():
    plan = _plan()
    assert [h.name for h in plan.hosts] == [f"rayslice-slice-0-w-{i}" for i in range(4)]
    assert [h.role for h in plan.hosts] == [ROLE_HEAD, ROLE_WORKER, ROLE_WORKER, ROLE_WORKER]
    assert plan.head.ip == "100.64.9.2" and plan.gateway == "100.64.9.1"
    assert plan.slice_ips(0) == ["100.64.9.2", "100.64.9.3", "100.64.9.4", "100.64.9.5"]
    assert plan.root == "/run/rayslice-local/a1b2c3"


def test_multislice_plan_puts_the_head_vm_first():
    plan = _plan({"slices": 2, "acceleratorType": "v6e-16"})
    assert plan.hosts[0].role == ROLE_HEAD_VM and plan.hosts[0].slice_index == -1
    assert plan.head is plan.hosts[0]
    assert [h.role for h in plan.hosts[1:]] == [ROLE_WORKER] * 8
    assert plan.slice_ips(1) == [f"100.64.9.{i}" for i in range(7, 11)]


def test_names_are_unique_per_run_and_fit_linux_interface_names():
    plan, other = _plan({"slices": 4, "acceleratorType": "v6e-64"}), _plan(run_id="ffffff")
    interfaces = [plan.bridge] + [n for h in plan.hosts for n in (h.veth, h.veth_peer)]
    assert all(len(n) <= 15 for n in interfaces)
    assert len(set(interfaces)) == len(interfaces)
    assert not {h.netns for h in plan.hosts} & {h.netns for h in other.hosts}
    assert plan.bridge != other.bridge


def test_subnet_sizes_and_choice_avoid_used_networks():
    assert subnet_prefix(4) == 24 and subnet_prefix(253) == 24 and subnet_prefix(300) == 23
    used = [ipaddress.IPv4Network("100.64.0.0/11")]  # half the candidate space taken
    for seed in range(20):
        net = free_subnet(24, used, random.Random(seed))
        assert net.subnet_of(CANDIDATE_SPACE) and not net.overlaps(used[0])
    with pytest.raises(RuntimeError, match="no free"):
        free_subnet(24, [CANDIDATE_SPACE], random.Random(0))


def test_state_file_round_trip(tmp_path):
    state = SimulationState(
        plan=_plan({"head": "vm"}), state_dir=str(tmp_path), processes={"boot:x": ProcessRef(12, 345)}
    )
    state.save()
    assert SimulationState.load(tmp_path) == state
    assert SimulationState.load(tmp_path / "missing") is None


def test_without_root_the_cli_says_what_is_needed(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(simulator.os, "geteuid", lambda: 1000)
    assert cli.main(["local", "up", "--state-dir", str(tmp_path)]) == cli.EXIT_INVALID
    err = capsys.readouterr().err
    assert "needs root" in err and "CAP_NET_ADMIN" in err
    assert not (tmp_path / "state.json").exists()


def test_status_layout_shows_hosts_and_cluster_totals():
    report = {
        "run_id": "a1b2c3",
        "slices": 1,
        "accelerator_type": "v6e-16",
        "head": "slice",
        "network": str(NET),
        "dashboard": "http://100.64.9.2:8265",
        "hosts": [
            {
                "name": "rayslice-slice-0-w-0",
                "role": "head",
                "ip": "100.64.9.2",
                "running": True,
                "state": "joined",
            },
            {
                "name": "rayslice-slice-0-w-1",
                "role": "worker",
                "ip": "100.64.9.3",
                "running": False,
                "state": "failed: head 100.64.9.2:6379 not reachable after 5s",
            },
        ],
        "ray": {
            "nodes": [{"ip": "100.64.9.2", "resources": {"TPU": 4.0, "node:100.64.9.2": 1.0}}],
            "totals": {"TPU": 4.0, "TPU-v6e-16-head": 1.0},
        },
    }
    text = format_report(report)
    assert "rayslice-slice-0-w-1  worker  100.64.9.3  no   failed: head" in text
    assert "cluster: TPU 4, TPU-v6e-16-head 1" in text
    assert "node:" not in text
