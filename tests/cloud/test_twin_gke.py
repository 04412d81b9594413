"""GKE node pools in the twin, applied from what the program declares: a flex-start pool waits in
an empty zone and gets all its nodes at once, a fixed pool in an empty zone ends in ERROR with
GKE's stockout condition, and the rules on flex-start pools refuse what breaks them; what GKE does
to a pool's nodes on a failure (the whole slice down, auto-repair where the pool has it) and at
the end of a flex-start run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rayslice import catalog
from rayslice.cloud import bodies, rules
from rayslice.cloud.capacity import CapacityExhausted
from rayslice.cloud.states import GCE_STOCKOUT, POOL_ERROR, POOL_RUNNING
from rayslice.cloud.twin import CloudTwin
from rayslice.cloud.twin.clock import TwinClock
from rayslice.cloud.twin.state import CloudRuleError
from rayslice.infra import preview
from rayslice.infra.network import SUBNET_CIDR
from tests.cloud.stacks import make

STACKS = Path(__file__).resolve().parents[2] / "infra"
FLEX, FIXED = "Pulumi.example-gke-flex-v6e-16.yaml", "Pulumi.example-gke-v6e-16.yaml"
ZONE, HOST_TYPE, PROJECT = "us-east5-a", "ct6e-standard-4t", "my-gcp-project"


def _deploy(example: str, free: int) -> CloudTwin:
    twin = CloudTwin(default_range=SUBNET_CIDR)
    twin.set_capacity(ZONE, HOST_TYPE, free)
    preview.deploy(preview.stack_config(str(STACKS / example), [f"zone={ZONE}"]), twin)
    return twin


def _pool(twin: CloudTwin, name: str) -> dict[str, Any]:
    [pool] = [p for (_, _, _, n), p in twin.node_pools.items() if n == name]
    return pool


def _nodes(twin: CloudTwin, pool: dict[str, Any]) -> list[str]:
    groups = {url.rsplit("/", 1)[-1] for url in pool["instanceGroupUrls"]}
    return [h.name for h in twin.hosts() if h.group in groups]


def test_a_flex_start_pool_waits_in_an_empty_zone_and_gets_every_node_at_once():
    twin = _deploy(FLEX, free=0)  # `pulumi up` returns: the pool exists, empty
    pool = _pool(twin, "gke-flex-v6e-16-slice-0")
    assert pool["status"] == POOL_RUNNING and pool["config"]["flexStart"] is True
    assert pool["config"]["maxRunDuration"] == "86400s" and pool["initialNodeCount"] == 0
    assert _nodes(twin, pool) == []
    assert len(_nodes(twin, _pool(twin, "gke-flex-v6e-16-head"))) == 1  # the CPU pool is a direct create
    twin.set_capacity(ZONE, HOST_TYPE, 3)
    assert _nodes(twin, pool) == []  # three of four: still waiting, nothing partial
    twin.set_capacity(ZONE, HOST_TYPE, 4)
    assert len(_nodes(twin, pool)) == 4
    assert all(twin.host(n).machine_type == HOST_TYPE for n in _nodes(twin, pool))
    assert twin.violations() == []


def test_a_fixed_pool_in_an_empty_zone_ends_in_error_with_gce_stockout_and_no_node():
    twin = CloudTwin(default_range=SUBNET_CIDR)
    twin.set_capacity(ZONE, HOST_TYPE, 0)
    with pytest.raises(CapacityExhausted) as err:
        preview.deploy(preview.stack_config(str(STACKS / FIXED), [f"zone={ZONE}"]), twin)
    assert "capacity=flex-start (compute, gke)" in str(err.value)
    pool = _pool(twin, "gke-v6e-16-slice-0")
    [condition] = pool["conditions"]
    assert pool["status"] == POOL_ERROR and condition["code"] == GCE_STOCKOUT
    assert condition["canonicalCode"] == "RESOURCE_EXHAUSTED"
    assert (
        f"The zone 'projects/{PROJECT}/zones/{ZONE}' does not have enough resources" in pool["statusMessage"]
    )
    assert _nodes(twin, pool) == []


def test_in_a_zone_with_room_a_fixed_pool_gets_its_nodes():
    twin = _deploy(FIXED, free=4)
    assert len(_nodes(twin, _pool(twin, "gke-v6e-16-slice-0"))) == 4
    assert twin.capacity.free[(ZONE, HOST_TYPE)] == 0


def _flex_pool(**changes: Any) -> dict[str, Any]:
    props: dict[str, Any] = {
        "name": "c-slice-0",
        "cluster": "c",
        "location": ZONE,
        "nodeLocations": [ZONE],
        "initialNodeCount": 0,
        "autoscaling": {"totalMinNodeCount": 0, "totalMaxNodeCount": 4, "locationPolicy": "ANY"},
        "nodeConfig": {"machineType": HOST_TYPE, "flexStart": True, "maxRunDuration": "86400s"},
    }
    props.update(changes)
    return props


@pytest.mark.parametrize(
    "changes,rule",
    [
        ({"initialNodeCount": 4}, "flex-start-pool-autoscaled"),
        ({"autoscaling": None, "nodeCount": 4}, "flex-start-pool-autoscaled"),
        (
            {"autoscaling": {"totalMaxNodeCount": 4, "maxNodeCount": 4, "locationPolicy": "ANY"}},
            "node-pool-autoscaling-limits",
        ),
        ({"autoscaling": {"totalMinNodeCount": 5, "totalMaxNodeCount": 4}}, "node-pool-autoscaling-limits"),
        (
            {"nodeConfig": {"machineType": HOST_TYPE, "flexStart": True, "maxRunDuration": "691200s"}},
            "node-pool-run-duration",
        ),
        (
            {"nodeConfig": {"machineType": HOST_TYPE, "flexStart": True, "maxRunDuration": "24h"}},
            "node-pool-run-duration",
        ),
    ],
)
def test_the_rules_refuse_a_broken_flex_start_pool_and_so_does_the_twin(changes, rule):
    assert [v.rule for v in rules.check(rules.Stack([make(bodies.NODE_POOL, "p", _flex_pool())]))] == []
    broken = make(bodies.NODE_POOL, "p", _flex_pool(**changes))
    assert rule in [v.rule for v in rules.check(rules.Stack([broken]))]
    twin = CloudTwin()
    with pytest.raises(CloudRuleError):
        twin.apply(bodies.NODE_POOL, "p", broken.request, project=PROJECT, zone=ZONE, target="c")
    assert twin.node_pools == {}


def test_a_node_pool_body_is_what_the_provider_sends():
    request = bodies.request(bodies.NODE_POOL, {**_flex_pool(), "project": PROJECT})
    assert request is not None
    assert (request.api, request.method, request.schema) == (
        "container",
        "container.projects.locations.clusters.nodePools.create",
        "CreateNodePoolRequest",
    )
    pool = request.body["nodePool"]
    assert pool["autoscaling"] == {
        "enabled": True,
        "minNodeCount": 0,
        "maxNodeCount": 0,
        "totalMinNodeCount": 0,
        "totalMaxNodeCount": 4,
        "locationPolicy": "ANY",
    }
    assert pool["locations"] == [ZONE] and "cluster" not in pool and "project" not in pool


def test_a_failed_node_takes_the_whole_slice_down_and_auto_repair_brings_it_back_whole():
    """The program's fixed pool asks for auto-repair (its cell's ``management``, GKE's default too)."""
    twin = _deploy(FIXED, free=8)
    pool = _pool(twin, "gke-v6e-16-slice-0")
    assert pool["management"] == {"autoRepair": True}
    before = {n: twin.host(n).ip for n in _nodes(twin, pool)}
    down: list[str] = []
    twin.on_host_down = lambda host: down.append(host.name)
    hit = twin.fail_node_pool(PROJECT, ZONE, "gke-v6e-16", "gke-v6e-16-slice-0")
    assert sorted(h.name for h in hit) == sorted(down) == sorted(before)
    assert {twin.host(n).status for n in before} == {"TERMINATED"}  # not repaired one by one
    assert twin.repair_node_pool(PROJECT, ZONE, "gke-v6e-16", "gke-v6e-16-slice-0") is True
    assert {n: (twin.host(n).status, twin.host(n).ip) for n in _nodes(twin, pool)} == {
        n: ("RUNNING", ip) for n, ip in before.items()
    }


