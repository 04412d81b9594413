"""platform=gke under Pulumi's mocks: node pools, placement, selectors and resources per shape,
the nodes' own service account, and how the control plane and an existing cluster are handled.

Expected shapes come from xpk's table (tests/fixtures/xpk-v1.13/), not from the catalog under
test, so a catalog or planning mistake shows up as a mismatch. Expected settings are literals.
"""

from __future__ import annotations

import asyncio
import csv
import ipaddress
import itertools
import re

import pytest

from rayslice import spec as specs
from rayslice.errors import InvalidInput
from rayslice.infra.gke import cluster as gke_cluster
from rayslice.infra.gke.nodes import tpu_pool_plans
from rayslice.infra.identity import GKE_NODES, account_id
from rayslice.infra.mocks import run_offline
from rayslice.infra.program import main
from tests.infra.gke.mocked import (
    ACCOUNT,
    CLUSTER,
    CONFIG_MAP,
    IAM_MEMBER,
    NAMESPACE,
    NETWORK_POLICY,
    NETWORK_TYPES,
    NODE_POOL,
    POLICY,
    RAYCLUSTER,
    RELEASE,
    SERVICE,
    SERVICE_ACCOUNT,
    SLEEP,
    SUBNET,
    ZONES,
    Recorder,
    deploy,
    gke_spec,
    resolved,
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


def test_the_program_runs_after_an_asyncio_run_in_the_same_process():
    # asyncio.run() leaves the thread without a current loop (the Jobs client's log streaming
    # calls it); a mocked run after it failed with "There is no current event loop" whenever
    # pytest-xdist happened to put such a test first on the same worker.
    async def nothing() -> None:
        return None

    asyncio.run(nothing())
    recorder = deploy(gke_spec("v6e-4"))
    # Pulumi registers the pools concurrently: their order is not the program's.
    assert sorted(p.inputs["name"] for p in recorder.resources[NODE_POOL]) == ["demo-head", "demo-slice-0"]


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


def test_unknown_topology_is_a_spec_error_naming_valid_types():
    with pytest.raises(specs.SpecError, match="unknown accelerator type 'v6e-3x3'"):
        specs.load({"platform": "gke", "acceleratorType": "v6e-3x3", "zone": "us-east5-b"})


# One shape per GKE rule (single host, COMPACT multi-host, workload policy) and generation.
PLAN_CASES = [
    "v6e-1",
    "v6e-8",
    "v6e-256",
    "v5p-8",
    "v5p-128",
    "v5litepod-8",
    "v5litepod-256",
    "v4-8",
    "v4-4x4x8",
    "tpu7x-8",
    "tpu7x-128",
]
PLAN_ZONES = {**ZONES, "v5litepod": "us-west4-a", "v4": "us-central2-b"}


@pytest.mark.parametrize("accelerator", PLAN_CASES)
def test_pool_plans_match_xpk_and_gkes_placement_rule(accelerator, xpk):
    """The shape checks that used to run at deploy time, done once here against xpk's table:
    machine type, node count and topology as xpk has them, hosts x chips = the topology, and
    the placement GKE requires (none for one host, a workload policy for tpu7x, else COMPACT)."""
    row = xpk[accelerator]
    zone = PLAN_ZONES[accelerator.split("-")[0]]
    cluster_spec = specs.load(
        {"platform": "gke", "acceleratorType": accelerator, "zone": zone, "name": "demo", "slices": 2}
    )
    plans = tpu_pool_plans(cluster_spec)
    assert [p.name for p in plans] == ["demo-slice-0", "demo-slice-1"]
    hosts = int(row["hosts"])
    expected_placement = (
        None if hosts == 1 else "workload-policy" if accelerator.startswith("tpu7x") else "COMPACT"
    )
    for plan in plans:
        assert (plan.machine_type, plan.node_count, plan.topology, plan.placement) == (
            row["machine_type"],
            hosts,
            row["topology"],
            expected_placement,
        )
    dims = [int(d) for d in row["topology"].split("x")]
    assert (
        hosts * int(row["chips_per_host"])
        == int(row["total_chips"])
        == dims[0] * dims[1] * (dims[2] if len(dims) == 3 else 1)
    )


NODE_ACCOUNT = "demo-gke-nodes@mock-project.iam.gserviceaccount.com"


def test_every_pool_runs_as_the_dedicated_node_account():
    recorder = deploy(gke_spec("tpu7x-16", slices=2))
    [account] = recorder.resources[ACCOUNT]
    assert account.inputs["accountId"] == "demo-gke-nodes"
    grants = recorder.resources[IAM_MEMBER]
    assert [(g.inputs["role"], g.inputs["member"]) for g in grants] == [
        ("roles/container.defaultNodeServiceAccount", f"serviceAccount:{NODE_ACCOUNT}")
    ]
    [wait] = recorder.resources[SLEEP]
    assert wait.inputs["createDuration"] == "60s"
    pools = recorder.resources[NODE_POOL]
    assert len(pools) == 3  # head + 2 slices
    for pool in pools:
        config = pool.inputs["nodeConfig"]
        assert config["serviceAccount"] == NODE_ACCOUNT
        assert config["workloadMetadataConfig"] == {"mode": "GKE_METADATA"}
        assert config["oauthScopes"] == ["https://www.googleapis.com/auth/cloud-platform"]
    assert recorder.exports["node_service_account"] is not None


@pytest.mark.parametrize(
    "name,expected",
    [
        ("demo", "demo-gke-nodes"),
        ("a", "a-gke-nodes"),
        # Too long with the suffix: cut to 21 characters plus "-n-" and sha256(name)[:6].
        ("team-a-large-training-run", "team-a-large-training-n-b14345"),
    ],
)
def test_node_account_id_fits_iam_rules(name, expected):
    account = account_id(name, GKE_NODES)
    assert re.fullmatch(r"[a-z][a-z0-9-]{4,28}[a-z0-9]", account), account
    assert account == expected


def test_long_names_sharing_a_prefix_get_different_node_accounts():
    assert account_id("team-a-large-training-run-1", GKE_NODES) != account_id(
        "team-a-large-training-run-2", GKE_NODES
    )


def test_control_plane_is_private_without_authorized_networks():
    recorder = deploy(gke_spec("v6e-16"))
    [cluster] = recorder.resources[CLUSTER]
    assert cluster.inputs["privateClusterConfig"] == {
        "enablePrivateNodes": True,
        "enablePrivateEndpoint": True,
    }
    assert cluster.inputs["masterAuthorizedNetworksConfig"] == {
        "cidrBlocks": [],
        "gcpPublicCidrsAccessEnabled": False,
    }
    assert cluster.inputs["datapathProvider"] == "ADVANCED_DATAPATH"
    assert '"server": "https://10.0.0.2"' in resolved(recorder.kubeconfig)
    command = resolved(recorder.exports["get_credentials_command"])
    assert command == "gcloud container clusters get-credentials demo --zone=us-east5-b --internal-ip"


def test_authorized_networks_open_the_public_endpoint_to_those_ranges_only():
    recorder = deploy(gke_spec("v6e-16", gkeAuthorizedNetworks=["198.51.100.0/24", "203.0.113.7/32"]))
    [cluster] = recorder.resources[CLUSTER]
    assert cluster.inputs["privateClusterConfig"] == {
        "enablePrivateNodes": True,
        "enablePrivateEndpoint": False,
    }
    assert cluster.inputs["masterAuthorizedNetworksConfig"] == {
        "cidrBlocks": [
            {"cidrBlock": "198.51.100.0/24", "displayName": "gkeAuthorizedNetworks[0]"},
            {"cidrBlock": "203.0.113.7/32", "displayName": "gkeAuthorizedNetworks[1]"},
        ],
        "gcpPublicCidrsAccessEnabled": False,
    }
    assert '"server": "https://203.0.113.10"' in resolved(recorder.kubeconfig)
    command = resolved(recorder.exports["get_credentials_command"])
    assert command == "gcloud container clusters get-credentials demo --zone=us-east5-b"


def test_network_policies_are_applied_with_the_ray_cluster():
    recorder = deploy(gke_spec("v6e-16", dashboardSourceRanges=["10.8.0.0/16"]))
    names = sorted(p.inputs["metadata"]["name"] for p in recorder.resources[NETWORK_POLICY])
    assert names == ["demo-dashboard", "demo-ray-pods"]


def test_kubernetes_objects_are_created_in_the_namespace_once_it_exists():
    """Pulumi creates the others after the Namespace (and deletes them before it)."""
    config = {
        "rayslice:platform": "gke",
        "rayslice:acceleratorType": "v6e-16",
        "rayslice:zone": "us-east5-b",
        "rayslice:name": "demo",
        "rayslice:dashboardSourceRanges": '["10.8.0.0/16"]',
        "gcp:project": "my-proj",
    }
    run = run_offline(lambda: main().exports, config)
    [namespace] = run.of_type(NAMESPACE)
    assert namespace.inputs["metadata"]["name"] == "rayslice-demo"
    [account] = run.of_type(SERVICE_ACCOUNT)
    assert account.inputs["automountServiceAccountToken"] is False
    namespaced = [
        account,
        *(r for kind in (CONFIG_MAP, SERVICE, NETWORK_POLICY, RAYCLUSTER) for r in run.of_type(kind)),
    ]
    assert len(namespaced) == 1 + 1 + 4 + 2 + 1
    for registration in namespaced:
        assert registration.inputs["metadata"]["namespace"] == "rayslice-demo", registration.name
        assert namespace.urn in registration.dependencies, registration.name


def test_existing_cluster_without_workload_identity_stops_before_any_pool():
    recorder = Recorder(existing={"workloadIdentityConfigs": []})
    with pytest.raises(InvalidInput) as caught:
        deploy(gke_spec("v6e-16", gkeCluster="team-cluster", project="my-proj"), recorder)
    assert (
        "gcloud container clusters update team-cluster --zone=us-east5-b "
        "--workload-pool=my-proj.svc.id.goog --project=my-proj"
    ) in str(caught.value)
    assert recorder.resources[NODE_POOL] == [] and recorder.resources[RAYCLUSTER] == []


@pytest.mark.parametrize(
    "pools,datapath,policy,errors,warnings",
    [
        (["p.svc.id.goog"], "ADVANCED_DATAPATH", False, 0, 0),
        (["p.svc.id.goog"], "LEGACY_DATAPATH", True, 0, 0),
        (["p.svc.id.goog"], "LEGACY_DATAPATH", False, 0, 1),
        ([], "ADVANCED_DATAPATH", False, 1, 0),
        ([""], "", False, 1, 1),
    ],
    ids=["fit", "calico", "no-policy", "no-wi", "neither"],
)
def test_existing_cluster_problems(pools, datapath, policy, errors, warnings):
    cluster_spec = gke_spec("v6e-16", gkeCluster="team-cluster")
    found_errors, found_warnings = gke_cluster.existing_cluster_problems(
        cluster_spec, pools, datapath, policy
    )
    assert (len(found_errors), len(found_warnings)) == (errors, warnings)
    for warning in found_warnings:
        assert "--enable-network-policy" in warning
    for error in found_errors:
        assert "--workload-pool=PROJECT_ID.svc.id.goog" in error


def test_flex_start_pools_start_empty_and_autoscale_to_the_slices_hosts():
    """capacity=flex-start: each TPU pool as xpk makes one (empty, autoscaled 0..hosts, location
    policy ANY, no reservation, no auto-repair), flex-start with the run limit; no queued
    provisioning; the head pool stays a fixed one-node pool."""
    recorder = deploy(gke_spec("v6e-16", capacity="flex-start", maxRunHours=24, slices=2))
    pools = {p.inputs["name"]: p.inputs for p in recorder.resources[NODE_POOL]}
    head = pools.pop("demo-head")
    assert head["nodeCount"] == 1 and "flexStart" not in head["nodeConfig"] and "autoscaling" not in head
    assert sorted(pools) == ["demo-slice-0", "demo-slice-1"]
    for pool in pools.values():
        assert "nodeCount" not in pool and pool["initialNodeCount"] == 0
        assert pool["autoscaling"] == {
            "totalMinNodeCount": 0,
            "totalMaxNodeCount": 4,
            "locationPolicy": "ANY",
        }
        assert pool["management"] == {"autoRepair": False} and "queuedProvisioning" not in pool
        config = pool["nodeConfig"]
        assert config["flexStart"] is True and config["maxRunDuration"] == "86400s"
        assert config["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}
        assert config["spot"] is False
        assert pool["placementPolicy"] == {"type": "COMPACT", "tpuTopology": "4x4"}


def test_queued_provisioning_on_gke_is_refused_naming_kueue():
    with pytest.raises(specs.SpecError) as err:
        gke_spec("v6e-16", capacity="flex-start", queued=True)
    assert "Kueue and ProvisioningRequest" in str(err.value) and "docs/capacity.md" in str(err.value)


def test_flex_start_on_gke_leaves_out_v4():
    with pytest.raises(specs.SpecError) as err:
        specs.load({"platform": "gke", "acceleratorType": "v4-16", "capacity": "flex-start"})
    assert "does not offer v4" in str(err.value)
