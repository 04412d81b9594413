"""The Kubernetes objects of a GKE Ray cluster: the RayCluster checked against KubeRay v1.7.0's
CRD, the ConfigMap, Services and NetworkPolicies against Kubernetes 1.31's OpenAPI schema,
shapes against xpk's table, names and policies against literals.
"""

from __future__ import annotations

import csv
import ipaddress
import json
import shlex
from pathlib import Path

import jsonschema
import pytest
import referencing
import referencing.jsonschema
import yaml

from rayslice import spec as specs
from rayslice.infra.gke import kuberay
from rayslice.startup_scripts import pod

ZONES = {
    "v6e": "us-east5-b",
    "v5p": "us-east5-a",
    "tpu7x": "us-central1-c",
    "v5litepod": "us-west4-a",
    "v4": "us-central2-b",
}
SHAPES = [
    ("v6e-4", 1),
    ("v6e-16", 1),
    ("v5p-16", 1),
    ("v6e-16", 2),
    ("tpu7x-16", 1),
    ("v6e-4", 2),
    ("v5litepod-16", 1),
    ("v4-32", 3),
    ("v6e-256", 1),
]
SHAPE_IDS = [f"{s}x{a}" for a, s in SHAPES]
# The Kubernetes version docs/deploy-gke.md names as the minimum; its schemas are vendored.
KUBERNETES_VERSION = "1.31"
SCHEMA_FILES = {
    "ConfigMap": "configmap-v1.json",
    "Service": "service-v1.json",
    "NetworkPolicy": "networkpolicy-networking-v1.json",
}


def gke_spec(accelerator: str, slices: int = 1, **extra) -> specs.ClusterSpec:
    zone = ZONES[accelerator.split("-")[0]]
    return specs.load(
        {
            "platform": "gke",
            "acceleratorType": accelerator,
            "zone": zone,
            "slices": slices,
            "name": "demo",
            **extra,
        }
    )


@pytest.fixture(scope="module")
def xpk(fixtures_dir) -> dict[str, dict[str, str]]:
    path = fixtures_dir / "xpk-v1.13" / "gke-tpu-system-characteristics.csv"
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    return {row["accelerator_type"]: row for row in csv.DictReader(lines)}


@pytest.fixture(scope="module")
def k8s_validators(fixtures_dir: Path) -> dict[str, jsonschema.protocols.Validator]:
    """One validator per kind, from the vendored Kubernetes JSON schemas (unknown fields refused)."""
    folder = fixtures_dir / f"kubernetes-{KUBERNETES_VERSION}"
    definitions = json.loads((folder / "_definitions.json").read_text())
    registry = referencing.Registry().with_resource(
        definitions["$id"], referencing.jsonschema.DRAFT202012.create_resource(definitions)
    )
    validators = {}
    for kind, name in SCHEMA_FILES.items():
        schema = json.loads((folder / name).read_text())
        validators[kind] = jsonschema.Draft202012Validator(schema, registry=registry)
    return validators


def schema_errors(validators, obj: dict) -> list[str]:
    validator = validators[obj["kind"]]
    return [f"{obj['kind']} {list(e.path)}: {e.message}" for e in validator.iter_errors(obj)]


def test_pinned_operator_is_the_one_the_crd_fixture_comes_from(fixtures_dir):
    assert kuberay.KUBERAY_VERSION == "1.7.0"
    assert (fixtures_dir / "kuberay-v1.7.0" / "ray.io_rayclusters.yaml").is_file()


