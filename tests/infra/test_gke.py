"""platform=gke under Pulumi's mocks: node pools, placement, selectors and resources per shape.

Expected shapes come from xpk's table (tests/fixtures/xpk-v1.13/),
not from the catalog under test, so a catalog or planning mistake shows up as a mismatch.
"""

from __future__ import annotations

import csv
import dataclasses
import ipaddress
import itertools
from collections import defaultdict
from typing import Any

import pulumi
import pytest

from rayslice import spec as specs
from rayslice.infra import TpuRayCluster, TpuRayClusterArgs
from rayslice.infra.gke_cluster import tpu_pool_plans

CLUSTER = "gcp:container/cluster:Cluster"
SUBNET = "gcp:compute/subnetwork:Subnetwork"
NETWORK_TYPES = (
    "gcp:compute/network:Network",
    SUBNET,
    "gcp:compute/router:Router",
    "gcp:compute/routerNat:RouterNat",
)
NODE_POOL = "gcp:container/nodePool:NodePool"
POLICY = "gcp:compute/resourcePolicy:ResourcePolicy"
RAYCLUSTER = "kubernetes:ray.io/v1:RayCluster"
RELEASE = "kubernetes:helm.sh/v3:Release"
SERVICE = "kubernetes:core/v1:Service"

ZONES = {"v6e": "us-east5-b", "v5p": "us-east5-a", "tpu7x": "us-central1-c"}


class Recorder(pulumi.runtime.Mocks):
    """Records every registered resource; fakes the few outputs the program reads back."""

    def __init__(self) -> None:
        self.resources: dict[str, list[pulumi.runtime.MockResourceArgs]] = defaultdict(list)

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.resources[args.typ].append(args)
        outputs = dict(args.inputs)
        if args.typ == CLUSTER:
            outputs.update(endpoint="203.0.113.10", masterAuth={"clusterCaCertificate": "Q0E="})
        return f"{args.name}-id", outputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        if args.token == "gcp:organizations/getClientConfig:getClientConfig":
            return {"project": "mock-project"}
        if args.token == "gcp:container/getCluster:getCluster":
            return {"endpoint": "203.0.113.20", "masterAuths": [{"clusterCaCertificate": "Q0E="}]}
        raise AssertionError(f"unexpected call {args.token}")


def deploy(cluster_spec: specs.ClusterSpec, recorder: Recorder | None = None) -> Recorder:
    """Run the cluster component under mocks; return what it registered."""
    recorder = recorder or Recorder()
    pulumi.runtime.set_mocks(recorder, project="rayslice", stack="test", preview=False)

    @pulumi.runtime.test
    def program() -> pulumi.Output:
        return TpuRayCluster("gke", TpuRayClusterArgs(spec=cluster_spec)).gke.kubeconfig

    program()
    return recorder


def gke_spec(accelerator: str, **extra: Any) -> specs.ClusterSpec:
    zone = ZONES[accelerator.split("-")[0]]
    return specs.load(
        {"platform": "gke", "acceleratorType": accelerator, "zone": zone, "name": "demo", **extra}
    )


@pytest.fixture(scope="module")
def xpk(fixtures_dir) -> dict[str, dict[str, str]]:
    path = fixtures_dir / "xpk-v1.13" / "gke-tpu-system-characteristics.csv"
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    return {row["accelerator_type"]: row for row in csv.DictReader(lines)}


CASES = [("v6e-4", 1), ("v6e-16", 1), ("v5p-16", 1), ("v6e-16", 2), ("tpu7x-16", 1)]


