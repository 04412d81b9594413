"""`rayslice status` on GKE: each slice's node pool through the emulated container v1 API and its
nodes through the pool's MIG, in every phase, and the kubectl command for the Ray pods."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rayslice import cli, names
from rayslice.cloud.capacity import CapacityExhausted
from rayslice.local.google.cloud_api.emulator import CloudApiEmulator
from rayslice.recovery.commands import node_pool_phase, render_text
from tests.recovery.conftest import CLUSTER, GKE_MACHINE, PROJECT, ZONE, gke_pool

SLICE0 = names.slice_name(CLUSTER, 0)
WHERE = ["--set", f"project={PROJECT}", "--set", f"zone={ZONE}", "--set", "platform=gke"]
FLEX = ["status", *WHERE, "--set", "capacity=flex-start", "--set", "maxRunHours=24"]


def _status(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert cli.main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_flex_start_pool_waits_in_an_empty_zone_then_runs_with_every_node(
    cloud: CloudApiEmulator, adc: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cloud.state.set_capacity(ZONE, GKE_MACHINE, 0)
    cloud.state.create_node_pool(PROJECT, ZONE, CLUSTER, gke_pool(SLICE0, flex=True))
    [item] = _status(FLEX, capsys)["slices"]
    assert (item["state"], item["phase"], item["nodes_running"], item["hosts_asked"]) == (
        "RUNNING",
        "waiting",
        0,
        4,
    )
    assert item["run_hours"] == 24 and item["flex_start"] and item["reason"] is None
    assert item["since"].endswith("Z")
    assert cli.main(FLEX) == 0
    text = capsys.readouterr().out
    assert f"slice {SLICE0}: node pool RUNNING, waiting for capacity" in text
    assert "0 of 4 nodes running, nodes run at most 24 h" in text
    assert f"kubectl get pods --namespace rayslice-{CLUSTER} --selector ray.io/cluster={CLUSTER}" in text

    cloud.state.set_capacity(ZONE, GKE_MACHINE, 3)  # not enough: a flex-start pool comes whole
    assert _status(FLEX, capsys)["slices"][0]["phase"] == "waiting"
    cloud.state.set_capacity(ZONE, GKE_MACHINE, 4)
    data = _status(FLEX, capsys)
    [item] = data["slices"]
    assert (item["phase"], item["nodes_running"]) == ("running", 4)
    assert [h["instance"] for h in item["hosts"]] == ["RUNNING"] * 4
    assert data["ray_pods"]["visible"] is False and data["head"] is None
    assert cloud.mutations() == []  # status only reads


def test_a_waiting_pool_that_reads_provisioning_is_waiting_too(
    cloud: CloudApiEmulator, adc: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No source says which status GKE gives an empty flex-start pool: both read as waiting."""
    cloud.state.set_capacity(ZONE, GKE_MACHINE, 0)
    pool = cloud.state.create_node_pool(PROJECT, ZONE, CLUSTER, gke_pool(SLICE0, flex=True))
    pool["status"] = "PROVISIONING"
    [item] = _status(FLEX, capsys)["slices"]
    assert (item["state"], item["phase"]) == ("PROVISIONING", "waiting")


