"""The Kubernetes objects of a GKE Ray cluster: the RayCluster checked against KubeRay v1.7.0's
CRD, the Namespace, ServiceAccount, ConfigMap, Services and NetworkPolicies against Kubernetes
1.31's OpenAPI schema, shapes against xpk's table, names, namespaces and the pods' identity
against literals. What the NetworkPolicies admit: test_network_policy.py.
"""

from __future__ import annotations

import csv
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
    "Namespace": "namespace-v1.json",
    "ServiceAccount": "serviceaccount-v1.json",
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
    assert {o["kind"] for o in others} == {
        "Namespace",
        "ServiceAccount",
        "ConfigMap",
        "Service",
        "NetworkPolicy",
    }
    errors = [error for obj in others for error in schema_errors(k8s_validators, obj)]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize(
    "kind,path,bad",
    [
        ("Service", ("spec", "publishNotReadyAdresses"), True),  # misspelt field
        ("Service", ("spec", "ports"), [{"name": "megascale", "port": "8081x"}]),  # not an int
        ("NetworkPolicy", ("spec", "policyTypes"), "Ingress"),  # a string, not a list
        ("ConfigMap", ("data",), {"pod-start.sh": 5}),  # data values are strings
        ("ServiceAccount", ("automountServiceAccountToken",), "false"),  # a string, not a bool
        ("Namespace", ("spec",), {"finalizer": ["kubernetes"]}),  # misspelt field
    ],
    ids=["misspelt", "port-type", "policy-types", "configmap-data", "automount-type", "namespace-spec"],
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
    kinds = [d["kind"] for d in docs]
    assert kinds == [
        "Namespace",
        "ServiceAccount",
        "ConfigMap",
        *["Service"] * 4,
        *["NetworkPolicy"] * 2,
        "RayCluster",
    ]
    script = docs[2]["data"]["pod-start.sh"]
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


# ---- namespace, service account, RBAC -------------------------------------------------------


def _pod_specs(manifest: dict) -> list[dict]:
    groups = [manifest["spec"]["headGroupSpec"], *manifest["spec"]["workerGroupSpecs"]]
    return [group["template"]["spec"] for group in groups]


@pytest.mark.parametrize("accelerator,slices", [("v6e-4", 1), ("v5p-16", 2)])
def test_every_object_lives_in_the_clusters_own_namespace(accelerator, slices):
    objects = kuberay.manifests(gke_spec(accelerator, slices, dashboardSourceRanges=["10.8.0.0/16"]))
    [namespace] = [o for o in objects if o["kind"] == "Namespace"]
    assert namespace["metadata"]["name"] == "rayslice-demo"
    assert "namespace" not in namespace["metadata"]  # a Namespace is cluster-scoped
    namespaced = [o for o in objects if o is not namespace]
    assert len(namespaced) == len(objects) - 1
    assert {o["metadata"]["namespace"] for o in namespaced} == {"rayslice-demo"}


def test_namespace_refuses_privileged_pods():
    labels = kuberay.namespace_manifest(gke_spec("v6e-16"))["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"


@pytest.mark.parametrize("accelerator", ["v6e-4", "v6e-16"])
def test_ray_pods_run_as_their_own_service_account_without_an_api_token(accelerator):
    cluster_spec = gke_spec(accelerator)
    account = kuberay.service_account_manifest(cluster_spec)
    assert account["metadata"] == {
        "name": "demo-ray",
        "namespace": "rayslice-demo",
        "labels": {"app.kubernetes.io/managed-by": "rayslice", "ray.io/cluster": "demo"},
    }
    assert account["automountServiceAccountToken"] is False
    pod_specs = _pod_specs(kuberay.raycluster_manifest(cluster_spec))
    assert len(pod_specs) == 2  # head and the TPU workers
    for pod_spec in pod_specs:
        assert pod_spec["serviceAccountName"] == "demo-ray"
        assert pod_spec["automountServiceAccountToken"] is False


def test_no_role_is_bound_because_nothing_in_the_pods_calls_the_api():
    """No Role, RoleBinding or cluster-wide grant, and the reasons hold. KubeRay 1.7.0
    (ray-operator/controllers/ray/common/pod.go) gives a Ray pod API access in two cases only,
    both off here: the in-tree autoscaler sidecar, and Kubernetes-delegated token auth
    (``authOptions.enableK8sTokenAuth``, which projects a service account token into every Ray
    pod and needs a ``ray:write`` grant). Otherwise the Ray token reaches the pods as an
    environment variable from a Secret, and the pod start script names no API client and no
    token path."""
    objects = kuberay.manifests(gke_spec("v5p-16", 2))
    rbac = {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
    assert not [o for o in objects if o["kind"] in rbac]
    manifest = next(o for o in objects if o["kind"] == "RayCluster")
    assert "enableInTreeAutoscaling" not in manifest["spec"] and "autoscalerOptions" not in manifest["spec"]
    assert set(manifest["spec"]["authOptions"]) == {"mode"}  # no enableK8sTokenAuth
    script = next(o for o in objects if o["kind"] == "ConfigMap")["data"][kuberay.POD_START_FILE]
    for api_use in ("kubectl", "/var/run/secrets/kubernetes.io", "KUBERNETES_SERVICE_HOST", "serviceaccount"):
        assert api_use not in script, api_use
    for pod_spec in _pod_specs(manifest):
        for volume in pod_spec["volumes"]:
            assert "projected" not in volume and "secret" not in volume, volume