@pytest.mark.parametrize("accelerator,slices", CASES, ids=[f"{s}x{a}" for a, s in CASES])
def test_node_pools_and_raycluster_follow_the_xpk_shape(accelerator, slices, xpk):
    row = xpk[accelerator]
    hosts, per_host = int(row["hosts"]), int(row["chips_per_host"])
    recorder = deploy(gke_spec(accelerator, slices=slices))

    pools = {p.inputs["name"]: p.inputs for p in recorder.resources[NODE_POOL]}
    assert set(pools) == {"demo-head", *(f"demo-slice-{i}" for i in range(slices))}
    for i in range(slices):
        pool = pools[f"demo-slice-{i}"]
        assert pool["nodeConfig"]["machineType"] == row["machine_type"]
        assert pool["nodeCount"] == hosts
        assert pool["nodeLocations"] == [pool["location"]]
        assert pool["nodeConfig"]["taints"] == [
            {"key": "google.com/tpu", "value": "present", "effect": "NO_SCHEDULE"}
        ]
        placement = pool.get("placementPolicy")
        if hosts == 1:
            assert placement is None
        elif accelerator.startswith("tpu7x"):
            assert placement == {"type": "COMPACT", "policyName": "demo-tpu-policy"}
        else:
            assert placement == {"type": "COMPACT", "tpuTopology": row["topology"]}
    policies = recorder.resources[POLICY]
    if accelerator.startswith("tpu7x"):
        assert [p.inputs["workloadPolicy"] for p in policies] == [
            {"type": "HIGH_THROUGHPUT", "acceleratorTopology": row["topology"]}
        ]
    else:
        assert policies == []

    [ray_cluster] = recorder.resources[RAYCLUSTER]
    [group] = ray_cluster.inputs["spec"]["workerGroupSpecs"]
    pod = group["template"]["spec"]
    assert group["numOfHosts"] == hosts and group["replicas"] == slices
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": row["gke_accelerator"],
        "cloud.google.com/gke-tpu-topology": row["topology"],
    }
    container = pod["containers"][0]
    assert (
        container["resources"]["requests"]
        == container["resources"]["limits"]
        == {"google.com/tpu": str(per_host)}
    )
    assert {"name": "megascale", "containerPort": 8081} in container["ports"]
    taint = pools["demo-slice-0"]["nodeConfig"]["taints"][0]
    assert {"key": taint["key"], "operator": "Equal", "value": taint["value"], "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert len(recorder.resources[SERVICE]) == slices * hosts


def test_head_pool_and_cluster_settings():
    recorder = deploy(gke_spec("v6e-16", headMachineType="n2-standard-8"))
    [cluster] = recorder.resources[CLUSTER]
    inputs = cluster.inputs
    assert inputs["removeDefaultNodePool"] is True and inputs["initialNodeCount"] == 1
    assert inputs["workloadIdentityConfig"] == {"workloadPool": "mock-project.svc.id.goog"}
    assert inputs["releaseChannel"] == {"channel": "REGULAR"}
    assert inputs["privateClusterConfig"]["enablePrivateNodes"] is True
    assert inputs["network"] == "demo-net" and inputs["subnetwork"] == "demo-subnet"
    assert "addonsConfig" not in inputs
    nat = recorder.resources["gcp:compute/routerNat:RouterNat"]
    assert len(nat) == 1
    head = next(p.inputs for p in recorder.resources[NODE_POOL] if p.inputs["name"] == "demo-head")
    assert head["nodeConfig"]["machineType"] == "n2-standard-8" and "taints" not in head["nodeConfig"]
    [release] = recorder.resources[RELEASE]
    assert release.inputs["chart"] == "kuberay-operator" and release.inputs["version"].startswith("1.7.")
    [ray_cluster] = recorder.resources[RAYCLUSTER]
    head_pod = ray_cluster.inputs["spec"]["headGroupSpec"]["template"]["spec"]
    assert head_pod["nodeSelector"] == {"cloud.google.com/gke-nodepool": "demo-head"}


def test_spot_and_reservation_reach_every_tpu_pool():
    spot = deploy(gke_spec("v6e-16", slices=2, capacity="spot"))
    tpu_pools = [p.inputs for p in spot.resources[NODE_POOL] if p.inputs["name"] != "demo-head"]
    assert [p["nodeConfig"].get("spot") for p in tpu_pools] == [True, True]
    reserved = deploy(gke_spec("v6e-16", capacity="reserved", reservation="my-res"))
    pool = next(p.inputs for p in reserved.resources[NODE_POOL] if p.inputs["name"] == "demo-slice-0")
    assert pool["nodeConfig"]["reservationAffinity"] == {
        "consumeReservationType": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": ["my-res"],
    }
    assert not pool["nodeConfig"].get("spot")


def test_addon_replaces_the_helm_release():
    recorder = deploy(gke_spec("v6e-16", kuberay="addon"))
    [cluster] = recorder.resources[CLUSTER]
    assert cluster.inputs["addonsConfig"] == {"rayOperatorConfigs": [{"enabled": True}]}
    assert recorder.resources[RELEASE] == []
    assert len(recorder.resources[RAYCLUSTER]) == 1


def test_created_cluster_is_vpc_native_on_the_subnets_secondary_ranges():
    recorder = deploy(gke_spec("v6e-16"))
    [subnet] = recorder.resources[SUBNET]
    ranges = {
        r["rangeName"]: ipaddress.ip_network(r["ipCidrRange"]) for r in subnet.inputs["secondaryIpRanges"]
    }
    [cluster] = recorder.resources[CLUSTER]
    policy = cluster.inputs["ipAllocationPolicy"]
    assert (
        set(ranges)
        == {policy["clusterSecondaryRangeName"], policy["servicesSecondaryRangeName"]}
        == {"demo-pods", "demo-services"}
    )
    networks = [ipaddress.ip_network(subnet.inputs["ipCidrRange"]), *ranges.values()]
    assert not any(a.overlaps(b) for a, b in itertools.combinations(networks, 2)), networks
    assert ranges["demo-pods"].num_addresses >= 2**18  # GKE's default /14: 1,024 nodes x 110 pods


def test_existing_subnetwork_lets_gke_add_its_own_ranges():
    recorder = deploy(gke_spec("v6e-16", network="shared-vpc", subnetwork="tpu-subnet"))
    assert not any(recorder.resources[t] for t in NETWORK_TYPES)
    [cluster] = recorder.resources[CLUSTER]
    assert (cluster.inputs["network"], cluster.inputs["subnetwork"]) == ("shared-vpc", "tpu-subnet")
    assert not cluster.inputs.get("ipAllocationPolicy")  # VPC-native, ranges chosen by GKE


def test_existing_cluster_gets_only_pools_and_no_network():
    recorder = deploy(gke_spec("v6e-16", gkeCluster="team-cluster"))
    assert recorder.resources[CLUSTER] == []
    assert not any(recorder.resources[t] for t in NETWORK_TYPES)
    assert {p.inputs["cluster"] for p in recorder.resources[NODE_POOL]} == {"team-cluster"}


def _tampered(cluster_spec: specs.ClusterSpec, **tpu_changes: Any) -> specs.ClusterSpec:
    """A spec whose catalog shape is wrong: what only a catalog bug could produce."""
    return dataclasses.replace(cluster_spec, tpu=dataclasses.replace(cluster_spec.tpu, **tpu_changes))


@pytest.mark.parametrize(
    "accelerator,changes,message",
    [
        ("v6e-16", {"topology": "3x3"}, "topology 3x3 does not exist for v6e"),
        ("v6e-16", {"hosts": 2}, "2 hosts x 4 chips = 8 chips, but topology 4x4 has 16"),
        (
            "v6e-16",
            {"machine_type": "ct6e-standard-8t"},
            "machine type ct6e-standard-8t does not carry topology 4x4",
        ),
        ("tpu7x-16", {"placement": "COMPACT"}, "2-host tpu7x node pools need placement 'workload-policy'"),
    ],
    ids=["topology", "num-hosts", "machine-type", "tpu7x-placement"],
)
def test_catalog_shape_gke_would_refuse_is_asserted(accelerator, changes, message):
    with pytest.raises(AssertionError, match=message):
        tpu_pool_plans(_tampered(gke_spec(accelerator), **changes))


def test_catalog_bug_stops_before_any_pool_or_kubernetes_object():
    recorder = Recorder()
    with pytest.raises(AssertionError, match="does not exist for v6e"):
        deploy(_tampered(gke_spec("v6e-16"), topology="3x3"), recorder)
    assert not any(recorder.resources[t] for t in (CLUSTER, NODE_POOL, RAYCLUSTER, RELEASE, SERVICE))


def test_unknown_topology_is_a_spec_error_naming_valid_types():
    with pytest.raises(specs.SpecError, match="unknown accelerator type 'v6e-3x3'"):
        specs.load({"platform": "gke", "acceleratorType": "v6e-3x3", "zone": "us-east5-b"})