@pytest.mark.parametrize("accelerator,slices", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("auth", ["token", "none"])
def test_raycluster_validates_against_the_crd(accelerator, slices, auth, crd_validator):
    manifest = kuberay.raycluster_manifest(gke_spec(accelerator, slices, rayAuth=auth))
    errors = sorted(crd_validator.iter_errors(manifest), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_strict_validation_catches_a_misspelt_field(crd_validator):
    manifest = kuberay.raycluster_manifest(gke_spec("v6e-16"))
    manifest["spec"]["workerGroupSpecs"][0]["numHosts"] = 4
    assert any("numHosts" in e.message for e in crd_validator.iter_errors(manifest))


@pytest.mark.parametrize("accelerator,slices", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("ranges", [[], ["10.8.0.0/16", "192.168.7.0/24"]], ids=["no-ranges", "ranges"])
def test_other_objects_validate_against_the_kubernetes_schema(accelerator, slices, ranges, k8s_validators):
    objects = kuberay.manifests(gke_spec(accelerator, slices, dashboardSourceRanges=ranges))
    others = [o for o in objects if o["kind"] != "RayCluster"]
    assert {o["kind"] for o in others} == {"ConfigMap", "Service", "NetworkPolicy"}
    errors = [error for obj in others for error in schema_errors(k8s_validators, obj)]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize(
    "kind,path,bad",
    [
        ("Service", ("spec", "publishNotReadyAdresses"), True),  # misspelt field
        ("Service", ("spec", "ports"), [{"name": "megascale", "port": "8081x"}]),  # not an int
        ("NetworkPolicy", ("spec", "policyTypes"), "Ingress"),  # a string, not a list
        ("ConfigMap", ("data",), {"pod-start.sh": 5}),  # data values are strings
    ],
    ids=["misspelt", "port-type", "policy-types", "configmap-data"],
)
def test_kubernetes_schema_refuses_a_broken_object(kind, path, bad, k8s_validators):
    cluster_spec = gke_spec("v6e-16", dashboardSourceRanges=["10.8.0.0/16"])
    obj = next(o for o in kuberay.manifests(cluster_spec) if o["kind"] == kind)
    assert schema_errors(k8s_validators, obj) == []
    node = obj
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = bad
    assert schema_errors(k8s_validators, obj)


@pytest.mark.parametrize("accelerator,slices", SHAPES, ids=SHAPE_IDS)
def test_worker_group_carries_xpks_slice_shape(accelerator, slices, xpk):
    row = xpk[accelerator]
    [group] = kuberay.raycluster_manifest(gke_spec(accelerator, slices))["spec"]["workerGroupSpecs"]
    pod_spec = group["template"]["spec"]
    [container] = pod_spec["containers"]
    assert container["resources"]["limits"] == {"google.com/tpu": row["chips_per_host"]}
    assert group["numOfHosts"] == int(row["hosts"])
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == slices
    assert pod_spec["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": row["gke_accelerator"],
        "cloud.google.com/gke-tpu-topology": row["topology"],
    }
    # KubeRay pastes rayStartParams into a bash command line: the value must survive the shell.
    [resources] = shlex.split(group["rayStartParams"]["resources"])
    assert json.loads(resources) == {"TPU": int(row["chips_per_host"])}
    env = {e["name"]: e for e in container["env"]}
    assert env["TPU_ACCELERATOR_TYPE"]["value"] == accelerator
    assert env["TPU_TOPOLOGY"]["value"] == row["topology"]
    assert env["RAYSLICE_REPLICA_INDEX"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.labels['ray.io/worker-group-replica-index']"}
    }
    multi_host = int(row["hosts"]) > 1
    assert ("RAYSLICE_HOST_INDEX" in env) == multi_host
    assert ("affinity" in pod_spec) == multi_host
    assert pod_spec["tolerations"] == [
        {"key": "google.com/tpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}
    ]


def test_one_service_per_host_with_the_names_the_pods_resolve():
    services = kuberay.host_services(gke_spec("v6e-16", slices=2))
    assert [s["metadata"]["name"] for s in services] == [
        f"demo-s{slice_index}-h{host}" for slice_index in (0, 1) for host in (0, 1, 2, 3)
    ]
    service = services[6]  # slice 1, host 2
    assert service["spec"] == {
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        "selector": {
            "ray.io/cluster": "demo",
            "ray.io/group": "tpu-v6e-16",
            "ray.io/worker-group-replica-index": "1",
            "ray.io/replica-host-index": "2",
        },
        "ports": [{"name": "megascale", "port": 8081}],
    }


def test_service_names_are_the_hostnames_the_pod_start_script_uses():
    cluster_spec = gke_spec("v5p-16", slices=2)
    names = [s["metadata"]["name"] for s in kuberay.host_services(cluster_spec)]
    assert names == ["demo-s0-h0", "demo-s0-h1", "demo-s1-h0", "demo-s1-h1"]
    assert names == pod.slice_hostnames(cluster_spec, 0) + pod.slice_hostnames(cluster_spec, 1)


def test_single_host_services_select_by_replica_only():
    [service] = kuberay.host_services(gke_spec("v6e-4"))
    assert service["spec"]["selector"] == {
        "ray.io/cluster": "demo",
        "ray.io/group": "tpu-v6e-4",
        "ray.io/worker-group-replica-index": "0",
    }


def test_manifests_are_one_yaml_stream_in_apply_order():
    cluster_spec = gke_spec("v5p-16", slices=2, dashboardSourceRanges=["10.8.0.0/16"])
    docs = list(yaml.safe_load_all(kuberay.manifests_yaml(kuberay.manifests(cluster_spec))))
    assert [d["kind"] for d in docs] == ["ConfigMap"] + ["Service"] * 4 + ["NetworkPolicy"] * 2 + [
        "RayCluster"
    ]
    script = docs[0]["data"]["pod-start.sh"]
    assert script.startswith("#!/bin/bash") and "demo-s1-h1" in script


def test_every_container_runs_the_pod_start_script():
    manifest = kuberay.raycluster_manifest(gke_spec("v6e-16"))
    assert manifest["metadata"]["annotations"] == {"ray.io/overwrite-container-cmd": "true"}
    groups = [manifest["spec"]["headGroupSpec"], *manifest["spec"]["workerGroupSpecs"]]
    for group in groups:
        pod_spec = group["template"]["spec"]
        [container] = pod_spec["containers"]
        assert container["command"] == ["/bin/bash", "/etc/rayslice/pod-start.sh"]
        assert container["image"] == "rayproject/ray:2.60.0-py311"
        assert pod_spec["volumes"][0]["configMap"]["name"] == "demo-pod-start"


def test_auth_mode_follows_the_spec():
    token = kuberay.raycluster_manifest(gke_spec("v6e-4"))
    assert token["spec"]["authOptions"] == {"mode": "token"}
    none = kuberay.raycluster_manifest(gke_spec("v6e-4", rayAuth="none"))
    assert none["spec"]["authOptions"] == {"mode": "disabled"}
    env = none["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "RAY_AUTH_MODE", "value": "disabled"} in env


# ---- NetworkPolicy: what it admits, evaluated with Kubernetes' rules ------------------------

NS = "default"
# The labels KubeRay 1.7 puts on the pods of RayCluster "demo" (and of another RayCluster).
HEAD = {"ray.io/cluster": "demo", "ray.io/node-type": "head", "ray.io/group": "headgroup"}
WORKER = {"ray.io/cluster": "demo", "ray.io/node-type": "worker", "ray.io/group": "tpu-v6e-16"}
OTHER_RAY = {"ray.io/cluster": "other", "ray.io/node-type": "worker", "ray.io/group": "cpu"}
OTHER_APP = {"app": "web"}


def _selects(selector: dict, labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "the evaluator knows matchLabels only"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _peer_admits(peer: dict, source: dict) -> bool:
    assert set(peer) <= {"podSelector", "ipBlock"}, "the evaluator knows podSelector and ipBlock only"
    if "podSelector" in peer:  # pods of the policy's own namespace
        return source.get("namespace") == NS and _selects(peer["podSelector"], source.get("labels", {}))
    block = peer["ipBlock"]
    address = ipaddress.ip_address(source["ip"])
    return address in ipaddress.ip_network(block["cidr"]) and not any(
        address in ipaddress.ip_network(e) for e in block.get("except", [])
    )


def admitted(policies: list[dict], target: dict[str, str], source: dict, port: int) -> bool:
    """Kubernetes' semantics: a pod selected by no Ingress policy admits everything; a selected
    pod admits what any rule of any selecting policy admits (a rule without `ports` admits
    every port, without `from` every source)."""
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == NS
        and "Ingress" in p["spec"]["policyTypes"]
        and _selects(p["spec"]["podSelector"], target)
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports is not None and not any(p["port"] == port and p["protocol"] == "TCP" for p in ports):
                continue
            peers = rule.get("from")
            if peers is None or any(_peer_admits(peer, source) for peer in peers):
                return True
    return False


def pod_source(labels: dict[str, str], namespace: str = NS) -> dict:
    return {"labels": labels, "namespace": namespace, "ip": "10.64.3.4"}


def ip_source(ip: str) -> dict:
    return {"ip": ip}


GCS, DASHBOARD, CLIENT, MEGASCALE, RAYLET = 6379, 8265, 10001, 8081, 43211


@pytest.mark.parametrize(
    "target,source,port,expected",
    [
        (HEAD, pod_source(WORKER), GCS, True),
        (HEAD, pod_source(WORKER), CLIENT, True),
        (HEAD, pod_source(WORKER), RAYLET, True),  # Ray's own ports beyond the well-known ones
        (WORKER, pod_source(HEAD), RAYLET, True),
        (WORKER, pod_source(WORKER), MEGASCALE, True),
        (HEAD, pod_source(OTHER_RAY), GCS, False),
        (HEAD, pod_source(OTHER_APP), DASHBOARD, False),
        (HEAD, pod_source(OTHER_APP), CLIENT, False),
        (HEAD, pod_source(WORKER, namespace="elsewhere"), GCS, False),
        (WORKER, pod_source(OTHER_APP), MEGASCALE, False),
        (HEAD, ip_source("10.8.1.2"), DASHBOARD, True),  # dashboardSourceRanges
        (HEAD, ip_source("192.168.7.9"), DASHBOARD, True),
        (HEAD, ip_source("10.8.1.2"), GCS, False),
        (HEAD, ip_source("10.8.1.2"), CLIENT, False),
        (HEAD, ip_source("10.9.0.1"), DASHBOARD, False),
        (WORKER, ip_source("10.8.1.2"), DASHBOARD, False),  # the ranges reach the head only
    ],
)
def test_network_policies_admit_only_the_clusters_own_pods_and_the_dashboard_ranges(
    target, source, port, expected
):
    policies = kuberay.network_policies(
        gke_spec("v6e-16", dashboardSourceRanges=["10.8.0.0/16", "192.168.7.0/24"])
    )
    assert admitted(policies, target, source, port) is expected


def test_without_dashboard_ranges_nothing_outside_the_cluster_reaches_the_head():
    policies = kuberay.network_policies(gke_spec("v6e-16"))
    assert [p["metadata"]["name"] for p in policies] == ["demo-ray-pods"]
    for port in (GCS, DASHBOARD, CLIENT):
        assert not admitted(policies, HEAD, ip_source("10.8.1.2"), port)
        assert not admitted(policies, HEAD, pod_source(OTHER_APP), port)
        assert admitted(policies, HEAD, pod_source(WORKER), port)


def test_the_evaluator_admits_everything_when_no_policy_selects_the_pod():
    """The evaluator itself: without a policy a pod is open (what the cluster had before)."""
    assert admitted([], HEAD, pod_source(OTHER_APP), GCS)
    assert admitted(kuberay.network_policies(gke_spec("v6e-16")), OTHER_APP, pod_source(OTHER_RAY), 80)