def test_a_fixed_pool_in_an_empty_zone_fails_with_gce_stockout(
    cloud: CloudApiEmulator, adc: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cloud.state.set_capacity(ZONE, GKE_MACHINE, 0)
    with pytest.raises(CapacityExhausted):
        cloud.state.create_node_pool(PROJECT, ZONE, CLUSTER, gke_pool(SLICE0, flex=False))
    [item] = _status(["status", *WHERE], capsys)["slices"]
    assert (item["state"], item["phase"], item["nodes_running"]) == ("ERROR", "failed", 0)
    assert item["reason"].startswith("GCE_STOCKOUT: Google Compute Engine: Not all instances running in IGM")
    assert "does not have enough resources available" in item["reason"]
    assert cli.main(["status", *WHERE]) == 0
    assert "node pool ERROR, failed: GCE_STOCKOUT" in capsys.readouterr().out


def test_a_missing_pool_and_a_pool_being_deleted(
    cloud: CloudApiEmulator, adc: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["status", *WHERE, "--set", "slices=2"]
    pool = cloud.state.create_node_pool(PROJECT, ZONE, CLUSTER, gke_pool(SLICE0, flex=False))
    pool["status"] = "STOPPING"
    first, second = _status(args, capsys)["slices"]
    assert (first["phase"], second["phase"], second["state"]) == ("deleting", "missing", "MISSING")
    assert cli.main(args) == 0
    text = capsys.readouterr().out
    assert (
        "node pool STOPPING, being deleted" in text
        and f"{names.slice_name(CLUSTER, 1)}: node pool MISSING" in text
    )


def test_deleting_a_pool_gives_its_nodes_back_and_withdraws_its_wait(cloud: CloudApiEmulator) -> None:
    twin = cloud.state
    twin.set_capacity(ZONE, GKE_MACHINE, 4)
    twin.create_node_pool(PROJECT, ZONE, CLUSTER, gke_pool(SLICE0, flex=True))
    waiting = names.slice_name(CLUSTER, 1)
    twin.create_node_pool(PROJECT, ZONE, CLUSTER, gke_pool(waiting, flex=True))  # no room left: waits
    assert twin.capacity.free[(ZONE, GKE_MACHINE)] == 0 and len(twin.capacity.waiting()) == 1
    twin.delete_node_pool(PROJECT, ZONE, CLUSTER, waiting)
    assert twin.capacity.waiting() == [] and twin.capacity.free[(ZONE, GKE_MACHINE)] == 0
    twin.delete_node_pool(PROJECT, ZONE, CLUSTER, SLICE0)
    assert twin.capacity.free[(ZONE, GKE_MACHINE)] == 4 and twin.node_pools == {}
    assert not [h for h in twin.hosts() if h.group]


UP, STOPPED = "RUNNING", "TERMINATED"


@pytest.mark.parametrize(
    "status,flex,nodes,phase",
    [
        ("RUNNING", True, [], "waiting"),
        ("PROVISIONING", True, [], "waiting"),
        ("PROVISIONING", False, [], "provisioning"),
        ("RUNNING", True, [UP, UP], "provisioning"),
        ("RUNNING", False, [UP] * 4, "running"),
        ("RUNNING_WITH_ERROR", False, [UP] * 4, "running"),
        ("RUNNING", True, [STOPPED] * 4, "down"),  # was "waiting": a slice GKE shut down
        ("RUNNING", False, [STOPPED] * 4, "down"),
        ("RUNNING", False, [STOPPED, "STAGING", STOPPED, STOPPED], "provisioning"),
        ("ERROR", False, [], "failed"),
        ("STOPPING", True, [UP] * 4, "deleting"),
    ],
)
def test_each_phase(status: str, flex: bool, nodes: list[str], phase: str) -> None:
    assert node_pool_phase({"status": status, "config": {"flexStart": flex}}, nodes, 4) == phase


def test_a_token_without_the_clusters_permission_is_refused_as_by_google(
    cloud: CloudApiEmulator, adc: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """nodePools.get needs container.clusters.get: a caller bound to Compute Engine reads only
    gets 403, and status exits 3 with one line naming the call."""
    cloud.state.create_node_pool(PROJECT, ZONE, CLUSTER, gke_pool(SLICE0, flex=False))
    original = cloud.authorize

    def bound(token: str, method_id: str | None, body: Any, params: Any = None) -> None:
        cloud.bind(token, ["compute.instanceGroupManagers.get"])
        original(token, method_id, body, params)

    monkeypatch.setattr(cloud, "authorize", bound)
    assert cli.main(["status", *WHERE]) == 3
    assert "container.clusters.get" in capsys.readouterr().err


def test_the_text_for_a_cluster_with_two_pools_says_each_phase() -> None:
    pool = {
        "name": SLICE0,
        "state": "RUNNING",
        "phase": "provisioning",
        "nodes_running": 2,
        "hosts_asked": 4,
        "since": "2026-12-04T08:00:00Z",
        "run_hours": None,
        "flex_start": False,
        "auto_repair": True,
        "reason": None,
        "hosts": [{"worker": 0, "name": "gke-n-0", "instance": "RUNNING"}],
    }
    stopped = {
        **pool,
        "name": names.slice_name(CLUSTER, 1),
        "phase": "down",
        "nodes_running": 0,
        "flex_start": True,
        "auto_repair": False,
        "hosts": [{"worker": 0, "name": "gke-f-0", "instance": "TERMINATED"}],
    }
    data = {
        "cluster": CLUSTER,
        "platform": "gke",
        "project": PROJECT,
        "zone": ZONE,
        "head": None,
        "controller": None,
        "slices": [pool, stopped],
        "events": [],
        "recovery": False,
        "ray_pods": {"visible": False, "why": "needs credentials", "command": "kubectl get pods"},
    }
    text = render_text(data)
    assert f"slice {SLICE0}: node pool RUNNING, provisioning nodes since 2026-12-04T08:00:00Z; 2 of 4" in text
    assert "  node 0 gke-n-0 [RUNNING]" in text and "recovery" not in text
    assert (
        f"slice {stopped['name']}: node pool RUNNING, down: every node stopped; auto-repair is off for this "
        "pool, so it stays down (flex-start: until its nodes' run ends)"
    ) in text