def test_a_flex_start_pool_without_auto_repair_stays_down_and_its_run_end_deletes_its_nodes():
    twin = _deploy(FLEX, free=4)
    cluster, name = "gke-flex-v6e-16", "gke-flex-v6e-16-slice-0"
    pool = _pool(twin, name)
    assert pool["management"] == {"autoRepair": False} and len(_nodes(twin, pool)) == 4
    twin.fail_node_pool(PROJECT, ZONE, cluster, name)
    assert twin.repair_node_pool(PROJECT, ZONE, cluster, name) is False
    assert {twin.host(n).status for n in _nodes(twin, pool)} == {"TERMINATED"}
    twin.end_node_pool_run(PROJECT, ZONE, cluster, name)
    assert _nodes(twin, pool) == [] and _pool(twin, name) is pool  # the pool stays, empty
    assert twin.capacity.free[(ZONE, HOST_TYPE)] == 4  # its hosts went back to the zone


def test_a_flex_start_pools_nodes_end_at_max_run_duration_on_the_clock_and_the_cluster_bills_its_fee():
    twin = CloudTwin(default_range=SUBNET_CIDR)
    twin.clock = TwinClock.manual(1_800_000_000.0)
    twin.set_capacity(ZONE, HOST_TYPE, 0)
    preview.deploy(preview.stack_config(str(STACKS / FLEX), [f"zone={ZONE}"]), twin)
    pool = _pool(twin, "gke-flex-v6e-16-slice-0")
    twin.advance(3600)  # waiting: no TPU node, the cluster's fee
    fee = catalog.gke_cluster_hour_price()[0]
    charges = twin.bill.by_resource()
    [cluster] = [c for r, c in charges.items() if r.endswith("/clusters/gke-flex-v6e-16")]
    assert cluster.usd == pytest.approx(fee) and cluster.host_hours == 0
    assert not any(c.host_hours for r, c in charges.items() if "slice" in r)
    twin.set_capacity(ZONE, HOST_TYPE, 4)
    assert len(_nodes(twin, pool)) == 4
    twin.advance(86400 - 1)  # maxRunDuration: 86400s from when the nodes were made
    assert len(_nodes(twin, pool)) == 4
    twin.advance(1)
    assert _nodes(twin, pool) == [] and twin.capacity.free[(ZONE, HOST_TYPE)] == 4
    [nodes] = [c for r, c in twin.bill.by_resource().items() if r.endswith("slice-0-grp")]
    assert nodes.host_hours == pytest.approx(4 * 24) and nodes.wasted_host_hours == 0
    assert nodes.unpriced_host_hours == pytest.approx(4 * 24) and nodes.usd == 0  # flex: not priced
