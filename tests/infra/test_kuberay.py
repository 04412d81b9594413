"""The Kubernetes objects of a GKE Ray cluster, checked against KubeRay v1.7.0's real CRD."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from rayslice import catalog
from rayslice import spec as specs
from rayslice.infra import kuberay
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


def test_pinned_operator_matches_the_crd_fixture(fixtures_dir):
    assert (fixtures_dir / f"kuberay-v{kuberay.KUBERAY_VERSION}").is_dir()


@pytest.mark.parametrize("accelerator,slices", SHAPES, ids=[f"{s}x{a}" for a, s in SHAPES])
@pytest.mark.parametrize("auth", ["token", "none"])
def test_raycluster_validates_against_the_crd(accelerator, slices, auth, crd_validator):
    manifest = kuberay.raycluster_manifest(gke_spec(accelerator, slices, rayAuth=auth))
    errors = sorted(crd_validator.iter_errors(manifest), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_strict_validation_catches_a_misspelt_field(crd_validator):
    manifest = kuberay.raycluster_manifest(gke_spec("v6e-16"))
    manifest["spec"]["workerGroupSpecs"][0]["numHosts"] = 4
    assert any("numHosts" in e.message for e in crd_validator.iter_errors(manifest))


@pytest.mark.parametrize("accelerator,slices", SHAPES, ids=[f"{s}x{a}" for a, s in SHAPES])
def test_worker_group_carries_the_slice_shape(accelerator, slices):
    tpu = catalog.lookup(accelerator, "gke")
    [group] = kuberay.raycluster_manifest(gke_spec(accelerator, slices))["spec"]["workerGroupSpecs"]
    container = group["template"]["spec"]["containers"][0]
    per_host = int(container["resources"]["limits"]["google.com/tpu"])
    # The kuberay-tpu-webhook's rule: hosts x chips per host = chips of the topology.
    assert group["numOfHosts"] * per_host == catalog._product(catalog.parse_topology(tpu.topology))
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == slices
    # KubeRay pastes rayStartParams into a bash command line: the value must survive the shell.
    assert json.loads(shlex.split(group["rayStartParams"]["resources"])[0]) == {"TPU": per_host}
    env = {e["name"]: e for e in container["env"]}
    assert env["TPU_ACCELERATOR_TYPE"]["value"] == tpu.accelerator_type
    assert env["TPU_TOPOLOGY"]["value"] == tpu.topology
    assert (
        env[pod.ENV_REPLICA_INDEX]["valueFrom"]["fieldRef"]["fieldPath"]
        == f"metadata.labels['{pod.LABEL_REPLICA_INDEX}']"
    )
    assert (pod.ENV_HOST_INDEX in env) == tpu.multi_host
    assert ("affinity" in group["template"]["spec"]) == tpu.multi_host


def test_check_raycluster_reports_a_num_of_hosts_mismatch():
    manifest = kuberay.raycluster_manifest(gke_spec("v6e-16"))
    assert kuberay.check_raycluster(manifest) == []
    manifest["spec"]["workerGroupSpecs"][0]["numOfHosts"] = 2
    [problem] = kuberay.check_raycluster(manifest)
    assert "numOfHosts 2 x google.com/tpu 4 = 8 chips, but topology 4x4 has 16" in problem


def test_check_raycluster_reports_an_unknown_topology():
    manifest = kuberay.raycluster_manifest(gke_spec("v5p-16"))
    manifest["spec"]["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"][
        "cloud.google.com/gke-tpu-topology"
    ] = "2x2x3"
    [problem] = kuberay.check_raycluster(manifest)
    assert "topology 2x2x3 does not exist for tpu-v5p-slice" in problem


def test_one_service_per_host_names_exactly_the_hostnames_the_pods_use():
    cluster_spec = gke_spec("v6e-16", slices=2)
    services = kuberay.host_services(cluster_spec)
    names = [s["metadata"]["name"] for s in services]
    expected = [name for i in range(2) for name in pod.slice_hostnames(cluster_spec, i)]
    assert names == expected and len(set(names)) == 8
    service = services[6]  # slice 1, host 2
    assert service["metadata"]["name"] == "demo-s1-h2"
    assert service["spec"]["selector"] == {
        "ray.io/cluster": "demo",
        "ray.io/group": "tpu-v6e-16",
        pod.LABEL_REPLICA_INDEX: "1",
        pod.LABEL_HOST_INDEX: "2",
    }
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True


def test_single_host_services_select_by_replica_only():
    [service] = kuberay.host_services(gke_spec("v6e-4"))
    assert pod.LABEL_HOST_INDEX not in service["spec"]["selector"]


def test_manifests_are_one_yaml_stream_in_apply_order():
    docs = list(yaml.safe_load_all(kuberay.manifests_yaml(kuberay.manifests(gke_spec("v5p-16", slices=2)))))
    assert [d["kind"] for d in docs] == ["ConfigMap"] + ["Service"] * 4 + ["RayCluster"]
    script = docs[0]["data"][kuberay.POD_START_FILE]
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
